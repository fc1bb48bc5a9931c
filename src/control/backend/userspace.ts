/**
 * The userspace backends (udp, vxlan-userspace, ipip-userspace) as one class: each supplies only
 * a spec (UserspaceSpec: framing, TUN, port, overheads, lease attrs, peerFor; or a
 * LazyUserspaceSpec resolved as prepare begins). A Dataplane whose TUN carries the subnet's
 * network address and a route for the whole cluster network, and a peer table planned from the
 * lease events (peer-plan.ts: only the leases an event names are parsed) and handed over once
 * per flush window: the first snapshot (and a new engine) as the whole table, after that only
 * what changed (a PeerDelta; the whole table again should the engine refuse one). Its owners:
 *
 *   EngineLifecycle  the engine started (or claimed from fast start), restarted on a new TUN,
 *                    watched (its death is fatal), closed
 *   TunUpkeep        the TUN's link state, address and route: applied, re-checked, restored
 *   PeerFeed         one run's peer records and their handover to the engine
 *
 *   prepare  → the dataplane starts (TUN exists, sockets bound, workers in their loops)
 *   start    → TUN MTU, address <subnet network address>/32 (/128), up, route <network> dev TUN
 *   run      → leases → peer records → setPeers, until the signal fires; every resync (10 s, the
 *              kernel backends' Reconciler loop) the TUN's link state, address and route are
 *              re-checked and restored (isReady is false while they cannot be)
 *   close    → the dataplane stops; the native engine's TUN is persistent (persistent-tun.ts):
 *              it stays with its address and route for the next run (a crash, kill -9 or stop
 *              costs pods packet loss until the next daemon attaches, never "net unreachable"),
 *              unless the lease is released or revoked (close({ release: true })): then it goes
 */
import { availableParallelism } from 'node:os';
import { WeftError, errorMessage } from '../../common/errors.js';
import { type Family, formatCIDR } from '../../common/ip.js';
import { jsonField } from '../../common/json-field.js';
import { Racer } from '../../common/lifecycle.js';
import { LogOnce } from '../../common/log.js';
import {
  type Dataplane,
  type DataplaneEngine,
  type DataplaneFormat,
  type DataplaneOptions,
  type OffloadName,
  type PeerEntry,
  chooseEngine,
  offloadsFromEnv,
  registerDataplaneMetrics,
  removeBpfPins,
} from '../../dataplane/index.js';
import type { TimedEvents } from '../../common/metrics.js';
import type { Lease, LeaseEvent } from '../lease/types.js';
import { openNetlink } from '../netlink/open-netlink.js';
import { type Netlink, type Op, applyAll } from '../netlink/netlink.js';
import { PodBridgeFollower } from '../netlink/pod-bridge.js';
import type { Backend, BackendContext, CloseHow, Handover, PreparedBackend } from './backend.js';
import { DataplaneRecord } from './fast-start.js';
import { inspectTun, staleTunOps } from './persistent-tun.js';
import { type PeerPlanContext, PeerRecords, planPeers } from './peer-plan.js';
import {
  clusterNetwork,
  enabledFamilies,
  kernelMetrics,
  timedProgramming,
  reconcilerMetricHooks,
  leaseSubnet,
  subnetAddress,
} from './kernel-common.js';
import { FLUSH_WINDOW_MS, Reconciler } from './reconcile.js';
import { sendAddress } from './send-address.js';
import { type HostForwardPath, egressTapBlocked, readHostForwardPath } from './host-forward.js';

/**
 * The re-check of the TUN's own state: restores (with `ops`, the ones start applied) when the
 * link is down, an address is gone or the cluster route no longer goes through the TUN. Returns
 * how many pieces were missing.
 */
async function restoreTun(nl: Netlink, tun: string, ops: readonly Op[]): Promise<number> {
  let missing = 0;
  const link = await nl.getLink(tun);
  if (!link?.up) missing++;
  for (const op of ops) {
    if (op.op === 'replaceAddr') {
      const family = op.addr.includes(':') ? 6 : 4;
      if (!(await nl.listAddrs(family, tun)).some((a) => a.addr === op.addr)) missing++;
    } else if (op.op === 'replaceRoute') {
      const family = op.dst.includes(':') ? 6 : 4;
      const routes = await nl.listRoutes({ family, dev: tun });
      if (!routes.some((r) => r.dst === op.dst && r.gw === null)) missing++;
    }
  }
  if (missing > 0) await applyAll(nl, ops);
  return missing;
}

