/**
 * weft's own Prometheus registry: counters and gauges with fixed label names, `collect` hooks
 * that read a value at scrape time, and the text exposition format 0.0.4. It replaces
 * prom-client, which loaded @opentelemetry/api and cost an idle daemon ~12 MB for what is a few
 * maps and a string join here.
 *
 * The format (https://prometheus.io/docs/instrumenting/exposition_formats/): per family one
 * `# HELP name text` (backslash and newline escaped), one `# TYPE name counter|gauge`, then a
 * line per series `name{label="value",...} number`; label values escape backslash, double quote
 * and newline; numbers are Go floats (`NaN`, `+Inf`, `-Inf`). Series are written in the order
 * they were first set, labels in `labelNames` order. An unlabelled metric always has its one
 * series (0 until set); a labelled one has none until a value is set.
 */

export type LabelValues<L extends string> = Readonly<Record<L, string | number>>;

export interface MetricValue<L extends string = string> {
  readonly labels: LabelValues<L>;
  readonly value: number;
}

/** One family as read at a scrape (for tests and the generated metrics reference). */
export interface MetricSnapshot<L extends string = string> {
  readonly name: string;
  readonly help: string;
  readonly type: 'counter' | 'gauge';
  readonly values: Array<MetricValue<L>>;
}

interface MetricOptions<L extends string, M> {
  readonly name: string;
  readonly help: string;
  readonly labelNames?: readonly L[];
  /** Registries to add the metric to (each refuses a second family of the same name). */
  readonly registers?: readonly Registry[];
  /** Called before each read of the metric, with `this` the metric (read-at-scrape values). */
  readonly collect?: (this: M) => void;
}

const METRIC_NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const LABEL_NAME = /^[a-zA-Z_][a-zA-Z0-9_]*$/;

abstract class Metric<L extends string> {
  abstract readonly type: 'counter' | 'gauge';
  readonly name: string;
  readonly help: string;
  readonly labelNames: readonly L[];
  readonly #collect: (() => void) | undefined;
  /** Series by their label values (JSON of the values in labelNames order). */
  readonly #series = new Map<string, { labels: LabelValues<L>; value: number }>();

  constructor(o: MetricOptions<L, unknown>) {
    if (!METRIC_NAME.test(o.name)) throw new Error(`metrics: invalid metric name ${o.name}`);
    const labelNames = o.labelNames ?? [];
    for (const l of labelNames) {
      if (!LABEL_NAME.test(l) || l.startsWith('__')) {
        throw new Error(`metrics: ${o.name}: invalid label name ${l}`);
      }
    }
    if (new Set(labelNames).size !== labelNames.length) {
      throw new Error(`metrics: ${o.name}: a label name is repeated`);
    }
    this.name = o.name;
    this.help = o.help;
    this.labelNames = [...labelNames];
    this.#collect = o.collect?.bind(this);
    this.reset();
    for (const r of o.registers ?? []) r.register(this);
  }

  /** Drops every series (an unlabelled metric goes back to 0). */
  reset(): void {
    this.#series.clear();
    if (this.labelNames.length === 0)
      this.#series.set('', { labels: {} as LabelValues<L>, value: 0 });
  }

  /** The family's series after its collect hook ran. */
  get(): MetricSnapshot<L> {
    this.#collect?.();
    return {
      name: this.name,
      help: this.help,
      type: this.type,
      values: [...this.#series.values()].map((s) => ({ labels: s.labels, value: s.value })),
    };
  }

  protected update(labels: LabelValues<L> | undefined, f: (old: number) => number): void {
    const given = labels ?? ({} as LabelValues<L>);
    const keys = Object.keys(given);
    if (
      keys.length !== this.labelNames.length ||
      keys.some((k) => !this.labelNames.includes(k as L))
    ) {
      throw new Error(
        `metrics: ${this.name} takes labels [${this.labelNames.join(', ')}], got [${keys.join(', ')}]`,
      );
    }
    const values = this.labelNames.map((l) => String(given[l]));
    const key = values.length === 0 ? '' : JSON.stringify(values);
    const s = this.#series.get(key);
    if (s) s.value = f(s.value);
    else {
      const ordered = Object.fromEntries(this.labelNames.map((l, i) => [l, values[i]!]));
      this.#series.set(key, { labels: ordered as LabelValues<L>, value: f(0) });
    }
  }
}

function args<L extends string>(
  a: LabelValues<L> | number | undefined,
  b: number | undefined,
  dflt: number | undefined,
): [LabelValues<L> | undefined, number] {
  if (typeof a === 'number') return [undefined, a];
  const v = b ?? dflt;
  if (v === undefined) throw new Error('metrics: a value is required');
  return [a, v];
}

/** A value that only goes up (reset only by `reset`, which collect hooks use for totals read elsewhere). */
export class Counter<L extends string = string> extends Metric<L> {
  readonly type = 'counter';

