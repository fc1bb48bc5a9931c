/**
 * The registration helpers over prom-client (src/common/metrics.ts): a family is created once
 * per registry and found again afterwards, known label values are exported at 0 from the start
 * (counters, gauges, histograms), and a name registered as another type is refused.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  DURATION_BUCKETS,
  Registry,
  counterOn,
  gaugeOn,
  histogramOn,
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
