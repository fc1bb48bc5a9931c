/**
 * Kube mode end to end: three nodes whose daemons use the Kubernetes API as their store, served
 * by the fake API server running inside the underlay namespace (the daemons reach it over the
 * underlay, as they would a real one), on host-gw and on kernel vxlan.
 *
 *                  underlay weft-<pid>-0: br0 10.250.0.254/24 ─ fake API server :6443
 *            u0 ┌──────────────┬─u1───────────┴─────┬─u2 ──────────┐
 *   ┌─ eth0 10.250.0.1 ─┐ ┌─ eth0 10.250.0.2 ─┐ ┌─ eth0 10.250.0.3 ─┐
 *   │ node-0 daemon     │ │ node-1 daemon     │ │ node-2 daemon     │  NODE_NAME=node-i,
 *   │ podCIDR 10.5.1/24 │ │ podCIDR 10.5.2/24 │ │ podCIDR 10.5.3/24 │  --kube-subnet-mgr
 *   │ cni0 10.5.1.1     │ │ cni0 10.5.2.1     │ │ cni0 10.5.3.1     │
 *   └──┬────────────────┘ └──┬────────────────┘ └──┬────────────────┘
 *    pod 0 10.5.1.2        pod 1 10.5.2.2        pod 2 10.5.3.2
 *
 * Per backend: every pod pair pings; each node carries flannel's annotations and
 * NetworkUnavailable=False; a restart keeps the subnet and the VtepMAC and rewrites no
 * annotation; deleting a node from the API removes its routes on the others and stops its
 * daemon with the lease revoked.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { join } from 'node:path';
import { Cluster, PACKAGE_ROOT, waitFor } from '../../src/testbed/cluster.js';
import { pingFailures } from '../../src/testbed/probes.js';
import { ip, isRoot } from '../../src/testbed/netns.js';

/** The fake API server, run in the underlay namespace (its control: JSON lines). */
const KUBE_APISERVER = join(PACKAGE_ROOT, 'test', 'helpers', 'kube-apiserver-child.ts');
const skip = isRoot() ? false : 'needs root (network namespaces)';
const P = 'flannel.alpha.coreos.com/';
type Obj = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

for (const backend of [{ Type: 'host-gw' }, { Type: 'vxlan' }]) {
  describe(`kube mode, ${backend.Type}`, { skip }, () => {
    let c: Cluster;

    before(async () => {
      c = await Cluster.create({
        store: 'kube',
        kubeApiServer: KUBE_APISERVER,
        backend,
      });
    });

    after(async () => {
      await c?.destroy();
    });

    test('each daemon takes its node podCIDR as its subnet', () => {
      assert.deepEqual(
        c.nodes.map((n) => n.env.FLANNEL_SUBNET),
        ['10.5.1.1/24', '10.5.2.1/24', '10.5.3.1/24'],
      );
    });

    test('every pod pings every other pod', async () => {
      assert.deepEqual(await pingFailures(c.pods), []);
    });

    test('each node carries the flannel annotations and NetworkUnavailable=False', async () => {
      for (const n of c.nodes) {
        const node = (await c.rpc('node', n.name)) as Obj;
        const ann = node.metadata.annotations;
        assert.equal(ann[`${P}kube-subnet-manager`], 'true');
        assert.equal(ann[`${P}backend-type`], backend.Type);
        assert.equal(ann[`${P}public-ip`], n.ip);
        const cond = node.status.conditions.find((x: Obj) => x.type === 'NetworkUnavailable');
        assert.equal(cond?.status, 'False');
        assert.equal(cond?.reason, 'FlannelIsUp');
      }
    });

    test('a restart keeps the subnet and backend data and rewrites no annotation', async () => {
      const before = ((await c.rpc('node', 'node-0')) as Obj).metadata.annotations;
      const writes = async () =>
        ((await c.rpc('patches', 'node-0')) as unknown as Obj[]).filter((p) => p.body?.metadata)
          .length;
      const writesBefore = await writes();
      const subnet = c.nodes[0]!.env.FLANNEL_SUBNET;
      await c.stopDaemon(0);
      await c.startDaemon(0);
      assert.equal(c.nodes[0]!.env.FLANNEL_SUBNET, subnet);
      const after = ((await c.rpc('node', 'node-0')) as Obj).metadata.annotations;
      assert.equal(after[`${P}backend-data`], before[`${P}backend-data`]);
      if (backend.Type === 'vxlan') {
        const mac = JSON.parse(after[`${P}backend-data`]).VtepMAC;
        assert.match(ip(c.nodes[0]!.ns, 'link', 'show', 'flannel.1'), new RegExp(mac));
      }
      assert.equal(await writes(), writesBefore);
      assert.deepEqual(await pingFailures(c.pods), []);
    });

    test('a node deleted from the API loses its routes and its daemon stops revoked', async () => {
      const gone = c.nodes[2]!;
      // 'close', not 'exit': its stderr (the revoked line) is read to the end by then
      const exited = new Promise<number | null>((r) => gone.daemon!.once('close', r));
      for (const n of c.nodes.slice(0, 2)) {
        assert.notEqual(ip(n.ns, 'route', 'show', '10.5.3.0/24').trim(), '', `${n.name} route`);
      }
      await c.rpc('deleteNode', gone.name);
      for (const n of c.nodes.slice(0, 2)) {
        await waitFor(
          () => ip(n.ns, 'route', 'show', '10.5.3.0/24').trim() === '',
          5000,
          `${n.name} to drop its route to 10.5.3.0/24`,
        );
      }
      assert.equal(await exited, 1);
      assert.ok(
        gone.logs.some((l) => l.code === 'WEFT_ERR_LEASE_REVOKED' && /revoked/.test(l.msg)),
        'no revoked error in the daemon log',
      );
    });
  });
}
