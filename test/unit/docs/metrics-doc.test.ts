/**
 * docs/metrics.md is generated from the code (scripts/metrics-doc.ts registers every weft_*
 * family with the daemon's own functions) and stays in step: the file matches a fresh render,
 * and every weft_* name written in src/ is one the catalog registers.
 */
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { test } from 'node:test';
import { METRICS_DOC, metricFamilies, renderMetricsDoc } from '../../../scripts/metrics-doc.js';

const SRC = resolve(import.meta.dirname, '../../../src');

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory()
      ? sourceFiles(join(dir, e.name))
      : e.name.endsWith('.ts')
        ? [join(dir, e.name)]
        : [],
  );
}

test('docs/metrics.md is what `npm run docs:metrics` writes from the code today', async () => {
  assert.equal(
    readFileSync(METRICS_DOC, 'utf8'),
    renderMetricsDoc(await metricFamilies()),
    'docs/metrics.md is out of step with the code: run `npm run docs:metrics`',
  );
});

test('every weft_* metric named in src/ is in the catalog (register new families there)', async () => {
  const known = new Set((await metricFamilies()).map((f) => f.name));
  assert.ok(known.size > 20, `the catalog holds ${known.size} families`);
  for (const file of sourceFiles(SRC)) {
    for (const m of readFileSync(file, 'utf8').matchAll(/['"`](weft_[a-z0-9_]*[a-z0-9])['"`]/g)) {
      assert.ok(
        known.has(m[1]!),
        `${m[1]} (${file.slice(SRC.length + 1)}) is not in scripts/metrics-doc.ts's catalog`,
      );
    }
  }
});
