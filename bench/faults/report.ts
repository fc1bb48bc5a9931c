/**
 * The fault suite's pure parts: what one row on one backend yields, its verdict, the table the
 * terminal and bench/faults/README.md show, and the JSON beside it. Nothing here touches a namespace.
 */
import { markdownTable } from '../report.js';

/**
 * pass / FAIL: the row ran and its goal was met or not; n/a: the fault has no meaning on that
 * backend (the figure says why); error: the row could not be run (the figure says what broke).
 */
export type Verdict = 'pass' | 'FAIL' | 'n/a' | 'error';

/** What a row measured: the figure as a person reads it, whether the goal held, raw numbers. */
export interface Outcome {
  readonly figure: string;
  readonly met: boolean;
  readonly values: Readonly<Record<string, number | string | boolean | null>>;
}

export interface FaultResult {
  /** The row's id (`--rows`). */
  readonly row: string;
  /** The row as the table shows it. */
  readonly title: string;
  readonly backend: string;
  readonly figure: string;
  readonly goal: string;
  readonly verdict: Verdict;
  readonly values: Readonly<Record<string, number | string | boolean | null>>;
}

export function verdictOf(o: Outcome): Verdict {
  return o.met ? 'pass' : 'FAIL';
}

/** One row's result from what happened: an outcome, a reason it does not apply, or an error. */
export function resultOf(
  row: { readonly id: string; readonly title: string; readonly goal: string },
  backend: string,
  what: { outcome: Outcome } | { notApplicable: string } | { error: unknown },
): FaultResult {
  const base = { row: row.id, title: row.title, backend, goal: row.goal };
  if ('outcome' in what)
    return {
      ...base,
      figure: what.outcome.figure,
      verdict: verdictOf(what.outcome),
      values: what.outcome.values,
    };
  if ('notApplicable' in what)
    return { ...base, figure: what.notApplicable, verdict: 'n/a', values: {} };
  const msg = what.error instanceof Error ? what.error.message : String(what.error);
  return {
    ...base,
    figure: `could not run: ${msg.split('\n')[0]!.slice(0, 160)}`,
    verdict: 'error',
    values: { error: msg.slice(0, 2000) },
  };
}

/** Table cells must not break the Markdown table. */
function cell(s: string): string {
  return s.replace(/\|/g, '\\|').replace(/\s*\n\s*/g, ' ');
}

export function faultTable(results: readonly FaultResult[]): string {
  return markdownTable(
    ['row', 'backend', 'figure', 'goal', 'verdict'],
    results.map((r) => [r.title, r.backend, r.figure, r.goal, r.verdict].map(cell)),
  );
}

/** Verdict counts, e.g. `31 pass, 4 FAIL, 9 n/a, 0 error`. */
export function tally(results: readonly FaultResult[]): string {
  const n = (v: Verdict) => results.filter((r) => r.verdict === v).length;
  return `${n('pass')} pass, ${n('FAIL')} FAIL, ${n('n/a')} n/a, ${n('error')} error`;
}

/** The run's exit status: 0 only when every row that applies passed. */
export function exitStatus(results: readonly FaultResult[]): number {
  return results.some((r) => r.verdict === 'FAIL' || r.verdict === 'error') ? 1 : 0;
}

/** Milliseconds as the table shows them: `0.37 s`, `12.4 s`. */
export function secs(ms: number): string {
  const s = ms / 1000;
  return `${s < 10 ? s.toFixed(2) : s.toFixed(1)} s`;
}

/**
 * The sum of a metric's samples in a Prometheus text exposition, over the samples whose labels
 * include every pair of `labels` (a family with no sample: 0).
 */
export function metricSum(
  text: string,
  name: string,
  labels: Readonly<Record<string, string>> = {},
): number {
  let sum = 0;
  for (const line of text.split('\n')) {
    const m = /^([a-zA-Z_:][\w:]*)(?:\{([^}]*)\})? (\S+)/.exec(line);
    if (!m || m[1] !== name) continue;
    const have = new Map([...(m[2] ?? '').matchAll(/(\w+)="([^"]*)"/g)].map((x) => [x[1], x[2]]));
    if (Object.entries(labels).every(([k, v]) => have.get(k) === v)) sum += Number(m[3]);
  }
  return sum;
}