export interface UserspaceSpec {
  readonly type: string;
  readonly format: DataplaneFormat;
  readonly tunName: string;
  readonly port: number;
  /** Bytes the encapsulation adds over an IPv4 underlay (udp 28, vxlan 50, ipip 20). */
  readonly overhead: number;
  /** The same over an IPv6 underlay (vxlan 70); default overhead + 20. */
  readonly overheadV6?: number;
  /** The TUN's MTU when the Backend block sets one (vxlan `MTU` − 50); else from the overheads. */
  readonly mtu?: number;
  /**
   * The underlay addresses the engine binds (wireguard: the ones its Mode sends from); absent:
   * underlayBinds' choice.
   */
  readonly bind?: { readonly bindIp: string | null; readonly bindIp6?: string };
  /**
   * Each pod family rides the underlay of its own family, as flannel's vxlan does (IPv4 pods to
   * the peer's PublicIP, IPv6 pods to its PublicIPv6; a dual-stack node binds both addresses).
   * Else (udp) every family rides one underlay: IPv4 when the node has an IPv4 address.
   */
  readonly underlayPerFamily?: boolean;
  readonly vni: number;
  /** Our VtepMAC (vxlan); null for udp. */
  readonly vtepMac: Buffer | null;
  readonly attrs: PreparedBackend['attrs'];
  /** The peer record for a lease, or a reason to skip it (logged once per lease). */
  peerFor(lease: Lease, family: Family, publicIP: string): PeerEntry | { skip: string };
  /** Told once the engine runs, before prepare returns (ipip: what it does not apply). */
  prepared?(dp: Dataplane): void;
  /** format wireguard: our static key and the cluster-wide PSK (DataplaneOptions.wireguard). */
  readonly wireguard?: DataplaneOptions['wireguard'];
  /** What the engine needs beside the peer table (wireguard: the peers' keys); absent: none. */
  readonly sidecar?: PeerSidecar;
}

/**
 * State an engine needs beside the peer table, planned from the same lease batches (the
 * wireguard backend's peers: public key, endpoint, keepalive). `update` sees every batch (our
 * own lease left out) and says whether anything changed; `handOver` gives the engine what it
 * needs now, after each table handover and to each new engine (it skips what the engine has).
 */
export interface PeerSidecar {
  update(batch: readonly LeaseEvent[], ownKey: string | null): boolean;
  handOver(dp: Dataplane): void;
  /** What the engine was last handed, encoded, for the fast-start record; absent: nothing. */
  encoded?(): Buffer;
}

/**
 * --dataplane-offloads when given, else the WEFT_DATAPLANE_OFFLOADS kill switch, else all; minus
 * the egress TAP (tap_gso) where the host would drop its frames (host-forward.ts: strict
 * reverse-path filtering, a FORWARD policy of drop without weft's forward rules), said once.
 */
export function offloadsOption(
  ctx: BackendContext,
  engine: DataplaneEngine,
  host: () => HostForwardPath = readHostForwardPath,
): readonly OffloadName[] {
  const o = ctx.options.dataplaneOffloads;
  const offloads = o !== '' ? offloadsFromEnv(o) : offloadsFromEnv();
  if (engine === 'js' || !offloads.includes('tap_gso')) return offloads;
  const reason = egressTapBlocked(host(), ctx.options.iptablesForwardRules);
  if (reason === null) return offloads;
  ctx.log.info(
    { reason },
    'egress TAP not used: TCP super-packets are split and sent with UDP GSO',
  );
  return offloads.filter((n) => n !== 'tap_gso');
}

/**
 * --dataplane-workers (TUN queues), or 0: one queue per CPU, at most 4 (the kernel spreads
 * flows over the queues, and over the queues' SO_REUSEPORT sockets).
 */
export function workersOption(ctx: BackendContext, cpus = availableParallelism()): number {
  const w = ctx.options.dataplaneWorkers;
  return w >= 1 ? w : Math.max(1, Math.min(cpus, 4));
}

