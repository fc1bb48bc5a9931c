/**
 * test/helpers/host-lock.ts: the lock namespace test files take over a host-wide path while
 * scripts/run-tests.mjs runs two of them at once.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { hostLock } from '../../helpers/host-lock.js';

const unique = (what: string) => `unit-${process.pid}-${what}`;

test('a second taker waits until the first releases', async () => {
  const name = unique('order');
  const order: string[] = [];
  const releaseFirst = await hostLock(name);
  const second = hostLock(name).then((release) => {
    order.push('second');
    release();
  });
  await new Promise((r) => setTimeout(r, 300));
  order.push('first releases');
  releaseFirst();
  await second;
  assert.deepEqual(order, ['first releases', 'second']);
  assert.equal(existsSync(join(tmpdir(), `weft-test-lock.${name}`)), false);
});

test('a lock left by a process that is gone is taken over', async () => {
  const name = unique('dead');
  const dir = join(tmpdir(), `weft-test-lock.${name}`);
  const gone = spawnSync(process.execPath, ['-e', '']).pid!; // exited and reaped: no such process now
  mkdirSync(dir);
  writeFileSync(join(dir, 'pid'), String(gone));
  const release = await hostLock(name);
  release();
  assert.equal(existsSync(dir), false);
});
