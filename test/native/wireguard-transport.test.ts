/**
 * WireGuard transport in native/src/wg_session.cc and wg_device.cc: the replay window (RFC 6479
 * as the kernel and wireguard-go size it: 8192 bits, 8128 counters back), the message counter
 * limits, transport drops, and each peer's timers driven by the devices' manual clocks
 * (wireguard-go timers.go: retransmission with jitter, keepalive, new handshake, rekey/reject
 * after time, zeroing of key material, persistent keepalive).
 */
import assert from 'node:assert/strict';
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

const REKEY_AFTER_MESSAGES = 2n ** 60n;
const REJECT_AFTER_MESSAGES = 2n ** 64n - 2n ** 13n - 1n;
const WINDOW = 8192 - 64;
const JITTER_MAX = 334_000_000;

const track = trackedPairs();

describe('replay window', () => {
  it('accepts counters in order', () => {
    assert.deepEqual(native.wgReplay([0, 1, 2, 3, 4]), [true, true, true, true, true]);
  });

  it('accepts counters out of order within the window, each once', () => {
    assert.deepEqual(native.wgReplay([10, 5, 7, 6, 9, 8, 0]), Array(7).fill(true));
  });

  it('refuses a duplicate, newest or older', () => {
    assert.deepEqual(native.wgReplay([5, 5]), [true, false]);
    assert.deepEqual(native.wgReplay([5, 9, 5, 9]), [true, true, false, false]);
  });

  it(`accepts ${WINDOW} back from the newest, refuses one more`, () => {
    const top = 20_000;
    assert.deepEqual(native.wgReplay([top, top - WINDOW, top - WINDOW - 1]), [true, true, false]);
  });

  it('a jump far ahead forgets the old window (its counters are too old)', () => {
    assert.deepEqual(native.wgReplay([1, 2, 1_000_000, 2, 999_999]), [
      true,
      true,
      true,
      false,
      true,
    ]);
  });

  it('sliding forward clears the reused words: a counter 8192 later is fresh', () => {
    const c = [3, 3 + 64, 3 + 8192, 3 + 8192 + 64];
    assert.deepEqual(native.wgReplay(c), [true, true, true, true]);
  });

  it('refuses counters ≥ REJECT_AFTER_MESSAGES', () => {
    assert.deepEqual(native.wgReplay([REJECT_AFTER_MESSAGES - 1n, REJECT_AFTER_MESSAGES]), [
      true,
      false,
    ]);
    assert.deepEqual(native.wgReplay([2n ** 64n - 1n]), [false]);
  });
});

describe('transport messages', () => {
  it('a replayed, a forged, an unknown-index and a truncated data message are dropped', () => {
    const { a, b } = track(pair());
    handshake(a, b);
    const msg = a.send(ipv4Packet(40)).packet!;
    assert.equal(b.receive(msg).verdict, 'data');
    assert.equal(b.receive(msg).verdict, 'drop_replayed');
    const forged = a.send(ipv4Packet(40)).packet!;
    forged[30] = forged[30]! ^ 1;
    assert.equal(b.receive(forged).verdict, 'drop_forged');
    const unknown = a.send(ipv4Packet(40)).packet!;
    unknown.writeUInt32LE((unknown.readUInt32LE(4) ^ 0xffff) >>> 0, 4);
    assert.equal(b.receive(unknown).verdict, 'drop_index');
    assert.equal(b.receive(msg.subarray(0, 31)).verdict, 'drop_malformed');
  });

  it('a forged message does not burn its counter: the genuine one still passes', () => {
    const { a, b } = track(pair());
    handshake(a, b);
    const msg = a.send(ipv4Packet(40)).packet!;
    const forged = Buffer.from(msg);
    forged[20] = forged[20]! ^ 1;
    assert.equal(b.receive(forged).verdict, 'drop_forged');
    assert.equal(b.receive(msg).verdict, 'data');
  });

  it("opened outside the lock (the engine's halves): the same verdicts as one Receive", () => {
    const { a, b } = track(pair());
    handshake(a, b);
    const split = (m: Buffer, between: 'none' | 'expire' | 'twice' = 'none') =>
      native.wgDevice('receiveSplit', b.id, m, SRC_A, between);
    assert.deepEqual(split(a.send(ipv4Packet(40)).packet!), ['data']);
    const forged = a.send(ipv4Packet(40)).packet!;
    forged[30] = forged[30]! ^ 1;
    assert.deepEqual(split(forged), ['drop_forged']);
    const unknown = a.send(ipv4Packet(40)).packet!;
    unknown.writeUInt32LE((unknown.readUInt32LE(4) ^ 0xffff) >>> 0, 4);
    assert.deepEqual(split(unknown), ['drop_index']);
    assert.deepEqual(split(a.send(Buffer.alloc(0)).packet!), ['keepalive']);
  });

  it('two workers opening the same message: one delivers it, the other is a replay', () => {
    const { a, b } = track(pair());
    handshake(a, b);
    const msg = a.send(ipv4Packet(40)).packet!;
    assert.deepEqual(native.wgDevice('receiveSplit', b.id, msg, SRC_A, 'twice'), [
      'data',
      'drop_replayed',
    ]);
    assert.equal(b.receive(msg).verdict, 'drop_replayed');
  });

  it('a key pair that expires while a worker opens its message: dropped as expired', () => {
    const { a, b } = track(pair());
    handshake(a, b);
    const msg = a.send(ipv4Packet(40)).packet!;
    assert.deepEqual(native.wgDevice('receiveSplit', b.id, msg, SRC_A, 'expire'), ['drop_expired']);
    assert.equal(b.peer().current, false);
  });

  it('a decrypted payload that is not IP is dropped', () => {
    const { a, b } = track(pair());
    handshake(a, b);
    assert.equal(b.receive(a.send(Buffer.from('not an ip packet')).packet!).verdict, 'drop_not_ip');
  });

  it('sending at REJECT_AFTER_MESSAGES fails and asks for a handshake', () => {
    const { a, b } = track(pair());
    handshake(a, b);
    assert.ok(native.wgDevice('setSendCounter', a.id, 0, REJECT_AFTER_MESSAGES - 1n));
    assert.equal(a.send(ipv4Packet(8)).status, 'ok');
    assert.equal(a.send(ipv4Packet(8)).status, 'expired');
    assert.ok(a.tick().includes('send_initiation'));
  });

  it('past REKEY_AFTER_MESSAGES a send still goes and a handshake is wanted', () => {
    const { a, b } = track(pair());
    handshake(a, b);
    assert.deepEqual(a.tick(), []);
    native.wgDevice('setSendCounter', a.id, 0, REKEY_AFTER_MESSAGES + 1n);
    const sent = a.send(ipv4Packet(8));
    assert.equal(sent.status, 'ok');
    assert.equal(sent.packet!.readBigUInt64LE(8), REKEY_AFTER_MESSAGES + 1n);
    assert.ok(a.tick().includes('send_initiation'));
  });

  it('without a session a send fails (expired) and a handshake is wanted', () => {
    const { a } = track(pair());
    assert.equal(a.send(ipv4Packet(8)).status, 'expired');
    assert.deepEqual(a.tick(), ['send_initiation']);
  });
});

