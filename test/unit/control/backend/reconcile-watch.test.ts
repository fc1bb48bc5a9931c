/**
 * The Reconciler re-checks when the kernel reports a change to what it owns (the Netlink's
 * watch), not by re-reading every entry on a timer. FakeNetlink reports its changes on the next
 * turn, as the kernel's notifications arrive: `settle()` lets them in.
 */
import assert from 'node:assert/strict';
import { constants } from 'node:os';
import { afterEach, describe, test } from 'node:test';
import { parseCIDR } from '../../../../src/common/ip.js';
import { logger } from '../../../../src/common/log.js';
import {
  RESYNC_MS,
  type RecheckTrigger,
  Reconciler,
  WATCHED_RESYNC_MS,
} from '../../../../src/control/backend/reconcile.js';
import { planVxlan } from '../../../../src/control/backend/vxlan.js';
import { FakeNetlink } from '../../../../src/control/netlink/fake-netlink.js';
import type { Netlink, Op } from '../../../../src/control/netlink/netlink.js';
import { FAM, peerLease } from './fixtures.js';

const log = logger('test');
log.level = 'silent';

/** Lets the watch's reports (one turn later) arrive. */
const settle = () => new Promise((r) => setImmediate(() => setImmediate(r)));

/** What each test leaves running (stopped even when an assertion fails). */
const open: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  for (const stop of open.splice(0)) await stop();
});

const hex = (n: number) => n.toString(16).padStart(2, '0');

function setup(family: 4 | 6 = 4, o: { watchDevs?: string[]; noWatch?: boolean } = {}) {
  const F = FAM[family];
  const nl = new FakeNetlink();
  nl.addLink('eth0');
  nl.addLink(F.dev, { kind: 'vxlan' });
  if (o.watchDevs) for (const d of o.watchDevs) nl.addLink(d);
  const netlink: Netlink = o.noWatch ? Object.assign(nl, { watch: undefined }) : nl;
  const network = parseCIDR(family === 4 ? '10.0.0.0/8' : 'fc00::/16')!;
  const triggers: RecheckTrigger[] = [];
  let base = 0;
  let rechecked: (t: RecheckTrigger) => void = () => undefined;
  const rec = new Reconciler({
    netlink,
    log,
    ownership: [
      { family, routes: [{ dev: F.dev, within: network }], neighDev: F.dev, fdbDev: F.dev },
    ],
    recheckDelayMs: 0,
    ...(o.watchDevs ? { watchDevs: o.watchDevs } : {}),
    onRecheck: (t) => {
      triggers.push(t);
      rechecked(t);
    },
    ensureBase: async () => {
      base++;
      return 0;
    },
  });
  const ctx = { dev: F.dev, extDev: 'eth0', directRouting: false, extNets: [] };
  const peer = (i: number) =>
    peerLease(
      {
        publicIP: `192.168.0.${i}`,
        publicIPv6: `2001:db8::${i.toString(16)}`,
        backendData: { VNI: 1, VtepMAC: `aa:bb:cc:00:00:${hex(i)}` },
        backendV6Data: { VNI: 1, VtepMAC: `aa:bb:cc:00:00:${hex(i)}` },
      },
      { v4: `10.6.${i}.0/24`, v6: `fc00:0:${(i + 0x100).toString(16)}::/64` },
    );
  const add = (i: number) =>
    rec.update(`p${i}`, planVxlan({ type: 'added', lease: peer(i) }, family, ctx));
  const remove = (i: number) =>
    rec.update(`p${i}`, planVxlan({ type: 'removed', lease: peer(i) }, family, ctx));
  /** Runs the loop; `next()` resolves with the trigger of the next re-check it ends. */
  const start = () => {
    const stop = new AbortController();
    const running = rec.run(stop.signal);
    open.push(async () => {
      stop.abort();
      await running;
    });
    return {
      next: () => new Promise<RecheckTrigger>((r) => (rechecked = r)),
      async stop() {
        stop.abort();
        await running;
      },
    };
  };
  open.push(() => rec.close());
  const dst = (i: number) =>
    family === 4 ? `10.6.${i}.0/24` : `fc00:0:${(i + 0x100).toString(16)}::/64`;
  const gw = (i: number) => (family === 4 ? `10.6.${i}.0` : `fc00:0:${(i + 0x100).toString(16)}::`);
  return { F, nl, rec, add, remove, start, triggers, base: () => base, dst, gw };
}

