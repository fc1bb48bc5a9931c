/**
 * Every export of the native addon (native/src/addon.cc), typed in one place: the boundary's
 * whole vocabulary. `loadNative()` (native.ts) returns this; NATIVE_EXPORTS lists the same names
 * (the compiler keeps the two in step) and test/native/addon-exports.test.ts checks the real
 * addon exports exactly these.
 *
 * Contract: buffers passed in are copied before a call returns (the caller may reuse them);
 * errors are thrown as Error (TypeError/RangeError for bad arguments) with `errno` where the
 * kernel refused. `engineRun` blocks its calling thread inside the packet loop until
 * `engineStop`/`engineClose` (call it only from a worker thread); `engineClose` stops every
 * worker and frees the engine's fds once the last `engineRun` has returned. Engine ids are
 * process-wide, so a worker thread (with its own addon instance) runs an engine the main thread
 * created.
 */
import type { Family } from './ip.js';

/** engineWgState: one WireGuard device (native/src/wg_engine.h WgDeviceState). */
export interface NativeWgState {
  publicKey: Buffer;
  listenPort: number;
  peers: {
    publicKey: Buffer;
    hasPsk: boolean;
    endpoint: { address: string; port: number } | null;
    allowedIps: string[];
    lastHandshakeSec: number;
    lastHandshakeNsec: number;
    rxBytes: number;
    txBytes: number;
    persistentKeepalive: number;
  }[];
}

// ---- netlink (src/control/netlink/native-netlink.ts) ----

export interface RawLink {
  index: number;
  name: string;
  mtu: number;
  mac: string | null;
  flags: number;
  /** IFLA_MASTER: the bridge a port is enslaved to (0: none). */
  master: number;
  kind: string;
  vxlan: {
    vni: number;
    port: number;
    local: string | null;
    link: number;
    learning: boolean;
    gbp: boolean;
  } | null;
  /** An ipip device's tunnel parameters (null for other kinds). */
  ipip: {
    local: string | null;
    remote: string | null;
    ttl: number;
    tos: number;
    pmtudisc: boolean;
  } | null;
  /** A TUN/TAP device's flags and attached queues (null for other kinds). */
  tun?: {
    type: 'tun' | 'tap';
    pi: boolean;
    vnetHdr: boolean;
    multiQueue: boolean;
    persist: boolean;
    queues: number;
  } | null;
}
export interface RawRoute {
  dst: string;
  dstLen: number;
  gw: string | null;
  ifindex: number;
  table: number;
  protocol: number;
  scope: number;
  type: number;
  flags: number;
}
export interface RawNeigh {
  dst: string | null;
  ifindex: number;
  mac: string | null;
  state: number;
  flags: number;
}
export interface RawAddr {
  addr: string;
  prefix: number;
  ifindex: number;
}

/** An open netlink socket (opaque to JS). */
export type NetlinkHandle = unknown;

/** One change the kernel announced on the rtnetlink groups (native/src/netlink.h NlChange). */
export type RawChange =
  | {
      kind: 'route';
      deleted: boolean;
      ifindex: number;
      family: Family;
      dst: string | null;
      dstLen: number;
      gw: string | null;
      table: number;
      type: number;
      flags: number;
    }
  | {
      kind: 'neigh' | 'fdb';
      deleted: boolean;
      ifindex: number;
      family: Family;
      dst: string | null;
      mac: string | null;
      state: number;
      flags: number;
    }
  | {
      kind: 'link';
      deleted: boolean;
      ifindex: number;
      name: string;
      flags: number;
      /** IFLA_MASTER (0: none). */
      master: number;
    }
  | { kind: 'addr'; deleted: boolean; ifindex: number; family: Family };

/**
 * Called once per wakeup with what was queued; `overflowed`: the kernel dropped notifications
 * (the socket buffer was full), so state must be re-read; `error`: the socket failed.
 */
export type RawChangeListener = (
  changes: RawChange[],
  overflowed: boolean,
  error: Error | null,
) => void;

// ---- dataplane (src/dataplane/) ----

