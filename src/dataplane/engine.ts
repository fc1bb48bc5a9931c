/**
 * The contract every dataplane engine implements (native-engine.ts, js-engine.ts), apart from
 * the seam (index.ts) that picks one, so engines and the seam never import each other.
 */
import type { WeftError } from '../common/errors.js';
import type { Logger } from '../common/log.js';
import type { OffloadName } from './offloads.js';
import type { PeerDelta, PeerEntry } from './peer-table.js';
import type { WireguardPeer, WireguardState } from './wireguard-peers.js';
import type { DataplaneStats } from './stats.js';

/**
 * The framing: flannel-udp or VXLAN in UDP, IPIP (raw IP protocol 4; native and bpf engines), or
 * WireGuard transport messages in UDP (native engine only; options.wireguard, setWireguardPeers).
 */
export type DataplaneFormat = 'udp' | 'vxlan' | 'ipip' | 'wireguard';
/** `bpf`: the native engine with the TC-BPF fast path in front (bpf-engine.ts). */
export type DataplaneEngine = 'native' | 'js' | 'bpf';

export interface DataplaneOptions {
  readonly format: DataplaneFormat;
  readonly engine: DataplaneEngine;
  readonly tunName: string;
  /** Worker threads = TUN queues = UDP sockets (native engine; the js engine uses one). */
  readonly workers: number;
  /** The external interface (bpf engine: where encapsulated packets leave and arrive). */
  readonly underlay?: string;
  /** The address the sockets bind (the external interface's address; IPIP: its IPv4 one). */
  readonly bindIp: string;
  /**
   * A dual-stack underlay (flannel's flannel.<VNI> and flannel-v6.<VNI> in one engine): the
   * IPv6 address to bind as well (bindIp is then IPv4); each peer is reached in its public
   * address's family. Absent: one family. Not with IPIP, nor the bpf engine's programs.
   */
  readonly bindIp6?: string;
  readonly port: number;
  readonly tunMtu: number;
  readonly vni: number;
  /** Our VtepMAC (VXLAN); ignored by udp. */
  readonly vtepMac: Buffer;
  /** Offloads wanted (offloads.ts names); default: WEFT_DATAPLANE_OFFLOADS. */
  readonly offloads?: readonly OffloadName[];
  /**
   * Native engine: pin queue k's threads to CPU k, steer each flow into the TUN queue of the
   * CPU that sent it (where it starts, or resumes after `steeringGapUs` without a packet; in
   * between it keeps its queue, so its packets stay in order) and prefer queue k's socket for
   * datagrams taken in on CPU k. Needs one queue per online CPU; otherwise logged and run
   * unpinned. Default false.
   */
  readonly cpuAffine?: boolean;
  /** Native engine: attach the TUN steering program (default true; tests turn it off). */
  readonly steering?: boolean;
  /**
   * Native engine, CPU-affine: the pause after which a flow moves to the sending CPU's queue
   * (default 10,000 µs: longer than a queue holds a packet, so none is overtaken).
   */
  readonly steeringGapUs?: number;
  /**
   * Native engine: the TUN is persistent (TUNSETPERSIST): it outlives close() and the process,
   * with its addresses and routes, and the next engine of the same name attaches to it again.
   * false (default): the flag is cleared, and the device goes with the engine. The js engine's
   * device never persists.
   */
  readonly persist?: boolean;
  /** Busy-poll this many µs after a light drain before sleeping (native engine; 0 = never). */
  readonly busyPollUs?: number;
  /**
   * Native engine: run the loop threads SCHED_FIFO at this priority (1..99; 0 = the normal
   * policy, the default). Without the privilege: logged, normal policy.
   */
  readonly schedFifo?: number;
  /**
   * Native engine: 1 thread per queue moving both directions (default), or 2, one per
   * direction, so a flow's data and its ACKs are moved by different threads (and CPUs). On the
   * 2-CPU bench machine the split measured no faster (bench/README), so it is opt-in.
   */
  readonly queueThreads?: 1 | 2;
  /**
   * format wireguard: our static private key and the cluster-wide preshared key (flannel's
   * net-conf PSK; absent: none), 32 bytes each. `port` is then the listen port (flannel: 51820).
   * `greet`: the first peers set get a handshake from us at once, not on their first packet
   * (this engine may replace one whose sessions they still hold; default false).
   */
  readonly wireguard?: {
    readonly privateKey: Buffer;
    readonly psk?: Buffer;
    readonly greet?: boolean;
  };
  readonly log?: Logger;
}

