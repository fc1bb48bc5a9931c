/**
 * Dataplane counters, one table per family: the native engine's counters, its drop reasons, and
 * the bpf programs' counter slots. Each table is the only list of its family: the C++ enums and
 * names (native/src/counters.gen.h, native/bpf/weft_counters.gen.h, written from these tables by
 * scripts/native-tables.ts; `npm run build` runs it), the stats fields below and the Prometheus
 * rows (stats-metrics.ts, with each row's help text) are derived from them. A new counter: one
 * more row here. The engines never load the metrics registry (a restarted node forwards before
 * it): this file is data only.
 */
import type { OffloadName } from './offloads.js';

/** A labelled Prometheus counter family: each row that names it is one label value's series. */
export interface LabelledFamily {
  readonly name: string;
  readonly help: string;
  readonly label: string;
}

/** One counter of a table. */
export interface CounterRow {
  /** The stats field, the C++ name (`k` + CamelCase, WEFT_C_ + UPPER_CASE for bpf slots). */
  readonly name: string;
  /** What it counts: the C++ comment, and the Prometheus help when `metric` is set. */
  readonly help: string;
  /** Its own (unlabelled) Prometheus counter family. */
  readonly metric?: string;
  /** Or one series of a labelled family, with this label value. */
  readonly series?: { readonly family: LabelledFamily; readonly value: string };
}

/** The native engine's counters (per worker), in their slot order. */
export const NATIVE_COUNTER_TABLE = [
  {
    name: 'tx_packets',
    help: 'Inner packets read from the TUN, encapsulated and sent.',
    metric: 'weft_dataplane_tx_packets_total',
  },
  {
    name: 'tx_bytes',
    help: 'Inner bytes encapsulated and sent.',
    metric: 'weft_dataplane_tx_bytes_total',
  },
  {
    name: 'rx_packets',
    help: 'Inner packets received, decapsulated and written to the TUN.',
    metric: 'weft_dataplane_rx_packets_total',
  },
  {
    name: 'rx_bytes',
    help: 'Inner bytes received and written to the TUN.',
    metric: 'weft_dataplane_rx_bytes_total',
  },
  {
    name: 'icmp_sent',
    help: 'ICMP unreachables written back into the TUN for packets with no peer.',
    metric: 'weft_dataplane_icmp_unreachable_sent_total',
  },
  {
    name: 'send_batches',
    help: 'sendmmsg calls (packets per batch = tx packets / batches).',
    metric: 'weft_dataplane_send_batches_total',
  },
  {
    name: 'recv_batches',
    help: 'recvmmsg calls that returned datagrams.',
    metric: 'weft_dataplane_recv_batches_total',
  },
  {
    name: 'tun_reads',
    help: 'TUN reads that returned a packet (a TSO super-packet counts once).',
    metric: 'weft_dataplane_tun_reads_total',
  },
  {
    name: 'tso_segments',
    help: 'Segments cut from TUN TSO super-packets.',
    metric: 'weft_dataplane_tso_segments_total',
  },
  {
    name: 'gro_writes',
    help: 'Coalesced TCP and UDP super-packets written to the TUN.',
    metric: 'weft_dataplane_gro_writes_total',
  },
  {
    name: 'gso_sends',
    help: 'UDP GSO messages sent (each several datagrams).',
    metric: 'weft_dataplane_gso_sends_total',
  },
  {
    name: 'gso_disabled',
    help: '1 once the socket refused UDP GSO (EIO) and it was switched off (weft_dataplane_offload_enabled).',
  },
  {
    name: 'gro_trains',
    help: 'UDP GRO receives that carried several datagrams.',
    metric: 'weft_dataplane_gro_trains_total',
  },
  {
    name: 'wakeups',
    help: 'Times a dataplane worker woke from epoll_wait.',
    metric: 'weft_dataplane_wakeups_total',
  },
  {
    name: 'busy_polls',
    help: 'Times a busy-polling worker found packets without sleeping (a wake-up saved).',
    metric: 'weft_dataplane_busy_polls_total',
  },
  {
    name: 'gso_fallbacks',
    help: 'UDP GSO messages refused with EMSGSIZE (path MTU below the segment size) and resent datagram by datagram.',
    metric: 'weft_dataplane_gso_fallbacks_total',
  },
  {
    name: 'remote_wakeups',
    help: 'Wake-ups to receive datagrams the kernel took in on another CPU (one more cross-CPU hop).',
    metric: 'weft_dataplane_remote_wakeups_total',
  },
  {
    name: 'tap_writes',
    help: 'Frames written to the egress TAP (a TCP super-packet whole, or one packet).',
    metric: 'weft_dataplane_tap_writes_total',
  },
  {
    name: 'tap_disabled',
    help: '1 once the TAP refused a frame with EINVAL and TCP went back to the sockets (weft_dataplane_offload_enabled).',
  },
  {
    name: 'wg_handshakes_sent',
    help: 'WireGuard handshake messages sent (initiations, responses).',
    metric: 'weft_dataplane_wg_handshakes_sent_total',
  },
  {
    name: 'wg_cookie_replies',
    help: 'WireGuard cookie replies sent: under load (a flood of handshake messages), a handshake message without a valid mac2 is answered with one instead of being processed.',
    metric: 'weft_dataplane_wg_cookie_replies_total',
  },
  {
    name: 'wg_staged',
    help: 'WireGuard packets queued for a peer without a session, sent once its handshake completes.',
    metric: 'weft_dataplane_wg_staged_packets_total',
  },
  {
    name: 'wg_keepalives',
    help: 'WireGuard keepalives sent (passive and persistent) and received.',
    metric: 'weft_dataplane_wg_keepalives_total',
  },
] as const satisfies readonly CounterRow[];

