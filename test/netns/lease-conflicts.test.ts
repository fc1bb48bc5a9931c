/**
 * Issue #17.3: bad peer leases are skipped and counted before any backend programs them, while
 * traffic to the good peers keeps flowing. Three nodes on a real etcd (inside the underlay
 * namespace); two leases are written into etcd by hand:
 *
 *   10.5.N.0/25   inside node 1's subnet /24 (where its pod 10.5.N.2 lives): programmed, it would
 *                 take node 1's pods from every other node (the more specific route wins)
 *   10.9.0.0/24   outside the cluster network 10.5.0.0/16
 *
 * Per backend (kernel vxlan, host-gw, udp, userspace vxlan): nodes 0 and 2 count
 * `weft_lease_conflicts_total{reason="overlaps_peer"}` and `{reason="outside_network"}` once,
 * node 1 counts `overlaps_own`; every pod pair still pings; /metrics passes promtool.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { after, before, describe, test } from 'node:test';
import { Cluster, ETCD_URL, HEALTH_PORT, waitFor } from '../../src/testbed/cluster.js';
import { pingFailures } from '../../src/testbed/probes.js';
import { isRoot, nsExec } from '../../src/testbed/netns.js';
import { etcdSkipReason } from '../helpers/etcd.js';

const skip = !isRoot() ? 'needs root (network namespaces)' : (etcdSkipReason() ?? false);

const BACKENDS: ReadonlyArray<{ backend: Record<string, unknown>; type: string }> = [
  { backend: { Type: 'vxlan' }, type: 'vxlan' },
  { backend: { Type: 'host-gw' }, type: 'host-gw' },
  { backend: { Type: 'udp' }, type: '' },
  { backend: { Type: 'vxlan', Dataplane: 'userspace' }, type: 'vxlan' },
];

function metrics(ns: string): string {
  return nsExec(ns, process.execPath, [
    '-e',
    `fetch('http://127.0.0.1:${HEALTH_PORT}/metrics').then(r=>r.text()).then(t=>process.stdout.write(t))`,
  ]);
}

function conflicts(ns: string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const m of metrics(ns).matchAll(/^weft_lease_conflicts_total\{reason="(\w+)"\} (\d+)$/gm))
    out[m[1]!] = Number(m[2]);
  return out;
}

for (const { backend, type } of BACKENDS) {
  const label = `${String(backend.Type)}${backend.Dataplane ? ` (${String(backend.Dataplane)})` : ''}`;
  describe(`bad peer leases are skipped and counted, ${label}`, { skip }, () => {
    let c: Cluster;
    before(async () => {
      c = await Cluster.create({ backend, store: 'etcd' });
      const victim = c.nodes[1]!.env.FLANNEL_SUBNET!.split('/')[0]!.replace(/\.1$/, '.0');
      const value = (n: number) =>
        JSON.stringify({
          PublicIP: `10.250.0.${90 + n}`,
          PublicIPv6: null,
          BackendType: type,
          ...(type === 'vxlan' ? { BackendData: { VNI: 1, VtepMAC: `0a:00:00:00:00:9${n}` } } : {}),
        });
      const put = (key: string, v: string) =>
        nsExec(c.underlay, 'etcdctl', ['--endpoints', ETCD_URL, 'put', key, v]);
      put(`/coreos.com/network/subnets/${victim}-25`, value(1));
      put('/coreos.com/network/subnets/10.9.0.0-24', value(2));
    });
    after(async () => {
      await c?.destroy();
    });

    test('each node counts each bad lease once, under its reason', async () => {
      const want = [
        { overlaps_peer: 1, outside_network: 1, overlaps_own: 0 },
        { overlaps_peer: 0, outside_network: 1, overlaps_own: 1 },
        { overlaps_peer: 1, outside_network: 1, overlaps_own: 0 },
      ];
      for (const [i, w] of want.entries()) {
        const ns = c.nodes[i]!.ns;
        const got = await waitFor(
          () => {
            const x = conflicts(ns);
            return x.outside_network === 1 ? x : false;
          },
          10_000,
          `node ${i} counts the bad leases`,
        );
        if (!got) throw new Error('unreachable');
        assert.deepEqual(
          {
            overlaps_peer: got.overlaps_peer,
            outside_network: got.outside_network,
            overlaps_own: got.overlaps_own,
          },
          w,
          `node ${i}`,
        );
        assert.equal(got.vtep_mac, 0);
        assert.equal(got.backend_data, 0);
      }
      execFileSync('promtool', ['check', 'metrics'], {
        input: metrics(c.nodes[0]!.ns),
        encoding: 'utf8',
      });
    });

    test('the skipped leases are logged once each, with the lease they clash with', async () => {
      const logged = () => c.nodes[0]!.logs.filter((l) => l.msg === 'peer lease skipped: conflict');
      await waitFor(() => logged().length >= 2, 10_000, 'the conflicts in the log');
      const lines = logged();
      assert.deepEqual(lines.map((l) => l.reason).sort(), ['outside_network', 'overlaps_peer']);
      const overlap = lines.find((l) => l.reason === 'overlaps_peer')!;
      assert.equal(
        (overlap.conflictsWith as { key: string }).key,
        c.nodes[1]!.env.FLANNEL_SUBNET!.replace(/\.1\/24$/, '.0-24'),
      );
    });

    test('every pod pair still pings', async () => {
      assert.deepEqual(await pingFailures(c.pods), []);
    });
  });
}