  constructor(o: MetricOptions<L, Counter<L>>) {
    super(o as MetricOptions<L, unknown>);
  }

  inc(value?: number): void;
  inc(labels: LabelValues<L>, value?: number): void;
  inc(a?: LabelValues<L> | number, b?: number): void {
    const [labels, v] = args(a, b, 1);
    if (!(v >= 0)) throw new Error(`metrics: ${this.name}: a counter only goes up (inc ${v})`);
    this.update(labels, (old) => old + v);
  }
}

/** A value that goes up and down. */
export class Gauge<L extends string = string> extends Metric<L> {
  readonly type = 'gauge';

  constructor(o: MetricOptions<L, Gauge<L>>) {
    super(o as MetricOptions<L, unknown>);
  }

  set(value: number): void;
  set(labels: LabelValues<L>, value: number): void;
  set(a: LabelValues<L> | number, b?: number): void {
    const [labels, v] = args(a, b, undefined);
    this.update(labels, () => v);
  }

  inc(value?: number): void;
  inc(labels: LabelValues<L>, value?: number): void;
  inc(a?: LabelValues<L> | number, b?: number): void {
    const [labels, v] = args(a, b, 1);
    this.update(labels, (old) => old + v);
  }

  dec(value?: number): void;
  dec(labels: LabelValues<L>, value?: number): void;
  dec(a?: LabelValues<L> | number, b?: number): void {
    const [labels, v] = args(a, b, 1);
    this.update(labels, (old) => old - v);
  }
}

export type AnyMetric = Counter | Gauge;

const escapeHelp = (s: string) => s.replace(/\\/g, '\\\\').replace(/\n/g, '\\n');
const escapeLabel = (s: string) =>
  s.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n');

/** A sample value as Prometheus (Go's ParseFloat) reads it. */
export function formatValue(v: number): string {
  if (Number.isNaN(v)) return 'NaN';
  if (v === Infinity) return '+Inf';
  if (v === -Infinity) return '-Inf';
  return String(v);
}

/** One family in the text format, its lines each ending in a newline. */
export function renderFamily(m: MetricSnapshot): string {
  let out = `# HELP ${m.name} ${escapeHelp(m.help)}\n# TYPE ${m.name} ${m.type}\n`;
  for (const s of m.values) {
    const labels = Object.entries(s.labels)
      .map(([k, v]) => `${k}="${escapeLabel(String(v))}"`)
      .join(',');
    out += `${m.name}${labels ? `{${labels}}` : ''} ${formatValue(s.value)}\n`;
  }
  return out;
}

/** The metrics one daemon serves, in registration order. */
export class Registry {
  readonly contentType = 'text/plain; version=0.0.4; charset=utf-8';
  readonly #metrics = new Map<string, AnyMetric>();

  register(metric: Metric<string>): void {
    if (this.#metrics.has(metric.name)) {
      throw new Error(`metrics: ${metric.name} is already registered`);
    }
    this.#metrics.set(metric.name, metric as AnyMetric);
  }

  getSingleMetric(name: string): AnyMetric | undefined {
    return this.#metrics.get(name);
  }

  /** Every family, read now (collect hooks run). */
  getMetricsAsJSON(): MetricSnapshot[] {
    return [...this.#metrics.values()].map((m) => m.get());
  }

  /** The exposition text served on /metrics. */
  metrics(): string {
    return this.getMetricsAsJSON().map(renderFamily).join('');
  }
}
