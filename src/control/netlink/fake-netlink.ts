/**
 * A recording Netlink with in-memory kernel state, for unit tests. It keeps the kernel's rules
 * that matter to the backends: routes are keyed by (table, dst), neighbours by (dev, dst), FDB
 * entries by (dev, mac, dst); ops on unknown devices fail with ENODEV; deleting what is absent
 * succeeds (the seam is idempotent); removing a device's last IPv4 address flushes its IPv4
 * routes and neighbours. test/netns/fake-netlink-agrees.test.ts checks it against the kernel.
 * `calls` records every applied batch; `failWith` injects an errno for ops matching a predicate.
 * `watch` reports changes on a later turn, as the kernel's notifications come: those made by
 * hand (`external`, as `ip` would: reported, not recorded in `calls`), and of the changes
 * applied, only what NativeNetlink's watch reports of its own (FDB removals, link changes);
 * `notify` and `failWatch` report what a test says. A bridge's ports and FDB are set by hand
 * (`enslave`, `learn`, `forget`: reported as the kernel reports them).
 */
import { constants } from 'node:os';
import type { WeftError } from '../../common/errors.js';
import { type Family, familyOf } from '../../common/ip.js';
import {
  type AddrEntry,
  type BridgePorts,
  type ChangeBatch,
  type FdbEntry,
  type KernelChange,
  type KernelWatch,
  type IpipInfo,
  type TunLinkInfo,
  type LinkInfo,
  type NeighEntry,
  type Netlink,
  type Op,
  type RouteEntry,
  type RouteFilter,
  NUD_PERMANENT,
  RT_TABLE_MAIN,
  isAlreadyDone,
  netlinkError,
} from './netlink.js';

interface FakeLink {
  index: number;
  name: string;
  mtu: number;
  mac: string;
  up: boolean;
  kind: string;
  /** The bridge it is a port of (its index; 0: none). */
  master: number;
  vxlan: LinkInfo['vxlan'];
  ipip: IpipInfo | null;
  tun: TunLinkInfo | null;
}

function isV4(addrOrCIDR: string): boolean {
  const slash = addrOrCIDR.indexOf('/');
  return familyOf(slash < 0 ? addrOrCIDR : addrOrCIDR.slice(0, slash)) === 4;
}

/** The NUD_* state of an FDB entry a bridge learnt (the kernel's NUD_REACHABLE). */
const NUD_REACHABLE = 0x02;

/** A bridge's FDB entry for `mac` behind `port`, learnt or aged out, as the kernel reports it. */
function learnt(deleted: boolean, mac: string, port: FakeLink): KernelChange {
  const bridgePort = { index: port.index, state: NUD_REACHABLE };
  return { kind: 'fdb', deleted, mac, dst: null, dev: port.name, bridgePort };
}

