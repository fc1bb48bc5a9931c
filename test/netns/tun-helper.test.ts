/**
 * The TUN helper (native/tun-helper/weft-tun.c, the js engine's TUN when the addon does not
 * load), run for real inside a namespace:
 *
 *   ┌──────── weft-<pid>-0 ──────────────────────────────┐
 *   │ weft-tun wtun0  ⇄ stdio frames ⇄ this test          │
 *   │ wtun0 10.9.0.1/24 up: an echo request from 10.9.0.2 │
 *   │ written in comes back out as the kernel's reply     │
 *   └─────────────────────────────────────────────────────┘
 *
 * Bad input from the parent (a zero length, stdin ending inside a frame) is an error exit with a
 * message, never a hang; a clean EOF is exit 0 and the device goes away with the helper.
 */
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { after, before, describe, test } from 'node:test';
import { checksum } from '../../src/dataplane/js-codec.js';
import { FrameParser, encodeFrame, tunHelperPath } from '../../src/dataplane/tun-helper.js';
import { NetnsScope, ip, isRoot } from '../../src/testbed/netns.js';
// @ts-expect-error: a plain .mjs build script without types
import { buildTunHelper } from '../../scripts/build-native.mjs';

const skip = isRoot() ? false : 'needs root (network namespaces, /dev/net/tun)';

interface Run {
  readonly proc: ChildProcess;
  readonly name: Promise<string>;
  readonly packets: Buffer[];
  readonly stderr: () => string;
  readonly exit: Promise<number | null>;
}

function startHelper(scope: NetnsScope, ns: string, dev: string): Run {
  const proc = scope.spawn(ns, tunHelperPath(), [dev]);
  const packets: Buffer[] = [];
  const parser = new FrameParser();
  let head: Buffer | null = Buffer.alloc(0);
  let err = '';
  let resolveName: (n: string) => void = () => undefined;
  const name = new Promise<string>((r) => (resolveName = r));
  proc.stdout!.on('data', (d: Buffer) => {
    if (head) {
      head = Buffer.concat([head, d]);
      const nl = head.indexOf(0x0a);
      if (nl < 0) return;
      resolveName(head.subarray(0, nl).toString());
      d = head.subarray(nl + 1);
      head = null;
    }
    packets.push(...parser.push(d));
  });
  proc.stderr!.on('data', (d: Buffer) => (err += d.toString()));
  const exit = new Promise<number | null>((r) => proc.once('exit', (code) => r(code)));
  return { proc, name, packets, stderr: () => err, exit };
}

/** An IPv4 ICMP echo request src → dst. */
function echoRequest(src: number[], dst: number[], id: number): Buffer {
  const p = Buffer.alloc(20 + 8 + 16, 0x61);
  p.set([0x45, 0, 0, p.length, 0, 0, 0x40, 0, 64, 1, 0, 0, ...src, ...dst], 0);
  p.writeUInt16BE(checksum(p, 0, 20), 10);
  p.set([8, 0, 0, 0, id >> 8, id & 0xff, 0, 1], 20);
  p.writeUInt16BE(checksum(p, 20, p.length), 22);
  return p;
}

async function waitUntil(pred: () => boolean, ms: number, what: string): Promise<void> {
  const end = Date.now() + ms;
  while (!pred()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

describe('weft-tun helper', { skip }, () => {
  const scope = new NetnsScope();
  let ns = '';

  before(() => {
    assert.equal(buildTunHelper({ strict: true }), true);
    ns = scope.add();
  });
  after(async () => {
    await scope.cleanup();
  });

  test('opens the TUN, names it, relays packets both ways and exits 0 on EOF', async () => {
    const h = startHelper(scope, ns, 'wtun0');
    assert.equal(await h.name, 'wtun0');
    assert.match(ip(ns, '-d', 'link', 'show', 'wtun0'), /tun type tun pi off/);
    ip(ns, 'addr', 'add', '10.9.0.1/24', 'dev', 'wtun0');
    ip(ns, 'link', 'set', 'wtun0', 'up');
    h.proc.stdin!.write(encodeFrame(echoRequest([10, 9, 0, 2], [10, 9, 0, 1], 0x4242)));
    // The kernel answers into the TUN: an echo reply 10.9.0.1 → 10.9.0.2 with our id.
    const isReply = (p: Buffer) =>
      p[9] === 1 && p[20] === 0 && p.readUInt16BE(24) === 0x4242 && p[19] === 2;
    await waitUntil(() => h.packets.some(isReply), 5000, 'the echo reply');
    h.proc.stdin!.end();
    assert.equal(await h.exit, 0, h.stderr());
    assert.throws(() => ip(ns, 'link', 'show', 'wtun0'), /does not exist/);
  });

  test('a frame of length 0 is an error exit with a message', async () => {
    const h = startHelper(scope, ns, 'wtun1');
    await h.name;
    h.proc.stdin!.write(Buffer.from([0, 0, 0x45]));
    assert.equal(await h.exit, 1);
    assert.match(h.stderr(), /bad frame from stdin: length 0/);
  });

  test('stdin ending inside a frame is an error exit, not a hang', async () => {
    const h = startHelper(scope, ns, 'wtun2');
    await h.name;
    h.proc.stdin!.end(Buffer.from([0, 40, 0x45, 0, 0]));
    assert.equal(await h.exit, 1);
    assert.match(h.stderr(), /stdin ended inside a frame \(5 of 42 bytes\)/);
  });

  test('a name that is too long is a usage error', async () => {
    const h = startHelper(scope, ns, 'x'.repeat(16));
    assert.equal(await h.exit, 2);
    assert.match(h.stderr(), /usage: weft-tun NAME/);
  });
});
