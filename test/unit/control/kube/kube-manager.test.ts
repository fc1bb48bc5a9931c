import { after, afterEach, beforeEach, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { isWeftError } from '../../../../src/common/errors.js';
import { parseNetConfig } from '../../../../src/control/config/net-config.js';
import { continuesSnapshot } from '../../../../src/control/lease/snapshot-parts.js';
import type { LeaseAttrs, LeaseEvent } from '../../../../src/control/lease/types.js';
import { createLeaseMetrics, type LeaseMetrics } from '../../../../src/control/metrics/metrics.js';
import { KubeApi, loadKubeConfig } from '../../../../src/control/kube/kube-api.js';
import {
  KubeManager,
  NETWORK_CONDITION,
  kubeAnnotations,
  openKubeManager,
} from '../../../../src/control/kube/kube-manager.js';
import { FakeKubeApiServer } from '../../../../src/testbed/kube-apiserver.js';

const P = 'flannel.alpha.coreos.com/';
const NET = JSON.stringify({ Network: '10.5.0.0/16', Backend: { Type: 'vxlan' } });
const NET_DUAL = JSON.stringify({
  Network: '10.5.0.0/16',
  EnableIPv6: true,
  IPv6Network: 'fc00::/48',
  Backend: { Type: 'host-gw' },
});
const MAC = 'aa:bb:cc:dd:ee:01';
const ATTRS: LeaseAttrs = {
  publicIP: '192.0.2.1',
  publicIPv6: null,
  backendType: 'vxlan',
  backendData: { VNI: 1, VtepMAC: MAC },
};

/** Annotations of a node that runs weft (or flannel) with vxlan. */
function peerAnnotations(ip: string, mac = 'aa:bb:cc:dd:ee:99'): Record<string, string> {
  return {
    [`${P}kube-subnet-manager`]: 'true',
    [`${P}backend-type`]: 'vxlan',
    [`${P}backend-data`]: JSON.stringify({ VNI: 1, VtepMAC: mac }),
    [`${P}public-ip`]: ip,
  };
}

let server: FakeKubeApiServer;
let metrics: LeaseMetrics;
let ac: AbortController;
const managers: KubeManager[] = [];

function manager(
  o: { net?: string; node?: string; condition?: boolean; waitMs?: number; pageSize?: number } = {},
) {
  const m = new KubeManager({
    api: new KubeApi(loadKubeConfig({ apiUrl: server.url })),
    nodeName: o.node ?? 'n1',
    netConfig: parseNetConfig(o.net ?? NET),
    setNodeNetworkUnavailable: o.condition ?? true,
    metrics,
    podCidrWaitMs: o.waitMs ?? 300,
    informer: { backoffMs: 20, ...(o.pageSize ? { listPageSize: o.pageSize } : {}) },
  });
  managers.push(m);
  return m;
}

/** The next value of an iterator, failing after `ms`. */
async function next<T>(it: AsyncIterator<T>, ms = 3000): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no value within ${ms} ms`)), ms);
  });
  try {
    const r = await Promise.race([it.next(), timeout]);
    if (r.done) throw new Error('iterator ended');
    return r.value;
  } finally {
    clearTimeout(timer);
  }
}

const summary = (events: LeaseEvent[]) =>
  events.map((e) => `${e.type} ${e.lease.key} ${e.lease.attrs.publicIP}`).sort();

/** The node list requests the fake server has seen (not watches, not single nodes). */
const nodeLists = () =>
  server
    .requestsTo('GET', '/api/v1/nodes')
    .filter((r) => r.path === '/api/v1/nodes' && r.query.get('watch') !== 'true');

async function counter(c: { get(): Promise<{ values: Array<{ value: number }> }> }) {
  return (await c.get()).values.reduce((s, v) => s + v.value, 0);
}

beforeEach(async () => {
  server = await FakeKubeApiServer.start();
  metrics = createLeaseMetrics();
  ac = new AbortController();
});

afterEach(async () => {
  ac.abort();
  for (const m of managers.splice(0)) await m.close();
  await server.close();
});

describe('annotation names', () => {
  test('a prefix without "/" gets one appended', () => {
    assert.equal(kubeAnnotations('example.com').backendData, 'example.com/backend-data');
  });

  test('a prefix with a name after "/" gets "-" appended', () => {
    assert.equal(kubeAnnotations('example.com/weft').publicIP, 'example.com/weft-public-ip');
  });

  test('the default prefix gives flannel names', () => {
    const a = kubeAnnotations('flannel.alpha.coreos.com');
    assert.equal(a.subnetKubeManaged, 'flannel.alpha.coreos.com/kube-subnet-manager');
    assert.equal(a.publicIPOverwrite, 'flannel.alpha.coreos.com/public-ip-overwrite');
  });

  test('two slashes or a non-FQDN prefix is a usage error', () => {
    assert.throws(
      () => kubeAnnotations('a.b/c/d'),
      (e) => isWeftError(e, 'WEFT_ERR_USAGE'),
    );
    assert.throws(
      () => kubeAnnotations('NoDots'),
      (e) => isWeftError(e, 'WEFT_ERR_USAGE'),
    );
  });
});

describe('acquireLease', () => {
  test('the lease is the node podCIDR and never expires', async () => {
    server.addNode({ name: 'n1', podCIDR: '10.5.7.0/24' });
    const lease = await manager().acquireLease(ATTRS);
    assert.equal(lease.key, '10.5.7.0-24');
    assert.equal(lease.expiration, null);
    assert.equal(lease.ipv6Subnet, null);
  });

  test('annotations are written with one strategic-merge patch on nodes/<name>/status', async () => {
    server.addNode({ name: 'n1', podCIDR: '10.5.7.0/24' });
    await manager({ condition: false }).acquireLease(ATTRS);
    const patches = server.requestsTo('PATCH', '/api/v1/nodes/n1');
    assert.equal(patches.length, 1);
    assert.equal(patches[0]!.path, '/api/v1/nodes/n1/status');
    assert.equal(patches[0]!.contentType, 'application/strategic-merge-patch+json');
    const ann = (server.node('n1')!.metadata as { annotations: Record<string, string> })
      .annotations;
    assert.deepEqual(ann, {
      [`${P}backend-type`]: 'vxlan',
      [`${P}backend-data`]: `{"VNI":1,"VtepMAC":"${MAC}"}`,
      [`${P}public-ip`]: '192.0.2.1',
      [`${P}kube-subnet-manager`]: 'true',
    });
  });

  test('annotations that already match are not patched again', async () => {
    server.addNode({ name: 'n1', podCIDR: '10.5.7.0/24' });
    await manager({ condition: false }).acquireLease(ATTRS);
    await manager({ condition: false }).acquireLease(ATTRS);
    assert.equal(server.requestsTo('PATCH', '/api/v1/nodes/n1').length, 1);
  });

  test('host-gw writes backend-data "null", as flannel', async () => {
    server.addNode({ name: 'n1', podCIDR: '10.5.7.0/24' });
    await manager({ condition: false }).acquireLease({
      publicIP: '192.0.2.1',
      publicIPv6: null,
      backendType: 'host-gw',
    });
    const ann = (server.node('n1')!.metadata as { annotations: Record<string, string> })
      .annotations;
    assert.equal(ann[`${P}backend-data`], 'null');
  });

  test('public-ip-overwrite replaces the published address', async () => {
    server.addNode({
      name: 'n1',
      podCIDR: '10.5.7.0/24',
      annotations: { [`${P}public-ip-overwrite`]: '198.51.100.9' },
    });
    const lease = await manager().acquireLease(ATTRS);
    const ann = (server.node('n1')!.metadata as { annotations: Record<string, string> })
      .annotations;
    assert.equal(ann[`${P}public-ip`], '198.51.100.9');
    assert.equal(lease.attrs.publicIP, '198.51.100.9');
  });

  test('NetworkUnavailable=False is set with flannel reason and message', async () => {
    server.addNode({ name: 'n1', podCIDR: '10.5.7.0/24' });
    await manager().acquireLease(ATTRS);
    const conds = (server.node('n1')!.status as { conditions: Array<Record<string, string>> })
      .conditions;
    assert.equal(conds.length, 1);
    assert.deepEqual(
      {
        type: conds[0]!.type,
        status: conds[0]!.status,
        reason: conds[0]!.reason,
        message: conds[0]!.message,
      },
      { ...NETWORK_CONDITION },
    );
    assert.equal(NETWORK_CONDITION.message, 'Flannel is running on this node');
  });

  test('--set-node-network-unavailable=false leaves the conditions alone', async () => {
    server.addNode({ name: 'n1', podCIDR: '10.5.7.0/24' });
    await manager({ condition: false }).acquireLease(ATTRS);
    const conds = (server.node('n1')!.status as { conditions: unknown[] }).conditions;
    assert.deepEqual(conds, []);
  });

  test('an unassigned podCIDR is waited for, then fails with WEFT_ERR_KUBE_POD_CIDR', async () => {
    server.addNode({ name: 'n1' });
    const t0 = Date.now();
    await assert.rejects(manager({ waitMs: 400 }).acquireLease(ATTRS), (e) => {
      assert.ok(isWeftError(e, 'WEFT_ERR_KUBE_POD_CIDR'));
      assert.match(e.message, /node "n1" pod cidr not assigned/);
      return true;
    });
    assert.ok(Date.now() - t0 >= 350, 'gave up without waiting');
  });

  test('a podCIDR assigned while waiting is used', async () => {
    server.addNode({ name: 'n1' });
    setTimeout(() => server.updateNode('n1', (n) => (n.spec.podCIDR = '10.5.9.0/24')), 150);
    const lease = await manager({ waitMs: 5000 }).acquireLease(ATTRS);
    assert.equal(lease.key, '10.5.9.0-24');
  });

  test('a podCIDR outside the network fails with WEFT_ERR_KUBE_POD_CIDR naming both', async () => {
    server.addNode({ name: 'n1', podCIDR: '10.6.1.0/24' });
    await assert.rejects(manager().acquireLease(ATTRS), (e) => {
      assert.ok(isWeftError(e, 'WEFT_ERR_KUBE_POD_CIDR'));
      assert.match(e.message, /10\.6\.1\.0\/24 is outside the configured network 10\.5\.0\.0\/16/);
      return true;
    });
  });

  test('dual-stack podCIDRs give a dual-stack lease and v6 annotations', async () => {
    server.addNode({ name: 'n1', podCIDRs: ['10.5.3.0/24', 'fc00:0:0:3::/64'] });
    const lease = await manager({ net: NET_DUAL, condition: false }).acquireLease({
      publicIP: '192.0.2.1',
      publicIPv6: '2001:db8::1',
      backendType: 'host-gw',
    });
    assert.equal(lease.key, '10.5.3.0-24&fc00:0:0:3::-64');
    const ann = (server.node('n1')!.metadata as { annotations: Record<string, string> })
      .annotations;
    assert.equal(ann[`${P}public-ipv6`], '2001:db8::1');
    assert.equal(ann[`${P}backend-v6-data`], 'null');
  });

  test('a dual-stack config on a node with only an IPv4 podCIDR is WEFT_ERR_KUBE_POD_CIDR', async () => {
    server.addNode({ name: 'n1', podCIDR: '10.5.3.0/24' });
    const m = manager({ net: NET_DUAL });
    await assert.rejects(
      m.acquireLease({ publicIP: '192.0.2.1', publicIPv6: '2001:db8::1', backendType: 'host-gw' }),
      (e) => isWeftError(e, 'WEFT_ERR_KUBE_POD_CIDR') && /no IPv6 podCIDR/.test(e.message),
    );
  });

  test('a missing node is WEFT_ERR_KUBE_NODE', async () => {
    await assert.rejects(manager().acquireLease(ATTRS), (e) =>
      isWeftError(e, 'WEFT_ERR_KUBE_NODE'),
    );
  });

  test('renewLease returns the lease with no expiration', async () => {
    server.addNode({ name: 'n1', podCIDR: '10.5.7.0/24' });
    const m = manager();
    const lease = await m.acquireLease(ATTRS);
    const renewed = await m.renewLease({ ...lease, expiration: new Date() });
    assert.equal(renewed.expiration, null);
    assert.equal(renewed.key, lease.key);
  });
});

describe('previous backend data', () => {
  test('the VtepMAC published before a restart is read back', async () => {
    server.addNode({
      name: 'n1',
      podCIDR: '10.5.7.0/24',
      annotations: peerAnnotations('192.0.2.1', MAC),
    });
    const m = manager();
    await m.loadPrevious();
    assert.deepEqual(m.storedVtepMACs(), { v4: MAC, v6: null });
    assert.deepEqual(m.previousBackendData(), {
      backendData: { VNI: 1, VtepMAC: MAC },
      backendV6Data: undefined,
    });
  });

  test('a node that never ran weft has no stored MAC', async () => {
    server.addNode({ name: 'n1', podCIDR: '10.5.7.0/24' });
    const m = manager();
    await m.loadPrevious();
    assert.deepEqual(m.storedVtepMACs(), { v4: null, v6: null });
  });
});

describe('watchLeases', () => {
  async function start() {
    server.addNode({ name: 'n1', podCIDR: '10.5.1.0/24' });
    server.addNode({
      name: 'n2',
      podCIDR: '10.5.2.0/24',
      annotations: peerAnnotations('192.0.2.2'),
    });
    server.addNode({ name: 'plain', podCIDR: '10.5.9.0/24' }); // not running weft
    const m = manager();
    const own = await m.acquireLease(ATTRS);
    const it = m.watchLeases(own, ac.signal)[Symbol.asyncIterator]();
    return { m, own, it };
  }

  test('the first batch adds every annotated peer, not us, not unannotated nodes', async () => {
    const { it } = await start();
    assert.deepEqual(summary(await next(it)), ['added 10.5.2.0-24 192.0.2.2']);
  });

  test('the events of a batch are counted, and the peers known set', async () => {
    const { it } = await start();
    await next(it);
    assert.equal(await counter(metrics.events), 1);
    assert.equal(await counter(metrics.peers), 1);
  });

  /** Our node and one peer with a VtepMAC: a manager not yet started. */
  function ownAndPeer() {
    server.addNode({ name: 'n1', podCIDR: '10.5.1.0/24' });
    server.addNode({
      name: 'n2',
      podCIDR: '10.5.2.0/24',
      annotations: peerAnnotations('192.0.2.2', 'aa:bb:cc:dd:ee:02'),
    });
    return manager();
  }

  test('otherLeases at start (a VTEP MAC to choose) and the watch share one latest-state list', async () => {
    const m = ownAndPeer();
    const others = await m.otherLeases(ATTRS, ac.signal);
    assert.deepEqual(
      others.map((l) => l.attrs.backendData),
      [{ VNI: 1, VtepMAC: 'aa:bb:cc:dd:ee:02' }],
    );
    const own = await m.acquireLease(ATTRS);
    const it = m.watchLeases(own, ac.signal)[Symbol.asyncIterator]();
    assert.deepEqual(summary(await next(it)), ['added 10.5.2.0-24 192.0.2.2']);
    const lists = nodeLists();
    assert.equal(lists.length, 1, 'one list');
    assert.equal(lists[0]!.query.get('resourceVersion'), null, 'the latest state (rv="")');
  });

  test('acquireLease with publish: false writes nothing; with latestPeers it starts a latest-state first list', async () => {
    const m = ownAndPeer();
    const lease = await m.acquireLease(ATTRS, { publish: false, latestPeers: true });
    assert.equal(lease.key, '10.5.1.0-24');
    assert.deepEqual(lease.attrs.backendData, ATTRS.backendData);
    const it = m.watchLeases(lease, ac.signal)[Symbol.asyncIterator]();
    assert.deepEqual(summary(await next(it)), ['added 10.5.2.0-24 192.0.2.2']);
    assert.deepEqual(server.requestsTo('PATCH', '/api/v1/nodes/n1'), [], 'nothing written');
    const lists = nodeLists();
    assert.equal(lists.length, 1, 'one list');
    assert.equal(lists[0]!.query.get('resourceVersion'), null, 'the latest state (rv="")');
  });

  test('acquireLease with publish: false and no VtepMAC to check leaves the first list to the watch cache', async () => {
    const m = ownAndPeer();
    const lease = await m.acquireLease(ATTRS, { publish: false });
    assert.equal(nodeLists().length, 0, 'no list yet');
    const it = m.watchLeases(lease, ac.signal)[Symbol.asyncIterator]();
    assert.deepEqual(summary(await next(it)), ['added 10.5.2.0-24 192.0.2.2']);
    assert.equal(nodeLists()[0]!.query.get('resourceVersion'), '0', 'any version (rv=0)');
  });

  test('the first list comes in parts of the snapshot, page by page, its sync the last part', async () => {
    server.addNode({ name: 'n1', podCIDR: '10.5.1.0/24' });
    for (let i = 2; i <= 6; i++) {
      server.addNode({
        name: `n${i}`,
        podCIDR: `10.5.${i}.0/24`,
        annotations: peerAnnotations(`192.0.2.${i}`, `aa:bb:cc:dd:ee:0${i}`),
      });
    }
    const m = manager({ pageSize: 2 });
    const own = await m.acquireLease(ATTRS);
    const it = m.watchLeases(own, ac.signal)[Symbol.asyncIterator]();
    const got: Array<[string[], boolean]> = [];
    for (let i = 0; i < 4; i++) {
      const b = await next(it);
      got.push([b.map((e) => `${e.type} ${e.lease.key}`), continuesSnapshot(b)]);
    }
    // pages of two nodes: n1 (us) and n2, n3 and n4, n5 and n6; the sync ends the snapshot
    // (nothing new in it: an empty last part)
    assert.deepEqual(got, [
      [['added 10.5.2.0-24'], true],
      [['added 10.5.3.0-24', 'added 10.5.4.0-24'], true],
      [['added 10.5.5.0-24', 'added 10.5.6.0-24'], true],
      [[], false],
    ]);
    server.addNode({
      name: 'n7',
      podCIDR: '10.5.7.0/24',
      annotations: peerAnnotations('192.0.2.7', 'aa:bb:cc:dd:ee:07'),
    });
    const later = await next(it);
    assert.deepEqual(
      [later.map((e) => `${e.type} ${e.lease.key}`), continuesSnapshot(later)],
      [['added 10.5.7.0-24'], false],
    );
  });

  test('a node otherLeases read is not read again for the first batch of the watch (the same lease)', async () => {
    const m = ownAndPeer();
    const [other] = await m.otherLeases(ATTRS, ac.signal);
    const own = await m.acquireLease(ATTRS);
    const it = m.watchLeases(own, ac.signal)[Symbol.asyncIterator]();
    const [first] = await next(it);
    assert.ok(other);
    assert.equal(first?.lease, other, 'the lease object otherLeases returned');
  });

  test('a new annotated node is added', async () => {
    const { it } = await start();
    await next(it);
    server.addNode({
      name: 'n3',
      podCIDR: '10.5.3.0/24',
      annotations: peerAnnotations('192.0.2.3'),
    });
    assert.deepEqual(summary(await next(it)), ['added 10.5.3.0-24 192.0.2.3']);
  });

  test('a changed public-ip is an added event with the new address', async () => {
    const { it } = await start();
    await next(it);
    server.updateNode('n2', (n) => {
      (n.metadata.annotations as Record<string, string>)[`${P}public-ip`] = '192.0.2.22';
    });
    assert.deepEqual(summary(await next(it)), ['added 10.5.2.0-24 192.0.2.22']);
  });

  test('changes to fields that do not matter produce no event', async () => {
    const { it } = await start();
    await next(it);
    server.updateNode('n2', (n) => ((n.metadata.labels as Record<string, string>).zone = 'a'));
    server.updateNode(
      'n2',
      (n) => (n.status = { conditions: [{ type: 'Ready', status: 'True' }] }),
    );
    server.addNode({
      name: 'n4',
      podCIDR: '10.5.4.0/24',
      annotations: peerAnnotations('192.0.2.4'),
    });
    // The next event is n4's: the two n2 updates before it produced none.
    assert.deepEqual(summary(await next(it)), ['added 10.5.4.0-24 192.0.2.4']);
  });

  test('a deleted node is removed', async () => {
    const { it } = await start();
    await next(it);
    server.deleteNode('n2');
    assert.deepEqual(summary(await next(it)), ['removed 10.5.2.0-24 192.0.2.2']);
  });

  test('a node that loses its kube-subnet-manager annotation is removed', async () => {
    const { it } = await start();
    await next(it);
    server.updateNode('n2', (n) => {
      delete (n.metadata.annotations as Record<string, string>)[`${P}kube-subnet-manager`];
    });
    assert.deepEqual(summary(await next(it)), ['removed 10.5.2.0-24 192.0.2.2']);
  });

  test('a malformed peer is skipped, logged once and counted once', async () => {
    const { it } = await start();
    await next(it);
    server.addNode({
      name: 'bad',
      podCIDR: '10.5.5.0/24',
      annotations: { ...peerAnnotations('192.0.2.5'), [`${P}backend-data`]: '{not json' },
    });
    server.updateNode('bad', (n) => ((n.metadata.labels as Record<string, string>).x = 'y'));
    server.addNode({
      name: 'bad2',
      podCIDR: '10.5.6.0/24',
      annotations: peerAnnotations('not-an-ip'),
    });
    server.addNode({
      name: 'n3',
      podCIDR: '10.5.3.0/24',
      annotations: peerAnnotations('192.0.2.3'),
    });
    assert.deepEqual(summary(await next(it)), ['added 10.5.3.0-24 192.0.2.3']);
    assert.equal(await counter(metrics.malformed), 2);
  });

  test('a malformed peer that is fixed is added', async () => {
    const { it } = await start();
    await next(it);
    server.addNode({ name: 'bad', podCIDR: '10.5.5.0/24', annotations: peerAnnotations('nope') });
    server.updateNode('bad', (n) => {
      (n.metadata.annotations as Record<string, string>)[`${P}public-ip`] = '192.0.2.5';
    });
    assert.deepEqual(summary(await next(it)), ['added 10.5.5.0-24 192.0.2.5']);
  });

  test('after a 410 Expired the informer relists and catches up on what it missed', async () => {
    const { it } = await start();
    await next(it);
    const watches = server.requestsTo('GET', '/api/v1/nodes').length;
    // While the watch is down, n2 goes away and n3 arrives, then history is compacted.
    server.dropWatches();
    server.deleteNode('n2');
    server.addNode({
      name: 'n3',
      podCIDR: '10.5.3.0/24',
      annotations: peerAnnotations('192.0.2.3'),
    });
    server.compact();
    assert.deepEqual(summary(await next(it)), [
      'added 10.5.3.0-24 192.0.2.3',
      'removed 10.5.2.0-24 192.0.2.2',
    ]);
    assert.equal(await counter(metrics.watchResyncs), 1);
    assert.ok(server.requestsTo('GET', '/api/v1/nodes').length >= watches + 2, 'no relist seen');
  });

  test('a relist after the first hands its pages on as plain batches; what it lacks goes at its end', async () => {
    server.addNode({ name: 'n1', podCIDR: '10.5.1.0/24' });
    for (const i of [2, 3]) {
      server.addNode({
        name: `n${i}`,
        podCIDR: `10.5.${i}.0/24`,
        annotations: peerAnnotations(`192.0.2.${i}`, `aa:bb:cc:dd:ee:0${i}`),
      });
    }
    const m = manager({ pageSize: 2 });
    const it = m.watchLeases(await m.acquireLease(ATTRS), ac.signal)[Symbol.asyncIterator]();
    await next(it); // n1 (us) and n2: the first page, a part
    await next(it); // n3 with the sync, the last part
    server.dropWatches();
    server.deleteNode('n2');
    for (const i of [4, 5]) {
      server.addNode({
        name: `n${i}`,
        podCIDR: `10.5.${i}.0/24`,
        annotations: peerAnnotations(`192.0.2.${i}`, `aa:bb:cc:dd:ee:0${i}`),
      });
    }
    server.compact();
    // the relist's pages: n1 n3 (nothing new), n4 n5; its sync: n2 is gone
    const page = await next(it);
    const end = await next(it);
    assert.deepEqual(
      [summary(page), continuesSnapshot(page)],
      [['added 10.5.4.0-24 192.0.2.4', 'added 10.5.5.0-24 192.0.2.5'], false],
    );
    assert.deepEqual(
      [summary(end), continuesSnapshot(end)],
      [['removed 10.5.2.0-24 192.0.2.2'], false],
    );
  });

  test('a dropped watch resumes from the last version without a relist', async () => {
    const { it } = await start();
    await next(it);
    server.dropWatches();
    server.addNode({
      name: 'n3',
      podCIDR: '10.5.3.0/24',
      annotations: peerAnnotations('192.0.2.3'),
    });
    assert.deepEqual(summary(await next(it)), ['added 10.5.3.0-24 192.0.2.3']);
    assert.equal(await counter(metrics.watchResyncs), 0);
  });

  test('server errors on re-watch are retried with backoff', async () => {
    const { it } = await start();
    await next(it);
    server.failNext(3);
    server.dropWatches();
    server.addNode({
      name: 'n3',
      podCIDR: '10.5.3.0/24',
      annotations: peerAnnotations('192.0.2.3'),
    });
    assert.deepEqual(summary(await next(it)), ['added 10.5.3.0-24 192.0.2.3']);
  });
});

describe('watchOwnLease', () => {
  test('our node deleted → WEFT_ERR_LEASE_REVOKED', async () => {
    server.addNode({ name: 'n1', podCIDR: '10.5.1.0/24' });
    const m = manager();
    const own = await m.acquireLease(ATTRS);
    const it = m.watchOwnLease(own, ac.signal)[Symbol.asyncIterator]();
    const pending = it.next();
    setTimeout(() => server.deleteNode('n1'), 100);
    await assert.rejects(pending, (e) => isWeftError(e, 'WEFT_ERR_LEASE_REVOKED'));
  });

  test('our node losing its podCIDR → WEFT_ERR_LEASE_REVOKED', async () => {
    server.addNode({ name: 'n1', podCIDR: '10.5.1.0/24' });
    const m = manager();
    const own = await m.acquireLease(ATTRS);
    const it = m.watchOwnLease(own, ac.signal)[Symbol.asyncIterator]();
    const pending = it.next();
    setTimeout(() => server.updateNode('n1', (n) => (n.spec = {})), 100);
    await assert.rejects(pending, (e) => isWeftError(e, 'WEFT_ERR_LEASE_REVOKED'));
  });

  test('the iterator ends when the signal fires', async () => {
    server.addNode({ name: 'n1', podCIDR: '10.5.1.0/24' });
    const m = manager();
    const own = await m.acquireLease(ATTRS);
    const it = m.watchOwnLease(own, ac.signal)[Symbol.asyncIterator]();
    const pending = it.next();
    setTimeout(() => ac.abort(), 50);
    assert.equal((await pending).done, true);
  });
});

describe('openKubeManager', () => {
  let dir: string;
  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), 'weft-kube-'));
    await writeFile(join(dir, 'net-conf.json'), NET);
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });
  after(() => undefined);

  const flags = (over: Record<string, unknown> = {}) => ({
    kubeApiUrl: server.url,
    kubeconfigFile: '',
    kubeAnnotationPrefix: 'flannel.alpha.coreos.com',
    netConfigPath: join(dir, 'net-conf.json'),
    setNodeNetworkUnavailable: true,
    env: { NODE_NAME: 'n1' },
    ...over,
  });

  test('NODE_NAME and --kube-api-url open a manager with the file config', async () => {
    server.addNode({ name: 'n1', podCIDR: '10.5.1.0/24' });
    const m = await openKubeManager(flags(), metrics);
    managers.push(m);
    assert.equal(m.nodeName, 'n1');
    assert.equal((await m.getNetworkConfig()).backend.type, 'vxlan');
  });

  test('POD_NAME and POD_NAMESPACE find the node through the pod', async () => {
    server.addNode({ name: 'worker-7', podCIDR: '10.5.1.0/24' });
    server.addPod('kube-flannel', 'weft-abcde', 'worker-7');
    const m = await openKubeManager(
      flags({ env: { POD_NAME: 'weft-abcde', POD_NAMESPACE: 'kube-flannel' } }),
      metrics,
    );
    managers.push(m);
    assert.equal(m.nodeName, 'worker-7');
  });

  test('no node name source is WEFT_ERR_KUBE_NODE', async () => {
    await assert.rejects(openKubeManager(flags({ env: {} }), metrics), (e) =>
      isWeftError(e, 'WEFT_ERR_KUBE_NODE'),
    );
  });

  test('a kubeconfig file with a bearer token is used', async () => {
    await server.close();
    server = await FakeKubeApiServer.start({ token: 's3cret' });
    server.addNode({ name: 'n1', podCIDR: '10.5.1.0/24' });
    const kubeconfig = join(dir, 'kubeconfig');
    await writeFile(
      kubeconfig,
      [
        'apiVersion: v1',
        'kind: Config',
        'clusters: [{name: fake, cluster: {server: "' + server.url + '"}}]',
        'users: [{name: weft, user: {token: s3cret}}]',
        'contexts: [{name: fake, context: {cluster: fake, user: weft}}]',
        'current-context: fake',
        '',
      ].join('\n'),
    );
    const m = await openKubeManager(flags({ kubeApiUrl: '', kubeconfigFile: kubeconfig }), metrics);
    managers.push(m);
    const lease = await m.acquireLease(ATTRS);
    assert.equal(lease.key, '10.5.1.0-24');
  });

  test('a wrong token is refused (401) without retrying forever', async () => {
    await server.close();
    server = await FakeKubeApiServer.start({ token: 's3cret' });
    server.addNode({ name: 'n1', podCIDR: '10.5.1.0/24' });
    await assert.rejects(openKubeManager(flags(), metrics), (e) => {
      assert.ok(isWeftError(e, 'WEFT_ERR_STORE_UNAVAILABLE'));
      assert.match(e.message, /401 Unauthorized/);
      return true;
    });
  });

  test('a missing net-conf.json is WEFT_ERR_CONFIG_NOT_FOUND naming the flag', async () => {
    await assert.rejects(
      openKubeManager(flags({ netConfigPath: join(dir, 'absent.json') }), metrics),
      (e) => isWeftError(e, 'WEFT_ERR_CONFIG_NOT_FOUND') && /--net-config-path/.test(e.message),
    );
  });
});
