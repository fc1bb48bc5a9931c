/**
 * deploy/grafana/weft.json, the dashboard for weft's metrics: every query names only metrics
 * weft exports (the catalog docs/metrics.md is generated from: weft_* and prom-client's
 * process_* and nodejs_*; a histogram through its _bucket, _sum and _count series), with labels
 * those metrics have, parses as PromQL (promtool), and every weft_* family is on some panel.
 * test/netns/prometheus.test.ts runs the same queries on a real Prometheus server.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { describe, test } from 'node:test';
import { metricFamilies } from '../../../scripts/metrics-doc.js';

interface Panel {
  id: number;
  type: string;
  title: string;
  datasource?: { uid: string };
  targets?: Array<{ expr: string }>;
  panels?: Panel[];
}

const dashboard = JSON.parse(
  readFileSync(resolve(import.meta.dirname, '../../../deploy/grafana/weft.json'), 'utf8'),
) as { uid: string; title: string; panels: Panel[] };
const panels = dashboard.panels.flatMap((p) => [p, ...(p.panels ?? [])]);
const exprs = panels.flatMap((p) => (p.targets ?? []).map((t) => t.expr));
/** Labels Prometheus adds to every series it scrapes. */
const TARGET_LABELS = new Set(['instance', 'job']);
/** Metric names in a query (any family prefix weft exports). */
const METRIC_NAME = /\b(?:weft|process|nodejs)_[a-z0-9_]+/g;
/** The series a histogram family exports besides its name. */
const HISTOGRAM_SERIES = /_(bucket|sum|count)$/;

/** The family a series name belongs to (a histogram's _bucket → the histogram). */
function familyOf(
  families: ReadonlyMap<string, { type: string }>,
  series: string,
): string | undefined {
  if (families.has(series)) return series;
  const base = series.replace(HISTOGRAM_SERIES, '');
  return families.get(base)?.type === 'histogram' ? base : undefined;
}

describe('deploy/grafana/weft.json', () => {
  test('every expression names metrics, and only ones weft exports', async () => {
    const families = new Map((await metricFamilies()).map((f) => [f.name, f]));
    assert.ok(exprs.length > 20);
    for (const expr of exprs) {
      const series = [...expr.matchAll(METRIC_NAME)].map((m) => m[0]);
      assert.ok(series.length > 0, `${expr}: names no metric`);
      const names = series.map((n) => familyOf(families, n));
      series.forEach((n, i) => assert.ok(names[i], `${expr}: ${n} is not a metric weft exports`));
      for (const m of expr.matchAll(/\b((?:weft|process|nodejs)_[a-z0-9_]+)\{([^}]*)\}/g)) {
        const family = families.get(familyOf(families, m[1]!)!)!;
        for (const sel of m[2]!.matchAll(/(\w+)\s*(=~|!=|!~|=)\s*"([^"]*)"/g)) {
          const [, label, op, value] = sel;
          if (TARGET_LABELS.has(label!)) continue;
          assert.ok(family.labels.includes(label!), `${expr}: ${m[1]} has no label ${label}`);
          const fixed = family.labelValues[label!];
          if (op === '=' && fixed)
            assert.ok(fixed.includes(value!), `${expr}: ${label}="${value}"`);
        }
      }
      for (const by of expr.matchAll(/\bby \(([^)]*)\)/g)) {
        for (const label of by[1]!.split(',').map((s) => s.trim())) {
          const any = names.some(
            (n) =>
              families.get(n!)!.labels.includes(label) ||
              (label === 'le' && families.get(n!)!.type === 'histogram'),
          );
          assert.ok(TARGET_LABELS.has(label) || any, `${expr}: no metric in it has ${label}`);
        }
      }
    }
  });

  test('every weft family is on a panel', async () => {
    const all = exprs.join('\n');
    for (const f of (await metricFamilies()).filter((f) => f.name.startsWith('weft_'))) {
      const series = f.type === 'histogram' ? `${f.name}_bucket` : f.name;
      assert.match(all, new RegExp(`\\b${series}\\b`), `${f.name} is on no panel`);
    }
  });

  test('every expression parses as PromQL (promtool check rules)', (t) => {
    if (spawnSync('promtool', ['--version']).error) {
      t.skip('promtool is not installed (Debian package prometheus): syntax not checked');
      return;
    }
    const tmp = mkdtempSync(join(tmpdir(), 'weft-grafana-'));
    try {
      // Grafana's variables become what they expand to
      const rules = exprs.map((e, i) => ({
        record: `weft:panel_${i}`,
        expr: e.replaceAll('$__rate_interval', '5m').replaceAll('$instance', '.*'),
      }));
      const file = join(tmp, 'rules.yml');
      writeFileSync(file, JSON.stringify({ groups: [{ name: 'weft-dashboard', rules }] }));
      const r = spawnSync('promtool', ['check', 'rules', file], { encoding: 'utf8' });
      assert.equal(r.status, 0, r.stdout + r.stderr);
    } finally {
      rmSync(tmp, { recursive: true, force: true });
    }
  });

  test('panels have unique ids and query the dashboard datasource variable', () => {
    const ids = panels.map((p) => p.id);
    assert.equal(new Set(ids).size, ids.length);
    for (const p of panels.filter((p) => p.type !== 'row'))
      assert.equal(p.datasource?.uid, '${datasource}', p.title);
  });
});
