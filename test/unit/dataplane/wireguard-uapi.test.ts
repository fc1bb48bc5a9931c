import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import {
  chmodSync,
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { type Server, type Socket, connect, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import type { WireguardPeerState, WireguardState } from '../../../src/dataplane/wireguard-peers.js';
import {
  UAPI_MAX_LINE,
  UapiRequestReader,
  encodeUapiGet,
  startWireguardUapi,
  uapiAnswer,
  uapiEndpoint,
  x25519PublicKey,
} from '../../../src/dataplane/wireguard-uapi.js';

const priv = Buffer.alloc(32, 0x11);
const psk = Buffer.alloc(32, 0x22);
const keyA = Buffer.alloc(32, 0xa1);
const keyB = Buffer.alloc(32, 0xb2);

const peer4: WireguardPeerState = {
  publicKey: keyA,
  hasPsk: true,
  endpoint: { address: '192.168.77.2', port: 51820 },
  allowedIps: ['10.7.2.0/24', 'fd07:0:0:2::/64'],
  lastHandshakeSec: 1764300000,
  lastHandshakeNsec: 123456789,
  rxBytes: 2048,
  txBytes: 4096,
  persistentKeepalive: 25,
};
const peer6: WireguardPeerState = {
  publicKey: keyB,
  hasPsk: false,
  endpoint: { address: 'fd00::2', port: 51821 },
  allowedIps: ['fd07:0:0:3::/64'],
  lastHandshakeSec: 0,
  lastHandshakeNsec: 0,
  rxBytes: 0,
  txBytes: 0,
  persistentKeepalive: 0,
};
const state = (peers: WireguardPeerState[] = [peer4, peer6]): WireguardState => ({
  publicKey: x25519PublicKey(priv),
  listenPort: 51820,
  peers,
});

describe('encodeUapiGet', () => {
  test("prints the device then each peer in wireguard-go's line order, keys in lowercase hex", () => {
    assert.equal(
      encodeUapiGet(state(), { privateKey: priv, psk }),
      [
        `private_key=${'11'.repeat(32)}`,
        'listen_port=51820',
        `public_key=${'a1'.repeat(32)}`,
        `preshared_key=${'22'.repeat(32)}`,
        'protocol_version=1',
        'endpoint=192.168.77.2:51820',
        'last_handshake_time_sec=1764300000',
        'last_handshake_time_nsec=123456789',
        'tx_bytes=4096',
        'rx_bytes=2048',
        'persistent_keepalive_interval=25',
        'allowed_ip=10.7.2.0/24',
        'allowed_ip=fd07:0:0:2::/64',
        `public_key=${'b2'.repeat(32)}`,
        `preshared_key=${'00'.repeat(32)}`,
        'protocol_version=1',
        'endpoint=[fd00::2]:51821',
        'last_handshake_time_sec=0',
        'last_handshake_time_nsec=0',
        'tx_bytes=0',
        'rx_bytes=0',
        'persistent_keepalive_interval=0',
        'allowed_ip=fd07:0:0:3::/64',
        '',
      ].join('\n'),
    );
  });

  test('leaves out an unknown listen port, a missing endpoint and a PSK it was not given', () => {
    const text = encodeUapiGet(
      { ...state([{ ...peer4, endpoint: null }]), listenPort: 0 },
      { privateKey: priv },
    );
    assert.doesNotMatch(text, /listen_port|endpoint|preshared_key/);
    assert.match(text, /^public_key=a1/m);
  });
});

describe('uapiEndpoint', () => {
  test('IPv4 as address:port, IPv6 in brackets', () => {
    assert.equal(uapiEndpoint('192.0.2.1', 51820), '192.0.2.1:51820');
    assert.equal(uapiEndpoint('2001:db8::1', 51821), '[2001:db8::1]:51821');
  });
});

describe('UapiRequestReader', () => {
  test('a get split across chunks, then a set whose lines are read and dropped', () => {
    const r = new UapiRequestReader();
    assert.deepEqual(r.feed('ge'), []);
    assert.deepEqual(r.feed('t=1\n'), []);
    assert.deepEqual(r.feed('\nset=1\nlisten_port=1\npublic_key=ab'), [{ op: 'get' }]);
    assert.deepEqual(r.feed('\n\nget=1\n\n'), [{ op: 'set' }, { op: 'get' }]);
  });

  test('malformed requests are invalid, and nothing is read after one', () => {
    for (const [bytes, reason] of [
      ['get=2\n\n', /unknown operation "get=2"/],
      ['\n', /unknown operation ""/],
      ['get=1\nx\n', /get=1 not followed by an empty line/],
      ['set=1\nno-equals\n\n', /a line without '='/],
      ['x'.repeat(UAPI_MAX_LINE + 1), /line too long/],
      [`set=1\n${'k='.padEnd(UAPI_MAX_LINE + 2, 'v')}\n`, /line too long/],
    ] as const) {
      const r = new UapiRequestReader();
      const got = r.feed(bytes);
      assert.equal(got.length, 1, bytes.slice(0, 20));
      assert.equal(got[0]!.op, 'invalid');
      assert.match((got[0] as { reason: string }).reason, reason);
      assert.deepEqual(r.feed('get=1\n\n'), []);
    }
  });
});

describe('uapiAnswer', () => {
  const secrets = { privateKey: priv, psk };
  test('get: the state then errno=0 and an empty line', () => {
    const a = uapiAnswer({ op: 'get' }, () => state(), secrets);
    assert.equal(a.close, false);
    assert.ok(
      a.text.endsWith('persistent_keepalive_interval=0\nallowed_ip=fd07:0:0:3::/64\nerrno=0\n\n'),
    );
  });
  test('set: refused with EOPNOTSUPP, negated as wireguard-go writes errors', () => {
    assert.deepEqual(
      uapiAnswer({ op: 'set' }, () => state(), secrets),
      {
        text: 'errno=-95\n\n',
        close: false,
      },
    );
  });
  test('invalid: EINVAL and the connection closes', () => {
    assert.deepEqual(
      uapiAnswer({ op: 'invalid', reason: 'x' }, () => state(), secrets),
      {
        text: 'errno=-22\n\n',
        close: true,
      },
    );
  });
  test('a state that cannot be read (engine closing): EIO', () => {
    const broken = () => {
      throw new Error('dataplane closed');
    };
    assert.equal(uapiAnswer({ op: 'get' }, broken, secrets).text, 'errno=-5\n\n');
  });
});

/** Sends `req` on a fresh connection to `path` and collects what comes back until it closes or `until` matches. */
function ask(path: string, req: string, until = /\n\n$/): Promise<string> {
  return new Promise((resolve, reject) => {
    const s = connect(path);
    let got = '';
    s.setEncoding('latin1');
    s.on('data', (d: string) => {
      got += d;
      if (until.test(got)) {
        s.destroy();
        resolve(got);
      }
    });
    s.on('end', () => resolve(got));
    s.on('error', reject);
    s.write(req);
  });
}

describe('startWireguardUapi (a socket in a temporary directory)', () => {
  let root: string;
  let n = 0;
  const fresh = () => {
    const d = join(root, `d${n++}`);
    mkdirSync(d, { mode: 0o700 });
    return d;
  };
  const start = (dir: string, extra: Record<string, unknown> = {}) =>
    startWireguardUapi({
      interfaceName: 'flannel-wg',
      state: () => state(),
      secrets: { privateKey: priv, psk },
      dir,
      ...extra,
    });
  before(() => {
    root = mkdtempSync(join(tmpdir(), 'weft-uapi-'));
  });
  after(() => rmSync(root, { recursive: true, force: true }));

  test('serves get (twice on one connection), refuses set, and removes its socket on close', async () => {
    const dir = fresh();
    const u = await start(dir);
    try {
      assert.equal(u.path, join(dir, 'flannel-wg.sock'));
      const st = lstatSync(u.path);
      assert.ok(st.isSocket());
      assert.equal(st.mode & 0o077, 0, `socket mode ${(st.mode & 0o777).toString(8)}`);
      const two = await ask(u.path, 'get=1\n\nget=1\n\n', /errno=0\n\n[^]*errno=0\n\n$/);
      const one = `${encodeUapiGet(state(), { privateKey: priv, psk })}errno=0\n\n`;
      assert.equal(two, one + one);
      assert.equal(await ask(u.path, 'set=1\nlisten_port=1\n\n'), 'errno=-95\n\n');
    } finally {
      await u.close();
    }
    assert.equal(existsSync(u.path), false);
  });

  test('a malformed request is answered with EINVAL and the connection closed', async () => {
    const u = await start(fresh());
    try {
      assert.equal(await ask(u.path, 'hello\n', /$^/), 'errno=-22\n\n');
      assert.equal(await ask(u.path, '\0\xff\n', /$^/), 'errno=-22\n\n');
      // still serving
      assert.match(await ask(u.path, 'get=1\n\n'), /errno=0\n\n$/);
    } finally {
      await u.close();
    }
  });

  test('a socket left by a dead process is replaced; a live one is refused', async () => {
    const dir = fresh();
    const path = join(dir, 'flannel-wg.sock');
    // a live listener: refused
    const other: Server = createServer();
    await new Promise<void>((r) => other.listen(path, r));
    await assert.rejects(start(dir), {
      code: 'WEFT_ERR_WIREGUARD_UAPI',
      message: /served by another process/,
    });
    await new Promise<void>((r) => other.close(() => r()));
    // the socket file of a listener killed with SIGKILL (nobody listens on it any more)
    spawnSync(process.execPath, [
      '-e',
      `require('net').createServer().listen(${JSON.stringify(path)}, () => process.kill(process.pid, 'SIGKILL'))`,
    ]);
    assert.ok(lstatSync(path).isSocket(), 'the stale socket file is there');
    const u = await start(dir);
    try {
      assert.match(await ask(u.path, 'get=1\n\n'), /errno=0\n\n$/);
    } finally {
      await u.close();
    }
  });

  test('refuses a symlink or a non-socket at the socket path', async () => {
    const dir = fresh();
    const path = join(dir, 'flannel-wg.sock');
    symlinkSync(join(root, 'elsewhere'), path);
    await assert.rejects(start(dir), { message: /flannel-wg\.sock is a symlink/ });
    rmSync(path);
    writeFileSync(path, 'not a socket');
    await assert.rejects(start(dir), { message: /exists and is not a socket/ });
    assert.ok(existsSync(path), 'a file that is not ours stays');
  });

  test('refuses a directory that is a symlink or writable by others', async () => {
    const real = fresh();
    const link = join(root, `link${n++}`);
    symlinkSync(real, link);
    await assert.rejects(start(link), { message: /is a symlink/ });
    const open = fresh();
    chmodSync(open, 0o777);
    await assert.rejects(start(open), { message: /writable by others/ });
  });

  test('refuses a private key that is not the engine key, and a name wg(8) cannot use', async () => {
    await assert.rejects(start(fresh(), { secrets: { privateKey: randomBytes(32) } }), {
      message: /privateKey is not the engine key/,
    });
    for (const bad of ['a/b', '', 'x'.repeat(16), '..'])
      await assert.rejects(start(fresh(), { interfaceName: bad }), { message: /wg\(8\) can name/ });
  });

  test('a client that never reads does not hold up another', async () => {
    // A state of 2000 peers (~600 KB an answer), asked for 20 times by a client that reads
    // nothing: far more than the socket buffers hold, so the server's writes to it back up.
    const many = Array.from({ length: 2000 }, (_, i) => ({
      ...peer4,
      publicKey: Buffer.alloc(32, i & 0xff),
    }));
    const u = await start(fresh(), { state: () => state(many) });
    const stuck: Socket = connect(u.path);
    try {
      await new Promise<void>((r) => stuck.once('connect', () => r()));
      stuck.pause();
      stuck.write('get=1\n\n'.repeat(20));
      const answer = await ask(u.path, 'get=1\n\n', /errno=0\n\n$/);
      assert.equal(answer.match(/^public_key=/gm)?.length, 2000);
      assert.ok(stuck.bytesRead < 20 * answer.length, 'the stuck client read nothing');
    } finally {
      stuck.destroy();
      await u.close();
    }
  });
});