export interface Dataplane {
  readonly engine: DataplaneEngine;
  readonly tunName: string;
  /** Replaces the whole peer table: setPeerTable(encodePeerTable(entries)). */
  setPeers(entries: readonly PeerEntry[]): void;
  /**
   * Replaces the whole peer table with records already encoded (peer-table.ts layout): what a
   * backend that keeps its records encoded hands over without re-encoding every peer. The
   * buffer is copied (or decoded) before the call returns; the caller may reuse it.
   */
  setPeerTable(table: Buffer): void;
  /**
   * Changes the current table by a delta (peer-table.ts PeerDelta): what setPeerTable(the whole
   * new table) would do, at the cost of the change (the native engine applies it to a table no
   * packet thread reads, then swaps it in; the bpf engine writes only the changed map entries,
   * additions before removals). Throws, the table unchanged, when the delta does not apply (a
   * removed subnet not in the table, a subnet twice in one list, a malformed record): the caller
   * then hands over the whole table. The js engine decodes its whole table again (O(peers)).
   */
  updatePeerTable(delta: PeerDelta): void;
  stats(): DataplaneStats;
  close(): Promise<void>;
  /**
   * Settles (with the reason) if the dataplane stops moving packets on its own while running:
   * a native loop left with an error, or the js engine's TUN helper died. Never before close()
   * otherwise, never because of close(). The backend turns it into a fatal daemon error, so the
   * supervisor (systemd, the DaemonSet) restarts weft instead of leaving a dead node up.
   */
  readonly failed: Promise<WeftError>;
  /**
   * native: the worker_threads threadId of the pool thread running each loop (queue 0's tx and
   * rx, then queue 1's, ...), all distinct; the js engine runs on the calling thread and leaves
   * this out.
   */
  readonly threadIds?: readonly number[];
  /**
   * bpf: the pods' bridge as control sees it (control/netlink/pod-bridge.ts, from rtnetlink;
   * null: there is none). weft_bridge attaches to it and hands GSO packets for a MAC behind one
   * of its ports straight to that port (bpf-engine.ts BridgeBypass). Engines without a bridge
   * bypass leave both methods out.
   */
  setPodBridge?(bridge: PodBridge | null): void;
  /** format wireguard: our public key (32 bytes). */
  readonly wireguardPublicKey?: Buffer;
  /**
   * format wireguard: the WireGuard peers from now on (public key, endpoint, persistent
   * keepalive). Their AllowedIPs are the peer table's subnets whose public address is the
   * peer's endpoint address. A peer that stays keeps its session; one that goes has its keys
   * zeroed. Throws, peers kept, on a bad entry.
   */
  setWireguardPeers?(peers: readonly WireguardPeer[]): void;
  /**
   * format wireguard: the device as `wg show` reports it (public key, listen port, per peer its
   * endpoint, AllowedIPs, last handshake, rx/tx bytes, keepalive), a copy taken under the
   * engine's lock; no keys but public ones. wireguard-uapi.ts serves it on the UAPI socket.
   */
  wireguardState?(): WireguardState;
  /** bpf: the bridge weft_bridge is on and its port map (MAC → the port's ifindex); null: none. */
  podBridge?(): { name: string; index: number; ports: ReadonlyMap<string, number> } | null;
}

/** The pods' bridge: its name and index, and the MACs its FDB puts behind each port. */
export interface PodBridge {
  readonly name: string;
  readonly index: number;
  readonly ports: ReadonlyArray<{
    readonly index: number;
    readonly name: string;
    readonly macs: readonly string[];
  }>;
}
