/**
 * The real daemon with flanneld's traffic flags, 2 dual-stack host-gw nodes (the shared cluster
 * builder, src/testbed/cluster.ts, draws it): `"EnableNFTables": true`, --ip-masq,
 * --ip-masq-fully-random-disable, -v=2 and --vmodule; then node 1 restarted with
 * --ip-blackhole-route.
 *
 *            underlay br0
 *        ┌───────┴───────┐
 *      node 0          node 1        weft daemon each (embedded store)
 *      nft: ip flannel-ipv4 / ip6 flannel-ipv6
 *      pod 0.0         pod 1.0
 *
 * Each node's tables equal flannel's golden text (plain `masquerade`), no iptables chain of
 * ours exists, a rule deleted by hand is back within --iptables-resync, -v=2 turned on debug
 * lines and --vmodule was warned about once, and the pods still reach each other; with
 * --ip-blackhole-route the pod bridge's own route is kept (flannel's flag is for setups without
 * a bridge) and the pods still reach each other.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { canonical, formatCIDR, parseCIDR } from '../../src/common/ip.js';
import {
  CLUSTER_NETWORK,
  CLUSTER_NETWORK_V6,
  Cluster,
  waitFor,
} from '../../src/testbed/cluster.js';
import { waitForMesh } from '../../src/testbed/probes.js';
import { isRoot, nsExec } from '../../src/testbed/netns.js';
import { nftGolden } from '../helpers/nft-golden.js';

const skip = isRoot() ? false : 'needs root (network namespaces)';

const network = (cidr: string) => formatCIDR(canonical(parseCIDR(cidr)!));

describe('daemon: nftables mode with flanneld’s traffic flags', { skip }, () => {
  let c: Cluster;

  before(async () => {
    c = await Cluster.create({
      nodes: 2,
      backend: { Type: 'host-gw' },
      dualStack: true,
      ipMasq: true,
      netConf: { EnableNFTables: true },
      flags: ['--ip-masq-fully-random-disable', '-v=2', '--vmodule=main=3'],
    });
  });
  after(async () => {
    await c?.destroy();
  });

  const list = (ns: string, family: 4 | 6) =>
    nsExec(ns, 'nft', ['list', 'table', family === 4 ? 'ip' : 'ip6', `flannel-ipv${family}`]);

  test('each node holds flannel’s tables for its own subnets, and no iptables chain of ours', () => {
    for (const n of c.nodes) {
      const S4 = network(n.env.FLANNEL_SUBNET!);
      const S6 = network(n.env.FLANNEL_IPV6_SUBNET!);
      assert.equal(list(n.ns, 4), nftGolden(4, CLUSTER_NETWORK, S4, false));
      assert.equal(list(n.ns, 6), nftGolden(6, CLUSTER_NETWORK_V6, S6, false));
      for (const save of ['iptables-save', 'ip6tables-save']) {
        assert.doesNotMatch(nsExec(n.ns, save), /FLANNEL|flanneld/, `${n.name} ${save}`);
      }
    }
  });

  test('a rule deleted by hand is back within --iptables-resync', async () => {
    const n = c.nodes[0]!;
    const want = nftGolden(4, CLUSTER_NETWORK, network(n.env.FLANNEL_SUBNET!), false);
    nsExec(n.ns, 'nft', ['flush', 'chain', 'ip', 'flannel-ipv4', 'postrtg']);
    await waitFor(() => list(n.ns, 4) === want, 20_000, 'the repaired table');
  });

  test('-v=2 logs at debug; --vmodule is warned about once', () => {
    const logs = c.nodes[0]!.logs;
    assert.ok(
      logs.some((l) => l.level === 'debug'),
      'no debug line',
    );
    const warned = logs.filter((l) => l.flag === '--vmodule');
    assert.equal(warned.length, 1);
    assert.equal(warned[0]!.level, 'warn');
  });

  test('pods still reach each other, both families', async () => {
    assert.equal(await waitForMesh(c.nodes.flatMap((n) => n.pods)), 0, 'pod pairs without replies');
  });

  test('--ip-blackhole-route after a restart: blackholes where no route of the subnet exists, the pod bridge’s kept', async () => {
    await c.stopDaemon(1);
    await c.startDaemon(1, ['--ip-blackhole-route']);
    const n = c.nodes[1]!;
    const S4 = network(n.env.FLANNEL_SUBNET!);
    const S6 = network(n.env.FLANNEL_IPV6_SUBNET!);
    // IPv6: the blackhole (metric 1024) sits behind the bridge's connected route (metric 256).
    await waitFor(
      () => nsExec(n.ns, 'ip', ['-6', 'route', 'show', 'type', 'blackhole']).includes(S6),
      20_000,
      `${n.name} blackhole ${S6}`,
    );
    // IPv4: the bridge's connected route has the same key; it stays, no blackhole replaces it.
    assert.match(nsExec(n.ns, 'ip', ['-4', 'route', 'show', S4]), /dev cni0/);
    assert.doesNotMatch(nsExec(n.ns, 'ip', ['-4', 'route', 'show', 'type', 'blackhole']), /./);
    assert.equal(await waitForMesh(c.nodes.flatMap((p) => p.pods)), 0, 'pod pairs without replies');
  });
});
