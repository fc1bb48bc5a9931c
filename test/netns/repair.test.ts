/**
 * Repair of the backend's own state by the re-check (the Reconciler's resync, started by the
 * kernel's change notification; every 10 s while the state cannot be restored), on 2-node
 * clusters with the real daemon (src/testbed/cluster.ts):
 *
 *   udp            the cluster route via flannel0 deleted by hand → restored, pods ping again;
 *                  the TUN's address deleted (the kernel flushes the route with it) → both back
 *   kernel vxlan   flannel.1 deleted → created again with the same VtepMAC, its address and every
 *                  peer entry restored, pods ping again; while a device holding the same VNI
 *                  keeps it from being created, /readyz answers 503, and 200 once it is back
 *   udp, vxlan userspace   the TUN deleted → the engine starts again on a new TUN of that name
 *                  (same options, the current peer table), address and route back, pods ping
 *
 * Waits are generous (a loaded machine); what is asserted is the restored state and the
 * readiness transitions, not how fast they came.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Cluster, CLUSTER_NETWORK, type Pod, waitFor } from '../../src/testbed/cluster.js';
import { isRoot, nsExecAsync } from '../../src/testbed/netns.js';

const skip = isRoot() ? false : 'needs root (network namespaces)';
const HEALTH_PORT = '9094';
/** Generous: the change-started re-check comes within a second, the 10 s one while a device cannot be restored; a loaded 2-CPU box may be slow. */
const REPAIR_WAIT_MS = 45_000;

async function pings(from: Pod, to: Pod): Promise<boolean> {
  try {
    await nsExecAsync(from.ns, 'ping', ['-c', '1', '-W', '1', to.ip], 10_000);
    return true;
  } catch {
    return false;
  }
}

async function readyz(ns: string): Promise<number> {
  const out = await nsExecAsync(ns, process.execPath, [
    '-e',
    `fetch('http://127.0.0.1:${HEALTH_PORT}/readyz').then(r=>process.stdout.write(String(r.status)))`,
  ]);
  return Number(out.trim());
}

const flags = ['--healthz-port', HEALTH_PORT, '--healthz-ip', '127.0.0.1'];

describe('udp: the TUN route and address are restored by the re-check', { skip }, () => {
  let c: Cluster;
  before(async () => {
    c = await Cluster.create({ nodes: 2, backend: { Type: 'udp' }, flags });
    await waitFor(() => pings(c.pods[0]!, c.pods[1]!), 30_000, 'first ping');
  });
  after(async () => {
    await c?.destroy();
  });

  const route = () => c.ipIn(0, 'route', 'show', CLUSTER_NETWORK);
  const repairs = () =>
    c.nodes[0]!.logs.filter((l) => l.msg === 'tun address/route restored').length;

  test('a deleted cluster route via flannel0 comes back and pods ping again', async () => {
    const before = repairs();
    c.ipIn(0, 'route', 'del', CLUSTER_NETWORK, 'dev', 'flannel0');
    await waitFor(() => repairs() > before, REPAIR_WAIT_MS, 'the daemon restoring the route');
    assert.match(route(), /dev flannel0/);
    await waitFor(() => pings(c.pods[0]!, c.pods[1]!), 30_000, 'ping after the repair');
    assert.equal(await readyz(c.nodes[0]!.ns), 200);
  });

  test('a deleted TUN address comes back with the route', async () => {
    const addr = c.nodes[0]!.env.FLANNEL_SUBNET!.replace(/\.1\/24$/, '.0/32');
    const before = repairs();
    c.ipIn(0, 'addr', 'del', addr, 'dev', 'flannel0');
    await waitFor(() => repairs() > before, REPAIR_WAIT_MS, 'the daemon restoring the address');
    await waitFor(
      () => c.ipIn(0, 'addr', 'show', 'dev', 'flannel0').includes(`inet ${addr}`),
      REPAIR_WAIT_MS,
      'the address restored',
    );
    await waitFor(() => /dev flannel0/.test(route()), REPAIR_WAIT_MS, 'the route restored');
    await waitFor(() => pings(c.pods[0]!, c.pods[1]!), 30_000, 'ping after the repair');
    assert.equal(await readyz(c.nodes[0]!.ns), 200);
  });
});

