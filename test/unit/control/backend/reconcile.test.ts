import assert from 'node:assert/strict';
import { constants } from 'node:os';
import { describe, test } from 'node:test';
import { parseCIDR } from '../../../../src/common/ip.js';
import { logger } from '../../../../src/common/log.js';
import {
  Reconciler,
  SNAPSHOT_CHUNK,
  runPlanned,
} from '../../../../src/control/backend/reconcile.js';
import { snapshotPart } from '../../../../src/control/lease/snapshot-parts.js';
import type { LeaseEvent } from '../../../../src/control/lease/types.js';
import { planVxlan } from '../../../../src/control/backend/vxlan.js';
import { FakeNetlink } from '../../../../src/control/netlink/fake-netlink.js';
import type { Op } from '../../../../src/control/netlink/netlink.js';
import { FAM, FAMILIES, peerLease } from './fixtures.js';

const log = logger('test');
log.level = 'silent';

for (const family of FAMILIES) {
  const F = FAM[family];
  const ctx = { dev: F.dev, extDev: 'eth0', directRouting: false, extNets: [] };
  /** Peer i: its own subnets, public addresses and VtepMACs. */
  const peer = (i: number) => {
    const hex = (n: number) => n.toString(16).padStart(2, '0');
    const mac = `aa:bb:cc:00:${hex(i >> 8)}:${hex(i & 255)}`;
    return peerLease(
      {
        publicIP: `192.168.${i >> 8}.${i & 255}`,
        publicIPv6: `2001:db8::${i.toString(16)}`,
        backendData: { VNI: 1, VtepMAC: mac },
        backendV6Data: { VNI: 1, VtepMAC: mac },
      },
      { v4: `10.${6 + (i >> 8)}.${i & 255}.0/24`, v6: `fc00:0:${(i + 0x100).toString(16)}::/64` },
    );
  };
  const setup = (opts: { retry?: { initialMs: number; maxMs: number; attempts: number } } = {}) => {
    const nl = new FakeNetlink();
    nl.addLink('eth0');
    nl.addLink(F.dev, { kind: 'vxlan' });
    const network = parseCIDR(family === 4 ? '10.0.0.0/8' : 'fc00::/16')!;
    const rec = new Reconciler({
      netlink: nl,
      log,
      ownership: [
        { family, routes: [{ dev: F.dev, within: network }], neighDev: F.dev, fdbDev: F.dev },
      ],
      ...(opts.retry ? { retry: opts.retry } : {}),
    });
    const add = (i: number) =>
      rec.update(`p${i}`, planVxlan({ type: 'added', lease: peer(i) }, family, ctx));
    return { nl, rec, add };
  };

  describe(`Reconciler, IPv${family}`, () => {
    test('a snapshot of 5,000 peers is applied in one batch', async () => {
      const { nl, rec, add } = setup();
      for (let i = 0; i < 5000; i++) add(i);
      await rec.flush();
      assert.equal(nl.calls.length, 1);
      assert.equal(nl.calls[0]!.length, 15_000);
      assert.equal(nl.routes.size, 5000);
      assert.equal(nl.neighs.size, 5000);
      assert.equal(nl.fdb.size, 5000);
    });

    test('a failing op rolls back the peer’s earlier ops and the peer is retried', async () => {
      const { nl, rec, add } = setup({ retry: { initialMs: 5, maxMs: 10, attempts: 3 } });
      nl.failWith((op) => op.op === 'replaceRoute', constants.errno.ENETUNREACH, 1);
      add(1);
      await rec.flush();
      // neigh and FDB went in, then were rolled back (route failed)
      assert.deepEqual(
        nl.calls[1]!.map((o) => o.op),
        ['delFdb', 'delNeigh'],
      );
      assert.equal(nl.neighs.size + nl.fdb.size + nl.routes.size, 0);
      await new Promise((r) => setTimeout(r, 50));
      await rec.flush();
      assert.equal(nl.neighs.size + nl.fdb.size + nl.routes.size, 3);
    });

    test('resync restores a deleted route, neighbour and FDB entry', async () => {
      const { nl, rec, add } = setup();
      add(1);
      add(2);
      await rec.flush();
      const before = { r: [...nl.routes.keys()], n: [...nl.neighs.keys()], f: [...nl.fdb.keys()] };
      nl.routes.delete(before.r[0]!);
      nl.neighs.delete(before.n[1]!);
      nl.fdb.delete(before.f[0]!);
      await rec.resync();
      assert.deepEqual([...nl.routes.keys()].sort(), before.r.sort());
      assert.deepEqual([...nl.neighs.keys()].sort(), before.n.sort());
      assert.deepEqual([...nl.fdb.keys()].sort(), before.f.sort());
    });

    test('resync removes owned entries nobody wants (an earlier run’s) and keeps the rest', async () => {
      const { nl, rec, add } = setup();
      // left from an earlier run: a peer that is gone
      await nl.apply(planVxlan({ type: 'added', lease: peer(9) }, family, ctx));
      // not ours: a route outside the owned scope
      const foreign: Op = {
        op: 'replaceRoute',
        dst: family === 4 ? '192.0.2.0/24' : '2001:db8:99::/64',
        dev: 'eth0',
      };
      await nl.apply([foreign]);
      add(1);
      await rec.flush();
      await rec.resync();
      assert.equal(nl.routes.size, 2); // peer 1 + foreign
      assert.equal(nl.neighs.size, 1);
      assert.equal(nl.fdb.size, 1);
      assert.ok([...nl.routes.values()].some((r) => r.dev === 'eth0'));
    });

    test('a peer whose VtepMAC changed loses its old FDB entry', async () => {
      const { nl, rec } = setup();
      rec.update('p', planVxlan({ type: 'added', lease: peerLease() }, family, ctx));
      await rec.flush();
      const newMac = { VNI: 1, VtepMAC: 'aa:bb:cc:00:00:09' };
      const changed = peerLease(family === 4 ? { backendData: newMac } : { backendV6Data: newMac });
      rec.update('p', planVxlan({ type: 'added', lease: changed }, family, ctx));
      await rec.flush();
      assert.deepEqual(
        [...nl.fdb.values()].map((f) => f.mac),
        ['aa:bb:cc:00:00:09'],
      );
      assert.deepEqual(
        [...nl.neighs.values()].map((n) => n.mac),
        ['aa:bb:cc:00:00:09'],
      );
    });

    test('a removed peer’s three entries are deleted', async () => {
      const { nl, rec, add } = setup();
      add(1);
      await rec.flush();
      rec.update('p1', planVxlan({ type: 'removed', lease: peer(1) }, family, ctx));
      await rec.flush();
      assert.equal(nl.routes.size + nl.neighs.size + nl.fdb.size, 0);
      assert.equal(rec.desiredCount(), 0);
    });
  });
}

