/**
 * Dataplane counters: the fixed drop-reason set (mirrors native/src/packet.h DropReason) and the
 * per-worker counter layout (mirrors native/src/engine.h Counter). Their Prometheus view is in
 * stats-metrics.ts (the engines never load the metrics registry: a restarted node forwards before it).
 */
import type { OffloadName } from './offloads.js';

/** Index i is native DropReason i. `none` is never counted. */
export const DROP_REASONS = [
  'none',
  'truncated',
  'oversized',
  'malformed',
  'unknown_source',
  'spoofed_source',
  'bad_vni',
  'bad_mac',
  'bad_ethertype',
  'no_route',
  'ttl_expired',
  'send_error',
  'tun_write_error',
] as const;
export type DropReason = (typeof DROP_REASONS)[number];

/** Index i is native Counter i; the drop counters follow (COUNTERS.length + reason index). */
export const COUNTERS = [
  'tx_packets',
  'tx_bytes',
  'rx_packets',
  'rx_bytes',
  'icmp_sent',
  'tun_reads',
  'send_batches',
  'recv_batches',
  'wakeups',
  'tso_segments',
  'gro_writes',
  'gso_sends',
  'gso_disabled',
  'gro_trains',
  'busy_polls',
  'gso_fallbacks',
  'remote_wakeups',
  'tap_writes',
  'tap_disabled',
] as const;
export type CounterName = (typeof COUNTERS)[number];
export const COUNTERS_PER_WORKER = COUNTERS.length + DROP_REASONS.length;

export interface WorkerStats {
  readonly counters: Readonly<Record<CounterName, number>>;
  readonly drops: Readonly<Record<DropReason, number>>;
}

export interface DataplaneStats {
  readonly engine: 'native' | 'js' | 'bpf';
  /** Offloads in use (the js engine uses none). */
  readonly offloads?: Readonly<Record<OffloadName, boolean>>;
  /** Native engine: how the TUN picks a queue (flow: steering program; cpu: affine queues). */
  readonly steering?: 'flow' | 'cpu' | 'tun';
  readonly workers: readonly WorkerStats[];
  readonly total: WorkerStats;
  /** bpf engine: the programs' own counters (bpf-binding.ts BPF_COUNTERS). */
  readonly bpf?: Readonly<Record<string, number>>;
}

export function emptyWorkerStats(): {
  counters: Record<CounterName, number>;
  drops: Record<DropReason, number>;
} {
  return {
    counters: Object.fromEntries(COUNTERS.map((c) => [c, 0])) as Record<CounterName, number>,
    drops: Object.fromEntries(DROP_REASONS.map((r) => [r, 0])) as Record<DropReason, number>,
  };
}

/** Decodes the engine's flat counter array (workers × COUNTERS_PER_WORKER). */
export function decodeCounters(engine: 'native' | 'js', flat: ArrayLike<number>): DataplaneStats {
  const workers: WorkerStats[] = [];
  const total = emptyWorkerStats();
  for (let w = 0; w * COUNTERS_PER_WORKER < flat.length; w++) {
    const base = w * COUNTERS_PER_WORKER;
    const s = emptyWorkerStats();
    COUNTERS.forEach((c, i) => {
      s.counters[c] = flat[base + i] ?? 0;
      total.counters[c] += s.counters[c];
    });
    DROP_REASONS.forEach((r, i) => {
      s.drops[r] = flat[base + COUNTERS.length + i] ?? 0;
      total.drops[r] += s.drops[r];
    });
    workers.push(s);
  }
  return { engine, workers, total };
}
