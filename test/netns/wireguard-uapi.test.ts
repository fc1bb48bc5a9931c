/**
 * `wg show` against the native engine's WireGuard device: two node namespaces, each running
 * test/helpers/dataplane-node.ts (format wireguard) serving the UAPI for its TUN
 * (src/dataplane/wireguard-uapi.ts), read by Debian's wg(8):
 *
 *   ns A                                          ns B
 *   tun wNNNNuaX 10.7.1.0/32                      tun wNNNNubY 10.7.2.0/32
 *   /var/run/wireguard/wNNNNuaX.sock              /var/run/wireguard/wNNNNubY.sock
 *   key a, peer b: endpoint 192.168.77.2:51820    key b, peer a: endpoint 192.168.77.1:51820
 *     AllowedIPs 10.7.2.0/24 fd07:0:0:2::/64,       AllowedIPs 10.7.1.0/24 fd07:0:0:1::/64,
 *     PSK, keepalive 25                             PSK, keepalive 25
 *   veth va 192.168.77.1/24 ───────────────────── veth vb 192.168.77.2/24
 *
 * (The UAPI directory is the host's, shared with wireguard-go tests: unique interface names,
 * only our own sockets removed, the directory only if we made it and it is empty.)
 * One ping A → B makes the session; then `wg show`, `wg show dump` and `wg set` on A and B; then
 * A's lease for B names a wrong port, and B's pings still get their replies (roaming).
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { x25519PublicKey } from '../../src/dataplane/wireguard-uapi.js';
import { NetnsScope, isRoot, nsExec, nsExecAsync, uniqueDev } from '../../src/testbed/netns.js';
import {
  type Node,
  type Side,
  PORT,
  startNode,
  stopPair,
  twoNodes,
} from '../helpers/dataplane-pair.js';
import { UAPI_DIR, claimUapiDir } from '../helpers/wireguard-go.js';

const hasWg = spawnSync('wg', ['--help']).status === 0;
const skip = !isRoot()
  ? 'needs root (network namespaces)'
  : !hasWg
    ? 'wg (Debian wireguard-tools) is not installed: npm run setup installs it'
    : false;
const KEEPALIVE = 25;
const b64 = (b: Buffer) => b.toString('base64');

describe('wg show against the native engine (UAPI socket)', { skip }, () => {
  const scope = new NetnsScope();
  let A: Side;
  let B: Side;
  const psk = randomBytes(32);
  const priv = [randomBytes(32), randomBytes(32)] as const;
  const pub = [x25519PublicKey(priv[0]), x25519PublicKey(priv[1])] as const;
  const names = [uniqueDev('ua'), uniqueDev('ub')] as const;
  const sockets = names.map((n) => join(UAPI_DIR, `${n}.sock`));
  let releaseUapiDir: (() => void) | null = null;
  let nodes: [Node, Node] | null = null;

  before(async () => {
    releaseUapiDir = await claimUapiDir();
    [A, B] = twoNodes(scope);
    const sides = [A, B] as const;
    const started = sides.map((s, i) =>
      startNode(scope, s, 'wireguard', 'native', {
        tunName: names[i],
        wireguard: { privateKey: b64(priv[i]!), psk: b64(psk) },
      }),
    ) as [Node, Node];
    nodes = started;
    for (const n of started) assert.equal((await n.ready).ready, true);
    for (const [i, n] of started.entries()) {
      const peer = sides[1 - i]!;
      const r1 = await n.send({
        cmd: 'peers',
        peers: [peer.subnet, peer.subnet6].map((subnet) => ({
          subnet,
          publicIP: peer.under,
          port: PORT.wireguard,
        })),
      });
      assert.equal(r1.ok, true, JSON.stringify(r1));
      const r2 = await n.send({
        cmd: 'wgpeers',
        wg: [
          {
            publicKey: b64(pub[1 - i]!),
            endpoint: peer.under,
            port: PORT.wireguard,
            persistentKeepalive: KEEPALIVE,
          },
        ],
      });
      assert.equal(r2.ok, true, JSON.stringify(r2));
      const r3 = await n.send({ cmd: 'uapi' });
      assert.equal(r3.ok, true, JSON.stringify(r3));
      assert.equal(r3.path, sockets[i]);
    }
    await nsExecAsync(A.ns, 'ping', ['-c', '3', '-i', '0.2', '-W', '5', B.v4]);
  });

  after(async () => {
    try {
      if (nodes) await stopPair(nodes);
    } finally {
      scope.cleanup();
      for (const s of sockets) rmSync(s, { force: true }); // a node that did not close left it
      releaseUapiDir?.();
    }
  });

  test('wg show: our key, the peer, its endpoint, AllowedIPs, a handshake and transfer', () => {
    const text = nsExec(A.ns, 'wg', ['show', names[0]]);
    assert.match(text, new RegExp(`^interface: ${names[0]}$`, 'm'));
    assert.ok(text.includes(`public key: ${b64(pub[0])}\n`), text);
    assert.match(text, /private key: \(hidden\)/);
    assert.match(text, /listening port: 51820/);
    assert.ok(text.includes(`peer: ${b64(pub[1])}\n`), text);
    assert.match(text, /preshared key: \(hidden\)/);
    assert.match(text, /endpoint: 192\.168\.77\.2:51820/);
    assert.match(text, /allowed ips: 10\.7\.2\.0\/24, fd07:0:0:2::\/64/);
    assert.match(text, /latest handshake: (Now|.* ago)/);
    assert.match(text, /transfer: .* received, .* sent/);
    assert.match(text, /persistent keepalive: every 25 seconds/);
  });

  test('wg show dump: the same, field by field, from both nodes', () => {
    const sides = [A, B] as const;
    for (const i of [0, 1] as const) {
      const peer = sides[1 - i]!;
      const [dev, p, ...rest] = nsExec(sides[i].ns, 'wg', ['show', names[i], 'dump'])
        .trimEnd()
        .split('\n')
        .map((l) => l.split('\t'));
      assert.equal(rest.length, 0, 'one peer');
      assert.deepEqual(dev, [b64(priv[i]), b64(pub[i]!), '51820', 'off']);
      const [key, pskText, endpoint, allowed, handshake, rx, tx, keepalive] = p!;
      assert.equal(key, b64(pub[1 - i]!));
      assert.equal(pskText, b64(psk));
      assert.equal(endpoint, `${peer.under}:51820`);
      assert.equal(allowed, `${peer.subnet},${peer.subnet6}`);
      assert.ok(Number(handshake) > 0, `latest handshake ${handshake}`);
      assert.ok(Number(rx) > 0 && Number(tx) > 0, `transfer rx ${rx} tx ${tx}`);
      assert.equal(keepalive, String(KEEPALIVE));
    }
  });

  test('wg set is refused (peers come from the leases): Operation not supported', () => {
    const r = spawnSync('ip', ['netns', 'exec', A.ns, 'wg', 'set', names[0], 'listen-port', '1'], {
      encoding: 'utf8',
    });
    assert.notEqual(r.status, 0);
    assert.match(r.stderr, /Unable to modify interface: Operation not supported/);
    assert.match(nsExec(A.ns, 'wg', ['show', names[0], 'listen-port']), /^51820$/m);
  });

  test('a peer is sent to where its packets come from (roaming), and wg show says so', async () => {
    // A's lease for B now names a port nobody listens on; the session stays (same key). A's
    // replies reach B only at the endpoint B's packets come from: 192.168.77.2:51820.
    const r = await nodes![0].send({
      cmd: 'wgpeers',
      wg: [
        {
          publicKey: b64(pub[1]),
          endpoint: B.under,
          port: 51999,
          persistentKeepalive: KEEPALIVE,
        },
      ],
    });
    assert.equal(r.ok, true, JSON.stringify(r));
    await nsExecAsync(B.ns, 'ping', ['-c', '3', '-i', '0.2', '-W', '5', A.v4]);
    const dump = nsExec(A.ns, 'wg', ['show', names[0], 'endpoints']);
    assert.equal(dump.trim(), `${b64(pub[1])}\t${B.under}:51820`);
  });

  test('closing the node removes its socket', async () => {
    await stopPair(nodes!);
    nodes = null;
    for (const s of sockets) assert.equal(existsSync(s), false, s);
  });
});
