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
 * vxlan userspace ⇄ kernel vxlan, both directions: ping, iperf3 TCP and UDP.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { availableParallelism } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { OFFLOAD_NAMES } from '../../src/dataplane/offloads.js';
import { Cluster, type Pod, PACKAGE_ROOT, waitFor } from '../../src/testbed/cluster.js';
import { assertEveryDatagramCounted } from '../helpers/drops.js';
import { KERNEL_NODE, addKernelVxlanNode } from '../helpers/kernel-vxlan-node.js';
import { ip, isRoot, nsExecAsync } from '../../src/testbed/netns.js';

const skip = isRoot() ? false : 'needs root (network namespaces)';
const HEALTH_PORT = '9093';

async function ping(from: Pod | string, dst: string, count = 1, interval = '0.2'): Promise<string> {
  const ns = typeof from === 'string' ? from : from.ns;
  return nsExecAsync(ns, 'ping', ['-c', String(count), '-i', interval, '-W', '2', dst], 60_000);
}

async function iperf(
  clientNs: string,
  serverNs: string,
  serverIp: string,
  udp = false,
): Promise<{ bps: number; lost: number }> {
  const srv = nsExecAsync(serverNs, 'iperf3', ['-s', '-1', '-B', serverIp], 30_000);
  await new Promise((r) => setTimeout(r, 300));
  const out = await nsExecAsync(
    clientNs,
    'iperf3',
    ['-c', serverIp, '-t', '2', '-J', ...(udp ? ['-u', '-b', '100M'] : [])],
    30_000,
  );
  await srv;
  const j = JSON.parse(out) as {
    end: {
      sum_received?: { bits_per_second: number };
      sum?: { bits_per_second: number; lost_percent: number };
    };
  };
  if (udp) return { bps: j.end.sum!.bits_per_second, lost: j.end.sum!.lost_percent };
  return { bps: j.end.sum_received!.bits_per_second, lost: 0 };
}

async function metrics(ns: string): Promise<string> {
  return nsExecAsync(ns, process.execPath, [
    '-e',
    `fetch('http://127.0.0.1:${HEALTH_PORT}/metrics').then(r=>r.text()).then(t=>process.stdout.write(t))`,
  ]);
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
      15_000,
      'first ping',
    );
    for (const a of c.pods) for (const b of c.pods) if (a !== b) await ping(a, b.ip);
  });

  test('iperf3 TCP and UDP carry traffic pod to pod', async () => {
    const [a, b] = [c.pods[0]!, c.pods[1]!];
    const tcp = await iperf(a.ns, b.ns, b.ip);
    assert.ok(tcp.bps > 50e6, `TCP ${tcp.bps} bit/s`);
    const udp = await iperf(b.ns, a.ns, a.ip, true);
    assert.ok(udp.bps > 10e6 && udp.lost < 10, `UDP ${udp.bps} bit/s, ${udp.lost}% lost`);
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
      ping(c.pods[0]!, c.pods[1]!.ip, 30, '0.1'),
    ]);
    assert.ok(sent > 1000 && sentStranger > 1000, `sent ${sent} + ${sentStranger}`);
    assert.match(pings, / 0% packet loss/, pings);
    assert.equal(target.daemon!.exitCode, null, 'daemon alive');
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
    const after = await metrics(target.ns);
    const d = (name: string, labels = '') =>
      metric(after, name, labels) - metric(before, name, labels);
    await waitFor(() => true, 100, 'settle');
    assert.equal(sent, 300);
    assert.equal(d('weft_dataplane_dropped_packets_total', '{reason="spoofed_source"}'), 300);
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
      20_000,
      'userspace → kernel ping',
    );
    await ping(pod, KPOD_IP, 3);
    await ping(kpod, pod.ip, 3);
  });

  test('userspace pods still reach each other', async () => {
    await ping(c.pods[0]!, c.pods[1]!.ip, 2);
  });

  test('iperf3 TCP both directions', async () => {
    const pod = c.pods[1]!;
    const up = await iperf(pod.ns, kpod, KPOD_IP);
    const down = await iperf(kpod, pod.ns, pod.ip);
    assert.ok(up.bps > 50e6, `userspace → kernel ${up.bps}`);
    assert.ok(down.bps > 50e6, `kernel → userspace ${down.bps}`);
  });

  test('iperf3 UDP both directions', async () => {
    const pod = c.pods[0]!;
    const up = await iperf(pod.ns, kpod, KPOD_IP, true);
    const down = await iperf(kpod, pod.ns, pod.ip, true);
    assert.ok(up.bps > 10e6 && up.lost < 10, `userspace → kernel ${up.bps} ${up.lost}%`);
    assert.ok(down.bps > 10e6 && down.lost < 10, `kernel → userspace ${down.bps} ${down.lost}%`);
  });
});
