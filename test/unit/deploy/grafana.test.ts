/**
 * deploy/grafana/weft.json, the dashboard for the weft_* metrics: every query names only metrics
 * weft exports (the catalog docs/metrics.md is generated from), with labels those metrics have,
 * parses as PromQL (promtool), and every family is on some panel.
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

describe('deploy/grafana/weft.json', () => {
  test('every expression names weft metrics, and only ones weft exports', async () => {
    const families = new Map((await metricFamilies()).map((f) => [f.name, f]));
    assert.ok(exprs.length > 20);
    for (const expr of exprs) {
      const names = [...expr.matchAll(/\bweft_[a-z0-9_]+/g)].map((m) => m[0]);
      assert.ok(names.length > 0, `${expr}: names no weft metric`);
      for (const n of names) assert.ok(families.has(n), `${expr}: ${n} is not a weft metric`);
      for (const m of expr.matchAll(/\b(weft_[a-z0-9_]+)\{([^}]*)\}/g)) {
        const family = families.get(m[1]!)!;
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
          const any = names.some((n) => families.get(n)!.labels.includes(label));
          assert.ok(TARGET_LABELS.has(label) || any, `${expr}: no metric in it has ${label}`);
        }
      }
    }
  });

  test('every weft family is on a panel', async () => {
    const all = exprs.join('\n');
    for (const f of await metricFamilies()) {
      assert.match(all, new RegExp(`\\b${f.name}\\b`), `${f.name} is on no panel`);
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
