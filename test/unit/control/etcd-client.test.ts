/**
 * The etcd gateway client's own parts (etcd-client.ts): the stream framing, the wire forms and
 * error mapping, and the deadline against a loopback server that accepts and never answers.
 * Everything that needs etcd's semantics runs against the real etcd in
 * test/integration/etcd-registry.test.ts.
 */
import assert from 'node:assert/strict';
import http from 'node:http';
import { type Server, type Socket, createServer } from 'node:net';
import { after, before, describe, test } from 'node:test';
import { isWeftError } from '../../../src/common/errors.js';
import { EtcdRegistry } from '../../../src/control/registry/etcd.js';
import {
  EtcdClient,
  EtcdError,
  JsonLines,
  type WatchItem,
  errorFromBody,
  fromWireWatch,
  isRecoverable,
} from '../../../src/control/registry/etcd-client.js';

describe('JsonLines', () => {
  test('an object cut across chunks, a multi-byte character cut in two, two in one chunk', () => {
    const text = '{"result":{"cancel_reason":"é"}}\n{"a":1}\n{"b":2}\n';
    const bytes = Buffer.from(text);
    const cut = bytes.indexOf(Buffer.from('é')) + 1; // inside the two bytes of é
    const lines = new JsonLines();
    assert.deepEqual(lines.push(bytes.subarray(0, cut)), []);
    assert.deepEqual(lines.push(bytes.subarray(cut)), [
      { result: { cancel_reason: 'é' } },
      { a: 1 },
      { b: 2 },
    ]);
    assert.deepEqual(lines.end(), []);
  });

  test('a last object without its newline comes out at the end', () => {
    const lines = new JsonLines();
    assert.deepEqual(lines.push(Buffer.from('{"a":1}\n{"b"')), [{ a: 1 }]);
    assert.deepEqual(lines.push(Buffer.from(':2}')), []);
    assert.deepEqual(lines.end(), [{ b: 2 }]);
  });
});

describe('wire forms', () => {
  test('a watch answer with fields at their zero value left out reads as zero', () => {
    const r = fromWireWatch({
      header: { revision: '9' },
      events: [
        { kv: { key: Buffer.from('/k').toString('base64'), mod_revision: '9' } },
        { type: 'DELETE', kv: { key: Buffer.from('/j').toString('base64') } },
      ],
    });
    assert.equal(r.created, false);
    assert.equal(r.canceled, false);
    assert.equal(r.compact_revision, '0');
    assert.equal(r.cancel_reason, '');
    assert.deepEqual(
      r.events.map((e) => [e.type, e.kv.key.toString(), e.kv.lease, e.kv.value.length]),
      [
        ['PUT', '/k', '0', 0],
        ['DELETE', '/j', '0', 0],
      ],
    );
  });

  test('errors: gRPC Unavailable is recoverable, InvalidArgument and NotFound are not', () => {
    const unavailable = errorFromBody(503, { error: 'etcdserver: no leader', code: 14 });
    assert.equal(unavailable.message, 'etcdserver: no leader');
    assert.equal(isRecoverable(unavailable), true);
    assert.equal(isRecoverable(errorFromBody(400, { message: 'bad', code: 3 })), false);
    assert.equal(isRecoverable(errorFromBody(404, { message: 'lease not found', code: 5 })), false);
  });

  test('errors: a stream error object carries its code; a body without one goes by status', () => {
    const e = errorFromBody(200, {
      error: { grpc_code: 16, http_code: 401, message: 'etcdserver: invalid auth token' },
    });
    assert.equal(e.code, 16);
    assert.equal(e.message, 'etcdserver: invalid auth token');
    assert.equal(isRecoverable(errorFromBody(502, {})), true);
    assert.equal(isRecoverable(errorFromBody(400, {})), false);
  });
});

describe('EtcdClient transport', () => {
  let silent: Server;
  let port = 0;
  const sockets = new Set<Socket>();
  before(async () => {
    // Accepts connections and never answers: a black-holed etcd.
    silent = createServer((s) => sockets.add(s));
    await new Promise<void>((r) => silent.listen(0, '127.0.0.1', r));
    port = (silent.address() as { port: number }).port;
  });
  after(async () => {
    for (const s of sockets) s.destroy();
    await new Promise((r) => silent.close(r));
  });

  test('a unary call to a host that never answers ends at its deadline, recoverable', async () => {
    const c = new EtcdClient({ endpoints: [`http://127.0.0.1:${port}`], callTimeoutMs: 200 });
    try {
      const err = await c.range({ key: Buffer.from('/x') }).then(
        () => assert.fail('answered'),
        (e: unknown) => e,
      );
      assert.ok(err instanceof EtcdError, String(err));
      assert.match(err.message, /deadline exceeded/);
      assert.equal(isRecoverable(err), true);
    } finally {
      c.close();
    }
  });

  test('opening a watch on a host that never answers fails at the deadline', async () => {
    const c = new EtcdClient({ endpoints: [`http://127.0.0.1:${port}`], callTimeoutMs: 200 });
    try {
      const items: unknown[] = [];
      await assert.rejects(
        c.watch(
          {
            key: Buffer.from('/a/'),
            range_end: Buffer.from('/a0'),
            start_revision: 1,
            progress_notify: false,
          },
          (i) => items.push(i),
        ),
        /deadline exceeded/,
      );
      assert.deepEqual(items, []);
    } finally {
      c.close();
    }
  });

  test('an endpoint that is not http(s) is refused at construction', () => {
    assert.throws(
      () => new EtcdClient({ endpoints: ['unix:///run/etcd.sock'], callTimeoutMs: 1000 }),
      /http:\/\/host:port/,
    );
  });
});