describe('Reconciler, updates during a flush', () => {
  test('a peer updated while its removal is in flight keeps its new entries', async () => {
    const nl = new FakeNetlink();
    nl.addLink('flannel.1', { kind: 'vxlan' });
    const rec = new Reconciler({
      netlink: nl,
      log,
      ownership: [{ family: 4, routes: [{ dev: 'flannel.1', within: parseCIDR('10.0.0.0/8')! }] }],
    });
    const ctx = { dev: 'flannel.1', extDev: 'eth0', directRouting: false, extNets: [] };
    rec.update('p', planVxlan({ type: 'added', lease: peerLease() }, 4, ctx));
    await rec.flush();
    rec.update('p', planVxlan({ type: 'removed', lease: peerLease() }, 4, ctx));
    nl.latencyMs = 20;
    const removing = rec.flush();
    await new Promise((r) => setTimeout(r, 5)); // the removal batch is now in flight
    rec.update('p', planVxlan({ type: 'added', lease: peerLease() }, 4, ctx)); // back at once
    await removing;
    await rec.flush();
    assert.equal(rec.desiredCount(), 3);
    assert.equal(nl.routes.size + nl.neighs.size + nl.fdb.size, 3);
  });
});

/** A Reconciler owning flannel.1's routes (inside 10/8), neighbours and FDB entries. */
function flannel1Reconciler(onRepaired?: (n: number) => void) {
  const nl = new FakeNetlink();
  nl.addLink('flannel.1', { kind: 'vxlan' });
  const rec = new Reconciler({
    netlink: nl,
    log,
    ownership: [
      {
        family: 4,
        routes: [{ dev: 'flannel.1', within: parseCIDR('10.0.0.0/8')! }],
        neighDev: 'flannel.1',
        fdbDev: 'flannel.1',
      },
    ],
    ...(onRepaired ? { onRepaired } : {}),
  });
  return { nl, rec };
}

/** flannel.1's plan context, and peer i of a cluster on it (its own subnet, address and MAC). */
const FLANNEL1 = { dev: 'flannel.1', extDev: 'eth0', directRouting: false, extNets: [] };
const flannel1Peer = (i: number) =>
  peerLease(
    {
      publicIP: `192.168.${i >> 8}.${i & 255}`,
      backendData: {
        VNI: 1,
        VtepMAC: `aa:bb:cc:00:${(i >> 8).toString(16).padStart(2, '0')}:${(i & 255).toString(16).padStart(2, '0')}`,
      },
    },
    { v4: `10.${6 + (i >> 8)}.${i & 255}.0/24`, v6: `fc00:0:${(i + 0x100).toString(16)}::/64` },
  );

