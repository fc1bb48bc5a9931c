/**
 * The pods' bridge followed through rtnetlink, for an engine with a bridge bypass (the bpf
 * engine's weft_bridge, Dataplane.setPodBridge):
 *
 *   Netlink.watch ── link: a port enslaved to / released from the bridge, the bridge made or gone
 *                 └─ fdb: a MAC the bridge learnt behind a port, moved or aged out
 *        ──▶ ports (index → name, MACs) ──▶ dp.setPodBridge({ name, index, ports })
 *
 * The bridge is the one named (flannel's CNI config names it; `--pod-bridge`, default cni0),
 * never assumed. A dump (Netlink.listBridgePorts) starts the table, and again after the kernel
 * dropped notifications or the bridge was made again; changes apply in order after it (a change
 * the dump already holds applies as a no-op). Each batch that changes the table hands the
 * engine the whole of it (a bridge has tens of ports, not thousands).
 *
 * A Netlink without a watch (the iproute2 fallback: no addon, so no bpf engine either) follows
 * nothing; a watch that fails leaves the engine with the last table (logged).
 */
import { errorMessage } from '../../common/errors.js';
import type { Logger } from '../../common/log.js';
import type { Dataplane, PodBridge } from '../../dataplane/index.js';
import type { ChangeBatch, KernelChange, KernelWatch, Netlink } from './netlink.js';
import { NUD_PERMANENT } from './netlink.js';

type Sink = Pick<Dataplane, 'setPodBridge'>;

export class PodBridgeFollower {
  readonly #nl: Netlink;
  readonly #name: string;
  readonly #log: Logger;
  #target: Sink | null = null;
  #watch: KernelWatch | null = null;
  #closed = false;
  /** The bridge's index (0: none). */
  #index = 0;
  /** Port index → its name. */
  readonly #ports = new Map<number, string>();
  /** MAC → the index of the port it is behind. */
  readonly #macs = new Map<string, number>();
  /** A dump in flight: changes wait for it. */
  #dumping: Promise<void> | null = null;
  #pending: KernelChange[] = [];

  constructor(nl: Netlink, name: string, log: Logger) {
    this.#nl = nl;
    this.#name = name;
    this.#log = log;
  }

  /**
   * Hands the bridge to `dp` from now on (the one before is forgotten): at once, and on every
   * change. The watch opens with the first engine that has a bridge bypass.
   */
  feed(dp: Sink): void {
    if (this.#closed || !dp.setPodBridge) return;
    this.#target = dp;
    if (!this.#watch && !this.#dumping) {
      if (!this.#open()) return;
    }
    if (!this.#dumping) this.#push();
  }

  /** What the engine was last handed (null: no bridge). */
  get state(): PodBridge | null {
    if (this.#index === 0) return null;
    const ports = new Map<number, { index: number; name: string; macs: string[] }>();
    for (const [index, name] of this.#ports) ports.set(index, { index, name, macs: [] });
    for (const [mac, port] of this.#macs) ports.get(port)?.macs.push(mac);
    return { name: this.#name, index: this.#index, ports: [...ports.values()] };
  }

  close(): void {
    this.#closed = true;
    this.#watch?.close();
    this.#watch = null;
    this.#target = null;
  }

  #open(): boolean {
    if (!this.#nl.watch || !this.#nl.listBridgePorts) {
      this.#log.info(
        { bridge: this.#name },
        "pods' bridge not followed: this netlink has no change watch",
      );
      this.#closed = true;
      return false;
    }
    try {
      // Opened before the dump: a change in between is both dumped and reported.
      this.#watch = this.#nl.watch(
        (batch) => this.#onChanges(batch),
        (err) => {
          this.#watch = null;
          this.#log.warn(
            { bridge: this.#name, err: errorMessage(err) },
            "pods' bridge watch failed; the bridge bypass keeps its last port table",
          );
        },
      );
    } catch (err) {
      this.#log.warn(
        { bridge: this.#name, err: errorMessage(err) },
        "pods' bridge watch unavailable; no bridge bypass",
      );
      this.#closed = true;
      return false;
    }
    this.#dump();
    return true;
  }

  /** Re-reads the bridge whole; changes that come meanwhile apply after it. */
  #dump(): void {
    if (this.#dumping) return;
    this.#dumping = (async () => {
      try {
        const b = await this.#nl.listBridgePorts!(this.#name);
        this.#index = b?.index ?? 0;
        this.#ports.clear();
        this.#macs.clear();
        for (const p of b?.ports ?? []) {
          this.#ports.set(p.index, p.name);
          for (const mac of p.macs) this.#macs.set(mac, p.index);
        }
      } catch (err) {
        this.#log.warn(
          { bridge: this.#name, err: errorMessage(err) },
          "pods' bridge not read; the bridge bypass keeps its last port table",
        );
      }
      this.#dumping = null;
      const pending = this.#pending;
      this.#pending = [];
      if (this.#closed) return;
      this.#apply(pending);
      if (!this.#dumping) this.#push();
    })();
  }

  #onChanges(batch: ChangeBatch): void {
    if (this.#closed) return;
    if (batch.overflowed) {
      this.#dump();
      return;
    }
    if (this.#dumping) {
      this.#pending.push(...batch.changes);
      return;
    }
    if (this.#apply(batch.changes) && !this.#dumping) this.#push();
  }

  /** Applies changes in order; whether the table changed (a dump asked for counts as one). */
  #apply(changes: readonly KernelChange[]): boolean {
    let changed = false;
    for (const c of changes) {
      if (c.kind === 'link') changed = this.#link(c) || changed;
      else if (c.kind === 'fdb') changed = this.#fdb(c) || changed;
    }
    return changed;
  }

  #link(c: Extract<KernelChange, { kind: 'link' }>): boolean {
    if (c.dev === this.#name) {
      if (c.deleted) {
        if (this.#index === 0) return false;
        this.#index = 0;
        this.#ports.clear();
        this.#macs.clear();
        return true;
      }
      // made (again): its ports and FDB are read whole
      if (c.index !== undefined && c.index !== this.#index) {
        this.#dump();
        return true;
      }
      return false;
    }
    if (c.index === undefined) return false;
    const port = this.#index !== 0 && !c.deleted && c.master === this.#index;
    if (port) {
      if (this.#ports.get(c.index) === c.dev) return false;
      this.#ports.set(c.index, c.dev);
      return true;
    }
    // released (master elsewhere or none) or gone; a change that does not say leaves it be
    if (!this.#ports.has(c.index) || (!c.deleted && c.master === undefined)) return false;
    this.#ports.delete(c.index);
    for (const [mac, p] of this.#macs) if (p === c.index) this.#macs.delete(mac);
    return true;
  }

  #fdb(c: Extract<KernelChange, { kind: 'fdb' }>): boolean {
    if (!c.bridgePort) return false;
    const { index, state } = c.bridgePort;
    if (c.deleted) {
      if (this.#macs.get(c.mac) !== index) return false;
      this.#macs.delete(c.mac);
      return true;
    }
    // the bridge's and the ports' own addresses are not pods
    if ((state & NUD_PERMANENT) !== 0 || !this.#ports.has(index)) return false;
    if (this.#macs.get(c.mac) === index) return false;
    this.#macs.set(c.mac, index);
    return true;
  }

  #push(): void {
    if (!this.#target?.setPodBridge) return;
    try {
      this.#target.setPodBridge(this.state);
    } catch (err) {
      this.#log.warn(
        { bridge: this.#name, err: errorMessage(err) },
        "pods' bridge not handed over",
      );
    }
  }
}
