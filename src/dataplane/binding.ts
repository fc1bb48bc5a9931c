/**
 * The typed view of the addon's dataplane exports (native/src/addon.cc, dpbind). Loaded through
 * src/common/native.ts.
 *
 * Contract: buffers passed in are copied before the call returns (the caller may reuse them);
 * `engineRun` blocks its calling thread inside the packet loop until `engineStop`/`engineClose`
 * (call it only from a worker thread); `engineClose` stops every worker and frees the engine's
 * fds once the last `engineRun` has returned. Engine ids are process-wide, so a worker thread
 * (with its own addon instance) runs an engine the main thread created.
 */
import { loadNative } from '../common/native.js';

export interface NativeCodecConfig {
  readonly vni: number;
  readonly vtepMac: Buffer;
  readonly tunMtu: number;
}

export interface NativeEngineConfig extends NativeCodecConfig {
  readonly format: 'udp' | 'vxlan';
  readonly tunName: string;
  readonly workers: number;
  readonly bindIp: string;
  readonly port: number;
  readonly sockBufBytes?: number;
  /** TUN_F_* bits wanted; the engine splits TSO4/6 and USO4/6 super-packets itself. */
  readonly offloads?: number;
  /** µs to busy-poll after a drain of ≤ 8 packets before sleeping; 0 = always sleep. */
  readonly busyPollUs?: number;
}

export interface NativeDataplane {
  codecEncap(
    format: 'udp' | 'vxlan',
    table: Buffer,
    cfg: NativeCodecConfig,
    packet: Buffer,
  ): { drop: string; peer: number | null; payload: Buffer | null; icmp: Buffer | null };
  codecDecap(
    format: 'udp' | 'vxlan',
    table: Buffer,
    cfg: NativeCodecConfig,
    outerSrc: Buffer,
    datagram: Buffer,
  ): { drop: string; tun: Buffer | null };
  vxlanSourcePort(packet: Buffer): number;
  peerLookup(table: Buffer, addr: Buffer): number;
  checksum(data: Buffer): number;
  dropReasons(): string[];
  counterNames(): string[];
  engineCreate(cfg: NativeEngineConfig): {
    id: number;
    tunName: string;
    offloadsAccepted: number;
    offloadsEnabled: number;
  };
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
  groCoalesce(packets: Buffer[], tunMtu: number, gather?: boolean, udp?: boolean): Buffer[];
  /** direction: 0 both ways, 1 TUN → UDP only, 2 UDP → TUN only (messages.ts DIRECTIONS). */
  engineRun(id: number, worker: number, direction?: number): number;
  engineStop(id: number): void;
  engineClose(id: number): void;
  /** Tells every engine's loops to leave; returns how many engines there were. */
  engineStopAll(): number;
  /** A native thread ends the process with `code` after `ms` (`_exit`), unless it ended before. */
  exitWatchdog(ms: number, code: number): void;
  engineSetPeers(id: number, table: Buffer): number;
  engineCounters(id: number): Float64Array;
}

export function loadDataplaneBinding(): NativeDataplane {
  return loadNative<NativeDataplane>();
}

/**
 * TUN_F_* offload bits (native/src/tun.h), plus the engine's own: `gro` (received TCP segments,
 * and UDP datagrams where the TUN took USO, coalesced into GSO TUN writes, native/src/coalesce.h),
 * `udp_gso` (UDP_SEGMENT on send: TSO segments, and runs of equal-size datagrams to one peer) and
 * `udp_gro` (UDP_GRO on receive).
 */
export const TUN_OFFLOADS = {
  csum: 0x01,
  tso4: 0x02,
  tso6: 0x04,
  uso4: 0x20,
  uso6: 0x40,
  gro: 0x10000,
  udp_gso: 0x20000,
  udp_gro: 0x40000,
} as const;

/** The offloads the engine uses by default (TUN checksum + TSO/USO split in userspace, GRO). */
export const DEFAULT_OFFLOADS =
  TUN_OFFLOADS.csum |
  TUN_OFFLOADS.tso4 |
  TUN_OFFLOADS.tso6 |
  TUN_OFFLOADS.uso4 |
  TUN_OFFLOADS.uso6 |
  TUN_OFFLOADS.gro |
  TUN_OFFLOADS.udp_gso |
  TUN_OFFLOADS.udp_gro;

export { OFFLOAD_NAMES, offloadListError } from './offloads.js';

/**
 * The kill switch: WEFT_DATAPLANE_OFFLOADS = "none" | "all" (default) | a comma list of
 * csum, tso4, tso6, uso4, uso6, gro, udp_gso, udp_gro. Unknown names are ignored (the flag
 * refuses them: offloadListError). The kernel takes USO only as a pair, and only beside csum.
 */
export function offloadsFromEnv(value = process.env.WEFT_DATAPLANE_OFFLOADS): number {
  if (value === undefined || value === '' || value === 'all') return DEFAULT_OFFLOADS;
  if (value === 'none') return 0;
  let bits = 0;
  for (const name of value.split(',')) {
    const b = (TUN_OFFLOADS as Record<string, number>)[name.trim()];
    if (b !== undefined) bits |= b;
  }
  return bits;
}
