/**
 * The node informer keeps only what weft reads of each node (name, resourceVersion,
 * annotations, pod CIDRs): a real Node's status, labels and managedFields are most of its size,
 * and 5,000 of them held whole would be most of a daemon's memory. Driven through the fake API
 * server, listed and watched.
 */
import assert from 'node:assert/strict';
import { afterEach, beforeEach, test } from 'node:test';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { logger } from '../../../../src/common/log.js';
import { KubeApi, loadKubeConfig } from '../../../../src/control/kube/kube-api.js';
import {
  NodeInformer,
  slimNode,
  type NodeBatch,
  type NodeChange,
} from '../../../../src/control/kube/kube-informer.js';
import { FakeKubeApiServer } from '../../../fakes/kube-apiserver.js';

const ANN = { 'flannel.alpha.coreos.com/public-ip': '192.168.1.2' };

/** A node as a kubelet fills it in: big status, labels, managedFields. */
function fatten(n: { metadata: Record<string, unknown>; status?: unknown; spec?: unknown }) {
  n.metadata.labels = { 'kubernetes.io/hostname': 'x', 'node.kubernetes.io/instance-type': 'm5' };
  n.metadata.managedFields = [{ manager: 'kubelet', fieldsV1: { 'f:status': {} } }];
  n.status = {
    images: Array.from({ length: 50 }, (_, i) => ({
      names: [`registry/image-${i}:v1`],
      sizeBytes: i,
    })),
    conditions: [{ type: 'Ready', status: 'True' }],
    nodeInfo: { kubeletVersion: 'v1.31.0' },
  };
  (n.spec as Record<string, unknown>).taints = [{ key: 'k', effect: 'NoSchedule' }];
}

const KEPT = (name: string, rv: string, podCIDR: string) => ({
  metadata: { name, resourceVersion: rv, annotations: ANN },
  spec: { podCIDR },
});

let server: FakeKubeApiServer;
let ac: AbortController;
beforeEach(async () => {
  server = await FakeKubeApiServer.start();
  ac = new AbortController();
});
afterEach(async () => {
  ac.abort();
  await server.close();
});

async function nextBatch(it: AsyncIterator<NodeBatch>): Promise<NodeBatch> {
  const r = await it.next();
  assert.ok(!r.done);
  return r.value;
}

test('slimNode keeps name, resourceVersion, annotations and pod CIDRs only', () => {
  const node = {
    metadata: { name: 'a', resourceVersion: '7', annotations: ANN, uid: 'u' },
    spec: { podCIDR: '10.5.1.0/24', podCIDRs: ['10.5.1.0/24', 'fd00::/64'] },
  };
  fatten(node);
  assert.deepEqual(slimNode(node), {
    metadata: { name: 'a', resourceVersion: '7', annotations: ANN },
    spec: { podCIDR: '10.5.1.0/24', podCIDRs: ['10.5.1.0/24', 'fd00::/64'] },
  });
  assert.deepEqual(slimNode({ metadata: { name: 'b' } }), { metadata: { name: 'b' } });
});

test(
  'listed and watched nodes reach subscribers (and the cache) cut down',
  { timeout: 20_000 },
  async () => {
    server.addNode({ name: 'a', podCIDR: '10.5.1.0/24', annotations: ANN });
    server.updateNode('a', (n) => fatten(n));
    const informer = new NodeInformer(new KubeApi(loadKubeConfig({ apiUrl: server.url })), {
      log: logger('test'),
      watchTimeoutSeconds: 30,
    });
    try {
      const it = informer.subscribe(ac.signal)[Symbol.asyncIterator]();
      const sync = await nextBatch(it);
      assert.equal(sync.kind, 'sync');
      const a = sync.kind === 'sync' ? sync.nodes.get('a') : undefined;
      assert.deepEqual(a, KEPT('a', a!.metadata.resourceVersion!, '10.5.1.0/24'));

      server.addNode({ name: 'b', podCIDR: '10.5.2.0/24', annotations: ANN });
      const rv = (server.updateNode('b', (n) => fatten(n)).metadata as { resourceVersion: string })
        .resourceVersion;
      const changes: NodeChange[] = [];
      while (!changes.some((c) => c.node.metadata.resourceVersion === rv)) {
        const batch = await nextBatch(it);
        assert.equal(batch.kind, 'changes');
        if (batch.kind === 'changes') changes.push(...batch.changes);
      }
      for (const c of changes)
        assert.deepEqual(c.node, KEPT('b', c.node.metadata.resourceVersion!, '10.5.2.0/24'));
      const cached = informer.get('b')!;
      assert.deepEqual(cached, KEPT('b', cached.metadata.resourceVersion!, '10.5.2.0/24'));
    } finally {
      await informer.close();
    }
  },
);

test(
  'the whole list is let go once the nodes are cached (the watch keeps only slim nodes)',
  {
    timeout: 20_000,
  },
  async () => {
    // A local holding the list inside the run loop stays alive while the loop is suspended in the
    // watch, for as long as it lasts: 5,000 real Nodes at 10-50 KB each.
    setFlagsFromString('--expose-gc');
    const gc = runInNewContext('gc') as () => void;
    const listed: Array<WeakRef<object>> = [];
    class TrackingApi extends KubeApi {
      override async listNodes(signal?: AbortSignal) {
        const list = await super.listNodes(signal);
        listed.push(
          new WeakRef(list),
          new WeakRef(list.items),
          ...list.items.map((n) => new WeakRef(n)),
        );
        return list;
      }
    }
    for (const [i, name] of ['a', 'b', 'c'].entries()) {
      server.addNode({ name, podCIDR: `10.5.${i + 1}.0/24`, annotations: ANN });
      server.updateNode(name, (n) => fatten(n));
    }
    const informer = new NodeInformer(new TrackingApi(loadKubeConfig({ apiUrl: server.url })), {
      log: logger('test'),
      watchTimeoutSeconds: 30,
    });
    try {
      const it = informer.subscribe(ac.signal)[Symbol.asyncIterator]();
      assert.equal((await nextBatch(it)).kind, 'sync');
      // A change seen proves the run loop has moved on into the watch, where it waits.
      server.addNode({ name: 'd', podCIDR: '10.5.4.0/24', annotations: ANN });
      assert.equal((await nextBatch(it)).kind, 'changes');
      assert.equal(listed.length, 5);
      // (WeakRef targets are kept until the current job ends)
      await new Promise((r) => setImmediate(r));
      gc();
      assert.deepEqual(
        listed.map((r) => r.deref() === undefined),
        listed.map(() => true),
        'nothing of the list is alive',
      );
      assert.deepEqual(
        informer.get('a'),
        KEPT('a', informer.get('a')!.metadata.resourceVersion!, '10.5.1.0/24'),
      );
    } finally {
      await informer.close();
    }
  },
);
