/**
 * weft's metrics are prom-client's (Counter, Gauge, Histogram, one Registry per daemon). This
 * file adds what every part of weft registers the same way:
 *
 * - `counterOn` / `gaugeOn` / `histogramOn(registry, config)`: the family named `config.name` on
 *   that registry, created the first time and returned as it is afterwards (a restarted backend,
 *   two backends of one daemon, the metrics reference that registers everything once);
 * - `known`: label values fixed in advance. Every combination is exported at 0 from the start,
 *   as Prometheus's instrumentation guide asks, so `increase()` shows 0 and not "no data" before
 *   the first event (a counter at 0, a histogram with empty buckets);
 * - the bucket sets for weft's durations.
 *
 * Values read from elsewhere at each scrape (the engines' counters) are set in the family's
 * `collect()`, which prom-client calls on every scrape and never otherwise: no JS runs per packet.
 *
 * Adding a metric: pick the family helper, name it `weft_<subsystem>_<what>_<unit>` (counters
 * end in `_total`), list fixed label values in `known`, and register it in scripts/metrics-doc.ts
 * if it is not created by one of the functions that script already calls.
 */
import {
  Counter,
  Gauge,
  Histogram,
  Registry,
  type CounterConfiguration,
  type GaugeConfiguration,
  type HistogramConfiguration,
  type LabelValues,
} from 'prom-client';

export { Counter, Gauge, Histogram, Registry };
export type { LabelValues };

/** Label values fixed in advance, for every label of the family. */
export type KnownValues<L extends string> = Readonly<Record<L, readonly string[]>>;

/**
 * Seconds, for control-plane work that takes a millisecond on a quiet node and seconds on a
 * loaded one or a slow store (kernel batches, store requests, lease acquire and renew, lease
 * event → peer programmed): 1 ms … 30 s.
 */
export const DURATION_BUCKETS: readonly number[] = Object.freeze([
  0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
]);

/** Every combination of the known values, in label order (none when a label has no values). */
export function labelCombinations<L extends string>(
  labelNames: readonly L[],
  known: KnownValues<L>,
): Array<LabelValues<L>> {
  let out: Array<Record<string, string>> = [{}];
  for (const l of labelNames) {
    const values = known[l] ?? [];
    out = out.flatMap((partial) => values.map((v) => ({ ...partial, [l]: v })));
  }
  return out as Array<LabelValues<L>>;
}

function existing<M>(reg: Registry, name: string, kind: string, make: () => M): M {
  const m = reg.getSingleMetric(name) as (M & { constructor: unknown }) | undefined;
  if (m === undefined) return make();
  const type = (m as unknown as { type?: string }).type;
  if (type !== undefined && type !== kind)
    throw new Error(`metrics: ${name} is registered as a ${type}, not a ${kind}`);
  return m;
}

type Config<C, L extends string> = Omit<C, 'registers'> & {
  readonly labelNames?: readonly L[];
  /** Fixed label values: every combination exported at 0 from the start. */
  readonly known?: KnownValues<L>;
};

/** The counter `o.name` on `reg` (created, its known label values at 0, the first time). */
export function counterOn<L extends string = string>(
  reg: Registry,
  o: Config<CounterConfiguration<L>, L>,
): Counter<L> {
  return existing(reg, o.name, 'counter', () => {
    const { known, ...config } = o;
    const c = new Counter<L>({ ...config, registers: [reg] } as CounterConfiguration<L>);
    if (known) for (const labels of labelCombinations(o.labelNames ?? [], known)) c.inc(labels, 0);
    return c;
  });
}

/** The gauge `o.name` on `reg` (created, its known label values at 0, the first time). */
export function gaugeOn<L extends string = string>(
  reg: Registry,
  o: Config<GaugeConfiguration<L>, L>,
): Gauge<L> {
  return existing(reg, o.name, 'gauge', () => {
    const { known, ...config } = o;
    const g = new Gauge<L>({ ...config, registers: [reg] } as GaugeConfiguration<L>);
    if (known) for (const labels of labelCombinations(o.labelNames ?? [], known)) g.set(labels, 0);
    return g;
  });
}

/**
 * The histogram `o.name` on `reg` (created the first time, with every combination of its known
 * label values exported with empty buckets). Buckets default to DURATION_BUCKETS.
 */
export function histogramOn<L extends string = string>(
  reg: Registry,
  o: Config<HistogramConfiguration<L>, L>,
): Histogram<L> {
  return existing(reg, o.name, 'histogram', () => {
    const { known, ...config } = o;
    const h = new Histogram<L>({
      buckets: [...DURATION_BUCKETS],
      ...config,
      registers: [reg],
    } as HistogramConfiguration<L>);
    if (known) for (const labels of labelCombinations(o.labelNames ?? [], known)) h.zero(labels);
    else if ((o.labelNames ?? []).length === 0) h.zero({} as LabelValues<L>);
    return h;
  });
}

/** Seconds since `start` (a `performance.now()` reading). */
export function secondsSince(start: number): number {
  return (performance.now() - start) / 1000;
}

/** The observations `TimedEvents` records at once; the rest wait for later event-loop turns. */
export const OBSERVE_SLICE = 256;

/**
 * A histogram series timing events to the moment they took effect (lease event → peer
 * programmed): one observation per event, recorded at most `slice` per event-loop turn.
 *
 * Why in slices: a flush that carries the first snapshot carries every lease (5,000 on a large
 * cluster), and prom-client's observe costs microseconds (its label checks and hashing run on
 * every call): 16–27 ms for 5,000 after the start's first flush (measured in the daemon,
 * bench:scale), during which the next lease event waited (the one-event p99). The values are
 * taken when `took` is called; only their recording is spread over turns, so a scrape in
 * between may see part of a large flush, and the rest a turn later.
 */
export class TimedEvents {
  readonly #observe: (seconds: number) => void;
  readonly #slice: number;
  /** Seconds not yet observed: #pending[#next..]. */
  #pending: number[] = [];
  #next = 0;
  #turn: NodeJS.Immediate | null = null;

  constructor(observe: (seconds: number) => void, slice = OBSERVE_SLICE) {
    this.#observe = observe;
    this.#slice = slice;
  }

  /** The events received at `received` (performance.now() readings) took effect now. */
  took(received: readonly number[]): void {
    if (received.length === 0) return;
    const now = performance.now();
    for (const t of received) this.#pending.push((now - t) / 1000);
    if (this.#turn === null) this.#record();
  }

  /** Observations not yet recorded. */
  get pending(): number {
    return this.#pending.length - this.#next;
  }

  readonly #record = (): void => {
    this.#turn = null;
    const end = Math.min(this.#pending.length, this.#next + this.#slice);
    for (; this.#next < end; this.#next++) this.#observe(this.#pending[this.#next]!);
    if (this.#next < this.#pending.length) {
      // (kept referenced: an unreferenced immediate lets the loop block in its poll phase, and
      // the rest would wait for the next I/O or timer)
      this.#turn = setImmediate(this.#record);
    } else {
      this.#pending = [];
      this.#next = 0;
    }
  };
}
