/**
 * The typed view of the addon's bpf exports (native/src/addon.cc bpfbind, native/src/bpf_loader.h)
 * and where the programs' object is (native/build/weft.bpf.o, built by scripts/build-native.mjs
 * with `clang -target bpf`).
 *
 * Contract: an id owns one loaded copy of the programs and their maps; `bpfClose` detaches and
 * frees all of it, pins included (idempotent; keepPinned leaves the pinned links attached).
 * Buffers passed in are copied before the call returns. Unpinned, the tcx links, programs and
 * maps go with the process's fds; pinned (bpf-pins.ts), the links outlive it.
 */
import { join } from 'node:path';
import { loadNative, packageRoot } from '../common/native.js';
import type { NativeAddon } from '../common/native-addon.js';

export type { BpfAttachMode, BpfConfig } from '../common/native-addon.js';

/** The addon's bpf exports (typed in NativeAddon, src/common/native-addon.ts). */
export type NativeBpf = Pick<
  NativeAddon,
  | 'bpfLoad'
  | 'bpfConfigure'
  | 'bpfSetPeers'
  | 'bpfUpdatePeers'
  | 'bpfTestRun'
  | 'bpfAttach'
  | 'bpfSetPorts'
  | 'bpfAttachBridge'
  | 'bpfCounters'
  | 'bpfObjectIds'
  | 'bpfClose'
  | 'bpfTakeOver'
>;

/** TC verdicts the programs return (TC_ACT_UNSPEC = TCX_NEXT: "not mine", the next program runs). */
export const TC_ACT_UNSPEC = -1;
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
  'bridge_bypass',
  'rx_error',
] as const;
export type BpfCounterName = (typeof BPF_COUNTERS)[number];

export function bpfObjectPath(): string {
  return process.env.WEFT_BPF_OBJECT ?? join(packageRoot(), 'native', 'build', 'weft.bpf.o');
}

/** The programs' source, shipped beside the object (its hash is checked against the object's). */
export function bpfSourcePath(): string {
  return join(packageRoot(), 'native', 'bpf', 'weft.bpf.c');
}

export function loadBpfBinding(): NativeBpf {
  return loadNative();
}