/**
 * The underlay addresses the engine binds and sends from: one (IPv4, else IPv6), or with
 * `perFamily` one per enabled pod family (IPv4 first; bindIp6 when both). Each is the public IP
 * when that is an address of this host (send-address.ts), else the interface's address.
 */
export function underlayBinds(
  ext: BackendContext['extIface'],
  families: readonly Family[],
  perFamily: boolean,
  local?: () => readonly string[],
): { bindIp: string | null; bindIp6?: string } {
  // Each family's send address: --public-ip where it is a local address, else the interface's.
  const v4Addr = sendAddress(ext, 4, local);
  const v6Addr = sendAddress(ext, 6, local);
  if (!perFamily) return { bindIp: v4Addr ?? v6Addr };
  const v4 = families.includes(4) ? v4Addr : null;
  const v6 = families.includes(6) ? v6Addr : null;
  if ((families.includes(4) && !v4) || (families.includes(6) && !v6)) return { bindIp: null };
  return v4 && v6 ? { bindIp: v4, bindIp6: v6 } : { bindIp: v4 ?? v6 };
}

export interface UserspaceDeps {
  readonly openNetlink?: () => Netlink;
  /**
   * Whether the engine's counters go on the registry as weft_dataplane_* (default true); false
   * when the caller runs several engines and registers their sum itself (wireguard's two).
   */
  readonly registerMetrics?: boolean;
  /**
   * The fast-start record is a further engine's, named by this TUN (fast-start.ts recordPath):
   * the node runs another engine whose record is the first (wireguard's two tunnels).
   */
  readonly recordTun?: string;
  readonly hostForwardPath?: () => HostForwardPath;
  /** The addon probe chooseEngine runs (default: the dataplane's own). */
  readonly probeAddon?: () => void;
}

/**
 * `handover`: set when a kernel backend hands over for lack of its module (registry.ts); its
 * `autoPrefers` is what --dataplane-engine=auto means here (the dataplane's chooseEngine).
 */

/** The engine as a spec resolves it at prepare (vxlan: its VtepMAC is chosen there). */
export interface LazyUserspaceSpec {
  readonly type: string;
  resolve(): Promise<UserspaceSpec>;
}

/**
 * The engine's lifecycle: started at prepare (or claimed from the last run's early start,
 * fast-start.ts), started again on a new TUN when the TUN is deleted, watched (`died` rejects
 * when the running engine stops on its own), closed.
 */
class EngineLifecycle {
  #dp: Dataplane | null = null;
  #options: DataplaneOptions | null = null;
  #fail: (err: unknown) => void = () => undefined;
  /** Rejects with the reason when the running engine stops moving packets on its own. */
  readonly died: Promise<never>;
  /** The TUN was left by an earlier run and adopted (start then clears what it kept). */
  adopted = false;

  constructor(
    private readonly ctx: BackendContext,
    private readonly registerMetrics = true,
  ) {
    this.died = new Promise<never>((_, reject) => (this.#fail = reject));
    this.died.catch(() => undefined);
  }

  get running(): Dataplane | null {
    return this.#dp;
  }

  get options(): DataplaneOptions | null {
    return this.#options;
  }

  /**
   * The last run's engine, started early on the TUN it left, when the options are the same;
   * else (it stops first, before the TUN is inspected) a new one.
   */
  async start(options: DataplaneOptions, nl: Netlink): Promise<Dataplane> {
    const early = (await this.ctx.early?.claim(options)) ?? null;
    let dp: Dataplane;
    if (early) {
      dp = early;
      this.adopted = true;
    } else {
      this.adopted =
        (await inspectTun(nl, options.tunName, options.engine, this.ctx.log)) === 'adopt';
      dp = await this.#startNew(options);
    }
    this.#options = options;
    this.#use(dp);
    return dp;
  }

  /** The TUN was deleted by hand: the engine starts again on a new TUN, same options. */
  async restart(): Promise<Dataplane> {
    const old = this.#dp!;
    this.ctx.log.warn({ tun: old.tunName }, 'tun device gone; starting the dataplane on a new one');
    await old.close();
    const dp = await this.#startNew(this.#options!);
    this.#use(dp);
    return dp;
  }

  /** Stops the engine; returns the one that ran (null when none). */
  async close(): Promise<Dataplane | null> {
    const d = this.#dp;
    this.#dp = null;
    if (d) await d.close();
    return d;
  }

  async #startNew(options: DataplaneOptions): Promise<Dataplane> {
    // the engine (worker pool, codecs) loads only when a userspace backend starts, so the
    // kernel backends' daemons never pay for it
    const { startDataplane } = await import('../../dataplane/index.js');
    return startDataplane(options);
  }

  #use(dp: Dataplane): void {
    this.#dp = dp;
    if (this.registerMetrics) registerDataplaneMetrics(this.ctx.metrics, () => dp.stats());
    // A dataplane that dies is fatal: the daemon exits 1 and its supervisor restarts it.
    void dp.failed.then((err) => {
      if (dp === this.#dp) this.#fail(err);
    });
  }
}

/**
 * The TUN's own state: its link state, address and route, applied at start and re-checked
 * each resync (restored when missing; `ok` false while they cannot be).
 */
class TunUpkeep {
  /** What start applied: the TUN's link state, address and route. */
  #ops: Op[] = [];
  #ok = true;

