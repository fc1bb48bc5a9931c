/**
 * The native engine's `wireguard` framing: two node namespaces, each running
 * test/helpers/dataplane-node.ts (format wireguard, 2 queues), or a Debian `wireguard-go` in B
 * configured as flanneld configures its kernel `flannel-wg` link:
 *
 *   ns A                                        ns B
 *   tun flannel-wg 10.7.1.0/32 (MTU 1420)       tun flannel-wg 10.7.2.0/32, or wireguard-go's
 *   route 10.7.0.0/16 → tun                     route 10.7.0.0/16 → tun (scope link)
 *   key a, peer b: endpoint 192.168.77.2:51820  key b, peer a: endpoint 192.168.77.1:51820
 *     AllowedIPs 10.7.2.0/24, PSK                 AllowedIPs 10.7.1.0/24, PSK
 *   veth va 192.168.77.1/24 ─────────────────── veth vb 192.168.77.2/24
 *
 * Ping both ways (IPv4 and IPv6 inside) and a fixed amount of TCP (iperf3) engine ⇄ engine, and
 * IPv4 engine ⇄ wireguard-go;
 * an inner source outside the sending peer's AllowedIPs dropped and counted (cryptokey
 * routing); a restarted node makes a new session; a flood of initiations answered with cookie
 * replies; a wrong peer key carries nothing.
 */
import assert from 'node:assert/strict';
import { type ChildProcess, execFileSync, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, afterEach, before, describe, test } from 'node:test';
import { waitFor } from '../../src/testbed/cluster.js';
import { UAPI_DIR, claimUapiDir, stopWireguardGo } from '../helpers/wireguard-go.js';
import { NetnsScope, ip, isRoot, nsExec, nsExecAsync, uniqueDev } from '../../src/testbed/netns.js';
import { iperf } from '../../src/testbed/probes.js';
import { TCP_FIXED, delivered } from '../helpers/carried.js';
import {
  type Node,
  type Side,
  PORT,
  startNode,
  stopPair,
  twoNodes,
} from '../helpers/dataplane-pair.js';

const hasWg =
  spawnSync('wireguard-go', ['--version']).status === 0 && spawnSync('wg', ['--help']).status === 0;
const skip = isRoot() ? false : 'needs root (network namespaces)';
const KEEPALIVE = 25;

type Totals = { counters: Record<string, number>; drops: Record<string, number> };

async function stopNode(n: Node): Promise<void> {
  await n.send({ cmd: 'close' });
  await n.closed;
}

interface Keys {
  priv: Buffer;
  pub?: Buffer;
}

