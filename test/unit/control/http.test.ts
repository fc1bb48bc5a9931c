// The daemon's HTTP endpoint under a connection flood: beyond its cap new connections are closed
// at once (and counted once in the log) while the ones it serves keep working; once clients go,
// new ones are served again. On loopback only.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { connect, type Socket } from 'node:net';
import { Registry } from '../../../src/common/metrics.js';
import { setLogLevel } from '../../../src/common/log.js';
import { startHealthServer, type HealthServer } from '../../../src/control/http.js';

const CAP = 4;
let server: HealthServer;
const sockets: Socket[] = [];

before(async () => {
  setLogLevel('silent');
  server = await startHealthServer({
    host: '127.0.0.1',
    port: 0,
    metrics: new Registry(),
    isReady: () => true,
    maxConnections: CAP,
  });
});
after(async () => {
  for (const s of sockets) s.destroy();
  await server.close();
});

/** Opens a connection that sends nothing; resolves once connected. */
function idle(): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const s = connect(server.port, '127.0.0.1', () => resolve(s));
    s.on('error', reject);
    sockets.push(s);
  });
}

/** Resolves with how the server treated the connection: closed unasked, or still open. */
function closedByServer(s: Socket): Promise<boolean> {
  if (s.destroyed || s.readableEnded) return Promise.resolve(true);
  return new Promise((resolve) => {
    s.once('close', () => resolve(true));
    s.once('end', () => resolve(true));
    // The server closes a dropped connection right after accept; an open one stays open.
    setTimeout(() => resolve(false), 500);
  });
}

/** A raw GET on a fresh connection: the status line, or null when the server closed it. */
function get(path: string): Promise<string | null> {
  return new Promise((resolve) => {
    const s = connect(server.port, '127.0.0.1', () => {
      s.write(`GET ${path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n`);
    });
    let data = '';
    s.on('data', (d: Buffer) => (data += d.toString()));
    s.on('error', () => undefined);
    s.on('close', () => resolve(data ? data.split('\r\n')[0]! : null));
  });
}

test('beyond the cap new connections are closed; below it they are served again', async () => {
  const held = [];
  for (let i = 0; i < CAP; i++) held.push(await idle());
  const extra = await Promise.all(Array.from({ length: 3 }, () => idle()));
  assert.deepEqual(await Promise.all(extra.map(closedByServer)), [true, true, true]);
  assert.deepEqual(await Promise.all(held.map(closedByServer)), [false, false, false, false]);
  assert.equal(await get('/healthz'), null, 'a request at the cap is refused');
  for (const s of held) s.destroy();
  // The server sees the closes asynchronously: the next request is served once it has.
  let status: string | null = null;
  for (let i = 0; i < 100 && status === null; i++) {
    status = await get('/healthz');
    if (status === null) await new Promise((r) => setTimeout(r, 20));
  }
  assert.equal(status, 'HTTP/1.1 200 OK');
});
