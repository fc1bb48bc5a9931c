/**
 * pingGaps reads `ping -D` output: the blackout is the largest gap between replies with a ping
 * lost inside it; a gap with every ping answered is the pinger stalling, not the path.
 * parsePing reads `ping -n` output into the bench's figures (average, median, p99); poolPings
 * joins several runs to one destination (the bench pings every path in turns) into one set.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { parsePing, pingGaps, poolPings } from '../../../src/testbed/probes.js';

/** A `ping -D` reply line at `t` seconds after an epoch second. */
const reply = (t: number, seq: number) =>
  `[${(1_700_000_000 + t).toFixed(6)}] 64 bytes from 10.5.1.2: icmp_seq=${seq} ttl=62 time=0.31 ms`;
const unreach = (t: number, seq: number) =>
  `[${(1_700_000_000 + t).toFixed(6)}] From 10.5.1.1 icmp_seq=${seq} Destination Net Unreachable`;
const T0 = 1_700_000_000_000;

test('the blackout is the largest gap between replies with pings lost inside it', () => {
  const out = [
    'PING 10.5.1.2 (10.5.1.2) 56(84) bytes of data.',
    reply(0.0, 1),
    reply(0.01, 2),
    unreach(0.02, 3),
    // seqs 3..40 lost: 0.01 s → 0.4 s
    reply(0.4, 41),
    reply(0.41, 42),
    '',
    '--- 10.5.1.2 ping statistics ---',
    '42 packets transmitted, 4 received, +1 errors, 90.4762% packet loss, time 410ms',
  ].join('\n');
  const g = pingGaps(out);
  assert.equal(Math.round(g.blackoutMs), 390);
  assert.equal(Math.round(g.maxGapMs), 390);
  assert.deepEqual([g.replies, g.unreachable, g.sent], [4, 1, 42]);
});

test('a gap with every ping answered is a stalled pinger: not a blackout', () => {
  const out = [reply(0, 1), reply(0.01, 2), reply(2.5, 3), reply(2.51, 4), reply(2.6, 6)].join(
    '\n',
  );
  const g = pingGaps(out);
  assert.equal(Math.round(g.maxGapMs), 2490);
  assert.equal(Math.round(g.blackoutMs), 90, 'only the gap over the lost seq 5');
  assert.equal(g.sent, 6, 'no summary: the highest icmp_seq');
});

test('the window bounds it: pings lost at the end, or no reply at all', () => {
  const out = [reply(0, 1), reply(0.01, 2)].join('\n');
  // 100 pings sent, the last 98 never answered until the window closed at 3 s
  const g = pingGaps(`${out}\n100 packets transmitted, 2 received, 98% packet loss`, {
    endMs: T0 + 3000,
  });
  assert.equal(Math.round(g.blackoutMs), 2990);
  const none = pingGaps('5 packets transmitted, 0 received, 100% packet loss', {
    startMs: T0,
    endMs: T0 + 1500,
  });
  assert.deepEqual([none.blackoutMs, none.replies, none.sent], [1500, 0, 5]);
});

/** `ping -n` output with these reply times, of `sent` pings. */
const pingOut = (times: number[], sent = times.length) =>
  [
    'PING 10.5.1.2 (10.5.1.2) 56(84) bytes of data.',
    ...times.map((t, i) => `64 bytes from 10.5.1.2: icmp_seq=${i + 1} ttl=62 time=${t} ms`),
    '',
    '--- 10.5.1.2 ping statistics ---',
    `${sent} packets transmitted, ${times.length} received`,
  ].join('\n');

test('parsePing: a few stalled replies move the average, not the median', () => {
  const p = parsePing(pingOut([0.3, 0.31, 0.29, 0.3, 0.32, 0.3, 0.28, 0.31, 0.3, 3.5], 11), 11);
  assert.deepEqual([p.sent, p.received], [11, 10]);
  assert.equal(p.avgMs!.toFixed(3), '0.621');
  assert.equal(p.p50Ms, 0.3); // nearest rank: the 5th of 10
  assert.equal(p.p99Ms, 3.5);
});

test('parsePing: no reply gives no figures', () => {
  const p = parsePing('3 packets transmitted, 0 received, 100% packet loss, time 2040ms', 3);
  assert.deepEqual(p, {
    sent: 3,
    received: 0,
    rttsMs: [],
    avgMs: null,
    p50Ms: null,
    p99Ms: null,
  });
});

test("poolPings: the figures of all the runs' replies together, not an average of averages", () => {
  const fast = parsePing(pingOut([0.1, 0.1, 0.1, 0.1]), 4);
  const slow = parsePing(pingOut([0.5, 0.9], 3), 3);
  const p = poolPings([fast, slow]);
  assert.deepEqual([p.sent, p.received], [7, 6]);
  assert.deepEqual(p.rttsMs, [0.1, 0.1, 0.1, 0.1, 0.5, 0.9]);
  assert.equal(p.avgMs!.toFixed(3), '0.300'); // (0.4 + 1.4) / 6; the runs' averages give 0.4
  assert.equal(p.p50Ms, 0.1); // nearest rank: the 3rd of 6
  assert.equal(p.p99Ms, 0.9);
});

test('poolPings: runs without a reply count as sent', () => {
  const none = parsePing('5 packets transmitted, 0 received', 5);
  const p = poolPings([none, parsePing(pingOut([0.2]), 1)]);
  assert.deepEqual([p.sent, p.received, p.avgMs], [6, 1, 0.2]);
});
