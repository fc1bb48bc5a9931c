/**
 * How the userspace backends hand the peer table to their dataplane (userspace.ts run): the
 * store's first snapshot whole, then per flush window only what changed (a PeerDelta), and the
 * whole table again when the dataplane refuses a delta. The dataplane is a fake taken over
 * through the fast-start hand-off (ctx.early), the netlink a FakeNetlink holding the TUN.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { WeftError } from '../../../../src/common/errors.js';
import { type Family, parseIP } from '../../../../src/common/ip.js';
import { createUserspaceBackend } from '../../../../src/control/backend/userspace.js';
import type { EarlyDataplane } from '../../../../src/control/backend/fast-start.js';
import type { Lease, LeaseEvent } from '../../../../src/control/lease/types.js';
import { FakeNetlink } from '../../../../src/control/netlink/fake-netlink.js';
import type { Dataplane, DataplaneOptions } from '../../../../src/dataplane/engine.js';
import {
  PEER_RECORD_SIZE,
  type PeerDelta,
  type PeerEntry,
  applyPeerDelta,
  encodePeerTable,
} from '../../../../src/dataplane/peer-table.js';
import { decodeCounters } from '../../../../src/dataplane/stats.js';
import { backendContext, ownLease, peerLease } from './fixtures.js';

const TUN = 'flannel0';

/** A dataplane that keeps the table it was given and says how it was given. */
function fakeDataplane() {
  const dp = {
    calls: [] as string[],
    table: Buffer.alloc(0) as Buffer,
    refuseNext: false,
    engine: 'native' as const,
    tunName: TUN,
    failed: new Promise<WeftError>(() => undefined),
    setPeers() {
      throw new Error('the backend hands over encoded records');
    },
    setPeerTable(t: Buffer) {
      dp.calls.push(`whole ${t.length / PEER_RECORD_SIZE}`);
      dp.table = Buffer.from(t);
    },
    updatePeerTable(d: PeerDelta) {
      if (dp.refuseNext) {
        dp.refuseNext = false;
        dp.calls.push('refused');
        throw new WeftError(
          'WEFT_ERR_DATAPLANE',
          'removed: peer record 0: subnet not in the table',
        );
      }
      dp.calls.push(
        `delta -${d.removed.length / PEER_RECORD_SIZE} +${d.upserts.length / PEER_RECORD_SIZE}`,
      );
      dp.table = applyPeerDelta(dp.table, d);
    },
    stats: () => decodeCounters('native', []),
    async close() {},
  } satisfies Dataplane & Record<string, unknown>;
  return dp;
}

/**
 * Lease events the test pushes; the backend reads them as its store stream (which, as a store's
 * does, ends a pending read when the reader returns).
 */
function eventStream() {
  const queue: LeaseEvent[][] = [];
  let wake: ((r: IteratorResult<LeaseEvent[]>) => void) | null = null;
  const iterator: AsyncIterator<LeaseEvent[]> = {
    next: () =>
      queue.length > 0
        ? Promise.resolve({ done: false, value: queue.shift()! })
        : new Promise((r) => (wake = r)),
    return: async () => {
      wake?.({ done: true, value: undefined });
      return { done: true, value: undefined };
    },
  };
  return {
    push(batch: LeaseEvent[]) {
      if (!wake) return void queue.push(batch);
      const w = wake;
      wake = null;
      w({ done: false, value: batch });
    },
    [Symbol.asyncIterator]: () => iterator,
  };
}

const lease = (i: number): Lease =>
  peerLease(
    { publicIP: `192.168.1.${100 + i}`, publicIPv6: `2001:db8:1::${(100 + i).toString(16)}` },
    { v4: `10.5.${100 + i}.0/24`, v6: `fc00:0:0:${(100 + i).toString(16)}::/64` },
  );
const added = (...ls: Lease[]): LeaseEvent[] => ls.map((l) => ({ type: 'added', lease: l }));
const removed = (...ls: Lease[]): LeaseEvent[] => ls.map((l) => ({ type: 'removed', lease: l }));

