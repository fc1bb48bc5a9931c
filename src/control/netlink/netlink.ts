/**
 * The Netlink seam: typed, idempotent kernel operations (iproute2's verbs) for the kernel
 * backends. Implementations: `NativeNetlink` (the addon, libmnl) and `FakeNetlink` (in-memory
 * kernel state that records every op, for unit tests).
 *
 * Contract:
 * - Ops name devices, never indexes: an implementation resolves names when it applies them, so a
 *   device recreated between plan and apply is still found. An unknown device fails that op
 *   with ENODEV.
 * - `apply(ops)` sends the whole list as one batch and returns one result per op, in op order:
 *   null on success, else a WeftError WEFT_ERR_NETLINK whose message names the operation, the
 *   target and the errno (`replace route 10.5.34.0/24 via 10.5.34.0 dev flannel.1: EEXIST`).
 *   Ops are independent; one failing does not stop the others. Ordering between ops in one batch
 *   is kept (the kernel handles them in sequence).
 * - Idempotent: `replace*` creates or overwrites; `del*` of an absent entry succeeds; `appendFdb`
 *   of an existing entry succeeds.
 * - `list*` return the kernel's current state, filtered as asked.
 */
import { constants } from 'node:os';
import { WeftError } from '../../common/errors.js';
import type { Family } from '../../common/ip.js';
import type { PodBridge } from '../../dataplane/index.js';

export interface RouteSpec {
  /** Destination prefix, e.g. `10.5.34.0/24` or `fc00:0:0:5d::/64`. */
  readonly dst: string;
  readonly gw?: string;
  readonly dev?: string;
  readonly onlink?: boolean;
  /** Routing table (default: main, 254). */
  readonly table?: number;
  /**
   * A blackhole route (no gw, no dev): packets to `dst` are dropped (--ip-blackhole-route).
   * `replaceRoute` of a blackhole only adds it where no route for `dst` exists, as flannel's
   * RouteAdd: it never replaces another route of that prefix (the pod bridge's own), and an
   * existing one (EEXIST) counts as done.
   */
  readonly type?: 'blackhole';
}

export interface NeighSpec {
  readonly dst: string;
  readonly dev: string;
  /** Link-layer address (required for replaceNeigh). */
  readonly mac?: string;
}

export interface FdbSpec {
  readonly mac: string;
  /** The remote VTEP (the peer's public address). */
  readonly dst: string;
  readonly dev: string;
}

export interface VxlanSpec {
  readonly name: string;
  readonly vni: number;
  readonly port: number;
  /** Local (source) address of the tunnel. */
  readonly local?: string;
  /** Underlying device name. */
  readonly link?: string;
  readonly learning: boolean;
  /** Group-based policy extension (VXLAN-GBP); absent: off. */
  readonly gbp?: boolean;
  readonly mtu?: number;
  readonly mac?: string;
}

/**
 * An `ipip` device as flannel creates flannel.ipip: `local` set, remote any, ttl inherit, tos 0,
 * nopmtudisc (the outer header copies the inner TTL and never sets DF).
 */
export interface IpipSpec {
  readonly name: string;
  /** Local (source) IPv4 address of the tunnel. */
  readonly local?: string;
  readonly mtu?: number;
}

/** A TUN/TAP device (kind `tun`) as the kernel reports it (`ip -d link`: tun type tun pi off ...). */
export interface TunLinkInfo {
  readonly type: 'tun' | 'tap';
  /** Packet information header (IFF_NO_PI clear). */
  readonly pi: boolean;
  readonly vnetHdr: boolean;
  readonly multiQueue: boolean;
  /** TUNSETPERSIST: the device outlives the last file attached to it. */
  readonly persist: boolean;
  /** Queues a process holds attached now (multi-queue devices; 0 for the others). */
  readonly queues: number;
}

/** An ipip device's tunnel parameters as the kernel reports them. */
export interface IpipInfo {
  readonly local: string | null;
  /** null: any. */
  readonly remote: string | null;
  /** 0: inherit. */
  readonly ttl: number;
  readonly tos: number;
  readonly pmtudisc: boolean;
}

export type Op =
  | ({ readonly op: 'replaceRoute' | 'delRoute' } & RouteSpec)
  | ({ readonly op: 'replaceNeigh' | 'delNeigh' } & NeighSpec)
  | ({ readonly op: 'appendFdb' | 'delFdb' } & FdbSpec)
  | { readonly op: 'replaceAddr' | 'delAddr'; readonly addr: string; readonly dev: string }
  | {
      readonly op: 'setLink';
      readonly dev: string;
      readonly up?: boolean;
      readonly mtu?: number;
      readonly mac?: string;
    }
  | { readonly op: 'delLink'; readonly dev: string }
  | ({ readonly op: 'addVxlan' } & VxlanSpec)
  | ({ readonly op: 'addIpip' } & IpipSpec);