/**
 * The framings (native/src/codec.h Format): UDP datagrams, or raw IP protocol 4. `wireguard`
 * is sealed and opened by the engine itself (the codec test exports refuse it).
 */
export type NativeFormat = 'udp' | 'vxlan' | 'ipip' | 'wireguard';

export interface NativeCodecConfig {
  readonly vni: number;
  readonly vtepMac: Buffer;
  readonly tunMtu: number;
  /** IPIP: our IPv4 address, 4 bytes (the outer source). The engine takes it from bindIp. */
  readonly localIp?: Buffer;
}

export interface NativeEngineConfig extends NativeCodecConfig {
  readonly format: NativeFormat;
  readonly tunName: string;
  readonly workers: number;
  readonly bindIp: string;
  /** Dual-stack underlay: an IPv6 address bound as well (bindIp is then IPv4). */
  readonly bindIp6?: string;
  readonly port: number;
  readonly sockBufBytes?: number;
  /** Offload names (src/dataplane/offloads.ts); unknown names are refused. Default: none. */
  readonly offloads?: readonly string[];
  /** µs to busy-poll after a drain of ≤ 8 packets before sleeping; 0 = always sleep. */
  readonly busyPollUs?: number;
  /** CPU-affine queues (engine.h EngineConfig.cpu_affine). Default false. */
  readonly cpuAffine?: boolean;
  /** Attach a TUN steering program (by flow, or by CPU when affine). Default true. */
  readonly steering?: boolean;
  /** CPU-affine steering: a flow moves to the sending CPU's queue after this pause (default 10 ms). */
  readonly steeringGapUs?: number;
  /** The egress TAP's name, with the tap_gso offload ('' lets the kernel pick). */
  readonly tapName?: string;
  /** Test knob: the TAP's start-up probe writes a frame the kernel refuses. */
  readonly tapProbeFail?: boolean;
  /** Test knob: each loop's Nth TAP frame is one the kernel refuses (0: never). */
  readonly tapFailAt?: number;
  /** Run the loop threads SCHED_FIFO at this priority (1..99); 0 or absent: normal policy. */
  readonly fifoPriority?: number;
  /** TUNSETPERSIST: the device outlives the engine (set), or goes with it (cleared). */
  readonly persist?: boolean;
  /** format wireguard: our static private key (32 bytes; required). */
  readonly wgPrivateKey?: Buffer;
  /** format wireguard: the cluster-wide preshared key (32 bytes); absent: none. */
  readonly wgPsk?: Buffer;
  /** format wireguard: handshake with the first peers set at once (DataplaneOptions.wireguard.greet). */
  readonly wgGreet?: boolean;
}

export interface NativeEngine {
  id: number;
  tunName: string;
  /** Offload names the kernel accepted on the TUN (whether wanted or not). */
  offloadsAccepted: string[];
  /** Offload names in use: wanted, accepted, and not switched off at start. */
  offloadsEnabled: string[];
  /** How the TUN picks a queue: by flow (a steering program), by CPU (affine queues), or its own. */
  steering: 'flow' | 'cpu' | 'tun';
  /** Why CPU-affine queues or the steering program are not in use ('' when all is as asked). */
  affinityNote: string;
  /** The egress TAP TCP leaves by ('' when it leaves by the sockets). */
  tapName: string;
  /** Why tap_gso was asked for and is not in use ('' otherwise). */
  tapNote: string;
  /** Why SCHED_FIFO was asked for and is not in use ('' otherwise). */
  fifoNote: string;
  /** format wireguard: our public key (32 bytes). */
  wgPublicKey?: Buffer;
}

// ---- bpf engine (src/dataplane/bpf-binding.ts, bpf-engine.ts; native/src/bpf_loader.h) ----

export interface BpfConfig {
  readonly format: 'udp' | 'vxlan' | 'ipip';
  readonly vni: number;
  readonly vtepMac: Buffer;
  readonly port: number;
  /**
   * Our underlay addresses (outer source; decapsulated only when one is the destination): IPv4,
   * IPv6, or both on a dual-stack underlay (each peer record says which its packets ride).
   */
  readonly localV4?: string;
  readonly localV6?: string;
  /** Device names (or ifindexes): weft's TUN and the underlay device. */
  readonly tun?: string | number;
  readonly underlay?: string | number;
}

