/**
 * The wireguard backend dual-stack in flannel's default Mode, `separate`: two `weft daemon`s
 * (embedded store, --dataplane-engine native, EnableIPv6), each running two tunnels, as
 * flanneld's two links: flannel-wg carries IPv4 pods in IPv4 to ListenPort, flannel-wg-v6
 * carries IPv6 pods in IPv6 to ListenPortV6, one key for both.
 *
 *            underlay br0 (L2)              10.250.0.0/24, fd00:250::/64
 *     ┌──────────┴──────────┐
 *   node 0                node 1
 *   flannel-wg    10.5.N.0/32, route 10.5.0.0/16 scope link, [10.250.0.N]:51820
 *   flannel-wg-v6 fd00:5:0:N::/128, route fd00:5::/48 scope link, [fd00:250::N]:51821
 *   pod 0.0 (v4 + v6)     pod 1.0 (v4 + v6)
 *
 * The devices and the lease (BackendData Port 51820, BackendV6Data Port 51821, one PublicKey);
 * pods ping both ways in both families, each family captured on its own underlay and port; a
 * fixed amount of TCP both ways over IPv6, counted on /metrics (the sum of both engines); a
 * restart starts both engines early, each from its own fast-start record. Then
 * the config changes to Mode auto and the daemons restart: flannel-wg-v6 goes, one flannel-wg
 * on 51820 carries both families, each peer reached over IPv4 (flannel's selectMode: the
 * testbed's addresses are all private).
 */
