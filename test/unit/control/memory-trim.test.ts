/**
 * MemoryTrimmer: one trim after a large lease change has gone quiet (or after the longest delay
 * under steady churn), none for a trickle or with nothing changing. Timers are mocked: the
 * tests drive time and assert when the trim ran.
 */
import assert from 'node:assert/strict';
import { afterEach, beforeEach, describe, mock, test } from 'node:test';
import { MemoryTrimmer, noteLeaseChanges } from '../../../src/control/memory-trim.js';
import type { LeaseEvent } from '../../../src/control/lease/types.js';

let clock = 0;
beforeEach(() => {
  clock = 0;
  mock.timers.enable({ apis: ['setTimeout'] });
});
afterEach(() => mock.timers.reset());

/** Moves time on in 100 ms steps (a timer set by a timer that ran in a step runs in a later one). */
const advance = (ms: number) => {
  for (let left = ms; left > 0; left -= 100) {
    const step = Math.min(100, left);
    clock += step;
    mock.timers.tick(step);
  }
};

/** Each trim gives back `gives[i]` bytes (0 once they run out). */
function trimmer(o: { gives?: number[] } = {}) {
  const calls: Array<{ before: number; after: number; released: boolean }> = [];
  const gives = [...(o.gives ?? [0])];
  let rss = 100 << 20;
  const t = new MemoryTrimmer({
    trim: () => {
      const g = gives.shift() ?? 0;
      rss -= g;
      return g > 0;
    },
    quietMs: 1_000,
    minChanges: 10,
    maxDelayMs: 5_000,
    followUpMs: 2_000,
    rss: () => rss,
    now: () => clock,
    onTrim: (before, after, released) => calls.push({ before, after, released }),
  });
  return { t, calls };
}

describe('MemoryTrimmer', () => {
  test('trims once, quietMs after the last of enough changes, and reports the RSS it saw', () => {
    const { t, calls } = trimmer({ gives: [1 << 19] });
    t.note(6);
    t.note(6);
    advance(999);
    assert.equal(t.trims, 0);
    advance(1);
    assert.equal(t.trims, 1);
    assert.deepEqual(calls, [
      { before: 100 << 20, after: (100 << 20) - (1 << 19), released: true },
    ]);
    // half a MiB given back: no follow-up
    advance(60_000);
    assert.equal(t.trims, 1);
  });

  test('a trim that gave back 1 MiB or more is followed by another, up to three', () => {
    const { t, calls } = trimmer({ gives: [4 << 20, 2 << 20, 1 << 20, 1 << 20, 1 << 20] });
    t.note(10);
    advance(1_000);
    assert.equal(t.trims, 1);
    advance(1_999);
    assert.equal(t.trims, 1);
    advance(1);
    assert.equal(t.trims, 2);
    advance(60_000);
    assert.equal(t.trims, 4);
    assert.deepEqual(
      calls.map((c) => (c.before - c.after) >> 20),
      [4, 2, 1, 1],
    );
  });

  test('follow-ups stop at the first trim that gives back less than 1 MiB', () => {
    const { t } = trimmer({ gives: [4 << 20, 0] });
    t.note(10);
    advance(60_000);
    assert.equal(t.trims, 2);
  });

  test('fewer changes than minChanges arm nothing', () => {
    const { t } = trimmer();
    t.note(9);
    assert.equal(t.armed, false);
    advance(60_000);
    assert.equal(t.trims, 0);
  });

  test('each new batch pushes the trim back until the changes stop', () => {
    const { t } = trimmer();
    t.note(10);
    for (let i = 0; i < 3; i++) {
      advance(900);
      t.note(1);
    }
    assert.equal(t.trims, 0);
    advance(1_000);
    assert.equal(t.trims, 1);
  });

  test('steady churn still trims maxDelayMs after the first change it covers', () => {
    const { t } = trimmer();
    t.note(10);
    for (let i = 0; i < 20; i++) {
      advance(500);
      t.note(1);
    }
    // never 1 s quiet in 10 s of churn: trimmed 5 s after the first change, then 5 s after the
    // first change after that trim
    assert.equal(t.trims, 2);
  });

  test('close cancels a trim that was armed', () => {
    const { t } = trimmer();
    t.note(50);
    assert.equal(t.armed, true);
    t.close();
    advance(60_000);
    assert.equal(t.trims, 0);
    t.note(50);
    assert.equal(t.armed, false);
  });

  test('noteLeaseChanges passes batches through and counts their events', async () => {
    const { t } = trimmer();
    const ev = (i: number) => ({ type: 'added', lease: { key: `k${i}` } }) as unknown as LeaseEvent;
    async function* src() {
      yield [ev(1), ev(2), ev(3), ev(4), ev(5)];
      yield [ev(6), ev(7), ev(8), ev(9), ev(10)];
    }
    const seen: number[] = [];
    for await (const b of noteLeaseChanges(src(), t)) seen.push(b.length);
    assert.deepEqual(seen, [5, 5]);
    assert.equal(t.armed, true);
    t.close();
  });
});