/** An event stream the test pushes batches into. */
function channel<T>() {
  const items: T[] = [];
  let wake: (() => void) | null = null;
  let ended = false;
  return {
    push(...batch: T[]) {
      items.push(...batch);
      wake?.();
    },
    end() {
      ended = true;
      wake?.();
    },
    async *[Symbol.asyncIterator](): AsyncGenerator<T> {
      for (;;) {
        while (items.length > 0) yield items.shift()!;
        if (ended) return;
        await new Promise<void>((r) => (wake = r));
        wake = null;
      }
    },
  };
}

describe('runPlanned: cost follows what changed', () => {
  const ctx = FLANNEL1;
  const lease = flannel1Peer;
  const setup = () => {
    const { nl, rec } = flannel1Reconciler();
    const planned: string[] = [];
    const events = channel<LeaseEvent[]>();
    const ac = new AbortController();
    const run = runPlanned(events, ac.signal, {
      reconciler: rec,
      families: [4],
      plan: (ev, family) => {
        planned.push(ev.lease.key);
        return planVxlan(ev, family, ctx);
      },
    });
    return { nl, rec, planned, events, ac, run };
  };

  test('separate event batches received together are applied in one kernel batch', async () => {
    const { nl, events, run } = setup();
    // 1,000 single-lease batches, as etcd delivers a burst of separate writes.
    for (let i = 0; i < 1000; i++) events.push([{ type: 'added', lease: lease(i) }]);
    events.end();
    await run;
    const applies = nl.calls.filter((c) => c.some((op) => op.op === 'replaceRoute'));
    assert.equal(applies.length, 1);
    assert.equal(applies[0]!.length, 3000);
    assert.equal(nl.routes.size, 1000);
  });

  test('an event about one peer plans and applies that peer only', async () => {
    const { nl, rec, planned, events, ac, run } = setup();
    events.push(
      Array.from({ length: 5000 }, (_, i) => ({ type: 'added' as const, lease: lease(i) })),
    );
    while (nl.routes.size < 5000) await new Promise((r) => setImmediate(r));
    while (rec.pendingCount() > 0) await new Promise((r) => setImmediate(r));
    planned.length = 0;
    const before = nl.calls.length;
    events.push([{ type: 'removed', lease: lease(42) }]);
    while (nl.routes.size > 4999) await new Promise((r) => setImmediate(r));
    assert.deepEqual(planned, [lease(42).key]);
    const batches = nl.calls.slice(before);
    assert.equal(batches.length, 1);
    assert.deepEqual(
      batches[0]!.map((op) => op.op),
      ['delRoute', 'delFdb', 'delNeigh'],
    );
    ac.abort();
    events.end();
    await run;
  });
});

/**
 * flannel1Reconciler after `before` (an earlier run's entries), every batch sent to the kernel
 * recorded with its ops and `at()` read when it was sent.
 */
async function recordingReconciler(
  before: (nl: FakeNetlink) => Promise<void>,
  at: () => number,
): Promise<{
  nl: FakeNetlink;
  rec: Reconciler;
  batches: Array<{ ops: readonly Op[]; at: number }>;
}> {
  const { nl, rec } = flannel1Reconciler();
  await before(nl);
  const batches: Array<{ ops: readonly Op[]; at: number }> = [];
  const apply = nl.apply.bind(nl);
  nl.apply = async (ops) => {
    batches.push({ ops, at: at() });
    return apply(ops);
  };
  return { nl, rec, batches };
}