export type BpfAttachMode = 'tcx' | 'clsact';

/** The loader's view of native/bpf/weft_abi.h (bpfAbi): each struct's layout, the names. */
export interface BpfAbi {
  readonly structs: ReadonlyArray<{
    readonly name: string;
    readonly size: number;
    readonly members: ReadonlyArray<{ name: string; offset: number; size: number }>;
  }>;
  readonly programs: readonly string[];
  readonly maps: readonly string[];
}

/** What a bpffs path holds (bpfPinInfo). ifindex 0 on a tcx link: its device is gone. */
export interface BpfPinInfo {
  readonly kind: 'link' | 'prog' | 'map';
  readonly id: number;
  readonly linkType: number;
  readonly progId: number;
  readonly progName: string;
  readonly ifindex: number;
  readonly attachType: number;
}

export type WgCryptoOp =
  | 'x25519'
  | 'publicKey'
  | 'seal'
  | 'open'
  | 'sealKeyed'
  | 'openKeyed'
  | 'xseal'
  | 'xopen'
  | 'hchacha20'
  | 'hash'
  | 'mac'
  | 'hmac'
  | 'mac32'
  | 'kdf'
  | 'initial'
  | 'tai64n';
/** status: ok, expired (no usable key pair: a handshake is wanted), too_short, forged. */
export interface WgSent {
  status: string;
  packet: Buffer | null;
}
/** verdict: wg_device.h VerdictName; packet: what to send back, or the decrypted IP packet. */
export interface WgReceived {
  verdict: string;
  peer: number;
  packet: Buffer | null;
}
export interface WgPeerState {
  handshake: string;
  previous: boolean;
  current: boolean;
  next: boolean;
  currentInitiator: boolean;
  sendCounter: bigint;
  attempts: number;
  /** Monotonic ns when the device next has work for this peer (Device::NextDeadline; 0: none). */
  nextDeadline: number;
  /** The device's index table size. */
  indices: number;
  /** The source of the peer's last authenticated packet (roaming); empty before one. */
  endpoint: Buffer;
}

export interface NativeAddon {
  version(): string;

  netlinkOpen(netnsPath: string): NetlinkHandle;
  netlinkClose(h: NetlinkHandle): void;
  /**
   * Sends the ops on a libuv pool thread (the kernel's work is done there); one result per op:
   * 0 or an errno. The handle's other calls wait while a batch holds its socket.
   */
  netlinkApplyAsync(h: NetlinkHandle, ops: Array<Record<string, unknown>>): Promise<Int32Array>;
  netlinkList(h: NetlinkHandle, what: 'route', family: Family, ifindex: number): RawRoute[];
  netlinkList(h: NetlinkHandle, what: 'neigh' | 'fdb', family: Family, ifindex: number): RawNeigh[];
  netlinkList(h: NetlinkHandle, what: 'addr', family: Family, ifindex: number): RawAddr[];
  netlinkList(h: NetlinkHandle, what: 'link', family: Family, ifindex: number): RawLink[];
  netlinkGetLink(h: NetlinkHandle, name: string): RawLink | null;
  /**
   * A change monitor polled by the event loop (keeps it alive until netlinkMonitorClose);
   * `ignore`: a netlink handle whose own changes are not reported.
   */
  netlinkMonitorOpen(
    netnsPath: string,
    listener: RawChangeListener,
    ignore?: NetlinkHandle,
  ): NetlinkHandle;
  netlinkMonitorClose(h: NetlinkHandle): void;

