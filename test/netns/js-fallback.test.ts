/**
 * weft without its native addon (WEFT_NATIVE_ADDON=/nonexistent: what an ABI mismatch, a failed
 * build or a missing libmnl look like): the udp backend on the js engine, the TUN opened by the
 * helper (weft-tun), the kernel programmed through iproute2. Real daemons in namespaces built by
 * src/testbed/cluster.ts:
 *
 *            underlay br0 (L2)                        10.250.0.0/24
 *     ┌──────────┼──────────┬────────────────┐
 *   node 0     node 1      node 9 (last test: the default native engine without the addon,
 *   flannel0   flannel0    must exit 1 naming --dataplane-engine=js)
 *   (weft-tun) (weft-tun)
 *   cni0       cni0
 *   pod 0.0    pod 1.0
 *
 * The last tests break things on purpose: node 1's helper is killed (the daemon must say so),
 * then a third daemon starts without the js engine flag.
 */
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Cluster, PACKAGE_ROOT, waitFor } from '../../src/testbed/cluster.js';
import { assertPodToPod } from '../helpers/carried.js';
import { assertEveryDatagramCounted } from '../../src/testbed/drops.js';
import { scrape } from '../helpers/scrape.js';
import { ip, isRoot, nsExecAsync } from '../../src/testbed/netns.js';
// @ts-expect-error: a plain .mjs build script without types
import { buildTunHelper } from '../../scripts/build-native.mjs';

const skip = isRoot() ? false : 'needs root (network namespaces)';
const HEALTH_PORT = '9095';
const NO_ADDON = { WEFT_NATIVE_ADDON: '/nonexistent/weft.node' };

/**
 * `count` replies from `dst` (ping -w: sending on until they came, ≤ 30 s; a late reply on a
 * loaded machine is no failure, and with -w ping exits 1 unless all `count` came).
 */
async function ping(ns: string, dst: string, count = 1): Promise<string> {
  return nsExecAsync(ns, 'ping', ['-c', String(count), '-i', '0.2', '-w', '30', dst], 60_000);
}

/** Waits (≤ 30 s) until `ns` gets a reply from `dst`: the peers have reached both dataplanes. */
async function firstReply(ns: string, dst: string): Promise<void> {
  await waitFor(
    async () => {
      await ping(ns, dst);
      return true;
    },
    30_000,
    `first reply from ${dst}`,
  );
}