const DROPPED: LabelledFamily = {
  name: 'weft_dataplane_dropped_packets_total',
  help: 'Packets dropped by the dataplane, by reason (a fixed set).',
  label: 'reason',
};
const drop = <N extends string>(name: N, help: string) => ({
  name,
  help,
  series: { family: DROPPED, value: name },
});

/** The native engine's drop reasons (native DropReason), index = reason; `none` is never counted. */
export const DROP_REASON_TABLE = [
  { name: 'none', help: 'Not dropped.' },
  drop('truncated', 'Shorter than its headers or its IP total length.'),
  drop('oversized', 'Larger than a buffer or a datagram can hold.'),
  drop('malformed', 'Bad IP version or header length, bad VXLAN flags.'),
  drop('unknown_source', 'The outer source address holds no lease.'),
  drop('spoofed_source', "The inner source address is outside the sending peer's subnet."),
  drop('bad_vni', 'The VXLAN VNI is not ours.'),
  drop('bad_mac', 'The inner Ethernet destination is not our VtepMAC.'),
  drop('bad_ethertype', 'The inner Ethernet type is neither IPv4 nor IPv6.'),
  drop('no_route', 'No peer subnet holds the inner destination.'),
  drop('ttl_expired', 'The inner TTL / hop limit reached zero.'),
  drop('send_error', 'sendmmsg refused the datagram.'),
  drop('tun_write_error', 'The TUN refused the packet.'),
  drop(
    'wg_allowed_ips',
    "WireGuard cryptokey routing: the decrypted inner source is outside the sending peer's AllowedIPs.",
  ),
  drop(
    'wg_rejected',
    'A WireGuard message that did not authenticate or apply (bad mac1, type, index, tag, replayed counter, expired key pair).',
  ),
  drop('wg_queue_full', 'A WireGuard peer without a session had its staging queue full.'),
  drop('wg_no_peer', "The inner destination's peer has no WireGuard key."),
] as const satisfies readonly CounterRow[];

const BPF_PASSED: LabelledFamily = {
  name: 'weft_dataplane_bpf_passed_packets_total',
  help: 'Packets the bpf programs left to the userspace engine (no peer, IPv6 underlay, TTL, bad or unknown input), by direction.',
  label: 'direction',
};
const BPF_ERROR: LabelledFamily = {
  name: 'weft_dataplane_bpf_error_packets_total',
  help: 'Packets the bpf programs changed half way and had to drop (encap or decap refused by the kernel after a header was written, redirect refused), by direction.',
  label: 'direction',
};