describe('runPlanned: the snapshot goes to the kernel while it is planned', () => {
  const ctx = FLANNEL1;
  const lease = flannel1Peer;
  const snapshot = (n: number): LeaseEvent[] =>
    Array.from({ length: n }, (_, i) => ({ type: 'added' as const, lease: lease(i) }));
  /**
   * runPlanned over `n` leases; `before` runs first (an earlier run's entries). Each kernel
   * batch is recorded with how many events were planned when it was sent (`at`).
   */
  const start = async (n: number, before: (nl: FakeNetlink) => Promise<void> = async () => {}) => {
    let planned = 0;
    const { nl, rec, batches } = await recordingReconciler(before, () => planned);
    const events = channel<LeaseEvent[]>();
    events.push(snapshot(n));
    events.end();
    await runPlanned(events, new AbortController().signal, {
      reconciler: rec,
      families: [4],
      plan: (ev, family) => {
        planned++;
        return planVxlan(ev, family, ctx);
      },
    });
    return { nl, batches };
  };
  const isDel = (op: Op) => op.op.startsWith('del');

  test('the first chunk is sent as soon as it is planned, before the rest', async () => {
    const n = SNAPSHOT_CHUNK * 4;
    const { nl, batches } = await start(n);
    assert.equal(batches[0]!.at, SNAPSHOT_CHUNK);
    assert.equal(batches[0]!.ops.length, SNAPSHOT_CHUNK * 3); // neighbour, FDB entry, route
    assert.ok(batches.length > 1);
    assert.equal(nl.routes.size, n);
  });

  test('a restart deletes no entry a lease still wants, a later chunk’s included', async () => {
    const n = SNAPSHOT_CHUNK * 3;
    const { nl, batches } = await start(n, async (nl) => {
      // the earlier run's entries, the same leases'
      await nl.apply(snapshot(n).flatMap((ev) => planVxlan(ev, 4, ctx)));
    });
    assert.deepEqual(batches.flatMap((b) => b.ops).filter(isDel), []);
    assert.equal(nl.routes.size, n);
  });

  test('entries no lease wants (an earlier run’s) are deleted after the whole snapshot is in', async () => {
    const n = SNAPSHOT_CHUNK * 2;
    const gone = lease(n); // a lease that is no more
    const { nl, batches } = await start(n, async (nl) => {
      await nl.apply(planVxlan({ type: 'added', lease: gone }, 4, ctx));
    });
    const firstDel = batches.findIndex((b) => b.ops.some(isDel));
    assert.ok(firstDel > 0);
    // every lease's entries were sent before it
    assert.equal(batches.slice(0, firstDel).flatMap((b) => b.ops).length, n * 3);
    assert.deepEqual(batches[firstDel]!.ops.map((op) => op.op).sort(), [
      'delFdb',
      'delNeigh',
      'delRoute',
    ]);
    assert.equal(nl.routes.size, n);
  });
});

describe('runPlanned: a snapshot in parts (snapshot-parts.ts)', () => {
  const ctx = FLANNEL1;
  const lease = flannel1Peer;
  const events = (from: number, to: number): LeaseEvent[] =>
    Array.from({ length: to - from }, (_, i) => ({
      type: 'added' as const,
      lease: lease(from + i),
    }));
  /**
   * runPlanned over a snapshot of three parts of `size` leases (the last one ending it); `before`
   * runs first (an earlier run's entries). Each kernel batch is recorded with how many parts had
   * been taken from the stream when it was sent (`at`).
   */
  const start = async (
    size: number,
    before: (nl: FakeNetlink) => Promise<void> = async () => {},
  ) => {
    let taken = 0;
    const { nl, rec, batches } = await recordingReconciler(before, () => taken);
    async function* parts(): AsyncIterable<LeaseEvent[]> {
      for (const b of [
        snapshotPart(events(0, size)),
        snapshotPart(events(size, 2 * size)),
        events(2 * size, 3 * size),
      ]) {
        taken++;
        yield b;
      }
    }
    await runPlanned(parts(), new AbortController().signal, {
      reconciler: rec,
      families: [4],
      plan: (ev, family) => planVxlan(ev, family, ctx),
    });
    return { nl, batches };
  };
  const isDel = (op: Op) => op.op.startsWith('del');

  test('each part is sent to the kernel before the next part is taken', async () => {
    const { nl, batches } = await start(3);
    assert.deepEqual(
      batches.slice(0, 2).map((b) => [b.at, b.ops.length]),
      [
        [1, 9], // the first part's neighbours, FDB entries and routes
        [2, 9],
      ],
    );
    assert.equal(nl.routes.size, 9);
  });

  test('the first re-check deletes only after the last part: an entry it wants stays, one nobody wants goes', async () => {
    const gone = lease(100); // a lease that is no more
    const { nl, batches } = await start(3, async (nl) => {
      // the earlier run's entries: a lease of the last part's, and one that is gone
      await nl.apply(planVxlan({ type: 'added', lease: lease(8) }, 4, ctx));
      await nl.apply(planVxlan({ type: 'added', lease: gone }, 4, ctx));
    });
    const firstDel = batches.findIndex((b) => b.ops.some(isDel));
    assert.ok(firstDel > 0);
    assert.equal(batches[firstDel]!.at, 3);
    assert.equal(batches.slice(0, firstDel).flatMap((b) => b.ops).length, 9 * 3);
    assert.deepEqual(
      batches
        .flatMap((b) => b.ops)
        .filter(isDel)
        .map((op) => op.op)
        .sort(),
      ['delFdb', 'delNeigh', 'delRoute'],
    );
    assert.equal(nl.routes.size, 9);
  });
});

