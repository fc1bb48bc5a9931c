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
import { createHash } from 'node:crypto';
import { readFileSync, readdirSync } from 'node:fs';
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

/** The programs' counter slots, in order (stats.ts BPF_COUNTER_TABLE, native/bpf/weft_abi.h). */
export { BPF_COUNTERS } from './stats.js';
export type { BpfCounterName } from './stats.js';

export function bpfObjectPath(): string {
  return process.env.WEFT_BPF_OBJECT ?? join(packageRoot(), 'native', 'build', 'weft.bpf.o');
}

/** The programs' source, shipped beside the object (its hash is checked against the object's). */
export function bpfSourcePath(): string {
  return join(bpfSourceDir(), 'weft.bpf.c');
}

/** native/bpf: weft.bpf.c and the headers it shares with the loader (weft_abi.h). */
export function bpfSourceDir(): string {
  return join(packageRoot(), 'native', 'bpf');
}

/**
 * The SHA-256 scripts/build-native.mjs (bpfSourceHash, the same rule) writes into the object:
 * over every *.c and *.h in `dir` by name, each as its name, a NUL and its bytes. Null when
 * `dir` holds none (an object shipped without its sources).
 */
export function bpfSourceHash(dir = bpfSourceDir()): string | null {
  let names: string[];
  try {
    names = readdirSync(dir)
      .filter((n) => /\.[ch]$/.test(n))
      .sort();
  } catch {
    return null;
  }
  if (names.length === 0) return null;
  const h = createHash('sha256');
  for (const name of names)
    h.update(name)
      .update('\0')
      .update(readFileSync(join(dir, name)));
  return h.digest('hex');
}

export function loadBpfBinding(): NativeBpf {
  return loadNative();
}
