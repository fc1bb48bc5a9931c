/**
 * Dataplane counters: the fixed drop-reason set (mirrors native/src/packet.h DropReason), the
 * per-worker counter layout (mirrors native/src/engine.h Counter) and their Prometheus view,
 * `weft_dataplane_*`, read from the engine at scrape time (never per packet).
 */
import { Counter, Gauge } from 'prom-client';
import type { Registry } from 'prom-client';
import { OFFLOAD_NAMES } from './offloads.js';
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

const attached = new WeakMap<
  Registry,
  { source: () => DataplaneStats | null; last: DataplaneStats | null }
>();

/**
 * Adds weft_dataplane_* to `registry`, read from `source` at each scrape. `source` returns null
 * while no dataplane runs (the series then stay at their last values). Registering again on
 * the same registry (a restarted backend) only replaces the source.
 */
export function registerDataplaneMetrics(
  registry: Registry,
  source: () => DataplaneStats | null,
): void {
  const existing = attached.get(registry);
  if (existing) {
    existing.source = source;
    return;
  }
  const slot = { source, last: null as DataplaneStats | null };
  attached.set(registry, slot);
  const read = () => {
    slot.last = slot.source() ?? slot.last;
    return slot.last;
  };
  const counter = (name: string, help: string, pick: (s: WorkerStats) => number) =>
    new Counter({
      name,
      help,
      registers: [registry],
      collect() {
        const s = read();
        this.reset();
        if (s) this.inc(pick(s.total));
      },
    });
  counter(
    'weft_dataplane_tx_packets_total',
    'Inner packets read from the TUN, encapsulated and sent.',
    (s) => s.counters.tx_packets,
  );
  counter(
    'weft_dataplane_tx_bytes_total',
    'Inner bytes encapsulated and sent.',
    (s) => s.counters.tx_bytes,
  );
  counter(
    'weft_dataplane_rx_packets_total',
    'Inner packets received, decapsulated and written to the TUN.',
    (s) => s.counters.rx_packets,
  );
  counter(
    'weft_dataplane_rx_bytes_total',
    'Inner bytes received and written to the TUN.',
    (s) => s.counters.rx_bytes,
  );
  counter(
    'weft_dataplane_icmp_unreachable_sent_total',
    'ICMP unreachables written back into the TUN for packets with no peer.',
    (s) => s.counters.icmp_sent,
  );
  counter(
    'weft_dataplane_send_batches_total',
    'sendmmsg calls (packets per batch = tx packets / batches).',
    (s) => s.counters.send_batches,
  );
  counter(
    'weft_dataplane_recv_batches_total',
    'recvmmsg calls that returned datagrams.',
    (s) => s.counters.recv_batches,
  );
  counter(
    'weft_dataplane_tun_reads_total',
    'TUN reads that returned a packet (a TSO super-packet counts once).',
    (s) => s.counters.tun_reads,
  );
  counter(
    'weft_dataplane_tso_segments_total',
    'Segments cut from TUN TSO super-packets.',
    (s) => s.counters.tso_segments,
  );
  counter(
    'weft_dataplane_gro_writes_total',
    'Coalesced TCP and UDP super-packets written to the TUN.',
    (s) => s.counters.gro_writes,
  );
  counter(
    'weft_dataplane_gso_sends_total',
    'UDP GSO messages sent (each several datagrams).',
    (s) => s.counters.gso_sends,
  );
  counter(
    'weft_dataplane_gro_trains_total',
    'UDP GRO receives that carried several datagrams.',
    (s) => s.counters.gro_trains,
  );
  counter(
    'weft_dataplane_wakeups_total',
    'Times a dataplane worker woke from epoll_wait.',
    (s) => s.counters.wakeups,
  );
  counter(
    'weft_dataplane_busy_polls_total',
    'Times a busy-polling worker found packets without sleeping (a wake-up saved).',
    (s) => s.counters.busy_polls,
  );
  counter(
    'weft_dataplane_gso_fallbacks_total',
    'UDP GSO messages refused with EMSGSIZE (path MTU below the segment size) and resent datagram by datagram.',
    (s) => s.counters.gso_fallbacks,
  );
  counter(
    'weft_dataplane_remote_wakeups_total',
    'Wake-ups to receive datagrams the kernel took in on another CPU (one more cross-CPU hop).',
    (s) => s.counters.remote_wakeups,
  );
  counter(
    'weft_dataplane_tap_writes_total',
    'Frames written to the egress TAP (a TCP super-packet whole, or one packet).',
    (s) => s.counters.tap_writes,
  );
  new Counter({
    name: 'weft_dataplane_dropped_packets_total',
    help: 'Packets dropped by the dataplane, by reason (a fixed set).',
    labelNames: ['reason'],
    registers: [registry],
    collect() {
      const s = read();
      this.reset();
      for (const r of DROP_REASONS) {
        if (r === 'none') continue;
        this.inc({ reason: r }, s ? s.total.drops[r] : 0);
      }
    },
  });
  new Gauge({
    name: 'weft_dataplane_offload_enabled',
    help: 'Whether each dataplane offload is in use (probed at start; udp_gso turns 0 if the socket refuses it, tap_gso if the TAP refuses a frame).',
    labelNames: ['feature'],
    registers: [registry],
    collect() {
      const s = read();
      this.reset();
      for (const f of OFFLOAD_NAMES) {
        const on = s?.offloads?.[f] ?? false;
        const off =
          (f === 'udp_gso' && (s?.total.counters.gso_disabled ?? 0) > 0) ||
          (f === 'tap_gso' && (s?.total.counters.tap_disabled ?? 0) > 0);
        this.set({ feature: f }, on && !off ? 1 : 0);
      }
    },
  });
  new Gauge({
    name: 'weft_dataplane_engine',
    help: 'The packet engine running (1) and the others (0): native, bpf (kernel fast path + native), js.',
    labelNames: ['engine'],
    registers: [registry],
    collect() {
      const s = read();
      this.reset();
      for (const e of ['native', 'bpf', 'js'] as const)
        this.set({ engine: e }, s?.engine === e ? 1 : 0);
    },
  });
  new Counter({
    name: 'weft_dataplane_bpf_passed_packets_total',
    help: 'Packets the bpf programs left to the userspace engine (no peer, IPv6 underlay, TTL, bad or unknown input), by direction.',
    labelNames: ['direction'],
    registers: [registry],
    collect() {
      const s = read();
      this.reset();
      this.inc({ direction: 'tx' }, s?.bpf?.tx_passed ?? 0);
      this.inc({ direction: 'rx' }, s?.bpf?.rx_passed ?? 0);
    },
  });
  new Counter({
    name: 'weft_dataplane_bpf_bridge_bypass_packets_total',
    help: "GSO packets the bpf engine handed from the pods' bridge (cni0) straight to the pod's port, which the bridge would have segmented in software.",
    registers: [registry],
    collect() {
      const s = read();
      this.reset();
      this.inc(s?.bpf?.bridge_bypass ?? 0);
    },
  });
  new Gauge({
    name: 'weft_dataplane_workers',
    help: 'Dataplane worker threads (TUN queues) running.',
    labelNames: ['engine'],
    registers: [registry],
    collect() {
      const s = read();
      this.reset();
      if (s) this.set({ engine: s.engine }, s.workers.length);
    },
  });
}