describe('the cap on an answer', () => {
  //   EtcdClient ──HTTP──▶ loopback fake "etcd" that answers with oversized bodies
  const CAP = 1024;
  const big = JSON.stringify({ header: { revision: '5' }, kvs: [], pad: 'x'.repeat(4 * CAP) });
  let server: http.Server;
  let url = '';
  const requests: string[] = [];
  before(async () => {
    server = http.createServer((req, res) => {
      requests.push(req.url ?? '');
      req.resume();
      if (req.url === '/v3/kv/range') {
        res.writeHead(200, { 'content-type': 'application/json' }).end(big); // Content-Length
      } else if (req.url === '/v3/kv/txn') {
        res.writeHead(200, { 'content-type': 'application/json' }); // chunked, no length
        for (let i = 0; i < big.length; i += 256) res.write(big.slice(i, i + 256));
        res.end();
      } else if (req.url === '/v3/watch') {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.write('{"result":{"header":{"revision":"5"},"created":true}}\n');
        res.write(`{"result":${big}}\n`);
      } else {
        res.writeHead(404).end('{}');
      }
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    url = `http://127.0.0.1:${(server.address() as { port: number }).port}`;
  });
  after(async () => {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  });

  const tooLarge = (e: unknown) => isWeftError(e, 'WEFT_ERR_STORE_RESPONSE_TOO_LARGE');

  test('a body announced larger than the cap fails with WEFT_ERR_STORE_RESPONSE_TOO_LARGE', async () => {
    const c = new EtcdClient({ endpoints: [url], callTimeoutMs: 5000, maxResponseBytes: CAP });
    try {
      await assert.rejects(c.range({ key: Buffer.from('/x') }), tooLarge);
    } finally {
      c.close();
    }
  });

  test('a chunked body that grows past the cap fails the same way', async () => {
    const c = new EtcdClient({ endpoints: [url], callTimeoutMs: 5000, maxResponseBytes: CAP });
    try {
      await assert.rejects(c.txn({ compare: [], success: [], failure: [] }), tooLarge);
    } finally {
      c.close();
    }
  });

  test('a watch message over the cap ends the stream with that error', async () => {
    const c = new EtcdClient({ endpoints: [url], callTimeoutMs: 5000, maxResponseBytes: CAP });
    const items: WatchItem[] = [];
    let ended: () => void = () => {};
    const done = new Promise<void>((r) => (ended = r));
    try {
      await c.watch(
        {
          key: Buffer.from('/a/'),
          range_end: Buffer.from('/a0'),
          start_revision: 1,
          progress_notify: false,
        },
        (i) => {
          items.push(i);
          if (i.kind !== 'data') ended();
        },
      );
      await done;
      assert.equal(items.length, 2);
      const [first, second] = items;
      assert.equal(first?.kind === 'data' && first.res.created, true);
      assert.ok(second?.kind === 'error' && tooLarge(second.err), JSON.stringify(second));
    } finally {
      c.close();
    }
  });

  test('the registry passes the code on without retrying', async () => {
    const r = new EtcdRegistry({
      endpoints: [url],
      maxResponseBytes: CAP,
      attempts: 5,
      retryInitialMs: 1,
    });
    try {
      const before = requests.length;
      await assert.rejects(r.listSubnets(), tooLarge);
      assert.deepEqual(requests.slice(before), ['/v3/kv/range'], 'asked once');
    } finally {
      await r.close();
    }
  });

  test('under the default cap the same answer is read', async () => {
    const c = new EtcdClient({ endpoints: [url], callTimeoutMs: 5000 });
    try {
      assert.equal((await c.range({ key: Buffer.from('/x') })).header.revision, '5');
    } finally {
      c.close();
    }
  });

  test('a watch message over the cap is skipped and the registry re-lists (a resync batch)', async () => {
    //   EtcdRegistry ──▶ fake: 1st watch sends an oversized message; range lists one key
    const key = Buffer.from('/coreos.com/network/subnets/10.5.1.0-24').toString('base64');
    const value = Buffer.from('{"PublicIP":"192.0.2.1"}').toString('base64');
    let watches = 0;
    const fake = http.createServer((req, res) => {
      req.resume();
      res.writeHead(200, { 'content-type': 'application/json' });
      if (req.url === '/v3/watch') {
        res.write('{"result":{"header":{"revision":"7"},"created":true}}\n');
        if (++watches === 1) res.write(`{"result":${big}}\n`);
      } else if (req.url === '/v3/kv/range') {
        res.end(
          JSON.stringify({ header: { revision: '9' }, kvs: [{ key, value, mod_revision: '8' }] }),
        );
      } else {
        res.end('{}');
      }
    });
    await new Promise<void>((r) => fake.listen(0, '127.0.0.1', r));
    const r = new EtcdRegistry({
      endpoints: [`http://127.0.0.1:${(fake.address() as { port: number }).port}`],
      maxResponseBytes: CAP,
    });
    const ac = new AbortController();
    const it = r.watchSubnets(7, ac.signal)[Symbol.asyncIterator]();
    try {
      const first = await it.next();
      assert.equal(first.done, false);
      assert.equal(first.value?.kind, 'resync');
      assert.ok(first.value?.kind === 'resync');
      assert.deepEqual(
        first.value.leases.map((l) => [l.key, l.value]),
        [['10.5.1.0-24', '{"PublicIP":"192.0.2.1"}']],
      );
      assert.equal(first.value.revision, 9);
    } finally {
      ac.abort();
      await it.return?.();
      await r.close();
      fake.closeAllConnections();
      await new Promise((done) => fake.close(done));
    }
  });
});
