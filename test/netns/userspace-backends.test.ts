/**
 * The userspace backends end to end, real `weft daemon`s (embedded store) in namespaces built by
 * src/testbed/cluster.ts:
 *
 *            underlay br0 (L2)                         10.250.0.0/24
 *     ┌──────────┼──────────┬─────────────┐
 *   node 0     node 1     node 2       kernel node (vxlan suite only): hand-made kernel
 *   flannel0   flannel0   flannel0     vxlan flannel.1, 10.250.0.9, subnet 10.5.200.0/24,
 *   (udp) or flannel.1 TUN (vxlan      its lease written into the store by this test
 *   userspace), cni0 10.5.X.1/24
 *   pod 0.0    pod 1.0    pod 2.0      kpod 10.5.200.2
 *
 * udp: every pod pair pings; iperf3 TCP and UDP; the TUN is flannel0 with MTU − 28; /metrics has
 * the dataplane counters; a flood of random datagrams at port 8285 while pods ping (no loss,
 * daemon alive, drops counted); spoofed inner sources all dropped.
 * vxlan userspace ⇄ kernel vxlan, both directions: ping, iperf3 TCP and UDP; the kernel node's
 * lease removed and written again (the userspace nodes' tables change by delta).
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { availableParallelism } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { EmbeddedRegistry } from '../../src/control/registry/embedded.js';
import { OFFLOAD_NAMES } from '../../src/dataplane/offloads.js';
import {
  Cluster,
  HEALTH_PORT as CLUSTER_HEALTH_PORT,
  type Pod,
  PACKAGE_ROOT,
  waitFor,
} from '../../src/testbed/cluster.js';
import { TCP_FIXED, UDP_PACED, assertBothWays, assertPodToPod } from '../helpers/carried.js';
import { assertEveryDatagramCounted } from '../../src/testbed/drops.js';
import { KERNEL_NODE, addKernelVxlanNode } from '../helpers/kernel-vxlan-node.js';
import { ip, isRoot, nsExecAsync } from '../../src/testbed/netns.js';
import { scrape } from '../helpers/scrape.js';

const skip = isRoot() ? false : 'needs root (network namespaces)';
const HEALTH_PORT = '9093';

async function ping(from: Pod | string, dst: string, count = 1, interval = '0.2'): Promise<string> {
  const ns = typeof from === 'string' ? from : from.ns;
  // -w: wait (≤ 30 s) for `count` replies, sending on meanwhile: a late reply is no failure.
  return nsExecAsync(ns, 'ping', ['-c', String(count), '-i', interval, '-w', '30', dst], 60_000);
}

function metrics(ns: string, port: string | number = HEALTH_PORT): Promise<string> {
  return scrape(ns, port);
}

function metric(text: string, name: string, labels = ''): number {
  const line = text
    .split('\n')
    .find((l) => l.startsWith(`${name}${labels} `) || (labels === '' && l.startsWith(`${name} `)));
  return line ? Number(line.split(' ').pop()) : NaN;
}

async function flood(ns: string, args: Record<string, unknown>): Promise<number> {
  const out = await nsExecAsync(
    ns,
    process.execPath,
    ['--import', 'tsx', join(PACKAGE_ROOT, 'test/helpers/udp-flood.ts'), JSON.stringify(args)],
    60_000,
  );
  return (JSON.parse(out) as { sent: number }).sent;
}

describe('udp backend across 3 nodes', { skip }, () => {
  let c: Cluster;
  before(async () => {
    c = await Cluster.create({
      backend: { Type: 'udp' },
      flags: ['--healthz-port', HEALTH_PORT, '--healthz-ip', '127.0.0.1'],
    });
  });
  after(async () => {
    await c?.destroy();
  });

  test('the TUN is flannel0 with MTU interface − 28, the subnet network address and the network route', () => {
    const n = c.nodes[0]!;
    const link = c.ipIn(0, 'link', 'show', 'flannel0');
    assert.match(link, /mtu 1472/);
    const net = n.env.FLANNEL_SUBNET!.replace(/\.1\/24$/, '.0');
    assert.match(
      c.ipIn(0, 'addr', 'show', 'flannel0'),
      new RegExp(`inet ${net.replace(/\./g, '\\.')}/32`),
    );
    assert.match(c.ipIn(0, 'route', 'show', '10.5.0.0/16'), /dev flannel0/);
    assert.equal(n.env.FLANNEL_MTU, '1472');
  });

  test('every pod pair pings', async () => {
    await waitFor(
      async () => {
        await ping(c.pods[0]!, c.pods[1]!.ip);
        return true;
      },
      30_000,
      'first ping',
    );
    for (const a of c.pods) for (const b of c.pods) if (a !== b) await ping(a, b.ip);
  });

  test('iperf3 TCP and UDP carry traffic pod to pod, through the dataplane', async () => {
    // Mechanism, not rate: what arrived, and the receiving node's counters holding it (a bit
    // rate or a loss figure depends on machine load).
    await assertPodToPod(c, c.pods[0]!, c.pods[1]!, (ns) => metrics(ns));
  });

  test('/metrics carries the dataplane counters and offload gauges, and passes promtool', async () => {
    const m = await metrics(c.nodes[0]!.ns);
    assert.ok(metric(m, 'weft_dataplane_tx_packets_total') > 0, 'tx packets');
    assert.ok(metric(m, 'weft_dataplane_rx_packets_total') > 0, 'rx packets');
    // The default: one queue per CPU, at most 4.
    assert.equal(
      metric(m, 'weft_dataplane_workers', '{engine="native"}'),
      Math.min(availableParallelism(), 4),
    );
    assert.match(m, /weft_dataplane_dropped_packets_total\{reason="spoofed_source"\} \d+/);
    const offload = (f: string) => metric(m, 'weft_dataplane_offload_enabled', `{feature="${f}"}`);
    const want = process.env.WEFT_DATAPLANE_OFFLOADS === 'none' ? 0 : 1;
    for (const f of OFFLOAD_NAMES) assert.equal(offload(f), want, f);
    // The exposition passes Prometheus' own linter (throws with its complaints otherwise).
    execFileSync('promtool', ['check', 'metrics'], { input: m, encoding: 'utf8' });
  });

  test('a flood of random datagrams is dropped and counted while pods keep pinging', async () => {
    const target = c.nodes[1]!;
    const before = await metrics(target.ns);
    // A stranger address on node 0's underlay side (holds no lease) floods too.
    ip(c.nodes[0]!.ns, 'addr', 'add', '10.250.0.99/24', 'dev', 'eth0');
    const [sent, sentStranger, pings] = await Promise.all([
      flood(c.nodes[0]!.ns, { mode: 'random', target: target.ip, port: 8285, seconds: 4 }),
      flood(c.nodes[0]!.ns, {
        mode: 'random',
        target: target.ip,
        port: 8285,
        seconds: 4,
        bindIp: '10.250.0.99',
      }),
      // No -w: replies during the flood, not after it. How many of them is the machine's load.
      nsExecAsync(c.pods[0]!.ns, 'ping', ['-c', '30', '-i', '0.1', '-W', '2', c.pods[1]!.ip]),
    ]);
    assert.ok(sent > 1000 && sentStranger > 1000, `sent ${sent} + ${sentStranger}`);
    assert.match(pings, / [1-9]\d* received/, pings);
    assert.equal(target.daemon!.exitCode, null, 'daemon alive');
    await ping(c.pods[0]!, c.pods[1]!.ip, 3);
    const after = await metrics(target.ns);
    const drops = (reason: string) =>
      metric(after, 'weft_dataplane_dropped_packets_total', `{reason="${reason}"}`) -
      metric(before, 'weft_dataplane_dropped_packets_total', `{reason="${reason}"}`);
    assert.ok(drops('unknown_source') > 500, `unknown_source ${drops('unknown_source')}`);
    const garbage = drops('malformed') + drops('truncated') + drops('spoofed_source');
    assert.ok(garbage > 500, `malformed+truncated+spoofed ${garbage}`);
  });

  test('spoofed inner sources are all dropped', async () => {
    const target = c.nodes[1]!;
    const before = await metrics(target.ns);
    const other = c.nodes[2]!.env.FLANNEL_SUBNET!.replace(/\.1\/24$/, '.77');
    const sent = await flood(c.nodes[0]!.ns, {
      mode: 'spoof',
      target: target.ip,
      port: 8285,
      count: 300,
      innerSrc: other,
      innerDst: c.pods[1]!.ip,
    });
    assert.equal(sent, 300);
    // The daemon reads them when it gets the CPU: wait for the count, then check it is exact.
    const spoofed = async () => {
      const after = await metrics(target.ns);
      const name = 'weft_dataplane_dropped_packets_total';
      const labels = '{reason="spoofed_source"}';
      return metric(after, name, labels) - metric(before, name, labels);
    };
    await waitFor(async () => (await spoofed()) >= 300, 30_000, '300 spoofed drops counted');
    assert.equal(await spoofed(), 300);
  });

  test('every bad datagram is counted, zero-length ones included', async () => {
    const target = c.nodes[1]!;
    await assertEveryDatagramCounted({
      from: c.nodes[0]!.ns,
      targetNs: target.ns,
      target: target.ip,
      port: 8285,
      scrape: () => metrics(target.ns),
    });
  });
});

describe('vxlan userspace ⇄ kernel vxlan', { skip }, () => {
  let c: Cluster;
  let kpod = '';
  const KPOD_IP = KERNEL_NODE.pod;
  before(async () => {
    c = await Cluster.create({ nodes: 2, backend: { Type: 'vxlan', Dataplane: 'userspace' } });
    // The kernel node, configured by hand as DESIGN §5 describes (no weft on it).
    const k = await addKernelVxlanNode(c, false);
    kpod = k.pod;
  });
  after(async () => {
    await c?.destroy();
  });

  test('ping: userspace pod → kernel pod and kernel pod → userspace pod', async () => {
    const pod = c.pods[0]!;
    await waitFor(
      async () => {
        await ping(pod, KPOD_IP);
        return true;
      },
      30_000,
      'userspace → kernel ping',
    );
    await ping(pod, KPOD_IP, 3);
    await ping(kpod, pod.ip, 3);
  });

  test('userspace pods still reach each other', async () => {
    await ping(c.pods[0]!, c.pods[1]!.ip, 2);
  });

  /** iperf3 both ways with the kernel pod, counted by the userspace node (no rate or loss). */
  const bothWays = (pod: Pod, args: readonly string[]) =>
    assertBothWays(c, pod, pod.ip, { ns: kpod, ip: KPOD_IP }, args, (ns) =>
      metrics(ns, CLUSTER_HEALTH_PORT),
    );

  test('iperf3 TCP both directions', () => bothWays(c.pods[1]!, TCP_FIXED));

  test('iperf3 UDP both directions', () => bothWays(c.pods[0]!, UDP_PACED));

  test('the kernel node’s lease removed: it leaves the userspace table (net unreachable); written again: pods ping', async () => {
    const store = new EmbeddedRegistry(c.storeDir);
    try {
      const key = '10.5.200.0-24';
      const kept = (await store.listSubnets()).leases.find((l) => l.key === key)!;
      assert.ok(kept, 'the kernel node holds a lease');
      await store.deleteSubnet(key);
      await waitFor(
        () =>
          nsExecAsync(c.pods[0]!.ns, 'ping', ['-c', '1', '-W', '5', KPOD_IP]).then(
            () => false,
            (err: Error) => /Destination Net Unreachable/.test(err.message),
          ),
        30_000,
        'net unreachable once the lease is gone',
      );
      await store.createSubnet(key, kept.value, 3_600_000);
      // (an answer of net unreachable ends a ping too: asked again until the peer is back)
      await waitFor(
        () =>
          nsExecAsync(c.pods[0]!.ns, 'ping', ['-c', '1', '-W', '5', KPOD_IP]).then(
            () => true,
            () => false,
          ),
        30_000,
        'ping once the lease is back',
      );
    } finally {
      await store.close();
    }
  });
});
