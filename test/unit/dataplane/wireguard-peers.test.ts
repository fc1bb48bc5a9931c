import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  WG_PEER_RECORD_SIZE,
  decodeWireguardPeers,
  encodeWireguardPeers,
} from '../../../src/dataplane/wireguard-peers.js';

describe('encodeWireguardPeers', () => {
  const key = Buffer.alloc(32, 7);

  test('lays each peer out as native/src/wg_engine.h reads it', () => {
    const buf = encodeWireguardPeers([
      { publicKey: key, endpoint: '192.0.2.9', port: 51820, persistentKeepalive: 25 },
      { publicKey: Buffer.alloc(32, 8), endpoint: '2001:db8::1', port: 51821 },
    ]);
    assert.equal(buf.length, 2 * WG_PEER_RECORD_SIZE);
    assert.deepEqual(buf.subarray(0, 32), key);
    assert.equal(buf[32], 4);
    assert.equal(buf.readUInt16BE(34), 51820);
    assert.equal(buf.readUInt16BE(36), 25);
    assert.deepEqual([...buf.subarray(48, 52)], [192, 0, 2, 9]);
    assert.ok(buf.subarray(52, 64).every((b) => b === 0));
    const b = buf.subarray(WG_PEER_RECORD_SIZE);
    assert.equal(b[32], 6);
    assert.equal(b.readUInt16BE(36), 0, 'keepalive off by default');
    assert.equal(b.subarray(48, 64).toString('hex'), '20010db8000000000000000000000001');
  });

  test('refuses a bad key, endpoint, port or keepalive, naming the peer and the rule', () => {
    const ok = { publicKey: key, endpoint: '192.0.2.9', port: 51820 };
    for (const [bad, rule] of [
      [{ ...ok, publicKey: Buffer.alloc(31) }, /peer 0: publicKey must be 32 bytes/],
      [{ ...ok, endpoint: 'node-a' }, /peer 0: endpoint node-a is not an IP address/],
      [{ ...ok, port: 0 }, /peer 0: port must be 1\.\.65535/],
      [{ ...ok, persistentKeepalive: 1.5 }, /peer 0: persistentKeepalive must be 0\.\.65535/],
    ] as const) {
      assert.throws(() => encodeWireguardPeers([bad]), rule);
    }
  });
});

describe('decodeWireguardPeers', () => {
  test('gives back what encodeWireguardPeers encoded (the fast-start record keeps peers so)', () => {
    const peers = [
      {
        publicKey: Buffer.alloc(32, 7),
        endpoint: '192.0.2.9',
        port: 51820,
        persistentKeepalive: 25,
      },
      {
        publicKey: Buffer.alloc(32, 8),
        endpoint: '2001:db8::1',
        port: 51821,
        persistentKeepalive: 0,
      },
    ];
    assert.deepEqual(decodeWireguardPeers(encodeWireguardPeers(peers)), peers);
  });
});
