/**
 * The Noise IKpsk2 handshake of native/src/wg_device.cc between two in-process devices on
 * manual clocks: message sizes and types, matching transport keys (data both ways), what fails
 * to authenticate (wrong static key, wrong PSK, mac1), the cookie path under load, and the
 * replay protection of initiations (TAI64N timestamp, flood limit).
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { describe, it } from 'node:test';
import {
  SECOND,
  SRC_A,
  SRC_B,
  WgDev,
  handshake,
  ipv4Packet,
  native,
  pair,
  trackedPairs,
} from '../helpers/wireguard.js';

const track = trackedPairs();

describe('WireGuard handshake', () => {
  it('initiation (148 B, type 1) → response (92 B, type 2) → keepalive (32 B, type 4)', () => {
    const { a, b } = track(pair({ psk: randomBytes(32) }));
    const init = a.initiate()!;
    assert.equal(init.length, 148);
    assert.equal(init.readUInt32LE(0), 1);
    assert.equal(a.peer().handshake, 'initiation_created');
    const resp = b.receive(init);
    assert.equal(resp.verdict, 'response');
    assert.equal(resp.peer, 0);
    assert.equal(resp.packet!.length, 92);
    assert.equal(resp.packet!.readUInt32LE(0), 2);
    // the response is addressed to the initiation's sender index
    assert.equal(resp.packet!.readUInt32LE(8), init.readUInt32LE(4));
    // the responder holds its key pair as "next" until the initiator's first packet confirms it
    assert.deepEqual([b.peer().next, b.peer().current], [true, false]);
    const done = a.receive(resp.packet!, SRC_B);
    assert.equal(done.verdict, 'handshake_done');
    assert.equal(done.packet!.length, 32);
    assert.equal(done.packet!.readUInt32LE(0), 4);
    assert.equal(done.packet!.readUInt32LE(4), resp.packet!.readUInt32LE(4));
    assert.deepEqual([a.peer().current, a.peer().currentInitiator], [true, true]);
    assert.equal(b.receive(done.packet!).verdict, 'keepalive');
    assert.deepEqual([b.peer().next, b.peer().current], [false, true]);
    assert.equal(a.peer().handshake, 'zeroed');
    assert.equal(b.peer().handshake, 'zeroed');
  });

  it('derives matching transport keys: IP packets round-trip both ways, padded to 16', () => {
    const { a, b } = track(pair());
    handshake(a, b);
    for (const size of [0, 1, 13, 100, 1372]) {
      const p = ipv4Packet(size, size & 0xff);
      const ab = a.send(p);
      assert.equal(ab.status, 'ok');
      const padded = Math.ceil(p.length / 16) * 16;
      assert.equal(ab.packet!.length, 16 + padded + 16);
      const got = b.receive(ab.packet!);
      assert.equal(got.verdict, 'data');
      assert.deepEqual(got.packet, p);
      const ba = b.send(p);
      assert.equal(ba.status, 'ok');
      assert.deepEqual(a.receive(ba.packet!, SRC_B).packet, p);
    }
  });

  it('roaming: the endpoint follows authenticated packets only', () => {
    const { a, b } = track(pair());
    assert.equal(b.peer().endpoint.length, 0);
    handshake(a, b); // b heard a from SRC_A
    assert.deepEqual(b.peer().endpoint, SRC_A);
    assert.deepEqual(a.peer().endpoint, SRC_B);
    const moved = Buffer.from([192, 0, 2, 7, 0x12, 0x34]);
    const forged = a.send(ipv4Packet(8)).packet!;
    forged[20] = forged[20]! ^ 1;
    assert.equal(b.receive(forged, moved).verdict, 'drop_forged');
    assert.deepEqual(b.peer().endpoint, SRC_A);
    assert.equal(b.receive(a.send(ipv4Packet(8)).packet!, moved).verdict, 'data');
    assert.deepEqual(b.peer().endpoint, moved);
  });

  it('a removed peer: its sessions and handshakes are gone', () => {
    const { a, b } = track(pair());
    handshake(a, b);
    const data = a.send(ipv4Packet(8)).packet!;
    assert.ok(native.wgDevice('removePeer', b.id, 0));
    assert.equal(native.wgDevice('peer', b.id, 0), null);
    assert.equal(b.receive(data).verdict, 'drop_index');
    a.advance(5 * SECOND);
    assert.equal(b.receive(a.initiate()!).verdict, 'drop_handshake');
  });

  it('the counter nonce counts up from 0 per key pair', () => {
    const { a, b } = track(pair());
    handshake(a, b);
    // the confirming keepalive used counter 0
    const counters = [1, 2, 3].map(() => a.send(ipv4Packet(8)).packet!.readBigUInt64LE(8));
    assert.deepEqual(counters, [1n, 2n, 3n]);
  });

  it('a responder that does not know the static key drops the initiation', () => {
    const a = new WgDev();
    const b = new WgDev();
    track({ a, b });
    a.addPeer(b.publicKey);
    b.addPeer(track(new WgDev()).publicKey);
    assert.equal(b.receive(a.initiate()!).verdict, 'drop_handshake');
  });

  it('an initiation for another responder fails mac1 there', () => {
    const { a } = track(pair());
    const c = track(new WgDev());
    c.addPeer(a.publicKey);
    assert.equal(c.receive(a.initiate()!).verdict, 'drop_mac1');
  });

  it('a wrong PSK: the responder answers, the initiator refuses the response', () => {
    const { a, b } = track(pair({ psk: randomBytes(32), pskB: randomBytes(32) }));
    const resp = b.receive(a.initiate()!);
    assert.equal(resp.verdict, 'response');
    assert.equal(a.receive(resp.packet!, SRC_B).verdict, 'drop_handshake');
    assert.equal(a.peer().current, false);
  });

  it('mac1 is always checked: a flipped bit anywhere before mac2 drops the message', () => {
    const { a, b } = track(pair());
    const init = a.initiate()!;
    for (const at of [4, 8, 40, 100, 116, 120, 131]) {
      const bad = Buffer.from(init);
      bad[at] = bad[at]! ^ 1;
      assert.equal(b.receive(bad).verdict, 'drop_mac1', `byte ${at}`);
    }
    // mac2 is not covered by mac1 and not checked when the responder is not under load
    const mac2 = Buffer.from(init);
    mac2[140] = mac2[140]! ^ 1;
    assert.equal(b.receive(mac2).verdict, 'response');
  });

  it('malformed: wrong sizes, a nonzero reserved byte, an unknown type', () => {
    const { a, b } = track(pair());
    const init = a.initiate()!;
    assert.equal(b.receive(init.subarray(0, 147)).verdict, 'drop_malformed');
    assert.equal(b.receive(Buffer.concat([init, Buffer.alloc(1)])).verdict, 'drop_malformed');
    const reserved = Buffer.from(init);
    reserved[1] = 1;
    assert.equal(b.receive(reserved).verdict, 'drop_malformed');
    const type9 = Buffer.from(init);
    type9[0] = 9;
    assert.equal(b.receive(type9).verdict, 'drop_malformed');
    assert.equal(b.receive(Buffer.alloc(3)).verdict, 'drop_malformed');
  });

  it('under load: a cookie reply first, then an initiation with mac2 from that source passes', () => {
    const { a, b } = track(pair());
    b.underLoad(true);
    const init = a.initiate()!;
    assert.equal(init.subarray(132).equals(Buffer.alloc(16)), true, 'no cookie yet: mac2 zero');
    const reply = b.receive(init, SRC_A);
    assert.equal(reply.verdict, 'cookie_reply');
    assert.equal(reply.packet!.length, 64);
    assert.equal(reply.packet!.readUInt32LE(0), 3);
    assert.equal(reply.packet!.readUInt32LE(4), init.readUInt32LE(4));
    assert.equal(b.peer().handshake, 'zeroed', 'nothing was processed');
    assert.equal(a.receive(reply.packet!, SRC_B).verdict, 'cookie_taken');
    a.advance(5 * SECOND); // REKEY_TIMEOUT between initiations
    b.advance(5 * SECOND);
    const init2 = a.initiate()!;
    assert.equal(init2.subarray(132).equals(Buffer.alloc(16)), false, 'mac2 set');
    // the cookie is bound to the source address it was made for
    assert.equal(b.receive(init2, SRC_B).verdict, 'cookie_reply');
    assert.equal(b.receive(init2, SRC_A).verdict, 'response');
  });

  it('under load, handshakes past 20/s (burst 5) from one address are dropped before any work', () => {
    const { a, b } = track(pair());
    b.underLoad(true);
    assert.equal(a.receive(b.receive(a.initiate()!).packet!, SRC_B).verdict, 'cookie_taken');
    a.advance(5 * SECOND);
    const init = a.initiate()!; // carries mac2 now
    // wireguard-go's bucket: a new address starts with 4 packet costs, each message takes one
    // while more than one is left; the same message again is a replay once it passes
    const verdicts = [1, 2, 3, 4, 5].map(() => b.receive(init, SRC_A).verdict);
    assert.deepEqual(verdicts, [
      'response',
      'drop_timestamp',
      'drop_timestamp',
      'drop_timestamp',
      'drop_ratelimit',
    ]);
    assert.equal(b.receive(init, SRC_A).verdict, 'drop_ratelimit');
    // tokens refill at one packet cost per 50 ms: 1 ns tips it over again
    b.advance(1);
    assert.equal(b.receive(init, SRC_A).verdict, 'drop_timestamp');
    assert.equal(b.receive(init, SRC_A).verdict, 'drop_ratelimit');
  });

  it('a cookie reply that does not open (forged, or for no message of ours) is dropped', () => {
    const { a, b } = track(pair());
    b.underLoad(true);
    const reply = b.receive(a.initiate()!, SRC_A).packet!;
    const forged = Buffer.from(reply);
    forged[40] = forged[40]! ^ 1;
    assert.equal(a.receive(forged, SRC_B).verdict, 'drop_cookie');
    const unknown = Buffer.from(reply);
    unknown.writeUInt32LE((unknown.readUInt32LE(4) ^ 1) >>> 0, 4);
    assert.equal(a.receive(unknown, SRC_B).verdict, 'drop_cookie');
  });

  it('the cookie expires after COOKIE_REFRESH_TIME (120 s): mac2 goes back to zero', () => {
    const { a, b } = track(pair());
    b.underLoad(true);
    assert.equal(a.receive(b.receive(a.initiate()!).packet!, SRC_B).verdict, 'cookie_taken');
    a.advance(120 * SECOND);
    const init = a.initiate()!;
    assert.equal(init.subarray(132).equals(Buffer.alloc(16)), true);
  });

  it('a replayed initiation (same timestamp) is dropped', () => {
    const { a, b } = track(pair());
    const init = a.initiate()!;
    assert.equal(b.receive(init).verdict, 'response');
    b.advance(SECOND);
    assert.equal(b.receive(init).verdict, 'drop_timestamp');
  });

  it('an older initiation after a newer one is dropped', () => {
    const { a, b } = track(pair());
    const older = a.initiate()!;
    a.advance(6 * SECOND);
    const newer = a.initiate()!;
    assert.equal(b.receive(newer).verdict, 'response');
    b.advance(SECOND);
    assert.equal(b.receive(older).verdict, 'drop_timestamp');
  });

  it('initiations faster than 50 a second from one peer are dropped (flood limit)', () => {
    const { a, b } = track(pair());
    const first = a.initiate()!;
    a.advance(6 * SECOND);
    const second = a.initiate()!;
    assert.equal(b.receive(first).verdict, 'response');
    b.advance(SECOND / 100);
    assert.equal(b.receive(second).verdict, 'drop_timestamp');
    b.advance(SECOND / 50);
    assert.equal(b.receive(second).verdict, 'response');
  });

  it('a second initiation within REKEY_TIMEOUT is not made', () => {
    const { a } = track(pair());
    assert.ok(a.initiate());
    a.advance(5 * SECOND - 1);
    assert.equal(a.initiate(), null);
    a.advance(1);
    assert.ok(a.initiate());
  });

  it('a responder waits REKEY_TIMEOUT after its response before it initiates itself', () => {
    const { a, b } = track(pair());
    assert.equal(b.receive(a.initiate()!).verdict, 'response');
    // unconfirmed ("next") keys cannot send: a handshake is wanted, but not yet allowed
    assert.equal(b.send(ipv4Packet(8)).status, 'expired');
    assert.deepEqual(b.tick(), ['send_initiation']);
    assert.equal(b.initiate(), null);
    b.advance(5 * SECOND);
    assert.deepEqual(b.tick(), ['send_initiation'], 'still wanted');
    assert.ok(b.initiate());
    assert.deepEqual(b.tick(), [], 'made');
  });

  // Both ends initiate at once (each greets a peer it has just learned). Each takes the other's
  // initiation, which replaces its own, and refuses the response to its own.
  function crossed(): { low: WgDev; high: WgDev; lowResp: Buffer; highResp: Buffer } {
    const { a, b } = track(pair());
    const [low, high] = Buffer.compare(a.publicKey, b.publicKey) < 0 ? [a, b] : [b, a];
    const lowInit = low.initiate()!;
    const highInit = high.initiate()!;
    const highResp = high.receive(lowInit).packet!; // high answers low's initiation
    const lowResp = low.receive(highInit).packet!; // low answers high's
    assert.equal(low.receive(highResp, SRC_B).verdict, 'drop_handshake', 'low: its own replaced');
    assert.equal(high.receive(lowResp).verdict, 'drop_handshake', 'high: its own replaced');
    return { low, high, lowResp, highResp };
  }

  it('crossed initiations: the lower key initiates again 50 ms after its first, and it completes', () => {
    const { low, high } = crossed();
    assert.deepEqual(low.tick(), ['send_initiation']);
    assert.equal(low.initiate(), null, 'not before 50 ms (the peer would drop it as a flood)');
    low.advance(SECOND / 20);
    high.advance(SECOND / 20);
    const again = low.initiate();
    assert.ok(again, 'made within REKEY_TIMEOUT of the last handshake message');
    const resp = high.receive(again);
    assert.equal(resp.verdict, 'response');
    const done = low.receive(resp.packet!, SRC_B);
    assert.equal(done.verdict, 'handshake_done');
    assert.equal(high.receive(done.packet!).verdict, 'keepalive');
    const p = ipv4Packet(40);
    assert.deepEqual(high.receive(low.send(p).packet!).packet, p);
    assert.deepEqual(low.receive(high.send(p).packet!, SRC_B).packet, p);
    assert.equal(low.initiate(), null, 'one initiation only: REKEY_TIMEOUT holds again');
  });

  it('crossed initiations: the higher key waits for REKEY_TIMEOUT, as WireGuard does', () => {
    const { high } = crossed();
    high.advance(SECOND / 20);
    assert.equal(high.initiate(), null);
  });

  it('an initiation taken while ours is outstanding but was dropped: the peer completes on our answer', () => {
    const { a, b } = track(pair());
    assert.ok(a.initiate()); // lost: b did not know a yet
    const resp = a.receive(b.initiate()!).packet!;
    const done = b.receive(resp, SRC_B);
    assert.equal(done.verdict, 'handshake_done');
    assert.equal(a.receive(done.packet!).verdict, 'keepalive');
  });

  it('a response to an initiation replaced by a newer one is dropped', () => {
    const { a, b } = track(pair());
    const first = a.initiate()!;
    const resp = b.receive(first).packet!;
    a.advance(5 * SECOND);
    a.initiate();
    assert.equal(a.receive(resp, SRC_B).verdict, 'drop_handshake');
  });
});