/**
 * The bpf programs' counter slots (native/bpf/weft.bpf.c), in order. `adds`: the native engine
 * counter the slot adds to in the bpf engine's totals (bpf-engine.ts withBpfCounters).
 */
export const BPF_COUNTER_TABLE = [
  {
    name: 'tx_packets',
    help: 'Inner packets weft_tx encapsulated and redirected.',
    adds: 'tx_packets',
  },
  { name: 'tx_bytes', help: 'Their inner bytes.', adds: 'tx_bytes' },
  {
    name: 'rx_packets',
    help: 'Inner packets weft_rx decapsulated into the TUN.',
    adds: 'rx_packets',
  },
  { name: 'rx_bytes', help: 'Their inner bytes.', adds: 'rx_bytes' },
  {
    name: 'tx_passed',
    help: 'Packets weft_tx left to the userspace engine (TUN side).',
    series: { family: BPF_PASSED, value: 'tx' },
  },
  {
    name: 'rx_passed',
    help: 'Packets for us (our port or, IPIP, our protocol; our address) weft_rx left to the userspace socket.',
    series: { family: BPF_PASSED, value: 'rx' },
  },
  {
    name: 'tx_error',
    help: 'Packets weft_tx changed half way (encap written, redirect refused) and dropped.',
    series: { family: BPF_ERROR, value: 'tx' },
  },
  {
    name: 'bridge_bypass',
    help: "GSO packets the bpf engine handed from the pods' bridge (--pod-bridge, cni0 by default) straight to the pod's port, which the bridge would have segmented in software.",
    metric: 'weft_dataplane_bpf_bridge_bypass_packets_total',
  },
  {
    name: 'rx_error',
    help: 'Packets weft_rx changed half way (flannel-udp TTL or IPIP ECN written, decap or redirect refused) and dropped.',
    series: { family: BPF_ERROR, value: 'rx' },
  },
  {
    name: 'tx_recut',
    help: 'TCP GSO packets with a short last segment weft_tx cut into equal segments (a smaller gso_size) so that one outer IPv6 UDP checksum is right for each, instead of leaving them to the userspace engine.',
    metric: 'weft_dataplane_bpf_recut_packets_total',
  },
] as const satisfies readonly (CounterRow & { readonly adds?: CounterName })[];

/** Index i is native DropReason i. `none` is never counted. */
export const DROP_REASONS = DROP_REASON_TABLE.map((r) => r.name);
export type DropReason = (typeof DROP_REASON_TABLE)[number]['name'];

/** Index i is native Counter i; the drop counters follow (COUNTERS.length + reason index). */
export const COUNTERS = NATIVE_COUNTER_TABLE.map((r) => r.name);
export type CounterName = (typeof NATIVE_COUNTER_TABLE)[number]['name'];

/** The programs' counter slots (native/bpf/weft.bpf.c), in order. */
export const BPF_COUNTERS = BPF_COUNTER_TABLE.map((r) => r.name);
export type BpfCounterName = (typeof BPF_COUNTER_TABLE)[number]['name'];

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
  /** bpf engine: the programs' own counters (BPF_COUNTERS). */
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

/**
 * Several engines' counters as one (the wireguard backend's two tunnels in `separate` mode):
 * workers side by side, totals summed, offloads and steering as the first engine reports them.
 */
export function sumStats(all: readonly DataplaneStats[]): DataplaneStats | null {
  const first = all[0];
  if (!first) return null;
  if (all.length === 1) return first;
  const total = emptyWorkerStats();
  for (const s of all) {
    for (const c of COUNTERS) total.counters[c] += s.total.counters[c];
    for (const r of DROP_REASONS) total.drops[r] += s.total.drops[r];
  }
  return { ...first, workers: all.flatMap((s) => s.workers), total };
}
