/**
 * The dataplane counters' Prometheus view, `weft_dataplane_*`, read from the engine at scrape
 * time (never per packet). The counter layout itself is in stats.ts.
 */
import { Counter, Gauge, type Registry } from '../common/prometheus.js';
import { OFFLOAD_NAMES } from './offloads.js';
import { DROP_REASONS } from './stats.js';
import type { DataplaneStats, WorkerStats } from './stats.js';

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
    name: 'weft_dataplane_bpf_error_packets_total',
    help: 'Packets the bpf programs changed half way and had to drop (encap or decap refused by the kernel after a header was written, redirect refused), by direction.',
    labelNames: ['direction'],
    registers: [registry],
    collect() {
      const s = read();
      this.reset();
      this.inc({ direction: 'tx' }, s?.bpf?.tx_error ?? 0);
      this.inc({ direction: 'rx' }, s?.bpf?.rx_error ?? 0);
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
