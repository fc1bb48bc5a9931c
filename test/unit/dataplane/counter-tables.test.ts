/**
 * The counter tables (src/dataplane/stats.ts) are the only list of each counter family: the
 * committed C++ headers are exactly what scripts/native-tables.ts writes from them (`npm run
 * build` rewrites them; the npm install script builds from the committed ones), and every
 * Prometheus family the rows name keeps one help text.
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { nativeTables } from '../../../scripts/native-tables.js';
import {
  BPF_COUNTER_TABLE,
  DROP_REASON_TABLE,
  NATIVE_COUNTER_TABLE,
} from '../../../src/dataplane/stats.js';
import type { CounterRow } from '../../../src/dataplane/stats.js';

const root = join(import.meta.dirname, '..', '..', '..');

describe('counter tables', () => {
  it('the generated C++ headers are up to date (npm run build rewrites them)', () => {
    for (const [path, text] of Object.entries(nativeTables())) {
      assert.equal(readFileSync(join(root, path), 'utf8'), text, `${path} is stale`);
    }
  });

  it('name each counter and each Prometheus series once per family', () => {
    const tables: ReadonlyArray<readonly CounterRow[]> = [
      NATIVE_COUNTER_TABLE,
      DROP_REASON_TABLE,
      BPF_COUNTER_TABLE,
    ];
    const metrics = new Set<string>();
    for (const rows of tables) {
      const names = rows.map((r) => r.name);
      assert.equal(new Set(names).size, names.length, names.join(','));
      for (const r of rows) {
        assert.match(r.name, /^[a-z][a-z0-9_]*$/);
        if (r.metric) {
          assert.ok(!metrics.has(r.metric), r.metric);
          metrics.add(r.metric);
        }
      }
      const series = rows.flatMap((r) =>
        r.series ? [`${r.series.family.name}/${r.series.value}`] : [],
      );
      assert.equal(new Set(series).size, series.length, series.join(','));
    }
  });
});
