/**
 * The node informer keeps only what weft reads of each node (name, resourceVersion,
 * annotations, pod CIDRs): a real Node's status, labels and managedFields are most of its size,
 * and 5,000 of them held whole would be most of a daemon's memory. It lists in pages, each read
 * as a stream and each node cut down as it is parsed, so no more than the nodes of one received
 * chunk are ever alive at once. Driven through the fake API server, listed and watched.
 */
import assert from 'node:assert/strict';
import { afterEach, beforeEach, test } from 'node:test';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { logger } from '../../../../src/common/log.js';
import {
  KubeApi,
  loadKubeConfig,
  type KubeNode,
  type ListOptions,
} from '../../../../src/control/kube/kube-api.js';
import {
  LIST_PAGE_SIZE,
  NODE_KEEP,
  NodeInformer,
  slimNode,
  type NodeBatch,
  type NodeChange,
} from '../../../../src/control/kube/kube-informer.js';
import { ListScanner } from '../../../../src/control/kube/kube-stream.js';
import { FakeKubeApiServer, realSizedNode } from '../../../../src/testbed/kube-apiserver.js';

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

/** An informer on the fake API server with the tests' watch timeout. */
function plainInformer(): NodeInformer {
  return new NodeInformer(new KubeApi(loadKubeConfig({ apiUrl: server.url })), {
    log: logger('test'),
    watchTimeoutSeconds: 30,
  });
}

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;

/**
 * A KubeApi that keeps a WeakRef to every full node the list hands over, with the number of
 * list requests the server had seen when it was handed over (its page).
 */
class TrackingApi extends KubeApi {
  readonly listed: Array<{ ref: WeakRef<KubeNode>; page: number }> = [];
  /** Called as each node is handed over, before the informer sees it. */
  onNode: ((page: number) => void) | null = null;

  /** The `keep` of every list, and the status of every node handed over. */
  readonly keeps: unknown[] = [];
  readonly statuses: unknown[] = [];

  override listNodes(each: (node: KubeNode) => void, o: ListOptions) {
    this.keeps.push(o.keep);
    return super.listNodes((n) => {
      const page = server.requestsTo('GET', '/api/v1/nodes').filter(isList).length;
      this.onNode?.(page);
      this.statuses.push((n as { status?: unknown }).status);
      this.listed.push({ ref: new WeakRef(n), page });
      each(n);
    }, o);
  }

  /** The pages whose nodes are still alive after a full collection. */
  alive(): number[] {
    gc();
    return this.listed.filter((l) => l.ref.deref() !== undefined).map((l) => l.page);
  }
}

const isList = (r: { query: URLSearchParams }) => r.query.get('watch') !== 'true';
const lists = () => server.requestsTo('GET', '/api/v1/nodes').filter(isList);

/** `count` nodes filled in as a kubelet does (16.7 KB of JSON each). */
function addRealNodes(count: number): void {
  for (let i = 0; i < count; i++) {
    server.addNode({
      name: `n${String(i).padStart(3, '0')}`,
      podCIDR: `10.5.${i}.0/24`,
      annotations: ANN,
      realSize: true,
    });
  }
}

/** WeakRef targets stay alive until the job that made them ends. */
const nextJob = () => new Promise((r) => setImmediate(r));

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

