/** The daemon's peer-change log lines (peer-log.ts): one per change while slow, summed when fast. */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { pino } from 'pino';
import {
  LOG_EACH_PEER_UP_TO,
  PEER_LINES_PER_SECOND,
  logPeerEvents,
} from '../../../src/control/peer-log.js';
import { snapshotPart } from '../../../src/control/lease/snapshot-parts.js';
import type { LeaseEvent } from '../../../src/control/lease/types.js';
import { peerLease } from './backend/fixtures.js';

function capture() {
  const lines: Array<{ msg: string; added?: number; removed?: number; key?: string }> = [];
  const log = pino({}, { write: (l: string) => lines.push(JSON.parse(l)) });
  return { lines, log };
}

async function* feed(batches: LeaseEvent[][], clock: { t: number }, stepMs: number) {
  for (const b of batches) {
    yield b;
    clock.t += stepMs;
  }
}

const ev = (type: 'added' | 'removed'): LeaseEvent => ({ type, lease: peerLease() });

async function drain(it: AsyncIterable<LeaseEvent[]>): Promise<number> {
  let n = 0;
  for await (const b of it) n += b.length;
  return n;
}

test('slow changes: one line each', async () => {
  const { lines, log } = capture();
  const clock = { t: 0 };
  const batches = Array.from({ length: 10 }, () => [ev('added')]);
  assert.equal(await drain(logPeerEvents(feed(batches, clock, 200), log, () => clock.t)), 10);
  assert.equal(lines.filter((l) => l.msg === 'peer lease added').length, 10);
  assert.equal(lines.filter((l) => l.msg === 'peer leases changed').length, 0);
});

test('a fast churn: the per-second budget of lines, then one sum', async () => {
  const { lines, log } = capture();
  const clock = { t: 0 };
  // 200 changes within one second (5 ms apart)
  const batches = Array.from({ length: 200 }, (_, i) => [ev(i % 2 ? 'removed' : 'added')]);
  await drain(logPeerEvents(feed(batches, clock, 5), log, () => clock.t));
  const each = lines.filter((l) => l.msg === 'peer lease added' || l.msg === 'peer lease removed');
  assert.equal(each.length, PEER_LINES_PER_SECOND);
  const sums = lines.filter((l) => l.msg === 'peer leases changed');
  assert.equal(sums.length, 1);
  assert.equal(sums[0]!.added! + sums[0]!.removed!, 200 - PEER_LINES_PER_SECOND);
});

test('a snapshot larger than the per-change limit is one line at once', async () => {
  const { lines, log } = capture();
  const clock = { t: 0 };
  const big = Array.from({ length: LOG_EACH_PEER_UP_TO + 1 }, () => ev('added'));
  const it = logPeerEvents(feed([big], clock, 0), log, () => clock.t)[Symbol.asyncIterator]();
  await it.next();
  assert.deepEqual(
    lines.map((l) => [l.msg, l.added]),
    [['peer leases changed', LOG_EACH_PEER_UP_TO + 1]],
  );
  await it.return?.();
});

test('a snapshot in parts is one line, at its last part, however small the parts', async () => {
  const { lines, log } = capture();
  const clock = { t: 0 };
  const parts = [
    snapshotPart([ev('added'), ev('added')]),
    snapshotPart([ev('added')]),
    [ev('added')],
  ];
  const it = logPeerEvents(feed(parts, clock, 0), log, () => clock.t)[Symbol.asyncIterator]();
  await it.next();
  await it.next();
  assert.equal(lines.length, 0);
  await it.next();
  assert.deepEqual(
    lines.map((l) => [l.msg, l.added]),
    [['peer leases changed', 4]],
  );
  await it.return?.();
});