  codecEncap(
    format: NativeFormat,
    table: Buffer,
    cfg: NativeCodecConfig,
    packet: Buffer,
  ): { drop: string; peer: number | null; payload: Buffer | null; icmp: Buffer | null };
  codecDecap(
    format: NativeFormat,
    table: Buffer,
    cfg: NativeCodecConfig,
    outerSrc: Buffer,
    datagram: Buffer,
  ): { drop: string; tun: Buffer | null };
  vxlanSourcePort(packet: Buffer): number;
  /** Test export: the record index for `addr` (-1: none); for an array, one per address. */
  peerLookup(table: Buffer, addr: Buffer): number;
  peerLookup(table: Buffer, addrs: readonly Buffer[]): number[];
  /**
   * Test export: the native table built from `table` with each delta ([removed, upserts]) applied
   * in place in turn: its records (table order), the record index each of `lookups` matches (-1:
   * none), and whether each of `publics` is a record's public address.
   */
  peerTableApply(
    table: Buffer,
    deltas: ReadonlyArray<readonly [Buffer, Buffer]>,
    lookups: readonly Buffer[],
    publics: readonly Buffer[],
  ): { table: Buffer; lookups: number[]; publics: boolean[] };
  checksum(data: Buffer): number;
  /**
   * Test export: the segments SplitTso cuts from a virtio_net_hdr + TCP GSO packet (inPlace:
   * SplitTsoHeaders, each segment reassembled from its headers and its payload in place).
   */
  tsoSplit(vnetHdrAndPacket: Buffer, inPlace?: boolean): Buffer[];
  /**
   * Test export: the TUN writes (vnet header + packet) the receive path makes of these packets
   * (gather: a coalescer that reads later payloads in place, as the engine uses it; udp: UDP
   * datagrams are merged too, as on a TUN that took USO).
   */
  groCoalesce(
    packets: Buffer[],
    tunMtu: number,
    gather?: boolean,
    udp?: boolean,
    authenticated?: boolean,
  ): Buffer[];
  /** native DropReason names, index = reason (src/dataplane/stats.ts DROP_REASONS). */
  dropReasons(): string[];
  /** Counter names (engine.h kCounterNames), then `drop_<reason>` (stats.ts COUNTERS). */
  counterNames(): string[];
  /** Every offload name the engine knows (offloads.h; src/dataplane/offloads.ts). */
  offloadNames(): string[];

  /** A plain TUN queue (IFF_TUN | IFF_NO_PI, non-blocking) for the js engine. */
  tunOpen(name: string): { fd: number; name: string };
  engineCreate(cfg: NativeEngineConfig): NativeEngine;
  /** direction: 0 both ways, 1 TUN → UDP only, 2 UDP → TUN only; → 0 or an errno. */
  engineRun(id: number, worker: number, direction?: number): number;
  engineStop(id: number): void;
  engineClose(id: number): void;
  /** Replaces the peer table; → the number of peers. */
  engineSetPeers(id: number, table: Buffer): number;
  /**
   * Changes the peer table by a delta (peer-table.ts PeerDelta: removed subnets, then records
   * added or replaced by subnet); → the number of peers. Throws, table kept, when it does not apply.
   */
  engineUpdatePeers(id: number, removed: Buffer, upserts: Buffer): number;
  /**
   * format wireguard: the WireGuard peers from now on (src/dataplane/wireguard-peers.ts records);
   * → their number. Throws, peers kept, on a bad record or an engine of another format.
   */
  engineSetWgPeers(id: number, records: Buffer): number;
  /**
   * format wireguard: the device as `wg show` reports it, copied under the engine's WireGuard
   * lock (src/dataplane/wireguard-peers.ts WireguardState); null for another format.
   */
  engineWgState(id: number): NativeWgState | null;
  /** workers × counterNames().length counters. */
  engineCounters(id: number): Float64Array;

  /** Tells every engine's loops to leave; returns how many engines there were. */
  engineStopAll(): number;
  /** A native thread ends the process with `code` after `ms` (`_exit`), unless it ended before. */
  exitWatchdog(ms: number, code: number): void;

