/**
 * Output shared by the benches and the fault suite: a Markdown table (what the terminal and the
 * README show) and the results files under bench/results/.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

/** A Markdown table with padded columns, one line per row, ending in a newline. */
export function markdownTable(
  head: readonly string[],
  rows: ReadonlyArray<readonly string[]>,
): string {
  const all = [head, ...rows];
  const w = head.map((_, i) => Math.max(...all.map((r) => (r[i] ?? '').length)));
  const line = (r: readonly string[]) =>
    `| ${w.map((x, i) => (r[i] ?? '').padEnd(x)).join(' | ')} |`;
  return (
    [line(head), `|${w.map((x) => '-'.repeat(x + 2)).join('|')}|`, ...rows.map(line)].join('\n') +
    '\n'
  );
}

/** A full run (every path, not --quick) is the only one that may replace latest.*. */
export function isFullRun(o: { quick: boolean; paths: readonly string[] }): boolean {
  return !o.quick && o.paths.length === 0;
}

/**
 * Writes a run's results to `dir`: always `<time>.json`; `latest.{json,md}` (and `latest.svg`
 * when there is a chart: what the README shows) only for a full run. Returns the names written.
 */
export function saveResults(
  dir: string,
  started: Date,
  out: { json: string; svg?: string; table: string },
  full: boolean,
): string[] {
  mkdirSync(dir, { recursive: true });
  const files: Array<[string, string]> = [
    [`${started.toISOString().replace(/[:.]/g, '-')}.json`, out.json],
  ];
  if (full) {
    files.push(['latest.json', out.json]);
    if (out.svg !== undefined) files.push(['latest.svg', out.svg]);
    files.push(['latest.md', out.table]);
  }
  for (const [name, text] of files) writeFileSync(join(dir, name), text);
  return files.map(([name]) => name);
}
