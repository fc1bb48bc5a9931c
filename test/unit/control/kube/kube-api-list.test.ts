/**
 * KubeApi's node list and watch on the wire, against the fake API server: pages followed by
 * their continue token (one snapshot), what a page asks for, an expired token, and the cap on
 * one object (a list item, a watch line, a plain response).
 */
import assert from 'node:assert/strict';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, beforeEach, test } from 'node:test';
import { isWeftError } from '../../../../src/common/errors.js';
import { sleep } from '../../../../src/common/lifecycle.js';
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
  // The history moves past the list's version as the second page is asked for.
  let compacted = false;
  server.onRequest = (r) => {
    if (!r.query.has('continue') || compacted) return;
    compacted = true;
    server.addPod('default', 'p', 'a');
    server.compact();
  };
  await assert.rejects(
    api().listNodes(() => undefined, { resourceVersion: '', limit: 2 }),
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

/**
 * A hand-written API server for the page-ahead tests: page 1 (no `continue` asked) writes its
 * metadata (continue "p2") and first item, then `page1Rest` once page 2 has been asked for
 * (or after 10 s, so that a client that never asks ahead fails the test instead of hanging);
 * page 2 is answered by `page2` (null: held open, never answered).
 */
async function pagedServer(page1Rest: string, page2: string | null) {
  const node = (name: string) => JSON.stringify({ metadata: { name } });
  const state = { page2AskedWhilePage1Open: false, page2Closed: false };
  let page1Open = false;
  let askedForPage2!: () => void;
  const page2Asked = new Promise<void>((r) => (askedForPage2 = r));
  let page2Gone!: () => void;
  const page2Closed = new Promise<void>((r) => (page2Gone = r));
  const srv = http.createServer((req, res) => {
    res.writeHead(200, { 'Content-Type': 'application/json' });
    if (!new URL(req.url ?? '/', 'http://x').searchParams.has('continue')) {
      page1Open = true;
      res.write(
        '{"kind":"NodeList","apiVersion":"v1","metadata":{"resourceVersion":"7","continue":"p2"},' +
          `"items":[${node('a')}`,
      );
      const failsafe = setTimeout(askedForPage2, 10_000);
      void page2Asked.then(() => {
        clearTimeout(failsafe);
        page1Open = false;
        res.end(page1Rest.replace('NODE_B', node('b')));
      });
      return;
    }
    state.page2AskedWhilePage1Open = page1Open;
    res.on('close', () => {
      state.page2Closed = true;
      page2Gone();
    });
    askedForPage2();
    if (page2 !== null)
      res.end(`{"kind":"NodeList","apiVersion":"v1","metadata":{},"items":[${node('c')}]}`);
  });
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const { port } = srv.address() as AddressInfo;
  return {
    state,
    page2Closed,
    api: new KubeApi(loadKubeConfig({ apiUrl: `http://127.0.0.1:${port}` })),
    close: () => {
      srv.closeAllConnections();
      return new Promise<void>((r) => srv.close(() => r()));
    },
  };
}

test("the next page is asked for once a page's metadata has come, while its items still arrive", async () => {
  const s = await pagedServer(',NODE_B]}', 'c');
  try {
    const seen: string[] = [];
    const r = await s.api.listNodes((n) => seen.push(n.metadata.name), {
      resourceVersion: '',
      limit: 2,
    });
    assert.equal(s.state.page2AskedWhilePage1Open, true, 'page 2 was asked for after page 1');
    assert.deepEqual(seen, ['a', 'b', 'c'], 'every node, in order');
    assert.deepEqual(r, { resourceVersion: '7', pages: 2 });
  } finally {
    await s.close();
  }
});

test('a page that fails ends the request made ahead for the next one', async () => {
  const s = await pagedServer(',not json', null);
  try {
    await assert.rejects(
      s.api.listNodes(() => undefined, { resourceVersion: '', limit: 2 }),
      (err) => isWeftError(err, 'WEFT_ERR_STORE_UNAVAILABLE'),
    );
    assert.equal(s.state.page2AskedWhilePage1Open, true);
    // Bounded only so that a request left open fails the test instead of hanging it.
    const guard = new AbortController();
    await Promise.race([s.page2Closed, sleep(10_000, guard.signal).catch(() => undefined)]);
    guard.abort();
    assert.equal(s.state.page2Closed, true, 'the request made ahead is still open');
  } finally {
    await s.close();
  }
});

test('a server that writes metadata after the items is asked page by page', async () => {
  const asked: string[] = [];
  const srv = http.createServer((req, res) => {
    const cont = new URL(req.url ?? '/', 'http://x').searchParams.get('continue') ?? '';
    asked.push(cont);
    const [name, meta] = cont === '' ? ['a', { continue: 'p2' }] : ['b', { resourceVersion: '9' }];
    res.writeHead(200, { 'Content-Type': 'application/json' });
    res.end(JSON.stringify({ items: [{ metadata: { name } }], metadata: meta }));
  });
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  try {
    const { port } = srv.address() as AddressInfo;
    const seen: string[] = [];
    const r = await new KubeApi(loadKubeConfig({ apiUrl: `http://127.0.0.1:${port}` })).listNodes(
      (n) => seen.push(n.metadata.name),
      { resourceVersion: '', limit: 1 },
    );
    assert.deepEqual(seen, ['a', 'b']);
    assert.deepEqual(asked, ['', 'p2']);
    assert.deepEqual(r, { resourceVersion: '9', pages: 2 });
  } finally {
    srv.closeAllConnections();
    await new Promise<void>((r) => srv.close(() => r()));
  }
});
