/**
 * The etcd gateway client's own parts (etcd-client.ts): the stream framing, the wire forms and
 * error mapping, and the deadline against a loopback server that accepts and never answers.
 * Everything that needs etcd's semantics runs against the real etcd in
 * test/integration/etcd-registry.test.ts.
 */
import assert from 'node:assert/strict';
import { type Server, type Socket, createServer } from 'node:net';
import { after, before, describe, test } from 'node:test';
import {
  EtcdClient,
  EtcdError,
  JsonLines,
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