describe('Reconciler: re-checks driven by kernel change notifications', () => {
  test('its own changes, adds and removals, call for no re-check', async () => {
    const { nl, rec, add, remove } = setup();
    for (let i = 1; i <= 50; i++) add(i);
    await rec.flush();
    for (let i = 1; i <= 25; i++) remove(i);
    await rec.flush();
    await settle();
    assert.ok(rec.watching);
    assert.equal(nl.routes.size, 25);
    assert.equal(rec.recheckWanted, null);
    rec.close();
  });

  for (const kind of ['route', 'neighbour', 'FDB entry'] as const) {
    test(`a ${kind} written long before, deleted by hand, is noticed (its writes mask nothing)`, async () => {
      const { nl, rec, add, dst, gw, F } = setup();
      for (let i = 1; i <= 5; i++) add(i);
      await rec.flush();
      await settle();
      assert.equal(rec.recheckWanted, null);
      nl.external([
        kind === 'route'
          ? { op: 'delRoute', dst: dst(3), dev: F.dev }
          : kind === 'neighbour'
            ? { op: 'delNeigh', dst: gw(3), dev: F.dev }
            : { op: 'delFdb', mac: 'aa:bb:cc:00:00:03', dst: '192.168.0.3', dev: F.dev },
      ]);
      await settle();
      assert.equal(rec.recheckWanted, 'change');
      rec.close();
    });
  }

  test('a removed peer’s neighbour written again by hand is stale: its entries are no longer wanted', async () => {
    const { nl, rec, add, remove, gw, F } = setup();
    for (let i = 1; i <= 3; i++) add(i);
    await rec.flush();
    remove(3);
    await rec.flush();
    await settle();
    assert.equal(rec.recheckWanted, null);
    nl.external([{ op: 'replaceNeigh', dst: gw(3), mac: 'aa:bb:cc:00:00:03', dev: F.dev }]);
    await settle();
    assert.equal(rec.recheckWanted, 'change');
    rec.close();
  });

  test('a peer planned again with the same entries still wants them', async () => {
    const { nl, rec, add, dst, F } = setup();
    add(1);
    add(1);
    await rec.flush();
    await settle();
    nl.external([{ op: 'delRoute', dst: dst(1), dev: F.dev }]);
    await settle();
    assert.equal(rec.recheckWanted, 'change');
    rec.close();
  });

  test('two peers wanting one route: the newest one’s is judged, and the older one’s once it leaves', async () => {
    const { nl, rec, F } = setup();
    const route = (gw: string): Op => ({
      op: 'replaceRoute',
      dst: '10.6.7.0/24',
      gw,
      dev: F.dev,
      onlink: true,
    });
    rec.update('a', [route('10.6.7.1')]);
    rec.update('b', [route('10.6.7.2')]);
    await rec.flush();
    await settle();
    nl.external([route('10.6.7.2')]); // as the newest wants it
    await settle();
    assert.equal(rec.recheckWanted, null);
    rec.update('b', []);
    await rec.flush();
    nl.external([route('10.6.7.1')]); // as the one left wants it
    await settle();
    assert.equal(rec.recheckWanted, null);
    nl.external([route('10.6.7.2')]); // as the one gone wanted it
    await settle();
    assert.equal(rec.recheckWanted, 'change');
    rec.close();
  });

  test('a route deleted by hand is restored by a re-check the change started', async () => {
    const { nl, rec, add, start, dst, F } = setup();
    add(1);
    add(2);
    await rec.flush();
    const loop = start();
    const next = loop.next();
    nl.external([{ op: 'delRoute', dst: dst(2), dev: F.dev }]);
    assert.equal(await next, 'change');
    assert.ok(nl.routes.has(`254|${dst(2)}`));
    await loop.stop();
  });

  for (const family of [4, 6] as const) {
    test(`IPv${family}: a permanent neighbour nobody wants, added by hand, is removed`, async () => {
      const { nl, rec, add, start, F } = setup(family);
      add(1);
      await rec.flush();
      const loop = start();
      const next = loop.next();
      const stray = family === 4 ? '10.6.99.0' : 'fc00:0:199::';
      nl.external([{ op: 'replaceNeigh', dst: stray, mac: 'aa:bb:cc:00:00:99', dev: F.dev }]);
      assert.equal(await next, 'change');
      assert.ok(!nl.neighs.has(`${F.dev}|${stray}`));
      assert.equal(nl.neighs.size, 1);
      await loop.stop();
    });
  }

  test('an FDB entry pointed elsewhere by hand is put back', async () => {
    const { nl, rec, add, start, F } = setup();
    add(1);
    await rec.flush();
    const loop = start();
    const next = loop.next();
    nl.external([
      { op: 'delFdb', mac: 'aa:bb:cc:00:00:01', dst: '192.168.0.1', dev: F.dev },
      { op: 'appendFdb', mac: 'aa:bb:cc:00:00:01', dst: '192.168.9.9', dev: F.dev },
    ]);
    assert.equal(await next, 'change');
    assert.deepEqual(
      [...nl.fdb.values()].map((f) => f.dst),
      ['192.168.0.1'],
    );
    await loop.stop();
  });

  test('changes outside what it owns call for no re-check', async () => {
    const { nl, rec, add, F } = setup();
    add(1);
    await rec.flush();
    nl.addLink('cni0');
    nl.external([
      { op: 'replaceRoute', dst: '192.168.50.0/24', gw: '192.168.0.254', dev: 'eth0' },
      { op: 'replaceRoute', dst: '10.244.0.0/24', dev: 'cni0' },
      { op: 'replaceNeigh', dst: '192.168.0.9', mac: '02:00:00:00:00:09', dev: 'eth0' },
      { op: 'setLink', dev: 'cni0', up: false },
      { op: 'replaceAddr', addr: '10.244.0.1/24', dev: 'cni0' },
    ]);
    // the kernel's own dynamic neighbours on the VXLAN device are not weft's either
    nl.notify([
      {
        kind: 'neigh',
        deleted: false,
        family: 4,
        dst: '10.6.77.0',
        dev: F.dev,
        mac: null,
        state: 0x20 /* NUD_FAILED */,
      },
    ]);
    await settle();
    assert.equal(rec.recheckWanted, null);
    rec.close();
  });

  test('its device announced up (carrier, operstate) or given an address calls for no re-check', async () => {
    const { nl, rec, add, F } = setup(6);
    add(1);
    await rec.flush();
    nl.notify([
      { kind: 'link', deleted: false, dev: F.dev, up: true },
      { kind: 'addr', deleted: false, family: 6, dev: F.dev },
    ]);
    await settle();
    assert.equal(rec.recheckWanted, null);
    nl.notify([{ kind: 'addr', deleted: true, family: 6, dev: F.dev }]);
    await settle();
    assert.equal(rec.recheckWanted, 'change', 'an address removed is');
    rec.close();
  });

  test('its device renamed (gone under its name) starts a re-check', async () => {
    const { nl, rec, add, F } = setup();
    add(1);
    await rec.flush();
    nl.notify([
      { kind: 'link', deleted: true, dev: F.dev, up: false },
      { kind: 'link', deleted: false, dev: 'renamed0', up: true },
    ]);
    await settle();
    assert.equal(rec.recheckWanted, 'change');
    rec.close();
  });

  test('its device set down starts a re-check, which re-checks the device first', async () => {
    const { nl, rec, add, start, base, F } = setup();
    add(1);
    await rec.flush();
    const loop = start();
    const next = loop.next();
    const before = base();
    nl.external([{ op: 'setLink', dev: F.dev, up: false }]);
    assert.equal(await next, 'change');
    assert.equal(base(), before + 1);
    await loop.stop();
  });

  test('a watched device’s own route deleted (the TUN’s cluster route) starts a re-check', async () => {
    const { nl, rec, start } = setup(4, { watchDevs: ['weft0'] });
    nl.external([{ op: 'replaceRoute', dst: '10.0.0.0/8', dev: 'weft0' }]);
    await rec.flush();
    await settle();
    assert.equal(rec.recheckWanted, null, 'a route added there is not a fault');
    const loop = start();
    const next = loop.next();
    nl.external([{ op: 'delRoute', dst: '10.0.0.0/8', dev: 'weft0' }]);
    assert.equal(await next, 'change');
    await loop.stop();
  });

  test('lost notifications (a socket overflow) start a full re-check', async () => {
    const { nl, rec, add, start } = setup();
    add(1);
    await rec.flush();
    const loop = start();
    const next = loop.next();
    nl.notify([], true);
    assert.equal(await next, 'overflow');
    await loop.stop();
  });

  test('with a watch the full re-check is a rare safety net; without one it runs every 10 s', async () => {
    const watched = setup();
    await watched.rec.flush();
    assert.equal(watched.rec.recheckEveryMs, WATCHED_RESYNC_MS);
    watched.rec.close();
    const plain = setup(4, { noWatch: true });
    await plain.rec.flush();
    assert.equal(plain.rec.watching, false);
    assert.equal(plain.rec.recheckEveryMs, RESYNC_MS);
  });

  test('a failed watch falls back to the periodic re-check, after one re-check at once', async () => {
    const { nl, rec, add, start } = setup();
    add(1);
    await rec.flush();
    const loop = start();
    const next = loop.next();
    nl.failWatch(new Error('netlink monitor: ENOMEM'));
    assert.equal(await next, 'overflow');
    assert.equal(rec.watching, false);
    assert.equal(rec.recheckEveryMs, RESYNC_MS);
    await loop.stop();
  });

  test('closing the loop closes the watch', async () => {
    const { nl, rec, start } = setup();
    await rec.flush();
    assert.equal(nl.watchers, 1);
    const loop = start();
    await loop.stop();
    assert.equal(nl.watchers, 0);
    assert.equal(rec.watching, false);
  });
});