  constructor(
    private readonly nl: Netlink,
    private readonly log: BackendContext['log'],
  ) {}

  get ok(): boolean {
    return this.#ok;
  }

  /** Applies `ops`; on an adopted TUN, removes what it kept from before. */
  async bringUp(tun: string, ops: Op[], adopted: boolean): Promise<void> {
    await applyAll(this.nl, ops);
    if (adopted) {
      const stale = await staleTunOps(this.nl, tun, ops);
      if (stale.length > 0) {
        this.log.info({ tun, stale }, 'removing what the adopted tun kept from before');
        await applyAll(this.nl, stale);
      }
    }
    this.#ops = ops;
    this.log.info({ tun, adopted }, 'tun device up');
  }

  /**
   * The re-check (the kernel backends' resync loop runs it): a TUN that is gone makes
   * `restart` start the engine on a new one; then what start applied is restored. Returns how
   * many pieces were missing.
   */
  async recheck(tun: () => string, restart: () => Promise<void>): Promise<number> {
    let missing = 0;
    try {
      if (!(await this.nl.getLink(tun()))) {
        await restart();
        missing++;
      }
      missing += await restoreTun(this.nl, tun(), this.#ops);
    } catch (err) {
      if (this.#ok)
        this.log.error(
          { tun: tun(), err: errorMessage(err) },
          'tun state cannot be restored; not ready',
        );
      this.#ok = false;
      throw err;
    }
    if (missing > 0) this.log.warn({ tun: tun(), missing }, 'tun address/route restored');
    else if (!this.#ok) this.log.info({ tun: tun() }, 'tun state whole again; ready');
    this.#ok = true;
    return missing;
  }
}

/**
 * Peer feeding for one run: records per lease, encoded when the lease changes; once per flush
 * window (events already received are coalesced) the engine takes what changed, or the whole
 * table (the first snapshot, a new engine, a refused delta).
 */
class PeerFeed {
  readonly #records = new PeerRecords();
  #whole = true;
  #first = true;
  #scheduled: NodeJS.Timeout | null = null;
  // When each lease event not yet handed to the engine was received (performance.now()).
  #received: number[] = [];
  readonly #timed: TimedEvents;

  constructor(
    private readonly engine: () => Dataplane,
    private readonly sidecar: PeerSidecar | null,
    private readonly plan: PeerPlanContext,
    private readonly log: BackendContext['log'],
    private readonly metrics: ReturnType<typeof kernelMetrics>,
    private readonly skipped: LogOnce,
    private readonly record: DataplaneRecord | null,
  ) {
    this.#timed = timedProgramming(metrics, 'engine');
  }

  /** Hands over the whole table (the next flush sends it again should the engine refuse it). */
  handOverTable(): void {
    try {
      this.engine().setPeerTable(this.#records.takeTable());
      this.#whole = false;
      this.log.debug({ peers: this.#records.size }, 'peer table replaced');
    } catch (err) {
      // the engine keeps its old table: the next flush hands over the whole table again
      this.#whole = true;
      this.log.error({ err: errorMessage(err) }, 'peer table refused');
    }
    this.sidecar?.handOver(this.engine());
  }

  update(batch: readonly LeaseEvent[]): void {
    const now = performance.now();
    const sideChanged = this.sidecar?.update(batch, this.plan.ownKey) ?? false;
    const changes = planPeers(batch, this.plan);
    for (const c of changes) {
      for (const reason of c.skipped) {
        if (this.skipped.first(`${c.key}/${reason}`)) {
          this.metrics.skipped.inc();
          this.log.warn({ lease: c.key, reason }, 'peer lease skipped');
        }
      }
    }
    // The store's first snapshot is handed over even when it changes nothing here (no
    // peers): it replaces whatever table the engine started with (fast-start.ts), at once.
    // After it, one table per flush window, as the kernel backends batch (a churn of small
    // batches would otherwise rebuild the 5,000-peer table on every event-loop turn).
    const wasFirst = this.#first;
    const changed = this.#records.apply(changes) || this.#first || sideChanged;
    this.#first = false;
    if (changed && !this.#scheduled) {
      this.#scheduled = setTimeout(() => this.#push(), wasFirst ? 0 : FLUSH_WINDOW_MS);
    }
    // (events that changed no record need no programming: they are not timed)
    if (changed) for (let i = 0; i < batch.length; i++) this.#received.push(now);
  }

  /** What is still waiting for its flush window goes now. */
  flush(): void {
    if (this.#scheduled) this.#push();
  }

  #push(): void {
    clearTimeout(this.#scheduled ?? undefined);
    this.#scheduled = null;
    const carried = this.#received;
    this.#received = [];
    try {
      this.#pushTable();
    } finally {
      this.#timed.took(carried);
    }
  }

  #pushTable(): void {
    if (this.#whole) {
      this.handOverTable();
    } else {
      const delta = this.#records.takeDelta();
      if (delta.changes === 0) {
        this.sidecar?.handOver(this.engine());
        const sidecar = this.sidecar;
        if (sidecar?.encoded) this.record?.wgPeers(() => sidecar.encoded!());
        return;
      }
      try {
        this.engine().updatePeerTable(delta);
        this.log.debug({ peers: this.#records.size, changes: delta.changes }, 'peer table updated');
        this.sidecar?.handOver(this.engine());
      } catch (err) {
        this.log.warn(
          { err: errorMessage(err) },
          'peer table change refused; handing over the whole table',
        );
        this.handOverTable();
      }
    }
    this.record?.peers(() => this.#records.table());
    const sidecar = this.sidecar;
    if (sidecar?.encoded) this.record?.wgPeers(() => sidecar.encoded!());
  }
}

/**
 * `handover`: set when a kernel backend hands over for lack of its module (registry.ts); its
 * `autoPrefers` is what --dataplane-engine=auto means here (the dataplane's chooseEngine).
 */
export class UserspaceBackend implements Backend {
  readonly type: string;
  readonly #ctx: BackendContext;
  readonly #given: UserspaceSpec | LazyUserspaceSpec;
  readonly #deps: UserspaceDeps;
  readonly #handover: Handover;
  readonly #families: Family[];
  readonly #skipped = new LogOnce();
  // Skipped peers are counted as the kernel backends count theirs (once per lease and reason).
  readonly #metrics: ReturnType<typeof kernelMetrics>;
  readonly #record: DataplaneRecord | null;
  readonly #engine: EngineLifecycle;
  #spec: UserspaceSpec | null = null;
  #mtu = 0;
  #nl: Netlink | null = null;
  #tun: TunUpkeep | null = null;
  #ownKey: string | null = null;

  constructor(
    ctx: BackendContext,
    spec: UserspaceSpec | LazyUserspaceSpec,
    deps: UserspaceDeps = {},
    handover: Handover = {},
  ) {
    this.type = spec.type;
    this.#ctx = ctx;
    this.#given = spec;
    this.#deps = deps;
    this.#handover = handover;
    this.#families = enabledFamilies(ctx.netConfig);
    this.#metrics = kernelMetrics(ctx.metrics);
    this.#engine = new EngineLifecycle(ctx, deps.registerMetrics ?? true);
    // What the next run starts early with (fast-start.ts): not for the js engine, nor for
    // "Dataplane": "auto" (its next start may take the kernel device of the TUN's name; a
    // handover comes only from "auto").
    const auto =
      handover.autoPrefers !== undefined ||
      jsonField(ctx.netConfig.backend.raw, 'Dataplane') === 'auto';
    this.#record =
      ctx.options.subnetFile && !auto
        ? new DataplaneRecord(
            ctx.options.subnetFile,
            ctx.log,
            deps.recordTun === undefined ? {} : { tun: deps.recordTun },
          )
        : null;
  }

  /** The engine running now (null before prepare and after close). */
  get dataplane(): Dataplane | null {
    return this.#engine.running;
  }

  /** The TUN's state: false while the re-check cannot restore it. */
  isReady(): boolean {
    return this.#tun?.ok ?? true;
  }

  async prepare(): Promise<PreparedBackend> {
    const ctx = this.#ctx;
    const log = ctx.log;
    const ext = ctx.extIface;
    const spec = 'resolve' in this.#given ? await this.#given.resolve() : this.#given;
    this.#spec = spec;
    const { bindIp, bindIp6 } =
      spec.bind ?? underlayBinds(ext, this.#families, spec.underlayPerFamily ?? false);
    // An IPv6 underlay in use: its larger outer header sets the TUN MTU (one TUN for both).
    const v6Underlay = bindIp6 !== undefined || (bindIp?.includes(':') ?? false);
    const mtu =
      spec.mtu ?? ext.mtu - (v6Underlay ? (spec.overheadV6 ?? spec.overhead + 20) : spec.overhead);
    this.#mtu = mtu;
    if (!bindIp) {
      throw new WeftError(
        'WEFT_ERR_BACKEND',
        `${spec.type}: ${ext.name} has no address to bind` +
          (spec.underlayPerFamily ? ' for every enabled family (each rides its own)' : ''),
      );
    }
    // the dataplane decides (auto, the framing, the addon); a refusal names the way out
    const engine = chooseEngine(
      {
        requested: ctx.options.dataplaneEngine,
        format: spec.format,
        who: spec.type,
        ...(this.#handover.autoPrefers ? { autoPrefers: this.#handover.autoPrefers } : {}),
      },
      this.#deps.probeAddon ? { probeAddon: this.#deps.probeAddon } : undefined,
    );
    const nl = (this.#deps.openNetlink ?? openNetlink)();
    this.#nl = nl;
    this.#tun = new TunUpkeep(nl, log);
    const options: DataplaneOptions = {
      format: spec.format,
      engine,
      tunName: spec.tunName,
      underlay: ext.name,
      workers: workersOption(ctx),
      offloads: offloadsOption(ctx, engine, this.#deps.hostForwardPath),
      busyPollUs: ctx.options.dataplaneBusyPoll,
      queueThreads: ctx.options.dataplaneQueueThreads,
      cpuAffine: ctx.options.dataplaneCpuAffine,
      schedFifo: ctx.options.dataplaneSchedFifo,
      persist: true,
      bindIp,
      ...(bindIp6 ? { bindIp6 } : {}),
      port: spec.port,
      tunMtu: mtu,
      vni: spec.vni,
      vtepMac: spec.vtepMac ?? Buffer.alloc(6),
      ...(spec.wireguard ? { wireguard: spec.wireguard } : {}),
      log,
    };
    const dp = await this.#engine.start(options, nl);
    log.info(
      {
        tun: dp.tunName,
        bind: `${bindIp}:${spec.port}`,
        ...(bindIp6 ? { bind6: `[${bindIp6}]:${spec.port}` } : {}),
        engine: dp.engine,
        mtu,
        // native: how the TUN picks a queue (cpu: CPU-affine queues; flow; tun: its own table)
        steering: dp.stats().steering,
      },
      'userspace dataplane started',
    );
    spec.prepared?.(dp);
    return { attrs: spec.attrs, mtu };
  }

  async start(lease: Lease): Promise<void> {
    const dp = this.#engine.running;
    if (!dp || !this.#tun) throw new Error(`${this.type}: start before prepare`);
    this.#ownKey = lease.key;
    const ops: Op[] = [{ op: 'setLink', dev: dp.tunName, mtu: this.#mtu, up: true }];
    for (const family of this.#families) {
      const subnet = leaseSubnet(lease, family);
      const network = clusterNetwork(this.#ctx.netConfig, family);
      if (!subnet || !network) continue;
      ops.push(
        {
          op: 'replaceAddr',
          addr: `${subnetAddress(subnet)}/${family === 4 ? 32 : 128}`,
          dev: dp.tunName,
        },
        { op: 'replaceRoute', dst: formatCIDR(network), dev: dp.tunName },
      );
    }
    await this.#tun.bringUp(dp.tunName, ops, this.#engine.adopted);
    const options = this.#engine.options;
    if (options && options.engine !== 'js')
      this.#record?.start(this.#ctx.netConfig.backend.raw, options);
  }

  async run(events: AsyncIterable<LeaseEvent[]>, signal: AbortSignal): Promise<void> {
    const spec = this.#spec;
    const tun = this.#tun;
    if (!this.#engine.running || !this.#nl || !spec || !tun)
      throw new Error(`${this.type}: run before prepare`);
    const log = this.#ctx.log;
    const engine = () => this.#engine.running!;
    const feed = new PeerFeed(
      engine,
      spec.sidecar ?? null,
      {
        families: this.#families,
        underlay: this.#ctx.extIface.ifaceAddr ? 4 : 6,
        perFamily: spec.underlayPerFamily ?? false,
        ownKey: this.#ownKey,
        peerFor: (lease, family, pub) => spec.peerFor(lease, family, pub),
      },
      log,
      this.#metrics,
      this.#skipped,
      this.#record,
    );
    // The pods' bridge, followed through netlink for an engine with a bridge bypass (bpf).
    const podBridge = new PodBridgeFollower(this.#nl, this.#ctx.options.podBridge, log);
    podBridge.feed(engine());
    // The TUN's state is re-checked by the kernel backends' resync loop (no peers of its own);
    // a new engine (the TUN deleted by hand) takes the current table whole, and the bridge.
    const recheck = new AbortController();
    const reconciler = new Reconciler({
      netlink: this.#nl,
      log,
      ownership: [],
      watchDevs: [engine().tunName],
      ...reconcilerMetricHooks(this.#metrics),
      ensureBase: () =>
        tun.recheck(
          () => engine().tunName,
          async () => {
            await this.#engine.restart();
            podBridge.feed(engine());
            feed.handOverTable();
          },
        ),
    });
    const rechecking = reconciler.run(recheck.signal);
    const iter = events[Symbol.asyncIterator]();
    const aborted = new Promise<null>((resolve) => {
      if (signal.aborted) resolve(null);
      signal.addEventListener('abort', () => resolve(null), { once: true });
    });
    const racer = new Racer<null>([aborted, this.#engine.died]);
    try {
      while (!signal.aborted) {
        const next = await racer.race(iter.next());
        if (next === null || next.done) break;
        feed.update(next.value);
      }
    } catch (err) {
      // The dataplane died: a next() is still pending (no abort will end it), so a return()
      // would wait behind it. The daemon aborts the lease stream as it stops.
      void iter.return?.()?.catch(() => undefined);
      throw err;
    } finally {
      podBridge.close();
      recheck.abort();
      await rechecking;
    }
    await iter.return?.();
    feed.flush();
  }

  async close(how: CloseHow = {}): Promise<void> {
    const log = this.#ctx.log;
    const d = await this.#engine.close();
    const nl = this.#nl;
    if (d && how.release && nl) {
      // the subnet is no longer ours: the device that would keep serving it goes, with the
      // bpf engine's programs pinned on it
      await this.#record?.remove();
      removeBpfPins(d.tunName, log);
      await applyAll(nl, [{ op: 'delLink', dev: d.tunName }]);
      log.info({ tun: d.tunName }, 'tun removed with the lease');
    } else {
      await this.#record?.flush();
    }
    nl?.close();
    this.#nl = null;
  }
}

/** A userspace backend for `spec` (udp, vxlan-userspace, ipip-userspace supply only the spec). */
export function createUserspaceBackend(
  ctx: BackendContext,
  spec: UserspaceSpec | LazyUserspaceSpec,
  deps: UserspaceDeps = {},
  handover: Handover = {},
): Backend {
  return new UserspaceBackend(ctx, spec, deps, handover);
}