  /**
   * bpf: an id owns one loaded copy of the programs and their maps; `bpfClose` detaches and
   * frees all of it (idempotent), pins included unless keepPinned. Loads the programs (the verifier runs
   * here); throws with the verifier's log on refusal.
   */
  bpfLoad(objectPath: string): number;
  bpfConfigure(id: number, cfg: BpfConfig): void;
  /** The peer maps become exactly this table (peer-table.ts layout), adds before removals. */
  bpfSetPeers(id: number, table: Buffer): void;
  /** The peer maps changed by a delta alone (as engineUpdatePeers), upserts before removals. */
  bpfUpdatePeers(id: number, removed: Buffer, upserts: Buffer): void;
  /**
   * BPF_PROG_TEST_RUN of one program on an Ethernet frame: the verdict (TC_ACT_*) and the frame
   * it left. gsoSize > 0 marks the skb GSO (the kernel then refuses encap: no gso_type).
   */
  bpfTestRun(
    id: number,
    prog: 'tx' | 'rx',
    frame: Buffer,
    gsoSize?: number,
    gsoSegs?: number,
  ): { verdict: number; data: Buffer };
  /**
   * weft_tx on the TUN's egress, weft_rx on the underlay's ingress; the mode it used. pinDir (an
   * existing directory on a bpffs): the tcx links are pinned there as `tx` and `rx` (and
   * weft_bridge's as `bridge`); links already pinned there that are weft's, on the same device
   * and hook, are `adopted` (their old program runs until bpfTakeOver), any other pin is
   * unpinned and `replaced` ("tx: why").
   */
  bpfAttach(
    id: number,
    tun: string | number,
    underlay: string | number,
    mode?: 'auto' | BpfAttachMode,
    pinDir?: string,
  ): { mode: BpfAttachMode; adopted: string[]; replaced: string[] };
  /** This engine's programs on the adopted links (bpf_link_update, atomic per link); → count. */
  bpfTakeOver(id: number): number;
  /** What a bpffs path holds (null: nothing, or not a bpf object); tcx links' device and hook. */
  bpfPinInfo(path: string): BpfPinInfo | null;
  /** Removes every pin in `dir` (links detached first) and `dir`; → how many pins went. */
  bpfUnpin(dir: string): number;
  /** Ids of the programs attached with tcx to `dev`'s hook (this process's namespace). */
  bpfTcxProgs(dev: string | number, hook: 'ingress' | 'egress'): number[];
  /** The programs' counter slots, in order (weft_abi.h; stats.ts BPF_COUNTERS). */
  bpfCounterNames(): string[];
  /** Test export: the structs, programs and maps of weft_abi.h as the loader compiled them. */
  bpfAbi(): BpfAbi;
  /** The port map becomes exactly these 12-byte records (MAC, 2 pad bytes, ifindex u32 LE). */
  bpfSetPorts(id: number, records: Buffer): void;
  /**
   * weft_bridge on the egress of `bridge` (a tcx link, replacing one; a name resolves in this
   * process's network namespace); 0 detaches. Returns the ifindex attached to.
   */
  bpfAttachBridge(id: number, bridge: string | number): number;
  /** BPF_COUNTERS, summed over CPUs. */
  bpfCounters(id: number): Float64Array;
  /** Ids of the programs, maps and links this id holds (tests check none outlives close). */
  bpfObjectIds(id: number): number[];
  /** keepPinned: only this process's fds close; the pinned links stay attached. */
  bpfClose(id: number, keepPinned?: boolean): void;