describe('Reconciler: what only a re-check can fix keeps the short period', () => {
  test('a peer out of quick retries brings the 10 s re-check back until it is programmed', async () => {
    const nl = new FakeNetlink();
    nl.addLink('flannel.1', { kind: 'vxlan' });
    const rec = new Reconciler({
      netlink: nl,
      log,
      ownership: [{ family: 4, routes: [{ dev: 'flannel.1', within: parseCIDR('10.0.0.0/8')! }] }],
      retry: { initialMs: 1, maxMs: 1, attempts: 0 },
    });
    open.push(() => rec.close());
    nl.failWith((op) => op.op === 'replaceRoute', constants.errno.ENETUNREACH, 1);
    rec.update('p1', [{ op: 'replaceRoute', dst: '10.6.1.0/24', dev: 'flannel.1' }]);
    await rec.flush();
    assert.equal(nl.routes.size, 0);
    assert.equal(rec.recheckEveryMs, RESYNC_MS);
    await rec.resync();
    assert.equal(nl.routes.size, 1);
    assert.equal(rec.recheckEveryMs, WATCHED_RESYNC_MS);
  });

  test('a re-check that cannot restore the backend’s own state keeps the 10 s period', async () => {
    const nl = new FakeNetlink();
    nl.addLink('flannel.1', { kind: 'vxlan' });
    let broken = true;
    let ended: () => void = () => undefined;
    const rec = new Reconciler({
      netlink: nl,
      log,
      ownership: [{ family: 4, routes: [{ dev: 'flannel.1', within: parseCIDR('10.0.0.0/8')! }] }],
      recheckDelayMs: 0,
      onRecheck: () => ended(),
      ensureBase: async () => {
        if (broken) throw new Error('VNI 1 is held by another device');
        return 0;
      },
    });
    await rec.flush();
    const stop = new AbortController();
    const running = rec.run(stop.signal);
    open.push(async () => {
      stop.abort();
      await running;
    });
    let next = new Promise<void>((r) => (ended = r));
    nl.external([{ op: 'setLink', dev: 'flannel.1', up: false }]);
    await next;
    assert.equal(rec.recheckEveryMs, RESYNC_MS);
    broken = false;
    next = new Promise<void>((r) => (ended = r));
    nl.external([{ op: 'setLink', dev: 'flannel.1', up: true }]);
    await next;
    assert.equal(rec.recheckEveryMs, WATCHED_RESYNC_MS);
  });
});
