/**
 * KubeApi's node list and watch on the wire, against the fake API server: pages followed by
 * their continue token (one snapshot), what a page asks for, an expired token, and the cap on
 * one object (a list item, a watch line, a plain response).
 */
import assert from 'node:assert/strict';
import { afterEach, beforeEach, test } from 'node:test';
import { isWeftError } from '../../../../src/common/errors.js';
import {
  KubeApi,
  LIST_GC_BYTES,
  loadKubeConfig,
  type KubeNode,
} from '../../../../src/control/kube/kube-api.js';
import { FakeKubeApiServer } from '../../../../src/testbed/kube-apiserver.js';

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

const api = (maxObjectBytes?: number) =>
  new KubeApi(loadKubeConfig({ apiUrl: server.url }), { maxObjectBytes });
const lists = () =>
  server.requestsTo('GET', '/api/v1/nodes').filter((r) => r.query.get('watch') !== 'true');
const names = ['a', 'b', 'c', 'd', 'e'];
const addAll = (o: { realSize?: boolean } = {}) => {
  for (const [i, name] of names.entries())
    server.addNode({ name, podCIDR: `10.5.${i}.0/24`, ...o });
};

test('pages of `limit` follow the continue token, all of one snapshot', async () => {
  addAll();
  const at = String(server.resourceVersion);
  const seen: string[] = [];
  const r = await api().listNodes(
    (n) => {
      seen.push(n.metadata.name);
      // a write during the list: not in its pages (they are the first page's snapshot)
      if (seen.length === 1) server.addNode({ name: 'zz', podCIDR: '10.5.9.0/24' });
    },
    { resourceVersion: '', limit: 2 },
  );
  assert.deepEqual(seen, names);
  assert.deepEqual(r, { resourceVersion: at, pages: 3 });
  assert.deepEqual(
    lists().map((q) => Object.fromEntries(q.query)),
    [
      { limit: '2' },
      { limit: '2', continue: lists()[1]!.query.get('continue') },
      { limit: '2', continue: lists()[2]!.query.get('continue') },
    ],
  );
});

test('resourceVersion=0: the first page asks for it, continued pages carry only the token', async () => {
  await server.close();
  server = await FakeKubeApiServer.start({ cachePagesRv0: true });
  addAll();
  const r = await api().listNodes(() => undefined, { resourceVersion: '0', limit: 2 });
  assert.equal(r.pages, 3);
  assert.deepEqual(
    lists().map((q) => [q.query.get('resourceVersion'), q.query.has('continue')]),
    [
      ['0', false],
      [null, true],
      [null, true],
    ],
  );
});

test('resourceVersion=0 from a watch cache that ignores limit: one response, every node', async () => {
  addAll();
  const seen: string[] = [];
  const r = await api().listNodes((n) => seen.push(n.metadata.name), {
    resourceVersion: '0',
    limit: 2,
  });
  assert.deepEqual(seen, names);
  assert.equal(r.pages, 1);
  assert.equal(lists().length, 1);
});

test('a continue token expired between pages is WEFT_ERR_STORE_COMPACTED', async () => {
  addAll();
  let n = 0;
  await assert.rejects(
    api().listNodes(
      () => {
        if (++n !== 2) return;
        server.addPod('default', 'p', 'a');
        server.compact();
      },
      { resourceVersion: '', limit: 2 },
    ),
    (err) => isWeftError(err, 'WEFT_ERR_STORE_COMPACTED'),
  );
});

test('a list item over the cap is WEFT_ERR_STORE_RESPONSE_TOO_LARGE; under it, listed', async () => {
  addAll({ realSize: true }); // 16.7 KB each
  await assert.rejects(
    api(8192).listNodes(() => undefined, { resourceVersion: '', limit: 500 }),
    (err) => isWeftError(err, 'WEFT_ERR_STORE_RESPONSE_TOO_LARGE') && /8192/.test(err.message),
  );
  const seen: KubeNode[] = [];
  await api(32_768).listNodes((n) => seen.push(n), { resourceVersion: '', limit: 500 });
  assert.equal(seen.length, 5);
});

test('a watch line over the cap is WEFT_ERR_STORE_RESPONSE_TOO_LARGE', async () => {
  server.addNode({ name: 'a', podCIDR: '10.5.0.0/24' });
  const from = String(server.resourceVersion);
  server.addNode({ name: 'big', podCIDR: '10.5.1.0/24', realSize: true });
  const watch = async () => {
    for await (const batch of api(8192).watchNodes(from, ac.signal, 30)) void batch;
  };
  await assert.rejects(watch(), (err) => isWeftError(err, 'WEFT_ERR_STORE_RESPONSE_TOO_LARGE'));
});

test('a single-object response over the cap is WEFT_ERR_STORE_RESPONSE_TOO_LARGE', async () => {
  server.addNode({ name: 'big', podCIDR: '10.5.1.0/24', realSize: true });
  await assert.rejects(api(8192).getNode('big'), (err) =>
    isWeftError(err, 'WEFT_ERR_STORE_RESPONSE_TOO_LARGE'),
  );
  assert.equal((await api(32_768).getNode('big')).metadata.name, 'big');
});

test('a list read asks for a young collection per LIST_GC_BYTES read (young-gc.ts)', async () => {
  for (let i = 0; i < 300; i++)
    server.addNode({ name: `n${i}`, podCIDR: `10.6.${i}.0/24`, realSize: true });
  const g = globalThis as { gc?: unknown };
  const saved = g.gc;
  const calls: unknown[] = [];
  g.gc = (o: unknown) => calls.push(o);
  try {
    // one page (the pacer counts per page)
    await api().listNodes(() => undefined, { resourceVersion: '', limit: 500 });
  } finally {
    if (saved === undefined) delete g.gc;
    else g.gc = saved;
  }
  // 300 Nodes of 16-18 KB (the fake's size, pinned in its own test): ≥ 4.8 MB read
  const expected = Math.floor((300 * 16_000) / LIST_GC_BYTES);
  assert.ok(expected >= 4 && calls.length >= expected, `${calls.length} collections`);
  assert.ok(calls.every((c) => (c as { type?: string }).type === 'minor'));
});