/** The next sync or changes batch (the page batches of a list are passed over: see below). */
async function nextBatch(it: AsyncIterator<NodeBatch>): Promise<NodeBatch> {
  for (;;) {
    const r = await it.next();
    assert.ok(!r.done);
    if (r.value.kind !== 'page') return r.value;
  }
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

test('NODE_KEEP keeps all that slimNode reads: a Node cut before its parse slims the same', () => {
  const full = realSizedNode({
    name: 'a',
    podCIDR: '10.5.1.0/24',
    podCIDRs: ['10.5.1.0/24', 'fd00::/64'],
    annotations: ANN,
  }) as unknown as KubeNode;
  const list = Buffer.from(JSON.stringify({ metadata: {}, items: [full] }));
  const cut: KubeNode[] = [];
  const s = new ListScanner((b) => cut.push(JSON.parse(b) as KubeNode), 1 << 20, 'l', NODE_KEEP);
  s.push(list);
  s.end();
  assert.deepEqual(slimNode(cut[0]!), slimNode(full));
  assert.ok(slimNode(full).spec?.podCIDRs?.length === 2 && slimNode(full).metadata.annotations);
  // what the cut spares JSON.parse: the status (images, conditions), labels, managedFields
  const raw = cut[0] as unknown as Record<string, Record<string, unknown>>;
  assert.equal(raw.status, null);
  assert.equal(raw.metadata!.managedFields, null);
  assert.equal(raw.metadata!.labels, null);
  assert.ok(JSON.stringify(cut[0]).length * 10 < list.length, 'under a tenth of the bytes');
});

test('the informer lists Nodes cut before their parse', { timeout: 20_000 }, async () => {
  addRealNodes(3);
  const api = new TrackingApi(loadKubeConfig({ apiUrl: server.url }));
  const informer = new NodeInformer(api, { log: logger('test'), watchTimeoutSeconds: 30 });
  try {
    const it = informer.subscribe(ac.signal)[Symbol.asyncIterator]();
    assert.equal((await nextBatch(it)).kind, 'sync');
    assert.equal(api.listed.length, 3);
    // each Node as JSON.parse made it: its status (images, conditions) was never built
    assert.deepEqual(api.statuses, [null, null, null]);
    assert.equal(api.keeps.length, 1);
    assert.equal(api.keeps[0], NODE_KEEP);
  } finally {
    await informer.close();
  }
});

test(
  'listed and watched nodes reach subscribers (and the cache) cut down',
  { timeout: 20_000 },
  async () => {
    server.addNode({ name: 'a', podCIDR: '10.5.1.0/24', annotations: ANN });
    server.updateNode('a', (n) => fatten(n));
    const informer = plainInformer();
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
  'the first list asks the watch cache (resourceVersion=0) in pages, the watch asks for bookmarks',
  { timeout: 20_000 },
  async () => {
    server.addNode({ name: 'a', podCIDR: '10.5.1.0/24', annotations: ANN });
    const listedAt = String(server.resourceVersion);
    const informer = plainInformer();
    try {
      const it = informer.subscribe(ac.signal)[Symbol.asyncIterator]();
      assert.equal((await nextBatch(it)).kind, 'sync');
      server.addNode({ name: 'b', podCIDR: '10.5.2.0/24', annotations: ANN });
      assert.equal((await nextBatch(it)).kind, 'changes');
      const [list, ...more] = lists();
      assert.equal(more.length, 0);
      assert.equal(list!.query.get('resourceVersion'), '0');
      assert.equal(list!.query.get('limit'), String(LIST_PAGE_SIZE));
      const watch = server.requestsTo('GET', '/api/v1/nodes').find((r) => !isList(r))!;
      assert.equal(watch.query.get('allowWatchBookmarks'), 'true');
      assert.equal(watch.query.get('resourceVersion'), listedAt, 'from the list version');
    } finally {
      await informer.close();
    }
  },
);

test(
  'latest() before the informer starts makes its first list a latest-state one and lists once',
  { timeout: 20_000 },
  async () => {
    server.addNode({ name: 'a', podCIDR: '10.5.1.0/24', annotations: ANN });
    const listedAt = String(server.resourceVersion);
    const informer = plainInformer();
    try {
      const nodes = await informer.latest(ac.signal);
      assert.deepEqual([...nodes.keys()], ['a']);
      const it = informer.subscribe(ac.signal)[Symbol.asyncIterator]();
      const first = await nextBatch(it);
      assert.equal(first.kind, 'sync', 'a later subscriber gets the same list');
      server.addNode({ name: 'b', podCIDR: '10.5.2.0/24', annotations: ANN });
      assert.equal((await nextBatch(it)).kind, 'changes');
      const [list, ...more] = lists();
      assert.equal(more.length, 0, 'one list for both');
      assert.equal(list!.query.get('resourceVersion'), null, 'rv="": the latest state');
      const watch = server.requestsTo('GET', '/api/v1/nodes').find((r) => !isList(r))!;
      assert.equal(watch.query.get('resourceVersion'), listedAt, 'from that list');
    } finally {
      await informer.close();
    }
  },
);

test(
  'latest() once the informer runs lists the latest state again (its cache may lag)',
  { timeout: 20_000 },
  async () => {
    server.addNode({ name: 'a', podCIDR: '10.5.1.0/24', annotations: ANN });
    const informer = plainInformer();
    try {
      const it = informer.subscribe(ac.signal)[Symbol.asyncIterator]();
      assert.equal((await nextBatch(it)).kind, 'sync');
      server.addNode({ name: 'b', podCIDR: '10.5.2.0/24', annotations: ANN });
      const nodes = await informer.latest(ac.signal);
      assert.deepEqual([...nodes.keys()].sort(), ['a', 'b']);
      const [cached, fresh, ...more] = lists();
      assert.equal(more.length, 0);
      assert.equal(cached!.query.get('resourceVersion'), '0');
      assert.equal(fresh!.query.get('resourceVersion'), null);
    } finally {
      await informer.close();
    }
  },
);

test(
  'a paged list: every page is cut down before the next one is parsed, and nothing of it stays',
  { timeout: 30_000 },
  async () => {
    await server.close();
    server = await FakeKubeApiServer.start({ cachePagesRv0: true });
    addRealNodes(10);
    const api = new TrackingApi(loadKubeConfig({ apiUrl: server.url }));
    const seenAlive: number[][] = [];
    let page = 0;
    api.onNode = (p) => {
      if (p === page) return;
      // the first node of a new page: nothing of the earlier pages may be alive
      page = p;
      seenAlive.push(api.alive());
    };
    const informer = new NodeInformer(api, {
      log: logger('test'),
      watchTimeoutSeconds: 30,
      listPageSize: 3,
    });
    try {
      const it = informer.subscribe(ac.signal)[Symbol.asyncIterator]();
      const sync = await nextBatch(it);
      assert.equal(sync.kind === 'sync' && sync.nodes.size, 10);
      assert.deepEqual(
        lists().map((r) => [r.query.get('limit'), r.query.has('continue')]),
        [
          ['3', false],
          ['3', true],
          ['3', true],
          ['3', true],
        ],
        'four pages of 3, the continue token followed',
      );
      assert.deepEqual(seenAlive, [[], [], [], []], 'no earlier page alive at a new page');
      await nextJob();
      assert.deepEqual(api.alive(), [], 'nothing of the list is alive');
      assert.equal(api.listed.length, 10);
      const kept = informer.get('n004')!;
      assert.deepEqual(Object.keys(kept), ['metadata', 'spec']);
      assert.deepEqual(Object.keys(kept.metadata).sort(), [
        'annotations',
        'name',
        'resourceVersion',
      ]);
      assert.equal(kept.spec?.podCIDR, '10.5.4.0/24');
    } finally {
      await informer.close();
    }
  },
);

test(
  'a list the watch cache sends whole (limit ignored for rv=0) is cut down node by node as it streams',
  { timeout: 30_000 },
  async () => {
    addRealNodes(40); // 0.67 MB in one response
    const api = new TrackingApi(loadKubeConfig({ apiUrl: server.url }));
    let most = 0;
    api.onNode = () => {
      most = Math.max(most, api.alive().length);
    };
    const informer = new NodeInformer(api, { log: logger('test'), watchTimeoutSeconds: 30 });
    try {
      const it = informer.subscribe(ac.signal)[Symbol.asyncIterator]();
      const sync = await nextBatch(it);
      assert.equal(sync.kind === 'sync' && sync.nodes.size, 40);
      assert.equal(lists().length, 1, 'one response');
      // alive at once: the nodes parsed from one received chunk (at most 64 KB: 4 nodes)
      assert.ok(most <= 8, `${most} full nodes alive at once`);
      await nextJob();
      assert.deepEqual(api.alive(), [], 'nothing of the list is alive');
    } finally {
      await informer.close();
    }
  },
);

test('a BOOKMARK moves the resourceVersion on and emits nothing', { timeout: 20_000 }, async () => {
  server.addNode({ name: 'a', podCIDR: '10.5.1.0/24', annotations: ANN });
  const informer = plainInformer();
  const watches = () => server.requestsTo('GET', '/api/v1/nodes').filter((r) => !isList(r));
  try {
    const it = informer.subscribe(ac.signal)[Symbol.asyncIterator]();
    assert.equal((await nextBatch(it)).kind, 'sync');
    // the watch is open once a change has come through it
    server.addNode({ name: 'b', podCIDR: '10.5.2.0/24', annotations: ANN });
    assert.equal((await nextBatch(it)).kind, 'changes');
    server.addPod('default', 'p', 'a'); // a version no node event carries
    const bookmarked = String(server.resourceVersion);
    const before = watches().length;
    // the stream ends right behind the bookmark: the informer reads it before the end
    server.bookmark();
    server.dropWatches();
    while (watches().length === before) await new Promise((r) => setTimeout(r, 5));
    assert.equal(watches().at(-1)!.query.get('resourceVersion'), bookmarked);
    server.addNode({ name: 'c', podCIDR: '10.5.3.0/24', annotations: ANN });
    const next = await nextBatch(it);
    assert.deepEqual(
      next.kind === 'changes' && next.changes.map((c) => c.node.metadata.name),
      ['c'],
      'the batch after the bookmark is the next change',
    );
    assert.equal(lists().length, 1, 'no relist');
  } finally {
    await informer.close();
  }
});

test(
  'a 410 Expired relists the latest state (resourceVersion="") in pages',
  { timeout: 20_000 },
  async () => {
    for (const [i, name] of ['a', 'b', 'c', 'd', 'e'].entries()) {
      server.addNode({ name, podCIDR: `10.5.${i + 1}.0/24`, annotations: ANN });
    }
    let relists = 0;
    const informer = new NodeInformer(new KubeApi(loadKubeConfig({ apiUrl: server.url })), {
      log: logger('test'),
      watchTimeoutSeconds: 30,
      listPageSize: 2,
      onRelist: () => relists++,
    });
    try {
      const it = informer.subscribe(ac.signal)[Symbol.asyncIterator]();
      assert.equal((await nextBatch(it)).kind, 'sync');
      server.addNode({ name: 'f', podCIDR: '10.5.6.0/24', annotations: ANN });
      assert.equal((await nextBatch(it)).kind, 'changes');
      const first = lists().length;
      // the informer's version falls out of the history; its next watch gets 410
      server.addPod('default', 'p', 'a');
      server.compact();
      server.dropWatches();
      const sync = await nextBatch(it);
      assert.equal(sync.kind, 'sync');
      assert.deepEqual(sync.kind === 'sync' && [...sync.nodes.keys()].sort(), [
        'a',
        'b',
        'c',
        'd',
        'e',
        'f',
      ]);
      assert.equal(relists, 1);
      assert.deepEqual(
        lists()
          .slice(first)
          .map((r) => [
            r.query.get('resourceVersion'),
            r.query.get('limit'),
            r.query.has('continue'),
          ]),
        [
          [null, '2', false],
          [null, '2', true],
          [null, '2', true],
        ],
        'rv="" (not 0: a lagging cache could go back in time), three pages of 2',
      );
    } finally {
      await informer.close();
    }
  },
);

/** An informer on the fake API server that lists `pageSize` nodes a page. */
function pagedInformer(
  pageSize: number,
  api = new KubeApi(loadKubeConfig({ apiUrl: server.url })),
): NodeInformer {
  return new NodeInformer(api, {
    log: logger('test'),
    watchTimeoutSeconds: 30,
    listPageSize: pageSize,
  });
}

/** Every batch up to and including the first sync. */
async function untilSync(it: AsyncIterator<NodeBatch>): Promise<NodeBatch[]> {
  const out: NodeBatch[] = [];
  for (;;) {
    const r = await it.next();
    assert.ok(!r.done);
    out.push(r.value);
    if (r.value.kind === 'sync') return out;
  }
}

const names = (b: NodeBatch) =>
  b.kind === 'page'
    ? b.nodes.map((n) => n.metadata.name)
    : b.kind === 'sync'
      ? [...b.nodes.keys()]
      : [];

test('a list hands on every listPageSize nodes as a page batch as it reads them, then the sync', async () => {
  for (let i = 0; i < 8; i++) {
    server.addNode({ name: `n${i}`, podCIDR: `10.5.${i}.0/24`, annotations: ANN });
  }
  const informer = pagedInformer(3);
  try {
    const got = await untilSync(informer.subscribe(ac.signal)[Symbol.asyncIterator]());
    assert.deepEqual(
      got.map((b) => [b.kind, names(b)]),
      [
        ['page', ['n0', 'n1', 'n2']],
        ['page', ['n3', 'n4', 'n5']],
        // (the last two come with the sync: it holds every node)
        ['sync', ['n0', 'n1', 'n2', 'n3', 'n4', 'n5', 'n6', 'n7']],
      ],
    );
    const page = got[0]!;
    assert.deepEqual(page.kind === 'page' && Object.keys(page.nodes[1]!), ['metadata', 'spec']);
  } finally {
    await informer.close();
  }
});

/** A KubeApi whose list hands over `before` nodes, then waits for `go` before the rest. */
class HeldListApi extends KubeApi {
  before = 0;
  reached: () => void = () => undefined;
  readonly atHold = new Promise<void>((r) => (this.reached = r));
  go: () => void = () => undefined;
  readonly released = new Promise<void>((r) => (this.go = r));

  override async listNodes(each: (node: KubeNode) => void, o: ListOptions) {
    const held: KubeNode[] = [];
    const r = await super.listNodes((n) => {
      if (held.length === 0 && this.before > 0) {
        this.before--;
        each(n);
      } else held.push(n);
    }, o);
    this.reached();
    await this.released;
    for (const n of held) each(n);
    return r;
  }
}

test('a subscriber that comes while a list is read gets the nodes listed so far first', async () => {
  for (let i = 0; i < 5; i++) {
    server.addNode({ name: `n${i}`, podCIDR: `10.5.${i}.0/24`, annotations: ANN });
  }
  const api = new HeldListApi(loadKubeConfig({ apiUrl: server.url }));
  api.before = 2;
  const informer = pagedInformer(2, api);
  try {
    const first = informer.subscribe(ac.signal)[Symbol.asyncIterator]();
    await api.atHold; // n0, n1 listed (one page batch), the rest held back
    const late = informer.subscribe(ac.signal)[Symbol.asyncIterator]();
    api.go();
    const a = await untilSync(first);
    const b = await untilSync(late);
    assert.deepEqual(
      a.map((x) => [x.kind, names(x)]),
      [
        ['page', ['n0', 'n1']],
        ['page', ['n2', 'n3']],
        ['sync', ['n0', 'n1', 'n2', 'n3', 'n4']],
      ],
    );
    assert.deepEqual(
      b.map((x) => [x.kind, names(x)]),
      [
        ['page', ['n0', 'n1']],
        ['page', ['n2', 'n3']],
        ['sync', ['n0', 'n1', 'n2', 'n3', 'n4']],
      ],
    );
  } finally {
    await informer.close();
  }
});

test('closing the informer just after a list page was handed on raises nothing', async () => {
  // (it did: http.request's own abort signal destroyed the request's socket with an error, in
  // the moment after a page's response ended when no one listens to that socket's errors)
  await server.close();
  server = await FakeKubeApiServer.start({ cachePagesRv0: true });
  for (let i = 0; i < 10; i++) {
    server.addNode({ name: `n${i}`, podCIDR: `10.5.${i}.0/24`, annotations: ANN });
  }
  const informer = pagedInformer(3);
  const it = informer.subscribe(ac.signal)[Symbol.asyncIterator]();
  const r = await it.next();
  assert.equal(!r.done && r.value.kind, 'page');
  await informer.close();
  await nextJob(); // (an uncaught exception fails the test)
  await new Promise((resolve) => setTimeout(resolve, 50));
});