describe('native engine, wireguard framing, between two namespaces', { skip }, () => {
  const scope = new NetnsScope();
  let A: Side;
  let B: Side;
  const psk = randomBytes(32);
  before(() => {
    [A, B] = twoNodes(scope);
  });
  after(() => scope.cleanup());

  /** A weft node in `s` with key `k` (its public key filled in from the node's first line). */
  async function weftNode(s: Side, k: Keys): Promise<Node> {
    const n = startNode(scope, s, 'wireguard', 'native', {
      wireguard: { privateKey: k.priv.toString('base64'), psk: psk.toString('base64') },
    });
    const ready = await n.ready;
    assert.equal(ready.ready, true, JSON.stringify(ready));
    k.pub = Buffer.from(ready.wgPublicKey as string, 'base64');
    return n;
  }

  /** `n` (in `self`'s namespace) routes `peer`'s subnet to it, whose key is `key`. */
  async function knows(n: Node, peer: Side, key: Buffer, more: Side[] = [], keys: Buffer[] = []) {
    const sides = [peer, ...more];
    const r1 = await n.send({
      cmd: 'peers',
      // AllowedIPs: the peer's IPv4 and IPv6 subnets
      peers: sides.flatMap((s) =>
        [s.subnet, s.subnet6].map((subnet) => ({
          subnet,
          publicIP: s.under,
          port: PORT.wireguard,
        })),
      ),
    });
    assert.equal(r1.ok, true, JSON.stringify(r1));
    const r2 = await n.send({
      cmd: 'wgpeers',
      wg: sides.map((s, i) => ({
        publicKey: (i === 0 ? key : keys[i - 1]!).toString('base64'),
        endpoint: s.under,
        port: PORT.wireguard,
        persistentKeepalive: KEEPALIVE,
      })),
    });
    assert.equal(r2.ok, true, JSON.stringify(r2));
  }

  const stats = async (n: Node) =>
    ((await n.send({ cmd: 'stats' })).stats as { total: Totals }).total;

  test('engine ⇄ engine: IPv4 and IPv6 ping both ways (the first wait for the handshake), then TCP', async () => {
    const ka: Keys = { priv: randomBytes(32) };
    const kb: Keys = { priv: randomBytes(32) };
    const [a, b] = await Promise.all([weftNode(A, ka), weftNode(B, kb)]);
    try {
      await knows(a, B, kb.pub!);
      await knows(b, A, ka.pub!);
      await nsExecAsync(A.ns, 'ping', ['-c', '3', '-i', '0.2', '-W', '5', B.v4]);
      await nsExecAsync(B.ns, 'ping', ['-c', '3', '-i', '0.2', '-W', '5', A.v4]);
      await nsExecAsync(A.ns, 'ping', ['-6', '-c', '3', '-i', '0.2', '-W', '5', B.v6]);
      await nsExecAsync(B.ns, 'ping', ['-6', '-c', '3', '-i', '0.2', '-W', '5', A.v6]);
      const tcp = await iperf(scope, B.ns, B.v4, A.ns, ['-B', A.v4, ...TCP_FIXED]);
      const bytes = delivered(tcp.json);
      const sb = await stats(b);
      assert.ok(sb.counters.rx_bytes! >= bytes, JSON.stringify(sb));
      const sa = await stats(a);
      assert.ok(sa.counters.wg_handshakes_sent! + sb.counters.wg_handshakes_sent! >= 2);
      assert.ok(sa.counters.wg_staged! + sb.counters.wg_staged! >= 1, 'a first ping waited');
    } finally {
      await stopPair([a, b]);
    }
  });

  test('a node restarted with its key makes a new session with a peer that kept the old one', async () => {
    const ka: Keys = { priv: randomBytes(32) };
    const kb: Keys = { priv: randomBytes(32) };
    const [a, first] = await Promise.all([weftNode(A, ka), weftNode(B, kb)]);
    let b = first;
    try {
      await knows(a, B, kb.pub!);
      await knows(b, A, ka.pub!);
      await nsExecAsync(A.ns, 'ping', ['-c', '1', '-W', '5', B.v4]);
      await stopNode(b);
      b = await weftNode(B, kb); // same key, no session: A still holds the old one
      await knows(b, A, ka.pub!);
      // B's ping waits for B's new handshake, which A takes (a newer timestamp); then A's ping
      // leaves under the new session.
      await nsExecAsync(B.ns, 'ping', ['-c', '2', '-i', '0.2', '-W', '5', A.v4]);
      await nsExecAsync(A.ns, 'ping', ['-c', '2', '-i', '0.2', '-W', '5', B.v4]);
      const sb = await stats(b);
      assert.ok(sb.counters.wg_staged! >= 1, 'the first ping waited for the handshake');
      assert.ok(sb.counters.wg_handshakes_sent! >= 1, JSON.stringify(sb.counters));
      assert.ok(sb.counters.rx_packets! >= 4, 'both replies and both requests came in');
    } finally {
      await stopPair([a, b]);
    }
  });

  test('an inner source outside the sending peer’s AllowedIPs is dropped and counted', async () => {
    const ka: Keys = { priv: randomBytes(32) };
    const kb: Keys = { priv: randomBytes(32) };
    const [a, b] = await Promise.all([weftNode(A, ka), weftNode(B, kb)]);
    // B also knows C (10.7.3.0/24 at 192.168.77.3): A may not speak for C's subnet.
    const C = { ...A, under: '192.168.77.3', subnet: '10.7.3.0/24', subnet6: 'fd07:0:0:3::/64' };
    try {
      await knows(a, B, kb.pub!);
      await knows(b, A, ka.pub!, [C], [randomBytes(32)]);
      await nsExecAsync(A.ns, 'ping', ['-c', '1', '-W', '5', B.v4]); // the session is up
      // B counts the request after writing it to its TUN, so the reply can reach A first: the
      // baseline is taken once the request is counted.
      await waitFor(
        async () => (await stats(b)).counters.rx_packets! >= 1,
        20_000,
        'B counts the ping request',
      );
      const before = await stats(b);
      // Five UDP packets from 10.7.3.5 (C's subnet) to B, written raw in A: A's engine seals
      // them for B (their destination), B opens them with A's key and refuses the source.
      nsExec(A.ns, 'python3', [
        '-c',
        `import socket, struct
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
payload = b'spoofed!'
udp = struct.pack('!HHHH', 4000, 4001, 8 + len(payload), 0) + payload
ip = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0,
                 socket.inet_aton('10.7.3.5'), socket.inet_aton('${B.v4}'))
for _ in range(5):
    s.sendto(ip + udp, ('${B.v4}', 0))`,
      ]);
      await waitFor(
        async () => (await stats(b)).drops.wg_allowed_ips! - before.drops.wg_allowed_ips! >= 5,
        20_000,
        'B counts the five spoofed packets',
      );
      const after = await stats(b);
      assert.equal(after.drops.wg_allowed_ips! - before.drops.wg_allowed_ips!, 5);
      // The replies to the ping and the spoofed packets are all B received: nothing went in.
      assert.equal(after.counters.rx_packets, before.counters.rx_packets);
    } finally {
      await stopPair([a, b]);
    }
  });

  test('a flood of initiations puts the engine under load: answered with cookie replies', async () => {
    const kb: Keys = { priv: randomBytes(32) };
    const b = await weftNode(B, kb);
    try {
      await knows(b, A, randomBytes(32));
      // 200 initiations from A's namespace with a valid mac1 (keyed by B's public key) and
      // random contents: before the load flag each fails to authenticate (wg_rejected); once
      // more than 64 came within a tick, B wants a mac2 and answers with cookie replies (type 3,
      // 64 bytes) that the flooder receives.
      const got = nsExec(A.ns, 'python3', [
        '-c',
        `import hashlib, os, socket, struct
key = hashlib.blake2s(b'mac1----' + bytes.fromhex('${kb.pub!.toString('hex')}')).digest()
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(5)
for i in range(200):
    m = struct.pack('<I', 1) + os.urandom(112)
    m += hashlib.blake2s(m, key=key, digest_size=16).digest() + bytes(16)
    s.sendto(m, ('${B.under}', ${PORT.wireguard}))
cookies = 0
try:
    while True:
        r = s.recv(2048)
        cookies += r[0] == 3 and len(r) == 64
except socket.timeout:
    pass
print(cookies)`,
      ]);
      const sb = await stats(b);
      assert.ok(Number(got) >= 1, `the flooder got ${got} cookie replies`);
      assert.equal(sb.counters.wg_cookie_replies, Number(got), JSON.stringify(sb));
      assert.ok(sb.drops.wg_rejected! >= 1, 'the first ones were processed (and refused)');
      assert.equal(sb.counters.wg_handshakes_sent, 0);
    } finally {
      await stopNode(b);
    }
  });

  test('a wrong peer key carries nothing: B refuses A’s initiations', async () => {
    const ka: Keys = { priv: randomBytes(32) };
    const kb: Keys = { priv: randomBytes(32) };
    const [a, b] = await Promise.all([weftNode(A, ka), weftNode(B, kb)]);
    try {
      await knows(a, B, randomBytes(32)); // not B's key
      await knows(b, A, ka.pub!);
      const out = await nsExecAsync(A.ns, 'ping', ['-c', '2', '-W', '2', B.v4]).catch(
        (e: Error) => e.message,
      );
      assert.match(out, /0 received|100% packet loss/);
      await waitFor(
        async () => (await stats(b)).drops.wg_rejected! >= 1,
        20_000,
        'B refuses an initiation',
      );
      const sb = await stats(b);
      assert.equal(sb.counters.rx_packets, 0);
      assert.equal(sb.counters.wg_handshakes_sent, 0, 'B answered nothing');
      assert.ok((await stats(a)).counters.wg_staged! >= 1);
    } finally {
      await stopPair([a, b]);
    }
  });
});

