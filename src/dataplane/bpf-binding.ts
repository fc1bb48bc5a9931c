/**
 * The typed view of the addon's bpf exports (native/src/addon.cc bpfbind, native/src/bpf_loader.h)
 * and where the programs' object is (native/build/weft.bpf.o, built by scripts/build-native.mjs
 * with `clang -target bpf`).
 *
 * Contract: an id owns one loaded copy of the programs and their maps; `bpfClose` detaches and
 * frees all of it (idempotent). Buffers passed in are copied before the call returns. Nothing is
 * pinned: when the process dies the kernel drops the tcx links, programs and maps with its fds.
 */
import { join } from 'node:path';
import { loadNative, packageRoot } from '../common/native.js';

export interface BpfConfig {
  readonly format: 'udp' | 'vxlan';
  readonly vni: number;
  readonly vtepMac: Buffer;
  readonly port: number;
  /** Our underlay IPv4 address (outer source; decapsulated only when it is the destination). */
  readonly localV4: string;
  /** Device names (or ifindexes): weft's TUN and the underlay device. */
  readonly tun?: string | number;
  readonly underlay?: string | number;
}

export type BpfAttachMode = 'tcx' | 'clsact';

export interface NativeBpf {
  /** Loads the programs (the verifier runs here); throws with the verifier's log on refusal. */
  bpfLoad(objectPath: string): number;
  bpfConfigure(id: number, cfg: BpfConfig): void;
  /** The peer maps become exactly this table (peer-table.ts layout), adds before removals. */
  bpfSetPeers(id: number, table: Buffer): void;
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
  /** weft_tx on the TUN's egress, weft_rx on the underlay's ingress; the mode it used. */
  bpfAttach(
    id: number,
    tun: string | number,
    underlay: string | number,
    mode?: 'auto' | BpfAttachMode,
  ): BpfAttachMode;
  /** BPF_COUNTERS, summed over CPUs. */
  bpfCounters(id: number): Float64Array;
  /** Ids of the programs, maps and links this id holds (tests check none outlives close). */
  bpfObjectIds(id: number): number[];
  bpfClose(id: number): void;
}

/** TC verdicts the programs return. */
export const TC_ACT_OK = 0;
export const TC_ACT_SHOT = 2;
export const TC_ACT_REDIRECT = 7;

/** The programs' counter slots (native/bpf/weft.bpf.c enum), in order. */
export const BPF_COUNTERS = [
  'tx_packets',
  'tx_bytes',
  'rx_packets',
  'rx_bytes',
  'tx_passed',
  'rx_passed',
  'tx_error',
] as const;
export type BpfCounterName = (typeof BPF_COUNTERS)[number];

export function bpfObjectPath(): string {
  return process.env.WEFT_BPF_OBJECT ?? join(packageRoot(), 'native', 'build', 'weft.bpf.o');
}

export function loadBpfBinding(): NativeBpf {
  return loadNative<NativeBpf>();
}
