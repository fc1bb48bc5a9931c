/**
 * Issue #12.1: daemons whose subnet files sit in ONE directory (`<dir>/n1.env`, `n2.env`,
 * `n3.env`) must still publish one VtepMAC each. Three nodes on a real etcd and three in kube
 * mode (the fake API server), kernel vxlan and userspace vxlan (`"Dataplane":"userspace"`):
 * every VtepMAC differs, each is kept in a file of its own beside its subnet file, and every
 * pod pair pings.
 *
 *            underlay br0 10.250.0.254/24 ─ etcd :2379 (or the fake API server :6443)
 *     ┌──────────┼──────────┐
 *   node 0     node 1     node 2        subnet files <dir>/subnets/n1.env n2.env n3.env
 *   pod 0      pod 1      pod 2
 */
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Cluster, PACKAGE_ROOT, type StoreKind } from '../../src/testbed/cluster.js';
import { pingFailures } from '../../src/testbed/probes.js';
import { isRoot } from '../../src/testbed/netns.js';
import { etcdSkipReason } from '../helpers/etcd.js';

const skip = !isRoot() ? 'needs root (network namespaces)' : (etcdSkipReason() ?? false);
/** The fake API server, run in the underlay namespace (its control: JSON lines). */
const KUBE_APISERVER = join(PACKAGE_ROOT, 'test', 'helpers', 'kube-apiserver-child.ts');

const BACKENDS = [{ Type: 'vxlan' }, { Type: 'vxlan', Dataplane: 'userspace' }] as const;

function label(b: Record<string, unknown>): string {
  return b.Dataplane === 'userspace' ? 'userspace vxlan' : 'kernel vxlan';
}

/** The VtepMAC file the daemon keeps beside `subnetFile` (one per node, docs/configuration.md). */
function macFileOf(subnetFile: string): string {
  return `${subnetFile}.flannel.1.vtep-mac`;
}

for (const backend of BACKENDS) {
  for (const store of ['etcd', 'kube'] as StoreKind[]) {
    describe(`subnet files in one directory, ${store}, ${label(backend)}`, { skip }, () => {
      let c: Cluster;
      before(async () => {
        c = await Cluster.create({
          backend,
          store,
          kubeApiServer: KUBE_APISERVER,
          sharedSubnetDir: true,
        });
      });
      after(async () => {
        await c?.destroy();
      });

      test('the subnet files share one directory and each node keeps a VtepMAC of its own', () => {
        const files = c.nodes.map((n) => n.subnetFile);
        assert.equal(new Set(files.map((f) => f.slice(0, f.lastIndexOf('/')))).size, 1);
        const macs = files.map((f) => {
          assert.ok(existsSync(macFileOf(f)), `${macFileOf(f)} exists`);
          return readFileSync(macFileOf(f), 'utf8').trim();
        });
        assert.equal(new Set(macs).size, macs.length, `one VtepMAC per node: ${macs.join(' ')}`);
      });

      test('every pod pair pings', async () => {
        assert.deepEqual(await pingFailures(c.pods), []);
      });
    });
  }
}