import assert from 'node:assert/strict';
import { existsSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { EmbeddedRegistry } from '../../src/control/registry/embedded.js';
import {
  CLUSTER_NETWORK,
  CLUSTER_NETWORK_V6,
  Cluster,
  HEALTH_PORT,
  type Pod,
} from '../../src/testbed/cluster.js';
import { isRoot, nsExecAsync } from '../../src/testbed/netns.js';
import { captureText } from '../helpers/capture.js';
import { TCP_FIXED, assertBothWays } from '../helpers/carried.js';
import { runWeft } from '../helpers/daemon.js';
import { scrape } from '../helpers/scrape.js';

const skip = isRoot() ? false : 'needs root (network namespaces)';

interface StoredLease {
  PublicIPv6: string | null;
  BackendType?: string;
  BackendData?: { PublicKey: string; Port: number };
  BackendV6Data?: { PublicKey: string; Port: number };
}

const ping = (ns: string, dst: string, count = 2) =>
  nsExecAsync(ns, 'ping', ['-c', String(count), '-i', '0.2', '-w', '30', dst], 60_000);

describe(
  'wireguard backend, dual-stack: Mode separate (flannel-wg + flannel-wg-v6), then auto',
  { skip },
  () => {
    let c: Cluster;
    const pod = (i: number): Pod => c.nodes[i]!.pods[0]!;
    before(async () => {
      c = await Cluster.create({
        nodes: 2,
        dualStack: true,
        backend: { Type: 'wireguard' },
        flags: ['--dataplane-engine=native'],
      });
    });
    after(async () => {
      await c?.destroy();
    });

    test('two TUNs as flanneld’s two links: MTU − 80, /32 and /128, one route per Network', () => {
      for (const i of [0, 1]) {
        const env = c.nodes[i]!.env;
        assert.equal(env.FLANNEL_MTU, '1420');
        const v4 = env.FLANNEL_SUBNET!.replace(/1\/24$/, '0/32');
        const v6 = env.FLANNEL_IPV6_SUBNET!.replace(/1\/64$/, '/128');
        assert.match(c.ipIn(i, 'link', 'show', 'flannel-wg'), /mtu 1420/);
        assert.match(c.ipIn(i, 'link', 'show', 'flannel-wg-v6'), /mtu 1420/);
        assert.match(c.ipIn(i, 'addr', 'show', 'flannel-wg'), new RegExp(`inet ${v4} `));
        assert.match(c.ipIn(i, '-6', 'addr', 'show', 'flannel-wg-v6'), new RegExp(`inet6 ${v6} `));
        assert.match(c.ipIn(i, 'route', 'show', '10.5.0.0/16'), /dev flannel-wg scope link/);
        assert.match(c.ipIn(i, '-6', 'route', 'show', 'fd00:5::/48'), /dev flannel-wg-v6\b/);
      }
    });

    test('the lease: BackendData Port 51820, BackendV6Data Port 51821, one PublicKey', async () => {
      const store = new EmbeddedRegistry(c.storeDir);
      try {
        const leases = (await store.listSubnets()).leases.map(
          (s) => JSON.parse(s.value) as StoredLease,
        );
        assert.equal(leases.length, 2);
        for (const l of leases) {
          assert.equal(l.BackendType, 'wireguard');
          assert.equal(l.BackendData?.Port, 51820);
          assert.equal(l.BackendV6Data?.Port, 51821);
          assert.equal(l.BackendV6Data?.PublicKey, l.BackendData?.PublicKey);
        }
      } finally {
        await store.close();
      }
    });

    test('pods ping both ways in both families, each on its own underlay and port', async () => {
      for (const [a, b] of [
        [0, 1],
        [1, 0],
      ] as const) {
        await ping(pod(a).ns, pod(b).ip);
        await ping(pod(a).ns, pod(b).ip6!);
      }
      const seen = (filter: string, dst: string) =>
        captureText(c.scope, c.nodes[1]!.ns, filter, 2, () => ping(pod(0).ns, dst));
      const v6 = await seen('ip6 and udp port 51821', pod(1).ip6!);
      assert.match(v6, /IP6 fd00:250::1\.51821 > fd00:250::2\.51821: UDP/, v6);
      const v4 = await seen('ip and udp port 51820', pod(1).ip);
      assert.match(v4, /IP 10\.250\.0\.1\.51820 > 10\.250\.0\.2\.51820: UDP/, v4);
    });

    test('IPv6 pods carry a fixed amount of TCP both ways, counted on /metrics', async () => {
      await assertBothWays(
        c,
        pod(0),
        pod(0).ip6!,
        { ns: pod(1).ns, ip: pod(1).ip6! },
        TCP_FIXED,
        (ns) => scrape(ns, HEALTH_PORT),
      );
    });

    test('a restarted node starts both tunnels early, each from its own record', async () => {
      const n = c.nodes[1]!;
      await c.stopDaemon(1);
      assert.ok(existsSync(`${n.subnetFile}.dataplane.json`), 'flannel-wg’s record');
      assert.ok(existsSync(`${n.subnetFile}.flannel-wg-v6.dataplane.json`), 'flannel-wg-v6’s');
      await c.startDaemon(1);
      const early = n.logs
        .filter((l) => l.msg === 'forwarding with the last run’s peers until the store answers')
        .map((l) => `${String(l.tun)} ${String(l.peers)}`)
        .sort();
      assert.deepEqual(early, ['flannel-wg 1', 'flannel-wg-v6 1']);
      await ping(pod(1).ns, pod(0).ip);
      await ping(pod(1).ns, pod(0).ip6!);
    });

    test('Mode auto after a restart: one flannel-wg carries both families over IPv4', async () => {
      const file = join(c.dir, 'net-conf-auto.json');
      writeFileSync(
        file,
        JSON.stringify({
          Network: CLUSTER_NETWORK,
          EnableIPv6: true,
          IPv6Network: CLUSTER_NETWORK_V6,
          Backend: { Type: 'wireguard', Mode: 'auto' },
        }),
      );
      const set = await runWeft(['config', 'set', file, `--store-dir=${c.storeDir}`]);
      assert.equal(set.code, 0, set.stderr);
      await c.stopDaemons();
      for (const i of [0, 1]) await c.startDaemon(i);
      for (const i of [0, 1]) {
        assert.throws(() => c.ipIn(i, 'link', 'show', 'flannel-wg-v6'), 'flannel-wg-v6 removed');
        const v6Record = `${c.nodes[i]!.subnetFile}.flannel-wg-v6.dataplane.json`;
        assert.ok(!existsSync(v6Record), 'and its fast-start record');
        assert.match(c.ipIn(i, '-6', 'route', 'show', 'fd00:5::/48'), /dev flannel-wg\b/);
      }
      await ping(pod(0).ns, pod(1).ip6!);
      await ping(pod(1).ns, pod(0).ip6!);
      await ping(pod(1).ns, pod(0).ip);
      const v6inV4 = await captureText(c.scope, c.nodes[1]!.ns, 'ip and udp port 51820', 2, () =>
        ping(pod(0).ns, pod(1).ip6!),
      );
      assert.match(v6inV4, /IP 10\.250\.0\.1\.51820 > 10\.250\.0\.2\.51820: UDP/, v6inV4);
    });
  },
);
