/**
 * Dual-stack userspace VXLAN against a dual-stack kernel vxlan node set up as flannel does it
 * (flannel.1 for IPv4 in IPv4, flannel-v6.1 for IPv6 in IPv6, each with its own VtepMAC in the
 * lease's BackendData / BackendV6Data): two `weft daemon`s with "Dataplane": "userspace"
 * (embedded store, EnableIPv6) and the kernel node programmed by hand from their leases.
 *
 *            underlay br0 (L2)               10.250.0.0/24, fd00:250::/64
 *     ┌──────────┼────────────┐
 *   node 0     node 1       kernel node: eth0 10.250.0.9, fd00:250::9
 *   TUN flannel.1 (both      flannel.1    vxlan id 1 local 10.250.0.9  (MAC 02:aa::09)
 *   families), sockets on    flannel-v6.1 vxlan id 1 local fd00:250::9 (MAC 02:aa::69)
 *   10.250.0.N:8472 and      cni0 10.5.200.1/24, fd00:5:0:ff00::1/64
 *   [fd00:250::N]:8472       kpod 10.5.200.2, fd00:5:0:ff00::2
 *   pod N.0 (v4 + v6)
 *
 * (The kernel node: test/helpers/kernel-vxlan-node.ts.) IPv4 pods ping and iperf3 both ways in IPv4 VXLAN, IPv6 pods both ways in IPv6 VXLAN (the
 * capture on the kernel node shows which outer family each pod family rides).
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { EmbeddedRegistry } from '../../src/control/registry/embedded.js';
import { Cluster, HEALTH_PORT, waitFor } from '../../src/testbed/cluster.js';
import { isRoot, nsExecAsync } from '../../src/testbed/netns.js';
import { captureText } from '../helpers/capture.js';
import { TCP_FIXED, assertBothWays } from '../helpers/carried.js';
import { scrape } from '../helpers/scrape.js';
import { KERNEL_NODE, type StoredLease, addKernelVxlanNode } from '../helpers/kernel-vxlan-node.js';

const skip = isRoot() ? false : 'needs root (network namespaces)';
const KPOD = { ip: KERNEL_NODE.pod, ip6: KERNEL_NODE.pod6 };

/** `count` replies (ping -w: sending on until they came, ≤ 30 s; a late reply is no failure). */
async function ping(ns: string, dst: string, count = 1): Promise<string> {
  return nsExecAsync(ns, 'ping', ['-c', String(count), '-i', '0.2', '-w', '30', dst], 60_000);
}

