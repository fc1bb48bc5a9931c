/**
 * The userspace backends' persistent TUN (issue 17 §1), on 2-node clusters with the real daemon
 * (src/testbed/cluster.ts, embedded store):
 *
 *            underlay br0 10.250.0.254/24
 *       u0 ┌──────────┴──────────┐ u1
 *   node 0 weft daemon        node 1 weft daemon  ← kill -9 / SIGTERM / restart
 *   TUN (flannel0 | flannel.1) TUN: persistent, 10.5.X.0/32, route 10.5.0.0/16
 *   cni0 ─ pod 0.0             cni0 ─ pod 1.0
 *
 * For udp and vxlan "Dataplane":"userspace": after kill -9 the TUN is still there (same ifindex,
 * persistent, no queue attached) with its address and the cluster route, so node 1 still routes
 * the cluster network into it; the restarted daemon starts its engine on it from the record of
 * the last run (fast-start.ts) before the store answers, adopts it (same ifindex, queues attached)
 * and pods ping both ways. udp only: a SIGTERM keeps it too (the lease is kept); an address and
 * a route left from before are removed on adoption; a persistent single-queue TUN of that name is
 * recreated; --release-lease-on-exit removes the TUN and the record. Nothing here is timed: the
 * blackout figures come from bench/restart-blackout.ts.
 */
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { after, before, describe, test } from 'node:test';
import { Cluster, CLUSTER_NETWORK, type Pod, waitFor } from '../../src/testbed/cluster.js';
import { isRoot } from '../../src/testbed/netns.js';
import { ping } from '../../src/testbed/probes.js';
import { PEER_RECORD_SIZE } from '../../src/dataplane/peer-table.js';

const skip = isRoot() ? false : 'needs root (network namespaces)';

/** One ping from `from` to `to` is answered. */
const pings = async (from: Pod, to: Pod) => (await ping(from.ns, to.ip, 1)).received === 1;

interface TunState {
  readonly ifindex: number;
  readonly persist: boolean;
  readonly multiQueue: boolean;
  readonly queues: number;
}

function tunState(c: Cluster, i: number, dev: string): TunState | null {
  let rows: Array<{
    ifindex: number;
    linkinfo?: { info_kind?: string; info_data?: Record<string, unknown> };
  }>;
  try {
    rows = JSON.parse(c.ipIn(i, '-d', '-j', 'link', 'show', 'dev', dev));
  } catch {
    return null;
  }
  const l = rows[0];
  if (!l) return null;
  assert.equal(l.linkinfo?.info_kind, 'tun', `${dev} is a tun`);
  const d = l.linkinfo!.info_data!;
  return {
    ifindex: l.ifindex,
    persist: d.persist === true,
    multiQueue: d.multi_queue === true,
    queues: Number(d.numqueues ?? 0),
  };
}

const kill9 = (c: Cluster, i: number) => c.killDaemon(i);

/** Peers in node `i`'s fast-start record (`<subnet file>.dataplane.json`); 0 when absent. */
function recordedPeers(c: Cluster, i: number): number {
  try {
    const rec = JSON.parse(readFileSync(`${c.nodes[i]!.subnetFile}.dataplane.json`, 'utf8')) as {
      peers: string;
    };
    return Buffer.from(rec.peers, 'base64').length / PEER_RECORD_SIZE;
  } catch {
    return 0; // not written yet
  }
}

const BACKENDS: ReadonlyArray<[string, Record<string, unknown>, string]> = [
  ['udp', { Type: 'udp' }, 'flannel0'],
  ['vxlan userspace', { Type: 'vxlan', Dataplane: 'userspace' }, 'flannel.1'],
];