describe('Reconciler ensureBase (the backend device re-check)', () => {
  test('runs before the peers on every resync; its restored count is a repair; a throw stops the resync', async () => {
    const nl = new FakeNetlink();
    nl.addLink('eth0');
    const calls: string[] = [];
    const listRoutes = nl.listRoutes.bind(nl);
    nl.listRoutes = async (f) => {
      calls.push('listRoutes');
      return listRoutes(f);
    };
    let result: number | Error = 2;
    const repaired: number[] = [];
    const rec = new Reconciler({
      netlink: nl,
      log,
      ownership: [{ family: 4, routes: [{ dev: 'eth0', within: parseCIDR('10.0.0.0/8')! }] }],
      onRepaired: (n) => repaired.push(n),
      ensureBase: async () => {
        calls.push('base');
        if (result instanceof Error) throw result;
        return result;
      },
    });
    await rec.resync();
    assert.deepEqual(calls, ['base', 'listRoutes']);
    assert.deepEqual(repaired, [2]);
    result = new Error('EEXIST');
    calls.length = 0;
    await assert.rejects(rec.resync(), /EEXIST/);
    assert.deepEqual(calls, ['base'], 'no peer re-check without the device');
    result = 0;
    calls.length = 0;
    await rec.resync();
    assert.deepEqual(calls, ['base', 'listRoutes']);
    assert.deepEqual(repaired, [2], 'nothing restored: no repair counted');
  });
});

describe('Reconciler resync: the re-check does not hold up lease events', () => {
  const ctx = { dev: 'flannel.1', extDev: 'eth0', directRouting: false, extNets: [] };
  const lease = (i: number) =>
    peerLease(
      {
        publicIP: `192.168.0.${i}`,
        backendData: { VNI: 1, VtepMAC: `aa:bb:cc:00:00:${i.toString(16).padStart(2, '0')}` },
      },
      { v4: `10.6.${i}.0/24`, v6: `fc00:0:${(i + 0x100).toString(16)}::/64` },
    );

  test('events applied while a resync reads the kernel are neither repaired nor undone by it', async () => {
    const repaired: number[] = [];
    const { nl, rec } = flannel1Reconciler((n) => repaired.push(n));
    const plan = (i: number, type: 'added' | 'removed') =>
      rec.update(`p${i}`, planVxlan({ type, lease: lease(i) }, 4, ctx));
    for (let i = 0; i < 10; i++) plan(i, 'added');
    await rec.flush();
    // The resync's neighbour dump waits until the test lets it go.
    let entered!: () => void;
    const inDump = new Promise<void>((r) => (entered = r));
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    const listNeighs = nl.listNeighs.bind(nl);
    nl.listNeighs = async (family, dev) => {
      const out = await listNeighs(family, dev); // the dump is taken now ...
      entered();
      await gate; // ... and compared later
      return out;
    };
    const resync = rec.resync();
    await inDump;
    plan(10, 'added');
    plan(3, 'removed');
    const flushed = await Promise.race([
      rec.flush().then(() => 'flushed'),
      new Promise((r) => setTimeout(r, 10_000, 'held behind the resync')), // hang guard
    ]);
    assert.equal(flushed, 'flushed');
    assert.ok(nl.routes.has('254|10.6.10.0/24') && !nl.routes.has('254|10.6.3.0/24'));
    const applied = nl.calls.length;
    release();
    await resync;
    assert.deepEqual(repaired, [], 'nothing was missing or stale');
    assert.equal(nl.calls.length, applied, 'the resync applied nothing');
    assert.equal(nl.routes.size, 10);
  });

  test('an entry deleted behind its back is still restored', async () => {
    const nl = new FakeNetlink();
    nl.addLink('flannel.1', { kind: 'vxlan' });
    const repaired: number[] = [];
    const rec = new Reconciler({
      netlink: nl,
      log,
      ownership: [{ family: 4, routes: [{ dev: 'flannel.1', within: parseCIDR('10.0.0.0/8')! }] }],
      onRepaired: (n) => repaired.push(n),
    });
    for (let i = 0; i < 5; i++)
      rec.update(`p${i}`, planVxlan({ type: 'added', lease: lease(i) }, 4, ctx));
    await rec.flush();
    nl.routes.delete('254|10.6.2.0/24');
    await rec.resync();
    assert.deepEqual(repaired, [1]);
    assert.ok(nl.routes.has('254|10.6.2.0/24'));
  });
});
