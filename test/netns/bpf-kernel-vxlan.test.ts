/**
 * The bpf engine against a weft kernel-vxlan node, both run by the real daemon (Kubernetes mode:
 * each node reads its own net-conf, so one runs kernel vxlan and the other userspace vxlan with
 * `--dataplane-engine=bpf`), pods made by weft-cni:
 *
 *                  underlay weft-<pid>-0: br0 10.250.0.254/24 ─ fake API server :6443
 *            u0 ┌────────────────────┴─────────┬─u1
 *   ┌─ eth0 10.250.0.1 ──────┐      ┌─ eth0 10.250.0.2 ─────────────────────────┐
 *   │ A: vxlan "kernel"      │      │ B: vxlan "userspace", --dataplane-engine=bpf│
 *   │  flannel.1 (vxlan dev) │      │  flannel.1 TUN (weft_tx), eth0 (weft_rx),   │
 *   │                        │      │  cni0 (weft_bridge)                         │
 *   └──┬─────────────────────┘      └──┬──────────────────────────────────────────┘
 *    pod 10.5.1.x                    pod 10.5.2.x
 *
 * Pods ping both ways and iperf3 TCP and UDP cross both ways; B's /metrics shows the programs,
 * not the userspace engine, carried it (and the kernel's TCP super-packets went past B's bridge).
 */
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Cluster, type ClusterNode, HEALTH_PORT, PACKAGE_ROOT } from '../../src/testbed/cluster.js';
import { isRoot, nsExecAsync } from '../../src/testbed/netns.js';
import { iperf, ping, waitForMesh } from '../../src/testbed/probes.js';
import { TCP_FIXED, UDP_PACED, assertCounted, delivered } from '../helpers/carried.js';
import { sample, scrape } from '../helpers/scrape.js';

const KUBE_APISERVER = join(PACKAGE_ROOT, 'test', 'helpers', 'kube-apiserver-child.ts');
const skip = isRoot() ? false : 'needs root (network namespaces, bpf)';

describe('bpf engine ⇄ weft kernel vxlan node (real daemons)', { skip }, () => {
  let c: Cluster;
  let A: ClusterNode;
  let B: ClusterNode;
  const metrics = () => scrape(B.ns, HEALTH_PORT);

  before(async () => {
    c = await Cluster.build({
      nodes: 2,
      store: 'kube',
      kubeApiServer: KUBE_APISERVER,
      backend: [
        { Type: 'vxlan', Dataplane: 'kernel' },
        { Type: 'vxlan', Dataplane: 'userspace' },
      ],
      podWiring: 'cni',
    });
    await c.startDaemon(0);
    await c.startDaemon(1, ['--dataplane-engine=bpf']);
    await c.addPods(1);
    [A, B] = c.nodes as [ClusterNode, ClusterNode];
  });
  after(async () => {
    await c?.destroy();
  });

  test('B runs the bpf engine, A a kernel vxlan device', async () => {
    const m = await metrics();
    assert.equal(sample(m, 'weft_dataplane_engine', '{engine="bpf"}'), 1);
    const link = await nsExecAsync(A.ns, 'ip', ['-d', 'link', 'show', 'flannel.1']);
    assert.match(link, /vxlan id 1 /);
  });

  test('pods ping both ways', async () => {
    assert.equal(await waitForMesh(c.pods, 15_000), 0, 'pod pairs unreachable');
    for (const [from, to] of [
      [A, B],
      [B, A],
    ] as const) {
      const p = await ping(from.pods[0]!.ns, to.pods[0]!.ip, 5, 0.05);
      assert.equal(p.received, 5, `${from.name} → ${to.name}`);
    }
  });

  test('iperf3 TCP and UDP cross both ways, through the programs', async () => {
    const m0 = await metrics();
    const arrived = { toB: 0, toA: 0 };
    for (const [from, to] of [
      [A, B],
      [B, A],
    ] as const) {
      for (const args of [TCP_FIXED, UDP_PACED]) {
        const run = await iperf(c.scope, to.pods[0]!.ns, to.pods[0]!.ip, from.pods[0]!.ns, args);
        arrived[to === B ? 'toB' : 'toA'] += delivered(run.json);
      }
    }
    const m1 = await metrics();
    const grew = (name: string, labels = '') => sample(m1, name, labels) - sample(m0, name, labels);
    // Both directions moved in the kernel: the userspace engine read almost nothing from its TUN
    // and its socket, while the totals (programs included) carried the traffic.
    assertCounted(m0, m1, 'weft_dataplane_rx_bytes_total', arrived.toB);
    assertCounted(m0, m1, 'weft_dataplane_tx_bytes_total', arrived.toA);
    assert.ok(grew('weft_dataplane_tun_reads_total') < 100);
    assert.equal(grew('weft_dataplane_bpf_passed_packets_total', '{direction="rx"}'), 0);
    // The kernel vxlan sender's TCP super-packets went to B's pod past the bridge.
    assert.ok(grew('weft_dataplane_bpf_bridge_bypass_packets_total') > 0);
  });
});