describe('timers (injected clock)', () => {
  it('the next deadline covers timers, a handshake waiting for REKEY_TIMEOUT and key expiry', () => {
    const { a, b } = track(pair());
    assert.equal(a.peer().nextDeadline, 0, 'nothing pending');
    const t0 = a.mono;
    const init = a.initiate()!;
    const retransmit = a.peer().nextDeadline;
    assert.ok(retransmit >= t0 + 5 * SECOND && retransmit < t0 + 5 * SECOND + JITTER_MAX);
    // the responder's unconfirmed key pair expires REJECT_AFTER_TIME after it was made, and a
    // handshake it wants waits REKEY_TIMEOUT after its response
    assert.equal(b.receive(init).verdict, 'response');
    assert.equal(b.peer().nextDeadline, b.mono + 180 * SECOND);
    assert.equal(b.send(ipv4Packet(8)).status, 'expired');
    assert.equal(b.peer().nextDeadline, b.mono + 5 * SECOND);
  });

  it('retransmits an unanswered initiation after REKEY_TIMEOUT + jitter (< 334 ms)', () => {
    const { a } = track(pair());
    const t0 = a.mono;
    a.initiate();
    a.at(t0 + 5 * SECOND - 1);
    assert.deepEqual(a.tick(), []);
    a.at(t0 + 5 * SECOND + JITTER_MAX);
    assert.deepEqual(a.tick(), ['send_initiation']);
    assert.equal(a.peer().attempts, 1);
  });

  it('gives up after MAX_TIMER_HANDSHAKES retransmissions; keys go 3 × REJECT_AFTER_TIME later', () => {
    const { a } = track(pair());
    a.initiate();
    let retransmissions = 0;
    for (;;) {
      a.advance(5 * SECOND + JITTER_MAX);
      const due = a.tick();
      if (due.includes('gave_up')) break;
      assert.deepEqual(due, ['send_initiation']);
      assert.ok(a.initiate(), 'the retransmission is made');
      retransmissions++;
      assert.ok(retransmissions < 100, 'never gave up');
    }
    // wireguard-go counts attempts 0..18 (REKEY_ATTEMPT_TIME / REKEY_TIMEOUT = 18) before it gives up
    assert.equal(retransmissions, 19);
    const gaveUp = a.mono;
    assert.equal(a.peer().nextDeadline, gaveUp + 540 * SECOND);
    a.at(gaveUp + 540 * SECOND);
    assert.deepEqual(a.tick(), ['zero_keys']);
    assert.equal(a.peer().handshake, 'zeroed');
    assert.equal(a.peer().indices, 0);
  });

  it('sends a keepalive KEEPALIVE_TIMEOUT after data received when it sent nothing', () => {
    const { a, b } = track(pair());
    handshake(a, b);
    assert.equal(b.receive(a.send(ipv4Packet(8)).packet!).verdict, 'data');
    b.advance(10 * SECOND - 1);
    assert.deepEqual(b.tick(), []);
    b.advance(1);
    assert.deepEqual(b.tick(), ['send_keepalive']);
  });

  it('no keepalive when it sent a packet itself in the meantime', () => {
    const { a, b } = track(pair());
    handshake(a, b);
    b.receive(a.send(ipv4Packet(8)).packet!);
    b.advance(SECOND);
    assert.equal(a.receive(b.send(ipv4Packet(8)).packet!, SRC_B).verdict, 'data');
    b.advance(10 * SECOND);
    assert.ok(!b.tick().includes('send_keepalive'));
  });

  it('a new handshake when data sent gets no answer for KEEPALIVE + REKEY_TIMEOUT', () => {
    const { a, b } = track(pair());
    handshake(a, b);
    const t = a.mono;
    a.send(ipv4Packet(8));
    a.at(t + 15 * SECOND - 1);
    assert.deepEqual(a.tick(), []);
    a.at(t + 15 * SECOND + JITTER_MAX);
    assert.deepEqual(a.tick(), ['send_initiation']);
  });

  it('an answer in time cancels that new handshake', () => {
    const { a, b } = track(pair());
    handshake(a, b);
    a.send(ipv4Packet(8));
    a.advance(SECOND);
    assert.equal(a.receive(b.send(ipv4Packet(8)).packet!, SRC_B).verdict, 'data');
    a.advance(20 * SECOND);
    assert.ok(!a.tick().includes('send_initiation'));
  });

  it('the initiator rekeys when sending after REKEY_AFTER_TIME; the responder does not', () => {
    const { a, b } = track(pair());
    handshake(a, b);
    a.advance(120 * SECOND + 1);
    b.advance(120 * SECOND + 1);
    assert.equal(a.send(ipv4Packet(8)).status, 'ok');
    assert.ok(a.tick().includes('send_initiation'));
    assert.equal(b.send(ipv4Packet(8)).status, 'ok');
    assert.ok(!b.tick().includes('send_initiation'));
  });

  it('the initiator rekeys when receiving in the key pair’s last minute', () => {
    const { a, b } = track(pair());
    handshake(a, b);
    a.advance((180 - 10 - 5) * SECOND + 1);
    assert.equal(a.receive(b.send(ipv4Packet(8)).packet!, SRC_B).verdict, 'data');
    assert.ok(a.tick().includes('send_initiation'));
  });

  it('at REJECT_AFTER_TIME the key pair neither sends nor receives, and is zeroed', () => {
    const { a, b } = track(pair());
    handshake(a, b);
    const late = b.send(ipv4Packet(8)).packet!;
    a.advance(180 * SECOND);
    b.advance(180 * SECOND);
    assert.equal(a.receive(late, SRC_B).verdict, 'drop_expired');
    assert.equal(a.send(ipv4Packet(8)).status, 'expired');
    assert.ok(a.tick().includes('send_initiation'));
    assert.equal(a.peer().current, false);
    b.tick();
    assert.equal(b.peer().current, false);
    assert.equal(b.peer().indices, 0);
  });

  it('zeroes all key material 3 × REJECT_AFTER_TIME after the last session', () => {
    const { a, b } = track(pair());
    handshake(a, b);
    const t = a.mono;
    a.at(t + 540 * SECOND - 1);
    assert.ok(!a.tick().includes('zero_keys'));
    a.at(t + 540 * SECOND);
    assert.ok(a.tick().includes('zero_keys'));
    assert.deepEqual([a.peer().previous, a.peer().current, a.peer().next], [false, false, false]);
  });

  it('a new session moves the old one to "previous"; both still decrypt', () => {
    const { a, b } = track(pair());
    handshake(a, b);
    const old = b.send(ipv4Packet(8)).packet!;
    a.advance(5 * SECOND);
    b.advance(5 * SECOND);
    handshake(a, b);
    assert.deepEqual([a.peer().previous, a.peer().current], [true, true]);
    assert.equal(a.receive(old, SRC_B).verdict, 'data');
    assert.equal(a.receive(b.send(ipv4Packet(8)).packet!, SRC_B).verdict, 'data');
  });

  it('persistent keepalive: every interval after the last packet either way', () => {
    const a = new WgDev();
    const b = new WgDev();
    track({ a, b });
    a.addPeer(b.publicKey, null, 25 * SECOND);
    b.addPeer(a.publicKey);
    handshake(a, b);
    a.advance(25 * SECOND - 1);
    assert.deepEqual(a.tick(), []);
    a.advance(1);
    assert.deepEqual(a.tick(), ['send_keepalive']);
    assert.equal(b.receive(a.send(Buffer.alloc(0)).packet!).verdict, 'keepalive');
    a.advance(25 * SECOND);
    assert.deepEqual(a.tick(), ['send_keepalive']);
  });
});
