import { test } from 'node:test';
import assert from 'node:assert/strict';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import {
  DisposableStack,
  Racer,
  backoffDelay,
  retry,
  sleep,
} from '../../../src/common/lifecycle.js';
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

test('Racer: each race settles with its promise, or with the first long-lived one to settle', async () => {
  let stop!: (v: 'stopped') => void;
  const racer = new Racer<'stopped'>([new Promise((r) => (stop = r))]);
  assert.equal(await racer.race(Promise.resolve(1)), 1);
  await assert.rejects(racer.race(Promise.reject(new Error('boom'))), /boom/);
  const waiting = racer.race(new Promise<number>(() => {}));
  assert.equal(racer.pending, 1);
  stop('stopped');
  assert.equal(await waiting, 'stopped');
  assert.equal(await racer.race(new Promise<number>(() => {})), 'stopped', 'after: at once');
  assert.equal(racer.pending, 0);
});

test('Racer: a failing long-lived promise rejects the races in progress', async () => {
  let fail!: (e: Error) => void;
  const racer = new Racer<never>([new Promise((_, rej) => (fail = rej))]);
  const waiting = racer.race(new Promise<number>(() => {}));
  fail(new Error('dataplane died'));
  await assert.rejects(waiting, /dataplane died/);
});

test('Racer: a settled race keeps nothing alive through a promise that never settles', async () => {
  // Promise.race([p, never]) leaves a handler on `never` that holds the race's result (and so
  // whatever it resolved with) until `never` settles: in a loop, one more per turn, for ever.
  setFlagsFromString('--expose-gc');
  const gc = runInNewContext('gc') as () => void;
  const never = new Promise<never>(() => {});
  const racer = new Racer<never>([never]);
  const viaRacer = await (async () => {
    const big = { payload: new Array(1000).fill(0) };
    await racer.race(Promise.resolve(big));
    return new WeakRef(big);
  })();
  const viaRace = await (async () => {
    const big = { payload: new Array(1000).fill(0) };
    await Promise.race([Promise.resolve(big), never]);
    return new WeakRef(big);
  })();
  await new Promise((r) => setImmediate(r));
  gc();
  assert.equal(viaRacer.deref(), undefined, 'the Racer let go');
  assert.notEqual(viaRace.deref(), undefined, 'Promise.race held it (the leak this avoids)');
  assert.equal(racer.pending, 0);
});
