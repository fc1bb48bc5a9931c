/**
 * The young-generation collection on demand: through V8's gc() when the process exposes it
 * (bin/weft's --expose-gc), nothing when it does not, and paced by the bytes read.
 */
import assert from 'node:assert/strict';
import { afterEach, test } from 'node:test';
import { YoungGcPacer, collectYoung } from '../../../src/common/young-gc.js';

const g = globalThis as { gc?: unknown };
const saved = g.gc;
afterEach(() => {
  if (saved === undefined) delete g.gc;
  else g.gc = saved;
});

/** Installs a recording gc(); returns what it was called with. */
function spyGc(): unknown[] {
  const calls: unknown[] = [];
  g.gc = (o: unknown) => calls.push(o);
  return calls;
}

test('collectYoung asks V8 for a minor collection when gc() is exposed', () => {
  const calls = spyGc();
  assert.equal(collectYoung(), true);
  assert.deepEqual(calls, [{ type: 'minor' }]);
});

test('collectYoung does nothing without --expose-gc', () => {
  delete g.gc;
  assert.equal(collectYoung(), false);
});

test('the pacer collects when an interval of bytes has been read, then counts again', () => {
  const calls = spyGc();
  const p = new YoungGcPacer(1000);
  for (let i = 0; i < 3; i++) p.read(400);
  assert.equal(calls.length, 1, 'at 1,200 bytes');
  p.read(400);
  p.read(400);
  assert.equal(calls.length, 1, '800 bytes since');
  p.read(400);
  assert.equal(calls.length, 2, '1,200 bytes since');
});