describe('udp backend on the js engine without the native addon', { skip }, () => {
  let c: Cluster;
  before(async () => {
    assert.equal(buildTunHelper({ strict: true }), true);
    c = await Cluster.create({
      nodes: 2,
      backend: { Type: 'udp' },
      flags: [
        '--dataplane-engine',
        'js',
        '--healthz-port',
        HEALTH_PORT,
        '--healthz-ip',
        '127.0.0.1',
      ],
      env: NO_ADDON,
    });
  });
  after(async () => {
    await c?.destroy();
  });

  test('the TUN comes from the helper and the kernel ops from iproute2', () => {
    for (const n of c.nodes) {
      const msgs = n.logs.map((l) => l.msg);
      assert.ok(
        msgs.includes('tun opened through the helper (native addon unavailable)'),
        `node ${n.index}`,
      );
      assert.ok(
        msgs.includes('native addon unavailable: kernel ops go through the ip and bridge commands'),
        `node ${n.index}`,
      );
      const started = n.logs.find((l) => l.msg === 'userspace dataplane started');
      assert.equal(started?.engine, 'js');
    }
    const net = c.nodes[0]!.env.FLANNEL_SUBNET!.replace(/\.1\/24$/, '.0');
    assert.match(
      c.ipIn(0, 'addr', 'show', 'flannel0'),
      new RegExp(`inet ${net.replace(/\./g, '\\.')}/32`),
    );
    assert.match(c.ipIn(0, 'link', 'show', 'flannel0'), /mtu 1472 .*state UNKNOWN/);
    assert.match(c.ipIn(0, 'route', 'show', '10.5.0.0/16'), /dev flannel0/);
  });

  test('pods ping each other both ways', async () => {
    const [a, b] = [c.pods[0]!, c.pods[1]!];
    await firstReply(a.ns, b.ip);
    assert.match(await ping(a.ns, b.ip, 3), / 3 received/);
    assert.match(await ping(b.ns, a.ip, 3), / 3 received/);
  });

  test('iperf3 TCP and UDP cross the helpers, through the js engine', async () => {
    // What arrived and the receiving node's counters holding it, not a rate (machine load).
    await assertPodToPod(c, c.pods[0]!, c.pods[1]!, (ns) => scrape(ns, HEALTH_PORT));
  });

  test('the js engine counts the traffic in /metrics', async () => {
    const m = await nsExecAsync(c.nodes[0]!.ns, process.execPath, [
      '-e',
      `fetch('http://127.0.0.1:${HEALTH_PORT}/metrics').then(r=>r.text()).then(t=>process.stdout.write(t))`,
    ]);
    const value = (name: string) =>
      Number(/^(\S+) (\S+)$/.exec(m.split('\n').find((l) => l.startsWith(name + ' ')) ?? '')?.[2]);
    assert.ok(value('weft_dataplane_tx_packets_total') >= 6, 'tx packets');
    assert.ok(value('weft_dataplane_rx_packets_total') >= 6, 'rx packets');
  });

  test('every bad datagram is counted, zero-length ones included', async () => {
    const target = c.nodes[1]!;
    await assertEveryDatagramCounted({
      from: c.nodes[0]!.ns,
      targetNs: target.ns,
      target: target.ip,
      port: 8285,
      scrape: () =>
        nsExecAsync(target.ns, process.execPath, [
          '-e',
          `fetch('http://127.0.0.1:${HEALTH_PORT}/metrics').then(r=>r.text()).then(t=>process.stdout.write(t))`,
        ]),
    });
  });

  test('vxlan userspace also runs without the addon', async () => {
    // A second pair of nodes in the same store would mix backends; a short separate cluster.
    const v = await Cluster.create({
      nodes: 2,
      backend: { Type: 'vxlan', Dataplane: 'userspace' },
      flags: ['--dataplane-engine', 'js'],
      env: NO_ADDON,
    });
    try {
      const [a, b] = [v.pods[0]!, v.pods[1]!];
      await firstReply(a.ns, b.ip);
      assert.match(await ping(b.ns, a.ip, 2), / 2 received/);
      assert.match(v.ipIn(0, '-d', 'link', 'show', 'flannel.1'), /tun type tun pi off/);
    } finally {
      await v.destroy();
    }
  });

  test('a helper that dies stops the daemon with exit 1, logged once (its supervisor restarts it)', async () => {
    const node = c.nodes[1]!;
    const daemon = node.daemon!;
    const exited = new Promise<number | null>((r) => daemon.once('exit', (code) => r(code)));
    const pids = execFileSync('ip', ['netns', 'pids', node.ns], { encoding: 'utf8' })
      .split('\n')
      .filter(Boolean);
    const helper = pids.find((p) => {
      try {
        return readFileSync(`/proc/${p}/comm`, 'utf8').trim() === 'weft-tun';
      } catch {
        return false;
      }
    });
    assert.ok(helper, 'the helper runs in node 1');
    process.kill(Number(helper), 'SIGKILL');
    const line = await waitFor(
      () => node.logs.find((l) => l.msg === 'tun helper exited; the js dataplane is down'),
      5000,
      'the helper exit log line',
    );
    assert.match(String(line?.why), /signal SIGKILL/);
    assert.equal(await exited, 1);
    assert.equal(node.logs.filter((l) => l.msg === line?.msg).length, 1);
  });

  test('the default native engine without the addon exits 1 naming --dataplane-engine=js', () => {
    const ns = c.scope.add();
    c.scope.vethBetween(c.underlay, 'u9', ns, 'eth0');
    ip(c.underlay, 'link', 'set', 'u9', 'master', 'br0', 'up');
    ip(ns, 'addr', 'add', '10.250.0.9/24', 'dev', 'eth0');
    ip(ns, 'link', 'set', 'eth0', 'up');
    const r = spawnSync(
      'ip',
      [
        'netns',
        'exec',
        ns,
        process.execPath,
        '--import',
        'tsx',
        join(PACKAGE_ROOT, 'test', 'helpers', 'weft-src.ts'),
        'daemon',
        '--store-dir',
        c.storeDir,
        '--iface',
        'eth0',
        '--subnet-file',
        join(c.dir, 'node9.env'),
      ],
      {
        cwd: PACKAGE_ROOT,
        env: { ...process.env, ...NO_ADDON },
        encoding: 'utf8',
        timeout: 30_000,
      },
    );
    assert.equal(r.status, 1, r.stderr);
    assert.match(r.stderr, /WEFT_ERR_NATIVE_UNAVAILABLE/);
    assert.match(r.stderr, /--dataplane-engine=js/);
  });
});