describe(
  'native engine, wireguard framing, against wireguard-go',
  {
    skip: skip || (!hasWg && 'wireguard-go or wg missing (npm run setup installs them)'),
  },
  () => {
    const scope = new NetnsScope();
    let A: Side;
    let B: Side;
    let wireguardGo: ChildProcess | null = null;
    let dir = '';
    let releaseUapiDir: (() => void) | null = null;
    before(async () => {
      releaseUapiDir = await claimUapiDir();
      [A, B] = twoNodes(scope);
      dir = mkdtempSync(join(tmpdir(), 'weft-wg-engine-'));
    });
    afterEach(async () => {
      await stopWireguardGo(wireguardGo);
      wireguardGo = null;
    });
    after(() => {
      scope.cleanup();
      rmSync(dir, { recursive: true, force: true });
      releaseUapiDir?.();
    });

    const wgTool = (args: string[], input?: string): string =>
      execFileSync('wg', args, { encoding: 'utf8', input }).trim();

    test('engine ⇄ wireguard-go set up as flanneld sets up flannel-wg: ping and TCP both ways', async () => {
      const goPriv = wgTool(['genkey']);
      const goPub = wgTool(['pubkey'], goPriv + '\n');
      const pskText = wgTool(['genpsk']);
      writeFileSync(join(dir, 'priv'), goPriv + '\n', { mode: 0o600 });
      writeFileSync(join(dir, 'psk'), pskText + '\n', { mode: 0o600 });
      const ourPriv = wgTool(['genkey']);
      // The device name is unique (the UAPI socket directory is shared by every namespace);
      // everything else is what flanneld gives its kernel flannel-wg link.
      const dev = uniqueDev('wg');
      wireguardGo = scope.spawn(B.ns, 'wireguard-go', ['-f', dev], {
        env: { ...process.env, WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD: '1' },
      });
      await waitFor(() => existsSync(join(UAPI_DIR, `${dev}.sock`)), 20_000, 'wireguard-go UAPI');
      const a = startNode(scope, A, 'wireguard', 'native', {
        wireguard: { privateKey: ourPriv, psk: pskText },
      });
      const ready = await a.ready;
      assert.equal(ready.ready, true, JSON.stringify(ready));
      assert.equal(ready.wgPublicKey, wgTool(['pubkey'], ourPriv + '\n'), 'wg derives our key');
      try {
        nsExec(B.ns, 'wg', [
          'set',
          dev,
          'listen-port',
          String(PORT.wireguard),
          'private-key',
          join(dir, 'priv'),
          'peer',
          ready.wgPublicKey as string,
          'endpoint',
          `${A.under}:${PORT.wireguard}`,
          'allowed-ips',
          A.subnet,
          'preshared-key',
          join(dir, 'psk'),
          'persistent-keepalive',
          String(KEEPALIVE),
        ]);
        ip(B.ns, 'link', 'set', dev, 'mtu', '1420');
        ip(B.ns, 'addr', 'add', `${B.v4}/32`, 'dev', dev);
        ip(B.ns, 'link', 'set', dev, 'up');
        ip(B.ns, 'route', 'add', '10.7.0.0/16', 'dev', dev, 'scope', 'link');
        const r1 = await a.send({
          cmd: 'peers',
          peers: [{ subnet: B.subnet, publicIP: B.under, port: PORT.wireguard }],
        });
        assert.equal(r1.ok, true, JSON.stringify(r1));
        const r2 = await a.send({
          cmd: 'wgpeers',
          wg: [
            {
              publicKey: goPub,
              endpoint: B.under,
              port: PORT.wireguard,
              persistentKeepalive: KEEPALIVE,
            },
          ],
        });
        assert.equal(r2.ok, true, JSON.stringify(r2));
        await nsExecAsync(A.ns, 'ping', ['-c', '3', '-i', '0.2', '-W', '5', B.v4]);
        await nsExecAsync(B.ns, 'ping', ['-c', '3', '-i', '0.2', '-W', '5', A.v4]);
        const toGo = delivered(
          (await iperf(scope, B.ns, B.v4, A.ns, ['-B', A.v4, ...TCP_FIXED])).json,
        );
        const fromGo = delivered(
          (await iperf(scope, A.ns, A.v4, B.ns, ['-B', B.v4, ...TCP_FIXED])).json,
        );
        const s = ((await a.send({ cmd: 'stats' })).stats as { total: Totals }).total;
        assert.ok(s.counters.tx_bytes! >= toGo, JSON.stringify(s.counters));
        assert.ok(s.counters.rx_bytes! >= fromGo, JSON.stringify(s.counters));
        const dump = nsExec(B.ns, 'wg', ['show', dev, 'dump']).trim().split('\n')[1]!.split('\t');
        assert.ok(Number(dump[4]) > 0, 'wireguard-go completed a handshake with weft');
      } finally {
        await stopNode(a);
      }
    });
  },
);
