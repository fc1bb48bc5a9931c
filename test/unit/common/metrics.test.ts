/**
 * The registration helpers over prom-client (src/common/metrics.ts): a family is created once
 * per registry and found again afterwards, known label values are exported at 0 from the start
 * (counters, gauges, histograms), and a name registered as another type is refused; and
 * TimedEvents, which records a large flush's observations a slice per event-loop turn.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  DURATION_BUCKETS,
  Registry,
  counterOn,
  gaugeOn,
  histogramOn,
  TimedEvents,
  labelCombinations,
} from '../../../src/common/metrics.js';

describe('counterOn / gaugeOn / histogramOn', () => {
  test('the same name on the same registry is the same family', () => {
    const r = new Registry();
    const a = counterOn(r, { name: 'weft_x_total', help: 'X.' });
    const b = counterOn(r, { name: 'weft_x_total', help: 'X.' });
    assert.equal(a, b);
    assert.notEqual(counterOn(new Registry(), { name: 'weft_x_total', help: 'X.' }), a);
  });

  test('known label values are exported at 0 before anything happens', async () => {
    const r = new Registry();
    counterOn(r, {
      name: 'weft_r_total',
      help: 'R.',
      labelNames: ['result', 'store'],
      known: { result: ['ok', 'error'], store: ['etcd'] },
    });
    gaugeOn(r, { name: 'weft_g', help: 'G.', labelNames: ['f'], known: { f: ['a'] } });
    const text = await r.metrics();
    assert.match(text, /^weft_r_total\{result="ok",store="etcd"\} 0$/m);
    assert.match(text, /^weft_r_total\{result="error",store="etcd"\} 0$/m);
    assert.match(text, /^weft_g\{f="a"\} 0$/m);
  });

  test('a histogram has every known series with empty buckets, and an unlabelled one its own', async () => {
    const r = new Registry();
    histogramOn(r, { name: 'weft_h_seconds', help: 'H.', labelNames: ['t'], known: { t: ['a'] } });
    histogramOn(r, { name: 'weft_u_seconds', help: 'U.' });
    const text = await r.metrics();
    assert.match(text, /^weft_h_seconds_bucket\{le="\+Inf",t="a"\} 0$/m);
    assert.match(text, /^weft_h_seconds_count\{t="a"\} 0$/m);
    assert.match(text, /^weft_u_seconds_count 0$/m);
    const buckets = text.match(/^weft_u_seconds_bucket/gm)!;
    assert.equal(buckets.length, DURATION_BUCKETS.length + 1); // and +Inf
  });

  test('a name registered as another type is refused', () => {
    const r = new Registry();
    gaugeOn(r, { name: 'weft_same', help: 'S.' });
    assert.throws(() => counterOn(r, { name: 'weft_same', help: 'S.' }), /gauge, not a counter/);
  });
});

test('labelCombinations: every combination in label order; none when a label has no values', () => {
  assert.deepEqual(labelCombinations(['a', 'b'], { a: ['1', '2'], b: ['x'] }), [
    { a: '1', b: 'x' },
    { a: '2', b: 'x' },
  ]);
  assert.deepEqual(labelCombinations(['a'], { a: [] }), []);
  assert.deepEqual(labelCombinations([], {}), [{}]);
});

describe('TimedEvents', () => {
  const nextTurn = () => new Promise<void>((resolve) => setImmediate(resolve));
  const recorder = () => {
    const seen: number[] = [];
    return { seen, timed: new TimedEvents((s) => seen.push(s), 4) };
  };

  test('a flush of up to a slice is observed before took() returns', () => {
    const { seen, timed } = recorder();
    const now = performance.now();
    timed.took([now, now, now]);
    assert.equal(seen.length, 3);
    assert.equal(timed.pending, 0);
  });

  test('each value is the time from its receipt to took()', () => {
    const { seen, timed } = recorder();
    const now = performance.now();
    timed.took([now - 2000, now - 500]);
    assert.ok(seen[0]! >= 2 && seen[0]! < 60, `${seen[0]}`);
    assert.ok(seen[1]! >= 0.5 && seen[1]! < seen[0]!, `${seen[1]}`);
  });

  test('a larger flush records a slice now, then a slice per turn, giving the loop back between', async () => {
    const { seen, timed } = recorder();
    timed.took(new Array<number>(10).fill(performance.now()));
    assert.equal(seen.length, 4);
    // queued behind the first slice's turn: runs before the last slice is recorded
    let between = -1;
    setImmediate(() => (between = seen.length));
    await nextTurn();
    await nextTurn();
    assert.equal(between, 8);
    await nextTurn();
    assert.equal(seen.length, 10);
    assert.equal(timed.pending, 0);
  });

  test('a flush while slices are still waiting is queued behind them, none lost', async () => {
    const { seen, timed } = recorder();
    const now = performance.now();
    timed.took(new Array<number>(6).fill(now - 1000));
    timed.took([now]);
    assert.equal(seen.length, 4);
    assert.equal(timed.pending, 3);
    while (timed.pending > 0) await nextTurn();
    assert.equal(seen.length, 7);
    // in order: the later flush's value last
    assert.ok(seen[6]! < seen[0]!);
  });
});
