import { test } from 'node:test';
import assert from 'node:assert/strict';
import { retry, sleep, backoffDelay, DisposableStack } from '../../../src/common/lifecycle.js';
import { WeftError } from '../../../src/common/errors.js';

test('retry stops after the allowed attempts and throws the last failure', async () => {
  let calls = 0;
  await assert.rejects(
    retry(
      async () => {
        calls++;
        throw new Error(`fail ${calls}`);
      },
      { attempts: 3, initialMs: 1, maxMs: 2 },
    ),
    /fail 3/,
  );
  assert.equal(calls, 3);
});

test('retry does not retry a failure the predicate rejects', async () => {
  let calls = 0;
  await assert.rejects(
    retry(
      async () => {
        calls++;
        throw new Error('fatal');
      },
      { attempts: 5, initialMs: 1, maxMs: 1, isRetriable: () => false },
    ),
    /fatal/,
  );
  assert.equal(calls, 1);
});

test('sleep rejects with an abort error when the signal fires', async () => {
  const ac = new AbortController();
  const p = sleep(10_000, ac.signal);
  ac.abort();
  await assert.rejects(
    p,
    (err: unknown) => err instanceof WeftError && err.code === 'WEFT_ERR_ABORTED',
  );
});

test('backoff grows by the factor and is capped', () => {
  const o = { initialMs: 100, maxMs: 5000, jitter: 0 };
  assert.deepEqual(
    [0, 1, 2, 3, 10].map((a) => backoffDelay(a, o)),
    [100, 200, 400, 800, 5000],
  );
});

test('disposable stack runs cleanups in reverse and keeps going after a failure', async () => {
  const order: number[] = [];
  const s = new DisposableStack();
  s.defer(() => order.push(1));
  s.defer(() => {
    throw new Error('x');
  });
  s.defer(() => order.push(3));
  const errors = await s.dispose();
  assert.deepEqual(order, [3, 1]);
  assert.equal(errors.length, 1);
});