describe(
  'dual-stack userspace vxlan ⇄ dual-stack kernel vxlan (flannel.1 + flannel-v6.1)',
  { skip },
  () => {
    let c: Cluster;
    let kns = '';
    let kpod = '';
    const leases: Array<{ key: string; v: StoredLease }> = [];

    before(async () => {
      c = await Cluster.create({
        nodes: 2,
        dualStack: true,
        backend: { Type: 'vxlan', Dataplane: 'userspace' },
      });
      const k = await addKernelVxlanNode(c, true);
      kns = k.ns;
      kpod = k.pod;
      leases.push(...k.peers.map((p) => ({ key: p.key, v: p.lease })));
    });
    after(async () => {
      await c?.destroy();
    });

    test('each weft lease publishes PublicIPv6 and BackendV6Data (flannel-v6.1 semantics); TUN MTU interface − 70', () => {
      assert.equal(leases.length, 2);
      for (const { v } of leases) {
        assert.match(v.PublicIPv6 ?? '', /^fd00:250::/);
        assert.equal(v.BackendV6Data?.VNI, 1);
        assert.match(v.BackendV6Data?.VtepMAC ?? '', /^[0-9a-f]{2}(:[0-9a-f]{2}){5}$/);
      }
      assert.match(c.ipIn(0, 'link', 'show', 'flannel.1'), /mtu 1430/);
      assert.equal(c.nodes[0]!.env.FLANNEL_MTU, '1430');
    });

    test('IPv4 and IPv6 pods ping the kernel node both ways, and each other', async () => {
      const pod = c.pods[0]!;
      await waitFor(
        async () => {
          await ping(pod.ns, KPOD.ip);
          await ping(pod.ns, KPOD.ip6);
          return true;
        },
        20_000,
        'userspace → kernel pings',
      );
      for (const p of c.pods) {
        await ping(p.ns, KPOD.ip, 2);
        await ping(p.ns, KPOD.ip6, 2);
        await ping(kpod, p.ip, 2);
        await ping(kpod, p.ip6!, 2);
      }
      await ping(c.pods[0]!.ns, c.pods[1]!.ip6!, 2);
      await ping(c.pods[1]!.ns, c.pods[0]!.ip6!, 2);
    });

    test('IPv4 pods ride IPv4 VXLAN, IPv6 pods IPv6 VXLAN (captured on the kernel node)', async () => {
      const pod = c.pods[0]!;
      const seen = (filter: string, dst: string) =>
        captureText(c.scope, kns, filter, 2, () => ping(pod.ns, dst, 2));
      const v6 = await seen('ip6 and udp dst port 8472', KPOD.ip6);
      assert.match(v6, /IP6 fd00:250::1\.\d+ > fd00:250::9\.8472: /, v6);
      const v4 = await seen('ip and udp dst port 8472', KPOD.ip);
      assert.match(v4, /IP 10\.250\.0\.1\.\d+ > 10\.250\.0\.9\.8472: /, v4);
    });

    test('iperf3 TCP both ways, IPv4 and IPv6', async () => {
      const pod = c.pods[1]!;
      for (const [podIp, kIp] of [
        [pod.ip, KPOD.ip],
        [pod.ip6!, KPOD.ip6],
      ] as const) {
        // What arrived, in the userspace node's counters; not a rate (the machine's load).
        await assertBothWays(c, pod, podIp, { ns: kpod, ip: kIp }, TCP_FIXED, (ns) =>
          scrape(ns, HEALTH_PORT),
        );
      }
    });
  },
);

describe('IPv6-only userspace vxlan: IPv6 pods in IPv6 VXLAN, BackendV6Data only', { skip }, () => {
  let c: Cluster;
  before(async () => {
    c = await Cluster.create({
      nodes: 2,
      dualStack: true,
      netConf: { EnableIPv4: false },
      backend: { Type: 'vxlan', Dataplane: 'userspace' },
      podWiring: 'cni',
    });
  });
  after(async () => {
    await c?.destroy();
  });

  test('the lease carries PublicIPv6 and BackendV6Data (no BackendData); MTU interface − 70', async () => {
    const store = new EmbeddedRegistry(c.storeDir);
    try {
      const leases = (await store.listSubnets()).leases.map(
        (s) => JSON.parse(s.value) as StoredLease,
      );
      assert.equal(leases.length, 2);
      for (const l of leases) {
        assert.match(l.PublicIPv6 ?? '', /^fd00:250::/);
        assert.equal(l.BackendData, undefined);
        assert.equal(l.BackendV6Data?.VNI, 1);
      }
    } finally {
      await store.close();
    }
    assert.equal(c.nodes[0]!.env.FLANNEL_MTU, '1430');
  });

  test('pods ping each other both ways, in IPv6 VXLAN on the wire', async () => {
    const [a, b] = [c.pods[0]!, c.pods[1]!];
    await waitFor(
      async () => {
        await ping(a.ns, b.ip6!);
        return true;
      },
      20_000,
      'first ping',
    );
    const out = await captureText(c.scope, c.nodes[1]!.ns, 'udp dst port 8472', 2, async () => {
      await ping(a.ns, b.ip6!, 2);
      await ping(b.ns, a.ip6!, 2);
    });
    assert.match(out, /IP6 fd00:250::1\.\d+ > fd00:250::2\.8472: /, out);
    assert.doesNotMatch(out, /IP 10\.250/, out);
  });
});