export type OpKind = Op['op'];

/** A route as the kernel holds it. */
export interface RouteEntry {
  readonly dst: string;
  readonly gw: string | null;
  readonly dev: string | null;
  readonly onlink: boolean;
  readonly table: number;
  readonly protocol: number;
  readonly scope: number;
}

export interface NeighEntry {
  readonly dst: string;
  readonly dev: string;
  readonly mac: string | null;
  /** NUD_* bits (PERMANENT = 0x80). */
  readonly state: number;
}

export interface FdbEntry {
  readonly mac: string;
  readonly dst: string | null;
  readonly dev: string;
  readonly state: number;
}

export interface AddrEntry {
  /** `10.5.34.0/32` */
  readonly addr: string;
  readonly dev: string;
}

export interface LinkInfo {
  readonly index: number;
  readonly name: string;
  readonly mtu: number;
  readonly mac: string | null;
  readonly up: boolean;
  /** `vxlan`, `veth`, `bridge`, ... ("" for plain devices such as lo). */
  readonly kind: string;
  /** The index of the bridge it is a port of (0: none; absent where not known). */
  readonly master?: number;
  readonly vxlan: {
    readonly vni: number;
    readonly port: number;
    readonly local: string | null;
    /** Underlying device index (0: none). */
    readonly link: number;
    readonly learning: boolean;
    /** VXLAN-GBP on (absent: off). */
    readonly gbp?: boolean;
  } | null;
  /** The tunnel parameters of an `ipip` device (absent or null for other kinds). */
  readonly ipip?: IpipInfo | null;
  /** A TUN/TAP device's flags (absent or null for other kinds). */
  readonly tun?: TunLinkInfo | null;
}

export interface RouteFilter {
  readonly family: Family;
  /** Exact destination prefix. */
  readonly dst?: string;
  readonly dev?: string;
  /** Default: main (254). */
  readonly table?: number;
}

/** A bridge's ports (listBridgePorts): the dataplane's PodBridge without the bridge's name. */
export type BridgePorts = Omit<PodBridge, 'name'>;

/**
 * A change the kernel announced (rtnetlink multicast), device names resolved (null: a device
 * the watcher could not name, already gone). Only what the re-check needs is carried.
 */
export type KernelChange =
  | {
      readonly kind: 'route';
      readonly deleted: boolean;
      readonly family: Family;
      /** `10.5.3.0/24` */
      readonly dst: string;
      readonly gw: string | null;
      readonly dev: string | null;
      readonly table: number;
      /** RTN_UNICAST (the only type the re-check compares). */
      readonly unicast: boolean;
    }
  | {
      readonly kind: 'neigh';
      readonly deleted: boolean;
      readonly family: Family;
      readonly dst: string;
      readonly dev: string | null;
      readonly mac: string | null;
      /** NUD_* bits. */
      readonly state: number;
    }
  | {
      readonly kind: 'fdb';
      readonly deleted: boolean;
      readonly mac: string;
      readonly dst: string | null;
      readonly dev: string | null;
      /**
       * Present for a bridge's entry (learnt or added behind one of its ports: NTF_SELF unset,
       * `dev` the port, `dst` null): the port's index, and the entry's NUD_* bits (PERMANENT:
       * the bridge's or a port's own address). Absent for a device's own entry (VXLAN).
       */
      readonly bridgePort?: { readonly index: number; readonly state: number };
    }
  | {
      readonly kind: 'link';
      /** Gone (or renamed: the old name is reported deleted). */
      readonly deleted: boolean;
      readonly dev: string;
      /** Set up (IFF_UP). */
      readonly up: boolean;
      /** The device's index (absent where the watcher does not know it). */
      readonly index?: number;
      /** The index of the bridge it is a port of (0: none; absent: unknown). */
      readonly master?: number;
    }
  | {
      readonly kind: 'addr';
      readonly deleted: boolean;
      readonly family: Family;
      readonly dev: string | null;
    };

/**
 * What one wakeup of a watch delivers: the changes queued, and whether the kernel dropped some
 * (`overflowed`: its socket buffer was full, so whatever the watcher keeps must be re-read).
 */
export interface ChangeBatch {
  readonly changes: readonly KernelChange[];
  readonly overflowed: boolean;
}

export interface KernelWatch {
  close(): void;
}

