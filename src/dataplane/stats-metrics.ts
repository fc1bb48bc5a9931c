/**
 * The dataplane counters' Prometheus view, `weft_dataplane_*`, read from the engine at scrape
 * time in each family's prom-client `collect()` (never per packet). The counter families, with
 * their metric names and help texts, are stats.ts's tables: a new engine counter is a row there.
 */
import { Counter, Gauge, type Registry } from '../common/metrics.js';
import { OFFLOAD_NAMES } from './offloads.js';
import { BPF_COUNTER_TABLE, DROP_REASON_TABLE, NATIVE_COUNTER_TABLE } from './stats.js';
import type { CounterName, CounterRow, DataplaneStats, DropReason } from './stats.js';

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
  // One family per row with `metric`, one per labelled family (its series in row order), in
  // table order; `pick` reads a row's value from the stats.
  const counters = (
    rows: readonly CounterRow[],
    pick: (s: DataplaneStats, name: string) => number,
  ) => {
    const families = new Map<string, { help: string; label?: string; rows: CounterRow[] }>();
    for (const row of rows) {
      if (row.metric) families.set(row.metric, { help: row.help, rows: [row] });
      else if (row.series) {
        const { name, help, label } = row.series.family;
        const f = families.get(name) ?? { help, label, rows: [] };
        f.rows.push(row);
        families.set(name, f);
      }
    }
    for (const [name, f] of families) {
      new Counter({
        name,
        help: f.help,
        labelNames: f.label ? [f.label] : [],
        registers: [registry],
        collect() {
          const s = read();
          this.reset();
          for (const row of f.rows) {
            const v = s ? pick(s, row.name) : 0;
            if (f.label) this.inc({ [f.label]: row.series!.value }, v);
            else this.inc(v);
          }
        },
      });
    }
  };
  counters(NATIVE_COUNTER_TABLE, (s, n) => s.total.counters[n as CounterName]);
  counters(DROP_REASON_TABLE, (s, n) => s.total.drops[n as DropReason]);
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
  counters(BPF_COUNTER_TABLE, (s, n) => s.bpf?.[n] ?? 0);
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