for (const [name, backend, dev] of BACKENDS) {
  describe(`${name}: the TUN outlives kill -9 and the restarted daemon adopts it`, { skip }, () => {
    let c: Cluster;
    before(async () => {
      c = await Cluster.create({ nodes: 2, backend });
      await waitFor(() => pings(c.pods[0]!, c.pods[1]!), 20_000, 'first ping');
    });
    after(async () => {
      await c?.destroy();
    });

    test('kill -9: device (same ifindex), address and route stay; restart adopts it; pods ping', async () => {
      const before = tunState(c, 1, dev)!;
      assert.ok(before.persist && before.multiQueue && before.queues > 0, JSON.stringify(before));
      const addr = c.nodes[1]!.env.FLANNEL_SUBNET!.replace(/\.1\/24$/, '.0/32');
      // the record follows table changes within a second (fast-start.ts): it holds the peer
      await waitFor(() => recordedPeers(c, 1) === 1, 10_000, 'the record holds the peer');
      await kill9(c, 1);

      const left = tunState(c, 1, dev);
      assert.deepEqual(left, { ...before, queues: 0 }, 'the TUN outlived the process, detached');
      assert.match(c.ipIn(1, 'addr', 'show', 'dev', dev), new RegExp(`inet ${addr} `));
      assert.match(c.ipIn(1, 'route', 'show', CLUSTER_NETWORK), new RegExp(`dev ${dev}`));
      // pods behind node 1 are still routed into the TUN (packet loss, not "unreachable")
      assert.match(c.ipIn(1, 'route', 'get', c.pods[0]!.ip), new RegExp(`dev ${dev}`));

      await c.startDaemon(1);
      const early = c.nodes[1]!.logs.find(
        (l) => l.msg === 'forwarding with the last run’s peers until the store answers',
      );
      assert.ok(early, 'the engine started from the record before the store answered');
      assert.equal(early.peers, 1);
      const after = tunState(c, 1, dev)!;
      assert.equal(after.ifindex, before.ifindex, 'the same device');
      assert.ok(after.queues > 0, 'queues attached again');
      assert.ok(await pings(c.pods[0]!, c.pods[1]!), 'pod 0.0 → pod 1.0');
      assert.ok(await pings(c.pods[1]!, c.pods[0]!), 'pod 1.0 → pod 0.0');
    });
  });
}

describe('udp: stop, stale state, an incompatible TUN, lease release', { skip }, () => {
  let c: Cluster;
  before(async () => {
    c = await Cluster.create({ nodes: 2, backend: { Type: 'udp' } });
    await waitFor(() => pings(c.pods[0]!, c.pods[1]!), 20_000, 'first ping');
  });
  after(async () => {
    await c?.destroy();
  });
  const record = () => `${c.nodes[1]!.subnetFile}.dataplane.json`;

  test('SIGTERM keeps the TUN (the lease is kept) and the next start adopts it', async () => {
    const before = tunState(c, 1, 'flannel0')!;
    await c.stopDaemon(1);
    assert.deepEqual(tunState(c, 1, 'flannel0'), { ...before, queues: 0 });
    assert.ok(existsSync(record()), 'the record stays for the next start');
    await c.startDaemon(1);
    assert.equal(tunState(c, 1, 'flannel0')!.ifindex, before.ifindex);
    assert.ok(await pings(c.pods[1]!, c.pods[0]!));
  });

  test('an address and a route the adopted TUN kept from before are removed', async () => {
    await kill9(c, 1);
    c.ipIn(1, 'addr', 'add', '10.5.254.0/32', 'dev', 'flannel0');
    c.ipIn(1, 'route', 'add', '10.6.0.0/16', 'dev', 'flannel0');
    await c.startDaemon(1);
    const addrs = c.ipIn(1, 'addr', 'show', 'dev', 'flannel0');
    assert.doesNotMatch(addrs, /10\.5\.254\.0/);
    assert.match(addrs, new RegExp(c.nodes[1]!.env.FLANNEL_SUBNET!.replace(/\.1\/24$/, '.0/32')));
    assert.equal(c.ipIn(1, 'route', 'show', '10.6.0.0/16').trim(), '');
    assert.match(c.ipIn(1, 'route', 'show', CLUSTER_NETWORK), /dev flannel0/);
    assert.ok(await pings(c.pods[1]!, c.pods[0]!));
  });

  test('a persistent single-queue TUN of that name is recreated as the engine needs it', async () => {
    await kill9(c, 1);
    c.ipIn(1, 'link', 'del', 'flannel0');
    c.ipIn(1, 'tuntap', 'add', 'dev', 'flannel0', 'mode', 'tun');
    const foreign = tunState(c, 1, 'flannel0')!;
    assert.ok(foreign.persist && !foreign.multiQueue);
    await c.startDaemon(1);
    const now = tunState(c, 1, 'flannel0')!;
    assert.notEqual(now.ifindex, foreign.ifindex);
    assert.ok(now.multiQueue && now.persist && now.queues > 0, JSON.stringify(now));
    assert.ok(
      c.nodes[1]!.logs.some(
        (l) => l.msg === 'recreating a persistent tun this engine cannot attach to',
      ),
    );
    // no table from the last run here: the store's comes just after /readyz
    await waitFor(() => pings(c.pods[1]!, c.pods[0]!), 20_000, 'pod 1.0 → pod 0.0');
  });

  test('--release-lease-on-exit: SIGTERM removes the TUN, its route and the record', async () => {
    await c.stopDaemon(1);
    await c.startDaemon(1, ['--release-lease-on-exit']);
    await c.stopDaemon(1);
    assert.equal(tunState(c, 1, 'flannel0'), null);
    assert.equal(c.ipIn(1, 'route', 'show', CLUSTER_NETWORK).trim(), '');
    assert.ok(!existsSync(record()), 'the record went with the lease');
  });
});