export interface Netlink {
  apply(ops: readonly Op[]): Promise<Array<WeftError | null>>;
  listRoutes(filter: RouteFilter): Promise<RouteEntry[]>;
  listNeighs(family: Family, dev: string): Promise<NeighEntry[]>;
  listFdb(dev: string): Promise<FdbEntry[]>;
  listAddrs(family: Family, dev: string): Promise<AddrEntry[]>;
  getLink(name: string): Promise<LinkInfo | null>;
  /**
   * The bridge `name`'s ports and the MACs its FDB holds behind each (learnt or static; not the
   * bridge's or the ports' own addresses); null when there is no such bridge. Optional, as
   * `watch`: together they let a follower keep a bridge's port table (pod-bridge.ts).
   */
  listBridgePorts?(name: string): Promise<BridgePorts | null>;
  /**
   * Kernel changes (links, addresses, routes, neighbours, FDB) as they happen, in the namespace
   * this Netlink acts in; changes this Netlink made may be left out (not all of them can be
   * told apart), and FDB additions may be (NativeNetlink leaves them out). `onError`: the watch failed and delivers nothing more. Optional: a Netlink
   * without it can only be re-checked by re-reading.
   */
  watch?(onChanges: (batch: ChangeBatch) => void, onError: (err: Error) => void): KernelWatch;
  close(): void;
}

export const NUD_PERMANENT = 0x80;
export const RT_TABLE_MAIN = 254;

/** Runs ops and throws the first failure (for setup steps where any failure is fatal). */
export async function applyAll(nl: Netlink, ops: readonly Op[]): Promise<void> {
  const results = await nl.apply(ops);
  const failed = results.find((r) => r !== null);
  if (failed) throw failed;
}

const ERRNO_NAMES = new Map<number, string>(
  Object.entries(constants.errno).map(([name, n]) => [n, name]),
);

export function errnoName(errno: number): string {
  return ERRNO_NAMES.get(errno) ?? `errno ${errno}`;
}

export function errnoOf(name: keyof typeof constants.errno): number {
  return constants.errno[name];
}

/** iproute2-like text for an op, used in error messages and logs. */
export function describeOp(op: Op): string {
  switch (op.op) {
    case 'replaceRoute':
    case 'delRoute': {
      const verb = op.op === 'replaceRoute' ? 'replace' : 'delete';
      const blackhole = op.type === 'blackhole';
      let s = `${blackhole && verb === 'replace' ? 'add' : verb} route ${blackhole ? 'blackhole ' : ''}${op.dst}`;
      if (op.gw) s += ` via ${op.gw}`;
      if (op.dev) s += ` dev ${op.dev}`;
      if (op.onlink) s += ' onlink';
      if (op.table !== undefined && op.table !== RT_TABLE_MAIN) s += ` table ${op.table}`;
      return s;
    }
    case 'replaceNeigh':
      return `replace neigh ${op.dst} lladdr ${op.mac ?? '?'} dev ${op.dev}`;
    case 'delNeigh':
      return `delete neigh ${op.dst} dev ${op.dev}`;
    case 'appendFdb':
    case 'delFdb':
      return `${op.op === 'appendFdb' ? 'append' : 'delete'} fdb ${op.mac} dst ${op.dst} dev ${op.dev}`;
    case 'replaceAddr':
    case 'delAddr':
      return `${op.op === 'replaceAddr' ? 'replace' : 'delete'} addr ${op.addr} dev ${op.dev}`;
    case 'setLink': {
      let s = `set link ${op.dev}`;
      if (op.up !== undefined) s += op.up ? ' up' : ' down';
      if (op.mtu !== undefined) s += ` mtu ${op.mtu}`;
      if (op.mac !== undefined) s += ` address ${op.mac}`;
      return s;
    }
    case 'delLink':
      return `delete link ${op.dev}`;
    case 'addVxlan':
      return `add link ${op.name} type vxlan id ${op.vni} dstport ${op.port}`;
    case 'addIpip':
      return `add link ${op.name} type ipip local ${op.local ?? 'any'}`;
  }
}

/** Whether an errno on this op means "already in the wanted state" (the ops are idempotent). */
export function isAlreadyDone(op: Op, errno: number): boolean {
  const e = constants.errno;
  switch (op.op) {
    case 'replaceRoute':
      return op.type === 'blackhole' && errno === e.EEXIST;
    case 'delRoute':
      return errno === e.ESRCH;
    case 'delNeigh':
    case 'delFdb':
      return errno === e.ENOENT;
    case 'delAddr':
      return errno === e.EADDRNOTAVAIL;
    case 'delLink':
      return errno === e.ENODEV;
    case 'appendFdb':
      return errno === e.EEXIST;
    default:
      return false;
  }
}

export function netlinkError(op: Op, errno: number): WeftError {
  const name = errnoName(errno);
  return new WeftError('WEFT_ERR_NETLINK', `${describeOp(op)}: ${name}`, {
    details: { op: op.op, errno: name },
  });
}

/** The device an op acts on, when it names one. */
export function opDevice(op: Op): string | undefined {
  if (op.op === 'addVxlan' || op.op === 'addIpip') return undefined;
  return op.dev;
}
