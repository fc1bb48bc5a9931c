/**
 * Netlink over the native addon (libmnl). Dumps are synchronous (they run on the control
 * thread, never on a packet path); a batch of changes is sent from a libuv pool thread
 * (`netlinkApplyAsync`): rtnetlink does each request's work in the sender's sendmsg, and a start's
 * 5,000 peers are ~0.3 s of it, which the event loop now spends planning the next peers
 * (reconcile.ts runPlanned). The handle's calls take turns on its socket in the addon: a dump
 * asked for while a batch is being sent waits until it is answered.
 *
 * `netns`: a namespace name (`/run/netns/<name>`) or path; the socket is opened inside it, so
 * every op acts there. Tests always pass one; the daemon runs in its node's namespace and passes
 * none.
 */
import { constants } from 'node:os';
import { WeftError } from '../../common/errors.js';
import type { Family } from '../../common/ip.js';
import { loadNative } from '../../common/native.js';
import type {
  NativeAddon,
  RawAddr,
  RawChange,
  RawLink,
  RawNeigh,
  RawRoute,
} from '../../common/native-addon.js';
import {
  type AddrEntry,
  type BridgePorts,
  type ChangeBatch,
  type FdbEntry,
  type KernelChange,
  type KernelWatch,
  type LinkInfo,
  type NeighEntry,
  type Netlink,
  type Op,
  type RouteEntry,
  type RouteFilter,
  NUD_PERMANENT,
  RT_TABLE_MAIN,
  errnoName,
  isAlreadyDone,
  netlinkError,
} from './netlink.js';

/** The addon's netlink exports (native/src/addon.cc, nlbind); tests may inject a fake. */
export type NetlinkBinding = Pick<
  NativeAddon,
  | 'netlinkOpen'
  | 'netlinkClose'
  | 'netlinkApplyAsync'
  | 'netlinkList'
  | 'netlinkGetLink'
  | 'netlinkMonitorOpen'
  | 'netlinkMonitorClose'
>;

const IFF_UP = 1;
const RTN_UNICAST = 1;
const RTN_BLACKHOLE = 6;
const RTNH_F_ONLINK = 4;
const NTF_SELF = 0x02;

function splitCIDR(cidr: string): { addr: string; len: number | undefined } {
  const i = cidr.lastIndexOf('/');
  return i < 0
    ? { addr: cidr, len: undefined }
    : { addr: cidr.slice(0, i), len: Number(cidr.slice(i + 1)) };
}

/** Ops after which the name → index cache is stale. */
function changesLinks(op: Op): boolean {
  return op.op === 'addVxlan' || op.op === 'addIpip' || op.op === 'delLink';
}

function toLinkInfo(l: RawLink): LinkInfo {
  return {
    index: l.index,
    name: l.name,
    mtu: l.mtu,
    mac: l.mac,
    up: (l.flags & IFF_UP) !== 0,
    master: l.master ?? 0,
    kind: l.kind,
    vxlan: l.vxlan,
    ipip: l.ipip ?? null,
    tun: l.tun ?? null,
  };
}

/** One call's use of the link cache: whether it read the links itself (a miss then means gone). */
interface CallState {
  fresh: boolean;
}

export class NativeNetlink implements Netlink {
  readonly #b: NetlinkBinding;
  readonly #h: unknown;
  readonly #path: string;
  #closed = false;
  /**
   * Link name → index, from one link dump, kept across calls: an apply of one peer's ops must
   * not dump every link. Refreshed when a name is missing, when an op fails with ENODEV (the
   * device was recreated behind us: its ops are retried once with the new index), after ops
   * that create or delete links, and by every listRoutes (the periodic re-check).
   */
  #links: Map<string, number> | null = null;
  /** Link dumps made (tests: the cache at work). */
  linkDumps = 0;

  constructor(options: { netns?: string; binding?: NetlinkBinding } = {}) {
    this.#b = options.binding ?? loadNative();
    const ns = options.netns;
    const path = ns === undefined ? '' : ns.includes('/') ? ns : `/run/netns/${ns}`;
    this.#path = path;
    try {
      this.#h = this.#b.netlinkOpen(path);
    } catch (err) {
      throw new WeftError('WEFT_ERR_NETLINK', (err as Error).message, { cause: err });
    }
  }