export class FakeNetlink implements Netlink {
  readonly links = new Map<string, FakeLink>();
  readonly routes = new Map<string, RouteEntry>();
  /** Blackhole routes, `<table>|<dst>`. */
  readonly blackholes = new Set<string>();
  readonly neighs = new Map<string, NeighEntry>();
  readonly fdb = new Map<string, FdbEntry>();
  readonly addrs = new Map<string, AddrEntry>();
  /** Bridges' FDB entries behind their ports: MAC → the port's name. */
  readonly bridgeFdb = new Map<string, string>();
  /** Every batch passed to apply(), in order. */
  readonly calls: Op[][] = [];
  #nextIndex = 1;
  #faults: Array<{ match: (op: Op) => boolean; errno: number; times: number }> = [];
  readonly #watchers = new Set<{
    onChanges: (b: ChangeBatch) => void;
    onError: (e: Error) => void;
  }>();
  closed = false;

  /** Adds a device (as `ip link add` would). */
  addLink(name: string, o: Partial<Omit<FakeLink, 'name' | 'index'>> = {}): FakeLink {
    const l: FakeLink = {
      index: this.#nextIndex++,
      name,
      mtu: o.mtu ?? 1500,
      mac: o.mac ?? '02:00:00:00:00:' + (this.#nextIndex - 1).toString(16).padStart(2, '0'),
      up: o.up ?? true,
      kind: o.kind ?? '',
      master: o.master ?? 0,
      vxlan: o.vxlan ?? null,
      ipip: o.ipip ?? null,
      tun: o.tun ?? null,
    };
    this.links.set(name, l);
    return l;
  }

  /** The next `times` ops matching `match` fail with `errno`. */
  failWith(match: (op: Op) => boolean, errno: number, times = 1): void {
    this.#faults.push({ match, errno, times });
  }

  /** Ops applied so far, flattened. */
  get ops(): Op[] {
    return this.calls.flat();
  }

  /** Delay before a batch takes effect (to test work arriving while a batch is in flight). */
  latencyMs = 0;

  async apply(ops: readonly Op[]): Promise<Array<WeftError | null>> {
    this.calls.push([...ops]);
    if (this.latencyMs > 0) await new Promise((r) => setTimeout(r, this.latencyMs));
    const changes: KernelChange[] = [];
    const results = ops.map((op) => {
      const errno = this.#fault(op) ?? this.#applyOne(op);
      // As NativeNetlink's watch: its own changes are not reported, but for what the kernel
      // does not stamp with the socket's port (FDB removals, link changes).
      if (errno === 0 && (op.op === 'delFdb' || op.op === 'setLink' || op.op === 'delLink'))
        changes.push(...this.#changeOf(op));
      return errno === 0 || isAlreadyDone(op, errno) ? null : netlinkError(op, errno);
    });
    this.notify(changes);
    return results;
  }

  /** Changes the state by hand, as `ip` would: reported to watchers, not recorded in `calls`. */
  external(ops: readonly Op[]): void {
    const changes: KernelChange[] = [];
    for (const op of ops) if (this.#applyOne(op) === 0) changes.push(...this.#changeOf(op));
    this.notify(changes);
  }

  watch(onChanges: (b: ChangeBatch) => void, onError: (e: Error) => void): KernelWatch {
    const w = { onChanges, onError };
    this.#watchers.add(w);
    return { close: () => this.#watchers.delete(w) };
  }

  /** The changes an op that succeeded reports (links: their state after it). */
  #changeOf(op: Op): KernelChange[] {
    if (op.op === 'setLink' || op.op === 'delLink') {
      const l = this.links.get(op.dev);
      return [
        l
          ? {
              kind: 'link',
              deleted: false,
              dev: op.dev,
              up: l.up,
              index: l.index,
              master: l.master,
            }
          : { kind: 'link', deleted: true, dev: op.dev, up: false },
      ];
    }
    return changeOf(op);
  }

  /**
   * Makes `port` a port of `bridge` (null: of none), as `ip link set PORT master BRIDGE` (or
   * `nomaster`): released, its FDB entries go (reported removed, as the kernel does).
   */
  enslave(port: string, bridge: string | null): void {
    const l = this.links.get(port);
    const b = bridge === null ? null : this.links.get(bridge);
    if (!l || b === undefined || (b && b.kind !== 'bridge'))
      throw new Error(`enslave ${port} to ${bridge}: no such device`);
    const changes = l.master !== 0 ? this.#flushPort(l) : [];
    l.master = b?.index ?? 0;
    changes.push({
      kind: 'link',
      deleted: false,
      dev: port,
      up: l.up,
      index: l.index,
      master: l.master,
    });
    this.notify(changes);
  }

  /** The bridge learns `mac` behind `port` (moved there if it was behind another). */
  learn(mac: string, port: string): void {
    const l = this.links.get(port);
    if (!l || l.master === 0) throw new Error(`learn ${mac} on ${port}: not a bridge port`);
    this.bridgeFdb.set(mac, port);
    this.notify([learnt(false, mac, l)]);
  }

  /** The bridge forgets `mac` (aged out). */
  forget(mac: string): void {
    const port = this.bridgeFdb.get(mac);
    const l = port === undefined ? undefined : this.links.get(port);
    if (!l) return;
    this.bridgeFdb.delete(mac);
    this.notify([learnt(true, mac, l)]);
  }

  /** Removes the FDB entries behind a port, returning their removals. */
  #flushPort(l: FakeLink): KernelChange[] {
    const out: KernelChange[] = [];
    for (const [mac, port] of this.bridgeFdb) {
      if (port !== l.name) continue;
      this.bridgeFdb.delete(mac);
      out.push(learnt(true, mac, l));
    }
    return out;
  }

  async listBridgePorts(name: string): Promise<BridgePorts | null> {
    const b = this.links.get(name);
    if (!b || b.kind !== 'bridge') return null;
    const ports = [...this.links.values()]
      .filter((l) => l.master === b.index)
      .map((l) => ({
        index: l.index,
        name: l.name,
        macs: [...this.bridgeFdb].filter(([, p]) => p === l.name).map(([mac]) => mac),
      }));
    return { index: b.index, ports };
  }

  /** Watchers active now (tests: a closed reconciler leaves none). */
  get watchers(): number {
    return this.#watchers.size;
  }

  /** Reports changes to every watcher on a later turn (nothing when there are none). */
  notify(changes: readonly KernelChange[], overflowed = false): void {
    if (this.#watchers.size === 0 || (changes.length === 0 && !overflowed)) return;
    const batch: ChangeBatch = { changes: [...changes], overflowed };
    setImmediate(() => {
      for (const w of this.#watchers) w.onChanges(batch);
    });
  }

  /** Fails every watch (as a monitor socket error would); they deliver nothing more. */
  failWatch(err: Error): void {
    const ws = [...this.#watchers];
    this.#watchers.clear();
    for (const w of ws) w.onError(err);
  }

  #fault(op: Op): number | undefined {
    const f = this.#faults.find((x) => x.times > 0 && x.match(op));
    if (!f) return undefined;
    f.times--;
    return f.errno;
  }

  #applyOne(op: Op): number {
    const E = constants.errno;
    if (
      op.op !== 'addVxlan' &&
      op.op !== 'addIpip' &&
      op.dev !== undefined &&
      !this.links.has(op.dev)
    )
      return E.ENODEV;
    switch (op.op) {
      case 'replaceRoute': {
        const table = op.table ?? RT_TABLE_MAIN;
        if (op.type === 'blackhole') {
          // Kept apart: the kernel implementations list unicast routes only. Added only where
          // no route for dst exists (isAlreadyDone takes the EEXIST as done).
          const key = `${table}|${op.dst}`;
          if (this.blackholes.has(key) || this.routes.has(key)) return E.EEXIST;
          this.blackholes.add(key);
          return 0;
        }
        this.routes.set(`${table}|${op.dst}`, {
          dst: op.dst,
          gw: op.gw ?? null,
          dev: op.dev ?? null,
          onlink: op.onlink ?? false,
          table,
          protocol: 3,
          scope: op.gw ? 0 : 253,
        });
        return 0;
      }
      case 'delRoute': {
        const key = `${op.table ?? RT_TABLE_MAIN}|${op.dst}`;
        if (op.type === 'blackhole') return this.blackholes.delete(key) ? 0 : E.ESRCH;
        return this.routes.delete(key) ? 0 : E.ESRCH;
      }
      case 'replaceNeigh':
        if (!op.mac) return E.EINVAL;
        this.neighs.set(`${op.dev}|${op.dst}`, {
          dst: op.dst,
          dev: op.dev,
          mac: op.mac,
          state: NUD_PERMANENT,
        });
        return 0;
      case 'delNeigh':
        return this.neighs.delete(`${op.dev}|${op.dst}`) ? 0 : E.ENOENT;
      case 'appendFdb': {
        const key = `${op.dev}|${op.mac}|${op.dst}`;
        if (this.fdb.has(key)) return E.EEXIST;
        this.fdb.set(key, { mac: op.mac, dst: op.dst, dev: op.dev, state: NUD_PERMANENT });
        return 0;
      }
      case 'delFdb':
        return this.fdb.delete(`${op.dev}|${op.mac}|${op.dst}`) ? 0 : E.ENOENT;
      case 'replaceAddr':
        this.addrs.set(`${op.dev}|${op.addr}`, { addr: op.addr, dev: op.dev });
        return 0;
      case 'delAddr': {
        if (!this.addrs.delete(`${op.dev}|${op.addr}`)) return E.EADDRNOTAVAIL;
        if (
          isV4(op.addr) &&
          ![...this.addrs.values()].some((a) => a.dev === op.dev && isV4(a.addr))
        ) {
          // The kernel flushes a device's IPv4 routes and neighbours with its last IPv4 address.
          for (const [k, r] of this.routes)
            if (r.dev === op.dev && isV4(r.dst)) this.routes.delete(k);
          for (const [k, n] of this.neighs)
            if (n.dev === op.dev && isV4(n.dst)) this.neighs.delete(k);
        }
        return 0;
      }
      case 'setLink': {
        const l = this.links.get(op.dev)!;
        if (op.up !== undefined) l.up = op.up;
        if (op.mtu !== undefined) l.mtu = op.mtu;
        if (op.mac !== undefined) l.mac = op.mac;
        return 0;
      }
      case 'delLink':
        this.#dropDevice(op.dev);
        return 0;
      case 'addIpip': {
        if (this.links.has(op.name)) return E.EEXIST;
        this.addLink(op.name, {
          kind: 'ipip',
          mtu: op.mtu ?? 1480,
          up: false,
          ipip: { local: op.local ?? null, remote: null, ttl: 0, tos: 0, pmtudisc: false },
        });
        return 0;
      }
      case 'addVxlan': {
        if (this.links.has(op.name)) return E.EEXIST;
        if (op.link !== undefined && !this.links.has(op.link)) return E.ENODEV;
        const link = op.link === undefined ? 0 : this.links.get(op.link)!.index;
        this.addLink(op.name, {
          kind: 'vxlan',
          mtu: op.mtu ?? 1450,
          up: false,
          ...(op.mac ? { mac: op.mac } : {}),
          vxlan: {
            vni: op.vni,
            port: op.port,
            local: op.local ?? null,
            link,
            learning: op.learning,
            gbp: op.gbp ?? false,
          },
        });
        return 0;
      }
    }
  }

  /** Removes a device and every entry on it (as the kernel does). */
  #dropDevice(name: string): void {
    this.links.delete(name);
    for (const m of [this.routes, this.neighs, this.fdb, this.addrs] as Array<
      Map<string, { dev: string | null }>
    >) {
      for (const [k, v] of m) if (v.dev === name) m.delete(k);
    }
  }

  /** Removes a device behind the backend's back (tests of device recreation). */
  removeLink(name: string): void {
    const l = this.links.get(name);
    const changes = l ? this.#flushPort(l) : [];
    this.#dropDevice(name);
    // a bridge removed releases its ports
    if (l?.kind === 'bridge')
      for (const p of this.links.values()) if (p.master === l.index) p.master = 0;
    changes.push({
      kind: 'link',
      deleted: true,
      dev: name,
      up: false,
      ...(l ? { index: l.index } : {}),
    });
    this.notify(changes);
  }

  async listRoutes(filter: RouteFilter): Promise<RouteEntry[]> {
    const table = filter.table ?? RT_TABLE_MAIN;
    return [...this.routes.values()].filter(
      (r) =>
        r.table === table &&
        familyOf(r.dst.slice(0, r.dst.lastIndexOf('/'))) === filter.family &&
        (filter.dst === undefined || r.dst === filter.dst) &&
        (filter.dev === undefined || r.dev === filter.dev),
    );
  }

  async listNeighs(family: Family, dev: string): Promise<NeighEntry[]> {
    return [...this.neighs.values()].filter((n) => n.dev === dev && familyOf(n.dst) === family);
  }

  async listFdb(dev: string): Promise<FdbEntry[]> {
    return [...this.fdb.values()].filter((f) => f.dev === dev);
  }

  async listAddrs(family: Family, dev: string): Promise<AddrEntry[]> {
    return [...this.addrs.values()].filter(
      (a) => a.dev === dev && familyOf(a.addr.slice(0, a.addr.lastIndexOf('/'))) === family,
    );
  }

  async getLink(name: string): Promise<LinkInfo | null> {
    const l = this.links.get(name);
    return l ? { ...l, vxlan: l.vxlan } : null;
  }

  close(): void {
    this.closed = true;
  }
}

/** The change the kernel reports for an op that succeeded. */
function changeOf(op: Op): KernelChange[] {
  const family = (a: string) => (isV4(a) ? 4 : 6);
  switch (op.op) {
    case 'replaceRoute':
    case 'delRoute':
      return [
        {
          kind: 'route',
          deleted: op.op === 'delRoute',
          family: family(op.dst),
          dst: op.dst,
          gw: op.gw ?? null,
          dev: op.dev ?? null,
          table: op.table ?? RT_TABLE_MAIN,
          unicast: op.type !== 'blackhole',
        },
      ];
    case 'replaceNeigh':
    case 'delNeigh':
      return [
        {
          kind: 'neigh',
          deleted: op.op === 'delNeigh',
          family: family(op.dst),
          dst: op.dst,
          dev: op.dev,
          mac: op.op === 'replaceNeigh' ? (op.mac ?? null) : null,
          state: NUD_PERMANENT,
        },
      ];
    case 'appendFdb':
    case 'delFdb':
      return [{ kind: 'fdb', deleted: op.op === 'delFdb', mac: op.mac, dst: op.dst, dev: op.dev }];
    case 'replaceAddr':
    case 'delAddr':
      return [{ kind: 'addr', deleted: op.op === 'delAddr', family: family(op.addr), dev: op.dev }];
    case 'setLink':
    case 'delLink':
      return []; // reported by the caller, which knows the link's state after the op
    case 'addVxlan':
    case 'addIpip':
      return [{ kind: 'link', deleted: false, dev: op.name, up: false }];
  }
}