/** The record the spec makes for a lease and family (the udp backend's, without checks). */
const entry = (l: Lease, family: Family, pub: string): PeerEntry => ({
  subnet: family === 4 ? l.subnet! : l.ipv6Subnet!,
  publicIP: parseIP(pub)!,
  port: 8285,
  vtepMac: null,
});

/** A table's records, sorted (tables with the same records compare equal). */
function sortedRecords(table: Buffer): string[] {
  const out: string[] = [];
  for (let o = 0; o < table.length; o += PEER_RECORD_SIZE)
    out.push(table.subarray(o, o + PEER_RECORD_SIZE).toString('hex'));
  return out.sort();
}

/** The records of these leases, both families, over the IPv4 underlay. */
const expected = (...ls: Lease[]) =>
  sortedRecords(
    encodePeerTable(
      ls.flatMap((l) => ([4, 6] as const).map((f) => entry(l, f, l.attrs.publicIP!))),
    ),
  );

async function started() {
  const dp = fakeDataplane();
  const nl = new FakeNetlink();
  nl.addLink(TUN, { kind: 'tun' });
  const early: EarlyDataplane = {
    options: {} as EarlyDataplane['options'],
    peerCount: 0,
    forBackend: async () => early,
    claim: async (_o: DataplaneOptions) => dp,
    release: async () => undefined,
  };
  const ctx = backendContext({ Type: 'udp' }, { early });
  const b = createUserspaceBackend(
    ctx,
    {
      type: 'udp',
      format: 'udp',
      tunName: TUN,
      port: 8285,
      overhead: 28,
      vni: 0,
      vtepMac: null,
      attrs: { backendType: '' },
      peerFor: entry,
    },
    { openNetlink: () => nl },
  );
  await b.prepare();
  await b.start(ownLease());
  const events = eventStream();
  const stop = new AbortController();
  const running = b.run(events, stop.signal);
  /** Resolves once the dataplane has had `n` calls (the flush window is a timer). */
  const calls = async (n: number) => {
    while (dp.calls.length < n) await new Promise((r) => setTimeout(r, 1));
    return dp.calls;
  };
  const end = async () => {
    stop.abort();
    await running;
    await b.close();
  };
  return { dp, events, calls, end, metrics: ctx.metrics };
}

describe('userspace backend: peer table handover', () => {
  test('the first snapshot goes whole, each later flush only what changed', async () => {
    const { dp, events, calls, end } = await started();
    try {
      events.push(added(lease(1), lease(2)));
      assert.deepEqual(await calls(1), ['whole 4']);
      events.push(removed(lease(1)));
      assert.deepEqual(await calls(2), ['whole 4', 'delta -2 +0']);
      events.push(added(lease(3)));
      assert.deepEqual(await calls(3), ['whole 4', 'delta -2 +0', 'delta -0 +2']);
      assert.deepEqual(sortedRecords(dp.table), expected(lease(2), lease(3)));
    } finally {
      await end();
    }
  });

  test('each lease event is timed to its hand-over to the engine', async () => {
    const { events, calls, end, metrics } = await started();
    const count = async () => {
      const m = await metrics.getSingleMetric('weft_backend_peer_programmed_seconds')!.get();
      const c = m.values.find(
        (v) =>
          (v as { metricName?: string }).metricName?.endsWith('_count') &&
          v.labels.target === 'engine',
      );
      return c?.value;
    };
    try {
      assert.equal(await count(), 0, 'exported at 0 before any event');
      events.push(added(lease(1), lease(2)));
      await calls(1);
      assert.equal(await count(), 2);
      events.push(removed(lease(1)));
      await calls(2);
      assert.equal(await count(), 3);
    } finally {
      await end();
    }
  });

  test('a delta the dataplane refuses: the whole table goes instead', async () => {
    const { dp, events, calls, end } = await started();
    try {
      events.push(added(lease(1)));
      await calls(1);
      dp.refuseNext = true;
      events.push(added(lease(2)));
      assert.deepEqual(await calls(3), ['whole 2', 'refused', 'whole 4']);
      events.push(removed(lease(2)));
      assert.deepEqual((await calls(4)).at(-1), 'delta -2 +0', 'deltas again after it');
      assert.deepEqual(sortedRecords(dp.table), expected(lease(1)));
    } finally {
      await end();
    }
  });
});
