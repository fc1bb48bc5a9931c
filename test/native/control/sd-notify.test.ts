/**
 * sd_notify through the native addon, received by a real AF_UNIX SOCK_DGRAM socket (Python's
 * socket module stands in for systemd: Node cannot open one, which is why the addon sends).
 */
import { afterEach, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { isWeftError } from '../../../src/common/errors.js';
import { sdNotify } from '../../../src/control/sd-notify.js';

const RECEIVER = `
import socket, sys
path = sys.argv[1]
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(('\\0' + path[1:]) if path.startswith('@') else path)
s.settimeout(10)
print('bound', flush=True)
data, _ = s.recvfrom(4096)
print(data.decode(), flush=True)
`;

const children: ChildProcess[] = [];
const dirs: string[] = [];

afterEach(async () => {
  for (const c of children.splice(0)) c.kill();
  for (const d of dirs.splice(0)) await rm(d, { recursive: true, force: true });
});

/** Starts a receiver on `path`; resolves once bound, with a promise of the datagram's text. */
async function receiver(path: string): Promise<{ received: Promise<string> }> {
  const child = spawn('python3', ['-c', RECEIVER, path], { stdio: ['ignore', 'pipe', 'inherit'] });
  children.push(child);
  let out = '';
  await new Promise<void>((resolve, reject) => {
    child.once('error', reject);
    child.stdout!.on('data', (c: Buffer) => {
      out += c.toString();
      if (out.startsWith('bound\n')) resolve();
    });
  });
  // Wrapped: an async function returning a bare promise would wait for it.
  const received = new Promise<string>((resolve) => {
    child.once('exit', () => resolve(out.slice('bound\n'.length).trimEnd()));
  });
  return { received };
}

test('READY=1 reaches a socket given by path', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'weft-notify-'));
  dirs.push(dir);
  const path = join(dir, 'notify');
  const { received } = await receiver(path);
  assert.equal(sdNotify('READY=1', { NOTIFY_SOCKET: path }), true);
  assert.equal(await received, 'READY=1');
});

test('STOPPING=1 reaches an abstract socket (@name)', async () => {
  const path = `@weft-notify-${process.pid}`;
  const { received } = await receiver(path);
  assert.equal(sdNotify('STOPPING=1', { NOTIFY_SOCKET: path }), true);
  assert.equal(await received, 'STOPPING=1');
});

test('without NOTIFY_SOCKET nothing is sent', () => {
  assert.equal(sdNotify('READY=1', {}), false);
});

test('a socket that does not exist is WEFT_ERR_SD_NOTIFY naming the errno', () => {
  assert.throws(
    () => sdNotify('READY=1', { NOTIFY_SOCKET: '/nonexistent/weft/notify' }),
    (e) => isWeftError(e, 'WEFT_ERR_SD_NOTIFY') && /ENOENT/.test(e.message),
  );
});