  /** Name → index of every link (the cache, filled on first use). */
  #indexes(call: CallState): Map<string, number> {
    return this.#links ?? this.#refreshLinks(call);
  }

  #refreshLinks(call: CallState): Map<string, number> {
    const m = new Map<string, number>();
    this.linkDumps++;
    for (const l of this.#list('link', 4, 0)) m.set(l.name, l.index);
    this.#links = m;
    call.fresh = true;
    return m;
  }

  /** The index of `dev`, refreshing the cache (once per call) when it does not know the name. */
  #index(dev: string, call: CallState): number | undefined {
    const i = this.#indexes(call).get(dev);
    if (i !== undefined || call.fresh) return i;
    return this.#refreshLinks(call).get(dev);
  }

  #list(what: 'link', family: Family, ifindex: number): RawLink[];
  #list(what: 'route', family: Family, ifindex: number): RawRoute[];
  #list(what: 'neigh' | 'fdb', family: Family, ifindex: number): RawNeigh[];
  #list(what: 'addr', family: Family, ifindex: number): RawAddr[];
  #list(
    what: 'link' | 'route' | 'neigh' | 'fdb' | 'addr',
    family: Family,
    ifindex: number,
  ): unknown[] {
    this.#check();
    try {
      return this.#b.netlinkList(this.#h, what as 'link', family, ifindex);
    } catch (err) {
      const errno = (err as { errno?: number }).errno;
      const name = errno === undefined ? (err as Error).message : errnoName(errno);
      throw new WeftError('WEFT_ERR_NETLINK', `list ${what}: ${name}`, { cause: err });
    }
  }

  #check(): void {
    if (this.#closed) throw new WeftError('WEFT_ERR_NETLINK', 'netlink: used after close');
  }

  async apply(ops: readonly Op[]): Promise<Array<WeftError | null>> {
    this.#check();
    const call: CallState = { fresh: false };
    const results: Array<WeftError | null> = new Array<WeftError | null>(ops.length).fill(null);
    // Device names are resolved per segment: a segment ends after an op that creates or deletes
    // a device, so later ops in the same batch see it (or its absence).
    let start = 0;
    while (start < ops.length) {
      let end = start;
      while (end < ops.length && !changesLinks(ops[end]!)) end++;
      end = Math.min(end + 1, ops.length);
      await this.#applySegment(ops, start, end, results, call);
      if (changesLinks(ops[end - 1]!)) this.#links = null;
      start = end;
    }
    return results;
  }

  async #applySegment(
    ops: readonly Op[],
    start: number,
    end: number,
    results: Array<WeftError | null>,
    call: CallState,
  ): Promise<void> {
    const idx = (dev: string) => this.#index(dev, call);
    const todo: number[] = [];
    for (let i = start; i < end; i++) todo.push(i);
    const enodev = await this.#send(ops, todo, idx, results);
    if (enodev.length === 0) return;
    // A cached index went stale (the device was recreated): look again, retry those once.
    if (call.fresh) return; // the indexes were read in this call: the device is really gone
    const links = this.#refreshLinks(call);
    await this.#send(ops, enodev, (dev) => links.get(dev), results);
  }

  /** Encodes and sends ops[i] for i in `which`; resolves with those that failed with ENODEV. */
  async #send(
    ops: readonly Op[],
    which: readonly number[],
    idx: (dev: string) => number | undefined,
    results: Array<WeftError | null>,
  ): Promise<number[]> {
    const raw: Array<Record<string, unknown>> = [];
    const rawIndex: number[] = [];
    for (const i of which) {
      const op = ops[i]!;
      const r = this.#encode(op, idx);
      if (typeof r === 'number') {
        results[i] = isAlreadyDone(op, r) ? null : netlinkError(op, r);
      } else {
        results[i] = null;
        raw.push(r);
        rawIndex.push(i);
      }
    }
    const enodev: number[] = [];
    if (raw.length === 0) return enodev;
    let errs: Int32Array;
    try {
      errs = await this.#b.netlinkApplyAsync(this.#h, raw);
    } catch (err) {
      // (closed while the batch waited for its turn)
      throw new WeftError('WEFT_ERR_NETLINK', (err as Error).message, { cause: err });
    }
    for (let k = 0; k < errs.length; k++) {
      const errno = errs[k]!;
      const i = rawIndex[k]!;
      if (errno === 0 || isAlreadyDone(ops[i]!, errno)) continue;
      results[i] = netlinkError(ops[i]!, errno);
      if (errno === constants.errno.ENODEV) enodev.push(i);
    }
    return enodev;
  }

  /** The binding's op object, or an errno when it cannot be sent (unknown device). */
  #encode(op: Op, idx: (dev: string) => number | undefined): Record<string, unknown> | number {
    const dev = (name: string | undefined): number | null => {
      if (name === undefined) return 0;
      return idx(name) ?? null;
    };
    const ENODEV = constants.errno.ENODEV;
    switch (op.op) {
      case 'replaceRoute':
      case 'delRoute': {
        const ifindex = dev(op.dev);
        if (ifindex === null) return ENODEV;
        const { addr, len } = splitCIDR(op.dst);
        return {
          op: op.op,
          dst: addr,
          dstLen: len ?? -1,
          gw: op.gw ?? '',
          ifindex,
          onlink: op.onlink ?? false,
          table: op.table ?? RT_TABLE_MAIN,
          routeType: op.type === 'blackhole' ? RTN_BLACKHOLE : 0,
        };
      }
      case 'replaceNeigh':
      case 'delNeigh':
      case 'appendFdb':
      case 'delFdb': {
        const ifindex = dev(op.dev);
        if (ifindex === null) return ENODEV;
        return { op: op.op, dst: op.dst, mac: op.mac ?? '', ifindex };
      }
      case 'replaceAddr':
      case 'delAddr': {
        const ifindex = dev(op.dev);
        if (ifindex === null) return ENODEV;
        const { addr, len } = splitCIDR(op.addr);
        return { op: op.op, dst: addr, dstLen: len ?? -1, ifindex };
      }
      case 'setLink': {
        const ifindex = dev(op.dev);
        if (ifindex === null) return ENODEV;
        return {
          op: op.op,
          ifindex,
          up: op.up === undefined ? -1 : op.up ? 1 : 0,
          mtu: op.mtu ?? 0,
          mac: op.mac ?? '',
        };
      }
      case 'delLink': {
        const ifindex = dev(op.dev);
        if (ifindex === null) return ENODEV;
        return { op: op.op, ifindex };
      }
      case 'addIpip':
        return { op: op.op, name: op.name, local: op.local ?? '', mtu: op.mtu ?? 0 };
      case 'addVxlan': {
        const link = dev(op.link);
        if (link === null) return ENODEV;
        return {
          op: op.op,
          name: op.name,
          vni: op.vni,
          port: op.port,
          local: op.local ?? '',
          link,
          learning: op.learning,
          gbp: op.gbp ?? false,
          mtu: op.mtu ?? 0,
          mac: op.mac ?? '',
        };
      }
    }
  }

  async listRoutes(filter: RouteFilter): Promise<RouteEntry[]> {
    const names = new Map<number, string>();
    for (const [name, index] of this.#refreshLinks({ fresh: false })) names.set(index, name);
    const table = filter.table ?? RT_TABLE_MAIN;
    const out: RouteEntry[] = [];
    for (const r of this.#list('route', filter.family, 0)) {
      if (r.table !== table || r.type !== RTN_UNICAST) continue;
      const dst = `${r.dst}/${r.dstLen}`;
      const dev = names.get(r.ifindex) ?? null;
      if (filter.dst !== undefined && filter.dst !== dst) continue;
      if (filter.dev !== undefined && filter.dev !== dev) continue;
      out.push({
        dst,
        gw: r.gw,
        dev,
        onlink: (r.flags & RTNH_F_ONLINK) !== 0,
        table: r.table,
        protocol: r.protocol,
        scope: r.scope,
      });
    }
    return out;
  }

  async listNeighs(family: Family, dev: string): Promise<NeighEntry[]> {
    const ifindex = this.#index(dev, { fresh: false });
    if (ifindex === undefined) return [];
    return this.#list('neigh', family, ifindex)
      .filter((n) => n.dst !== null)
      .map((n) => ({ dst: n.dst!, dev, mac: n.mac, state: n.state }));
  }

  async listFdb(dev: string): Promise<FdbEntry[]> {
    const ifindex = this.#index(dev, { fresh: false });
    if (ifindex === undefined) return [];
    return this.#list('fdb', 4, ifindex)
      .filter((n) => n.mac !== null && (n.flags & NTF_SELF) !== 0)
      .map((n) => ({ mac: n.mac!, dst: n.dst, dev, state: n.state }));
  }

  async listAddrs(family: Family, dev: string): Promise<AddrEntry[]> {
    const ifindex = this.#index(dev, { fresh: false });
    if (ifindex === undefined) return [];
    return this.#list('addr', family, ifindex).map((a) => ({ addr: `${a.addr}/${a.prefix}`, dev }));
  }

  async getLink(name: string): Promise<LinkInfo | null> {
    this.#check();
    try {
      const l = this.#b.netlinkGetLink(this.#h, name);
      return l ? toLinkInfo(l) : null;
    } catch (err) {
      const errno = (err as { errno?: number }).errno;
      const why = errno === undefined ? (err as Error).message : errnoName(errno);
      throw new WeftError('WEFT_ERR_NETLINK', `get link ${name}: ${why}`, { cause: err });
    }
  }

  async listBridgePorts(name: string): Promise<BridgePorts | null> {
    const links = this.#list('link', 4, 0);
    const bridge = links.find((l) => l.name === name && l.kind === 'bridge');
    if (!bridge) return null;
    const ports = new Map<number, { index: number; name: string; macs: string[] }>();
    for (const l of links)
      if (l.master === bridge.index) ports.set(l.index, { index: l.index, name: l.name, macs: [] });
    for (const n of this.#list('fdb', 4, 0)) {
      if (n.mac === null || (n.flags & NTF_SELF) !== 0 || (n.state & NUD_PERMANENT) !== 0) continue;
      ports.get(n.ifindex)?.macs.push(n.mac);
    }
    return { index: bridge.index, ports: [...ports.values()] };
  }

  /**
   * A monitor socket in this Netlink's namespace, polled by the event loop. Changes made through
   * this Netlink are left out where the kernel stamps them with its socket's port id (routes,
   * neighbours, addresses; not link changes): at 200 lease changes a second they would be most
   * of the traffic. FDB entries added are left out too (their notifications carry no port id);
   * removed ones, and the old destination of one pointed elsewhere, are reported. Device indexes
   * are named from a link
   * dump taken now, kept up to date by the link changes themselves (an index it does not know
   * sends it back to the kernel once per wakeup).
   */
  watch(onChanges: (batch: ChangeBatch) => void, onError: (err: Error) => void): KernelWatch {
    this.#check();
    const names = new Map<number, string>();
    const reread = () => {
      names.clear();
      for (const l of this.#list('link', 4, 0)) names.set(l.index, l.name);
    };
    let failed = false;
    let h: unknown = null;
    const listener = (raw: RawChange[], overflowed: boolean, error: Error | null): void => {
      if (failed) return;
      try {
        if (error) throw error;
        let dumpedNow = false;
        const name = (index: number): string | null => {
          if (index === 0) return null;
          let n = names.get(index);
          if (n === undefined && !dumpedNow) {
            dumpedNow = true;
            reread();
            n = names.get(index);
          }
          return n ?? null;
        };
        const changes: KernelChange[] = [];
        for (const c of raw) {
          if (c.kind === 'link') {
            // a device renamed is gone under its old name
            const old = names.get(c.ifindex);
            if (old !== undefined && old !== c.name)
              changes.push({ kind: 'link', deleted: true, dev: old, up: false });
          }
          const change = toChange(c, name, names);
          if (change) changes.push(change);
        }
        if (overflowed) reread();
        onChanges({ changes, overflowed });
      } catch (err) {
        failed = true;
        if (h !== null) this.#b.netlinkMonitorClose(h);
        onError(
          err instanceof WeftError
            ? err
            : new WeftError('WEFT_ERR_NETLINK', (err as Error).message, { cause: err }),
        );
      }
    };
    try {
      // Opened before the dump: a link added in between is both dumped and announced.
      h = this.#b.netlinkMonitorOpen(this.#path, listener, this.#h);
      reread();
    } catch (err) {
      if (h !== null) this.#b.netlinkMonitorClose(h);
      throw err instanceof WeftError
        ? err
        : new WeftError('WEFT_ERR_NETLINK', (err as Error).message, { cause: err });
    }
    return {
      close: () => {
        failed = true;
        this.#b.netlinkMonitorClose(h);
      },
    };
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#b.netlinkClose(this.#h);
  }
}

/** A raw change with its devices named; null for what the re-check never needs. */
function toChange(
  c: RawChange,
  name: (index: number) => string | null,
  names: Map<number, string>,
): KernelChange | null {
  switch (c.kind) {
    case 'route':
      return {
        kind: 'route',
        deleted: c.deleted,
        family: c.family,
        dst: `${c.dst ?? (c.family === 4 ? '0.0.0.0' : '::')}/${c.dstLen}`,
        gw: c.gw,
        dev: name(c.ifindex),
        table: c.table,
        unicast: c.type === RTN_UNICAST,
      };
    case 'neigh':
      return c.dst === null
        ? null
        : {
            kind: 'neigh',
            deleted: c.deleted,
            family: c.family,
            dst: c.dst,
            dev: name(c.ifindex),
            mac: c.mac,
            state: c.state,
          };
    case 'fdb': {
      if (c.mac === null) return null;
      const change = {
        kind: 'fdb',
        deleted: c.deleted,
        mac: c.mac,
        dst: c.dst,
        dev: name(c.ifindex),
      } as const;
      // NTF_SELF set: the device's own entry (the FDB weft writes); else a bridge's, behind a port
      return (c.flags & NTF_SELF) !== 0
        ? change
        : { ...change, dst: null, bridgePort: { index: c.ifindex, state: c.state } };
    }
    case 'link': {
      if (c.deleted) names.delete(c.ifindex);
      else names.set(c.ifindex, c.name);
      return {
        kind: 'link',
        deleted: c.deleted,
        dev: c.name,
        up: !c.deleted && (c.flags & IFF_UP) !== 0,
        index: c.ifindex,
        master: c.master ?? 0,
      };
    }
    case 'addr':
      return { kind: 'addr', deleted: c.deleted, family: c.family, dev: name(c.ifindex) };
  }
}
