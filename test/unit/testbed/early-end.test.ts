import assert from 'node:assert/strict';
import { test } from 'node:test';
import { onEarlyEnd } from '../../../src/testbed/early-end.js';

const EVENTS = ['SIGINT', 'SIGTERM', 'SIGHUP', 'uncaughtException', 'unhandledRejection'] as const;
const counts = () => EVENTS.map((e) => process.listenerCount(e));

test('onEarlyEnd: off() leaves the process handlers as they were', () => {
  const before = counts();
  const e = onEarlyEnd('test', () => undefined);
  assert.deepEqual(
    counts(),
    before.map((n) => n + 1),
  );
  assert.equal(e.stopping, false);
  e.off();
  assert.deepEqual(counts(), before);
});
