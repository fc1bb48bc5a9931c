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
 *
 * The second describe: dual-stack, one weft node (`--dataplane-engine=bpf`, embedded store)
 * against a kernel node built as flannel builds a dual-stack one (test/helpers/kernel-vxlan-node.ts):
 *
 *            underlay br0 (L2)          10.250.0.0/24, fd00:250::/64
 *     ┌──────────┴──────────────────────────┐
 *   node 0 (bpf): TUN flannel.1 (both        kernel node: eth0 10.250.0.9, fd00:250::9
 *   families), weft_tx/weft_rx; eth0         flannel.1    vxlan local 10.250.0.9
 *   10.250.0.1, fd00:250::1                  flannel-v6.1 vxlan local fd00:250::9
 *   pod 10.5.x.2, fd00:5:…::2                kpod 10.5.200.2, fd00:5:0:ff00::2
 *
 * IPv4 pods ride IPv4 VXLAN to the kernel node's flannel.1, IPv6 pods IPv6 VXLAN to its
 * flannel-v6.1, both from the programs of one engine.
 */
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import {
  Cluster,
  type ClusterNode,
  HEALTH_PORT,
  PACKAGE_ROOT,
  waitFor,
} from '../../src/testbed/cluster.js';
import { isRoot, nsExecAsync } from '../../src/testbed/netns.js';
import { iperf, ping, waitForMesh } from '../../src/testbed/probes.js';
import {
  TCP_FIXED,
  UDP_PACED,
  assertBothWays,
  assertCounted,
  delivered,
} from '../helpers/carried.js';
import { sample, scrape } from '../helpers/scrape.js';
import { captureText } from '../helpers/capture.js';
import { KERNEL_NODE, addKernelVxlanNode } from '../helpers/kernel-vxlan-node.js';

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

describe(
  'bpf engine, dual-stack ⇄ a dual-stack kernel vxlan node (flannel.1 + flannel-v6.1)',
  { skip },
  () => {
    let c: Cluster;
    let kns = '';
    let kpod = '';
    const KPOD = { ip: KERNEL_NODE.pod, ip6: KERNEL_NODE.pod6 };
    const metrics = () => scrape(c.nodes[0]!.ns, HEALTH_PORT);
    /** `count` replies (-w: sending on until they came, ≤ 30 s; a late reply is no failure). */
    const ping6 = (ns: string, dst: string, count = 1) =>
      nsExecAsync(ns, 'ping', ['-c', String(count), '-i', '0.2', '-w', '30', dst], 60_000);

    before(async () => {
      c = await Cluster.create({
        nodes: 1,
        dualStack: true,
        backend: { Type: 'vxlan', Dataplane: 'userspace' },
        flags: ['--dataplane-engine=bpf'],
      });
      const k = await addKernelVxlanNode(c, true);
      kns = k.ns;
      kpod = k.pod;
    });
    after(async () => {
      await c?.destroy();
    });

    test('the node runs the bpf engine on a dual-stack underlay', async () => {
      assert.equal(sample(await metrics(), 'weft_dataplane_engine', '{engine="bpf"}'), 1);
    });

    test('IPv4 pods ride IPv4 VXLAN, IPv6 pods IPv6 VXLAN, both ways (captured on the kernel node)', async () => {
      const pod = c.pods[0]!;
      await waitFor(
        async () => {
          await ping6(pod.ns, KPOD.ip);
          await ping6(pod.ns, KPOD.ip6);
          return true;
        },
        20_000,
        'bpf → kernel pings',
      );
      await ping6(kpod, pod.ip, 2);
      await ping6(kpod, pod.ip6!, 2);
      const seen = (filter: string, dst: string) =>
        captureText(c.scope, kns, filter, 2, () => ping6(pod.ns, dst, 2));
      const v6 = await seen('ip6 and udp dst port 8472', KPOD.ip6);
      assert.match(v6, /IP6 fd00:250::1\.\d+ > fd00:250::9\.8472: /, v6);
      const v4 = await seen('ip and udp dst port 8472', KPOD.ip);
      assert.match(v4, /IP 10\.250\.0\.1\.\d+ > 10\.250\.0\.9\.8472: /, v4);
    });

    test('iperf3 TCP both ways, IPv4 and IPv6, through the programs', async () => {
      const pod = c.pods[0]!;
      const m0 = await metrics();
      for (const [podIp, kIp] of [
        [pod.ip, KPOD.ip],
        [pod.ip6!, KPOD.ip6],
      ] as const) {
        // What arrived, in the node's counters; not a rate (the machine's load).
        await assertBothWays(c, pod, podIp, { ns: kpod, ip: kIp }, TCP_FIXED, () => metrics());
      }
      const m1 = await metrics();
      // The programs moved it: the userspace engine read almost nothing from its TUN, and the
      // kernel sender's datagrams (well-formed, one each) were all decapsulated in the kernel.
      const grew = (name: string, labels = '') =>
        sample(m1, name, labels) - sample(m0, name, labels);
      assert.ok(grew('weft_dataplane_tun_reads_total') < 100);
      assert.equal(grew('weft_dataplane_bpf_passed_packets_total', '{direction="rx"}'), 0);
    });
  },
);
