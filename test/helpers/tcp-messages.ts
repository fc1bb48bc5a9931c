/**
 * TCP messages of one exact size, one at a time: the client (TCP_NODELAY) writes `size` bytes
 * and waits for the server's one-byte answer before the next, so the sender's stack has nothing
 * else queued and sends each message as it was written (a GSO packet of `size` payload bytes
 * when it is over one MSS). The server checks every byte (a pattern keyed on the offset).
 */
import type { NetnsScope } from '../../src/testbed/netns.js';
import { nsExecAsync } from '../../src/testbed/netns.js';

// argv: HOST PORT SIZE COUNT. Prints "ready", then after COUNT messages "got <bytes> <bad>".
const SERVER = `
const net = require('node:net');
const [host, port, size, count] = process.argv.slice(1);
const n = Number(size), c = Number(count);
let got = 0, bad = 0, inMsg = 0;
const srv = net.createServer((s) => {
  s.on('data', (d) => {
    for (let i = 0; i < d.length; i++) if (d[i] !== ((got + i) * 7) % 251) bad++;
    got += d.length;
    inMsg += d.length;
    while (inMsg >= n) { inMsg -= n; s.write('k'); }
    if (got >= n * c) { process.stdout.write('got ' + got + ' ' + bad + '\\n'); s.end(); srv.close(); }
  });
});
srv.listen(Number(port), host, () => process.stdout.write('ready\\n'));
`;

// argv: HOST PORT SIZE COUNT.
const CLIENT = `
const net = require('node:net');
const [host, port, size, count] = process.argv.slice(1);
const n = Number(size), c = Number(count);
const s = net.connect(Number(port), host, () => { s.setNoDelay(true); next(); });
let sent = 0, acked = 0;
function next() {
  const b = Buffer.alloc(n);
  for (let i = 0; i < n; i++) b[i] = ((sent + i) * 7) % 251;
  sent += n;
  s.write(b);
}
s.on('data', (d) => { acked += d.length; if (acked < c) next(); else s.end(); });
s.on('error', (e) => { console.error(String(e)); process.exit(1); });
`;

/**
 * Sends `count` messages of `size` bytes from `clientNs` to `host` (in `serverNs`); returns the
 * bytes the server received and how many of them were not what was sent.
 */
export async function tcpMessages(
  scope: NetnsScope,
  serverNs: string,
  host: string,
  clientNs: string,
  size: number,
  count: number,
): Promise<{ received: number; bad: number }> {
  const port = String(20000 + Math.floor(Math.random() * 10000));
  // The node running the suite (setup installs it; a bare `node` may not be on root's PATH).
  const srv = scope.spawn(serverNs, process.execPath, [
    '-e',
    SERVER,
    host,
    port,
    String(size),
    String(count),
  ]);
  try {
    let out = '';
    const ready = new Promise<void>((resolve, reject) => {
      srv.stdout!.on('data', (d: Buffer) => {
        out += d.toString();
        if (out.includes('ready')) resolve();
      });
      srv.once('exit', (code) => reject(new Error(`server exited (${code}) before listening`)));
    });
    await ready;
    const done = new Promise<void>((resolve) => srv.once('exit', () => resolve()));
    await nsExecAsync(
      clientNs,
      process.execPath,
      ['-e', CLIENT, host, port, String(size), String(count)],
      60_000,
    );
    await done;
    const m = /got (\d+) (\d+)/.exec(out);
    if (!m) throw new Error(`server said: ${out}`);
    return { received: Number(m[1]), bad: Number(m[2]) };
  } finally {
    if (srv.exitCode === null) srv.kill('SIGKILL');
  }
}
