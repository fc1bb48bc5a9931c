/**
 * The fault suite's pure parts: a row's verdict from what happened, the table (row, backend,
 * figure, goal, verdict), the run's exit status, metric sums, and picking rows and backends.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  exitStatus,
  faultTable,
  metricSum,
  resultOf,
  secs,
  tally,
} from '../../../../bench/faults/report.js';
import { BACKENDS, pick } from '../../../../bench/faults/run.js';
import { ROWS } from '../../../../bench/faults/rows.js';

const row = { id: 'kill9', title: 'kill -9 + restart', goal: 'blackout < 1 s' };

test('a verdict comes from whether the goal held, a reason it does not apply, or an error', () => {
  const pass = resultOf(row, 'udp', {
    outcome: { figure: 'blackout 0.30 s', met: true, values: { blackoutMs: 300 } },
  });
  assert.deepEqual(
    [pass.verdict, pass.figure, pass.goal, pass.values],
    ['pass', 'blackout 0.30 s', 'blackout < 1 s', { blackoutMs: 300 }],
  );
  const fail = resultOf(row, 'udp', {
    outcome: { figure: 'blackout 2.80 s', met: false, values: {} },
  });
  assert.equal(fail.verdict, 'FAIL');
  const na = resultOf(row, 'host-gw', { notApplicable: 'host-gw owns no device' });
  assert.deepEqual([na.verdict, na.figure], ['n/a', 'host-gw owns no device']);
  const err = resultOf(row, 'vxlan', { error: new Error('etcd did not start\nstack...') });
  assert.deepEqual([err.verdict, err.figure], ['error', 'could not run: etcd did not start']);
  assert.equal(exitStatus([pass, na]), 0);
  assert.equal(exitStatus([pass, na, fail]), 1);
  assert.equal(exitStatus([pass, err]), 1);
  assert.equal(tally([pass, fail, na, err]), '1 pass, 1 FAIL, 1 n/a, 1 error');
});

test('the table has one line per result, columns row, backend, figure, goal, verdict', () => {
  const results = [
    resultOf(row, 'vxlan', { outcome: { figure: 'blackout 0.00 s', met: true, values: {} } }),
    resultOf(row, 'udp', { outcome: { figure: 'a | b\nc', met: false, values: {} } }),
  ];
  const lines = faultTable(results).trimEnd().split('\n');
  assert.equal(lines.length, 4);
  assert.match(lines[0]!, /^\| row +\| backend \| figure +\| goal +\| verdict \|$/);
  assert.match(
    lines[2]!,
    /^\| kill -9 \+ restart \| vxlan +\| blackout 0\.00 s +\| blackout < 1 s \| pass +\|$/,
  );
  // a pipe or newline in a figure cannot break the table
  assert.match(lines[3]!, /\| a \\\| b c +\|/);
  assert.match(lines[3]!, /\| FAIL +\|$/);
});

test('metricSum adds the samples whose labels match', () => {
  const text = [
    '# HELP weft_dataplane_dropped_packets_total Packets dropped',
    '# TYPE weft_dataplane_dropped_packets_total counter',
    'weft_dataplane_dropped_packets_total{reason="spoofed_source"} 7',
    'weft_dataplane_dropped_packets_total{reason="unknown_source"} 5',
    'weft_dataplane_dropped_packets_total_other 100',
    'weft_lease_peers 2',
  ].join('\n');
  assert.equal(metricSum(text, 'weft_dataplane_dropped_packets_total'), 12);
  assert.equal(
    metricSum(text, 'weft_dataplane_dropped_packets_total', { reason: 'unknown_source' }),
    5,
  );
  assert.equal(metricSum(text, 'weft_lease_peers'), 2);
  assert.equal(metricSum(text, 'weft_absent_total'), 0);
  assert.deepEqual([secs(370), secs(12_400)], ['0.37 s', '12.4 s']);
});

test('--rows and --backends pick by name, comma-separated or repeated; unknown names are refused', () => {
  assert.deepEqual(
    pick('backends', ['udp,vxlan', 'host-gw'], BACKENDS).map((b) => b.name),
    ['vxlan', 'host-gw', 'udp'],
  );
  assert.equal(pick('rows', [], ROWS).length, ROWS.length);
  assert.throws(() => pick('rows', ['kill9,nope'], ROWS), /--rows: unknown nope/);
});

test('every row either applies to a backend or says why not', () => {
  for (const b of BACKENDS)
    for (const r of ROWS) {
      const na = r.notApplicable(b);
      assert.ok(na === null || na.length > 10, `${r.id} on ${b.name}`);
    }
  // the campaign's rows all run on the userspace backends
  const udp = BACKENDS.find((b) => b.name === 'udp')!;
  assert.deepEqual(
    ROWS.filter((r) => r.notApplicable(udp) !== null).map((r) => r.id),
    ['delete-neighbour', 'delete-fdb'],
  );
});
