// The demo's table: the engine read from the daemons' log lines, and a bpf row that could not
// run (named, with its reason, not measured).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { DEMO_BACKENDS, daemonEngines, renderTable } from '../../../../src/control/demo/demo.js';

test('the default run has the bpf rows (vxlan and udp with --dataplane-engine=bpf) and wireguard', () => {
  assert.deepEqual(Object.keys(DEMO_BACKENDS), [
    'host-gw',
    'vxlan',
    'vxlan-userspace',
    'vxlan-bpf',
    'udp',
    'udp-bpf',
    'wireguard',
  ]);
  for (const name of ['vxlan-bpf', 'udp-bpf'])
    assert.deepEqual(DEMO_BACKENDS[name]!.flags, ['--dataplane-engine=bpf'], name);
});

test('no userspace dataplane started: the kernel moves the packets', () => {
  assert.deepEqual(daemonEngines([{ msg: 'ready' }, { msg: 'created vxlan device' }]), {
    engine: 'kernel',
    unavailable: null,
  });
});

test('the engine each daemon started, and why bpf fell back', () => {
  const lines = [
    {
      msg: 'bpf engine unavailable; the native engine runs instead',
      err: 'bpf engine unavailable (load: EPERM)',
    },
    { msg: 'userspace dataplane started', engine: 'native' },
    { msg: 'userspace dataplane started', engine: 'native' },
  ];
  assert.deepEqual(daemonEngines(lines), {
    engine: 'native',
    unavailable: 'bpf engine unavailable (load: EPERM)',
  });
  assert.deepEqual(
    daemonEngines([
      { msg: 'userspace dataplane started', engine: 'bpf' },
      { msg: 'userspace dataplane started', engine: 'native' },
    ]).engine,
    'bpf+native',
  );
});

test('the table names the engine; an unavailable row says why below it', () => {
  const out = renderTable([
    { backend: 'vxlan', engine: 'kernel', pairs: 6, reachable: 6, gbps: 14.2, rttAvgMs: 0.14 },
    {
      backend: 'udp-bpf',
      engine: 'native',
      pairs: 0,
      reachable: 0,
      gbps: null,
      rttAvgMs: null,
      unavailable: 'the bpf engine cannot run on this machine (load: EPERM)',
    },
  ]);
  const lines = out.split('\n');
  assert.match(lines[1]!, /^backend\s+engine\s+reachable\s+throughput\s+rtt avg$/);
  assert.match(out, /\nvxlan\s+kernel\s+6\/6\s+14\.20 Gbit\/s\s+0\.140 ms\n/);
  assert.match(out, /\nudp-bpf\s+native\s+unavailable\s+-\s+-\n/);
  assert.match(out, /\nudp-bpf: the bpf engine cannot run on this machine \(load: EPERM\)\n/);
});