  /**
   * Test export: one WireGuard primitive (native/src/wg_crypto.h) on byte strings; null when it
   * refused (a forged AEAD input, an all-zero X25519 result). Ops and arguments: x25519(priv,
   * pub), publicKey(priv), seal/open(key, nonce12, ad, data), xseal/xopen(key, nonce24, ad,
   * data), hchacha20(key, nonce16), hash(data), mac(key, data) (BLAKE2s-128), mac32(key, data)
   * (keyed BLAKE2s-256), hmac(key, data),
   * kdf(key, input) → τ1‖τ2‖τ3, initial() → chaining key ‖ hash, tai64n(wall ns, u64 LE).
   */
  wgCrypto(op: WgCryptoOp, ...args: Buffer[]): Buffer | null;
  /** Test export: each counter fed in turn to one fresh replay window (wg_session.h). */
  wgReplay(counters: ReadonlyArray<bigint | number>, limit?: bigint): boolean[];
  /** Test export: WireGuard test devices on a manual clock (native/src/wg_harness.h). */
  wgDevice(op: 'create', privateKey: Buffer): number;
  wgDevice(op: 'close', id: number): boolean;
  wgDevice(op: 'publicKey', id: number): Buffer;
  /** → the peer's number, or −1 (its own key, or a duplicate). */
  wgDevice(
    op: 'addPeer',
    id: number,
    publicKey: Buffer,
    psk?: Buffer | null,
    keepaliveNs?: number,
  ): number;
  wgDevice(op: 'clock', id: number, monoNs: number, wallNs: number): boolean;
  wgDevice(op: 'underLoad', id: number, on: boolean): boolean;
  /** A handshake initiation, or null when none may go now. */
  wgDevice(op: 'initiate', id: number, peer: number): Buffer | null;
  wgDevice(op: 'send', id: number, peer: number, payload: Buffer, mtu?: number): WgSent;
  wgDevice(op: 'receive', id: number, packet: Buffer, src: Buffer): WgReceived;
  /**
   * A transport message received in the engine's two halves (wg_harness.h
   * TestDeviceReceiveSplit): the verdict of each FinishOpen ("expire": the key pair expires
   * in between; "twice": finished twice), or BeginOpen's refusal.
   */
  wgDevice(
    op: 'receiveSplit',
    id: number,
    packet: Buffer,
    src: Buffer,
    between: 'none' | 'expire' | 'twice',
  ): string[];
  /** The actions due: send_initiation, send_keepalive, zero_keys, gave_up. */
  wgDevice(op: 'tick', id: number, peer: number): string[];
  wgDevice(op: 'peer', id: number, peer: number): WgPeerState | null;
  wgDevice(op: 'setSendCounter', id: number, peer: number, counter: bigint): boolean;
  /** Forgets a peer (keys zeroed, indices gone); its number is not reused. */
  wgDevice(op: 'removePeer', id: number, peer: number): boolean;

  /** One sd_notify datagram; → 0 or an errno. */
  sdNotify(socketPath: string, state: string): number;

  /** glibc's malloc_trim(0): free pages of every malloc arena back to the kernel; → whether any went. */
  mallocTrim(): boolean;
}

/** Every export name, once: the compiler refuses a name missing here or not in NativeAddon. */
export const NATIVE_EXPORTS: { readonly [K in keyof NativeAddon]: true } = {
  version: true,
  netlinkOpen: true,
  netlinkClose: true,
  netlinkApplyAsync: true,
  netlinkList: true,
  netlinkGetLink: true,
  netlinkMonitorOpen: true,
  netlinkMonitorClose: true,
  codecEncap: true,
  codecDecap: true,
  vxlanSourcePort: true,
  peerLookup: true,
  peerTableApply: true,
  checksum: true,
  tsoSplit: true,
  groCoalesce: true,
  dropReasons: true,
  counterNames: true,
  offloadNames: true,
  tunOpen: true,
  engineCreate: true,
  engineRun: true,
  engineStop: true,
  engineClose: true,
  engineSetPeers: true,
  engineUpdatePeers: true,
  engineSetWgPeers: true,
  engineWgState: true,
  engineCounters: true,
  engineStopAll: true,
  exitWatchdog: true,
  bpfLoad: true,
  bpfConfigure: true,
  bpfSetPeers: true,
  bpfUpdatePeers: true,
  bpfTestRun: true,
  bpfAttach: true,
  bpfSetPorts: true,
  bpfAttachBridge: true,
  bpfCounters: true,
  bpfObjectIds: true,
  bpfClose: true,
  bpfTakeOver: true,
  bpfPinInfo: true,
  bpfUnpin: true,
  bpfTcxProgs: true,
  bpfCounterNames: true,
  bpfAbi: true,
  wgCrypto: true,
  wgReplay: true,
  wgDevice: true,
  sdNotify: true,
  mallocTrim: true,
};