for (const [name, backend, tun] of [
  ['udp', { Type: 'udp' }, 'flannel0'],
  ['vxlan userspace', { Type: 'vxlan', Dataplane: 'userspace' }, 'flannel.1'],
] as const) {
  describe(`${name}: a deleted TUN is created again by the re-check`, { skip }, () => {
    let c: Cluster;
    before(async () => {
      c = await Cluster.create({ nodes: 2, backend, flags });
      await waitFor(() => pings(c.pods[0]!, c.pods[1]!), 30_000, 'first ping');
    });
    after(async () => {
      await c?.destroy();
    });

    test('a new TUN of the same name with its address and route; pods ping again; ready', async () => {
      const ifindex = () => /^(\d+):/.exec(c.ipIn(0, 'link', 'show', tun))?.[1];
      const old = ifindex();
      assert.ok(old);
      c.ipIn(0, 'link', 'del', tun);
      await waitFor(
        () =>
          c.nodes[0]!.logs.some(
            (l) => l.msg === 'tun device gone; starting the dataplane on a new one',
          ),
        REPAIR_WAIT_MS,
        'the daemon starting its dataplane on a new TUN',
      );
      await waitFor(
        () => {
          try {
            return ifindex() !== undefined && ifindex() !== old;
          } catch {
            return false;
          }
        },
        REPAIR_WAIT_MS,
        'a new TUN',
      );
      await waitFor(
        () => c.ipIn(0, 'route', 'show', CLUSTER_NETWORK).includes(`dev ${tun}`),
        REPAIR_WAIT_MS,
        'the cluster route on the new TUN',
      );
      await waitFor(() => pings(c.pods[0]!, c.pods[1]!), 30_000, 'ping after the repair');
      await waitFor(async () => (await readyz(c.nodes[0]!.ns)) === 200, REPAIR_WAIT_MS, 'ready');
    });
  });
}

describe('kernel vxlan: a deleted flannel.1 is created again', { skip }, () => {
  let c: Cluster;
  before(async () => {
    c = await Cluster.create({ nodes: 2, backend: { Type: 'vxlan' }, flags });
    await waitFor(() => pings(c.pods[0]!, c.pods[1]!), 30_000, 'first ping');
  });
  after(async () => {
    await c?.destroy();
  });

  const macOf = () => /link\/ether (\S+)/.exec(c.ipIn(0, 'link', 'show', 'flannel.1'))?.[1];
  const peerRoute = () =>
    c.ipIn(0, 'route', 'show', c.nodes[1]!.env.FLANNEL_SUBNET!.replace(/\.1\/24$/, '.0/24'));

  test('recreated with the same MAC, address and peer entries; pods ping again', async () => {
    const mac = macOf();
    assert.ok(mac);
    c.ipIn(0, 'link', 'del', 'flannel.1');
    await waitFor(
      () => c.nodes[0]!.logs.some((l) => l.msg === 'vxlan device missing; creating it again'),
      REPAIR_WAIT_MS,
      'the daemon creating flannel.1 again',
    );
    await waitFor(() => /dev flannel\.1 onlink/.test(peerRoute()), REPAIR_WAIT_MS, 'peer route');
    assert.equal(macOf(), mac, 'the VtepMAC the peers know is kept');
    const addr = c.nodes[0]!.env.FLANNEL_SUBNET!.replace(/\.1\/24$/, '.0/32');
    assert.ok(c.ipIn(0, 'addr', 'show', 'dev', 'flannel.1').includes(`inet ${addr}`));
    await waitFor(() => pings(c.pods[0]!, c.pods[1]!), 30_000, 'ping after the repair');
    assert.equal(await readyz(c.nodes[0]!.ns), 200);
  });

  test('/readyz is 503 while the device cannot be created, 200 once it is back', async () => {
    // The daemon is stopped while flannel.1 goes and the blocker comes, so it cannot make
    // flannel.1 again in between: it wakes to find the device gone and its VNI taken. Same VNI,
    // port and local address: the kernel refuses a second such device (EEXIST).
    const daemon = c.nodes[0]!.daemon!;
    daemon.kill('SIGSTOP');
    try {
      c.ipIn(0, 'link', 'del', 'flannel.1');
      c.ipIn(0, 'link', 'add', 'weftblk', 'type', 'vxlan', 'id', '1', 'dstport', '8472');
      c.ipIn(0, 'link', 'set', 'weftblk', 'up');
    } finally {
      daemon.kill('SIGCONT');
    }
    try {
      await waitFor(
        async () => (await readyz(c.nodes[0]!.ns)) === 503,
        REPAIR_WAIT_MS,
        '503 while flannel.1 cannot be created',
      );
      assert.ok(
        c.nodes[0]!.logs.some((l) => l.msg === 'vxlan device cannot be restored; not ready'),
      );
    } finally {
      c.ipIn(0, 'link', 'del', 'weftblk');
    }
    await waitFor(
      async () => (await readyz(c.nodes[0]!.ns)) === 200,
      REPAIR_WAIT_MS,
      '200 once flannel.1 is back',
    );
    assert.match(c.ipIn(0, 'link', 'show', 'flannel.1'), /UP/);
    await waitFor(() => pings(c.pods[0]!, c.pods[1]!), 30_000, 'ping after the repair');
  });
});
