/**
 * `npm run bench -- --quick` (or a run of some paths) must not replace the committed
 * bench/results/latest.* that the README shows; only a full run may (issue 13 §3).
 */
import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { isFullRun, markdownTable, saveResults } from '../../../bench/report.js';

const tmp = mkdtempSync(join(tmpdir(), 'weft-bench-results-'));
after(() => rmSync(tmp, { recursive: true, force: true }));
const out = { json: '{"run":2}\n', svg: '<svg/>', table: '| new |\n' };

test('a quick or partial run writes its own file and leaves latest.* as they were', () => {
  writeFileSync(join(tmp, 'latest.json'), '{"run":1}\n');
  writeFileSync(join(tmp, 'latest.md'), '| old |\n');
  for (const o of [
    { quick: true, paths: [] },
    { quick: false, paths: ['vxlan'] },
  ]) {
    assert.equal(isFullRun(o), false);
    saveResults(tmp, new Date('2026-11-23T10:00:00Z'), out, isFullRun(o));
  }
  assert.equal(readFileSync(join(tmp, 'latest.json'), 'utf8'), '{"run":1}\n');
  assert.equal(readFileSync(join(tmp, 'latest.md'), 'utf8'), '| old |\n');
  assert.deepEqual(readdirSync(tmp).sort(), [
    '2026-11-23T10-00-00-000Z.json',
    'latest.json',
    'latest.md',
  ]);
});

test('a full run replaces latest.json, latest.svg and latest.md', () => {
  const o = { quick: false, paths: [] };
  assert.equal(isFullRun(o), true);
  saveResults(tmp, new Date('2026-11-23T11:00:00Z'), out, isFullRun(o));
  assert.equal(readFileSync(join(tmp, 'latest.json'), 'utf8'), out.json);
  assert.equal(readFileSync(join(tmp, 'latest.svg'), 'utf8'), out.svg);
  assert.equal(readFileSync(join(tmp, 'latest.md'), 'utf8'), out.table);
});

test('markdownTable pads every column to its widest cell and fills missing cells', () => {
  assert.equal(
    markdownTable(['a', 'long head'], [['wide cell', 'x'], ['y']]),
    [
      '| a         | long head |',
      '|-----------|-----------|',
      '| wide cell | x         |',
      '| y         |           |',
      '',
    ].join('\n'),
  );
});
