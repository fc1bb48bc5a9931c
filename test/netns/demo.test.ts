/**
 * `weft demo` end to end, as a user runs it: the real bin/weft, real namespaces, the real CNI
 * plugins through weft-cni, real daemons; then nothing of it may be left behind.
 *
 *   underlay ns (br0) ── node 0 (weft daemon, cni0 ── pod) ── node 1 (weft daemon, cni0 ── pod)
 *   per backend: a fresh cluster; pods ping across nodes and iperf3 runs between them
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync } from 'node:fs';
import { isRoot } from '../../src/control/testbed/netns.js';
import { runWeft } from '../helpers/daemon.js';

const skip = isRoot() ? false : 'needs root (network namespaces)';

function demoNamespaces(): string[] {
  try {
    return readdirSync('/run/netns').filter((n) => n.startsWith('weft-demo-'));
  } catch {
    return [];
  }
}

test(
  'weft demo: pods on two nodes reach each other through weft-cni and the daemons, then everything is gone',
  { skip },
  async () => {
    const before = demoNamespaces();
    const r = await runWeft([
      'demo',
      '--nodes',
      '2',
      '--backend',
      'host-gw,vxlan-userspace',
      '--iperf-seconds',
      '1',
    ]);
    assert.equal(r.code, 0, `${r.stdout}\n${r.stderr.slice(-3000)}`);
    const rows = r.stdout.split('\n').filter((l) => /^(host-gw|vxlan-userspace)\s/.test(l));
    assert.equal(rows.length, 2, r.stdout);
    for (const row of rows) {
      const [, reach, gbps] = row.split(/\s{2,}/);
      assert.equal(reach, '2/2', row);
      assert.match(gbps!, /^\d+\.\d+ Gbit\/s$/, row);
    }
    assert.deepEqual(demoNamespaces(), before);
  },
);

test('weft demo refuses an unknown backend with exit 2 naming the flag', { skip }, async () => {
  const r = await runWeft(['demo', '--backend', 'carrier-pigeon']);
  assert.equal(r.code, 2);
  assert.match(r.stderr, /--backend: unknown backend "carrier-pigeon"/);
});
