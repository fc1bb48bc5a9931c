/** Peer lease checks (backend/peer-check.ts), one table for the rules and the stream around it. */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { Registry } from '../../../../src/common/metrics.js';
import { logger } from '../../../../src/common/log.js';
import {
  type PeerCheckConfig,
  PeerChecker,
  byAge,
  checkPeers,
  checkedPeerEvents,
  peerCheckConfig,
} from '../../../../src/control/backend/peer-check.js';
import { parseNetConfig } from '../../../../src/control/config/net-config.js';
import { continuesSnapshot, snapshotPart } from '../../../../src/control/lease/snapshot-parts.js';
import type { Lease, LeaseAttrs, LeaseEvent } from '../../../../src/control/lease/types.js';
import { ownLease, peerLease } from './fixtures.js';

const log = logger('test');
log.level = 'silent';

function config(backend: Record<string, unknown> = { Type: 'vxlan' }): PeerCheckConfig {
  const netConfig = parseNetConfig(
    JSON.stringify({
      Network: '10.5.0.0/16',
      EnableIPv6: true,
      IPv6Network: 'fc00::/48',
      Backend: backend,
    }),
  );
  return peerCheckConfig(netConfig, ownLease());
}

let n = 0;
/** A dual-stack vxlan peer with its own MAC pair unless `over` says otherwise. */
function peer(v4: string, over: Partial<LeaseAttrs> = {}, v6?: string): Lease {
  n++;
  const hex = `${((n >> 8) & 255).toString(16).padStart(2, '0')}:${(n & 255).toString(16).padStart(2, '0')}`;
  return peerLease(
    {
      backendData: { VNI: 1, VtepMAC: `0a:00:00:04:${hex}` },
      backendV6Data: { VNI: 1, VtepMAC: `0a:00:00:06:${hex}` },
      ...over,
    },
    { v4, v6: v6 ?? `fc00:0:0:${(0x100 + n).toString(16)}::/64` },
  );
}

const OWN_MAC = 'aa:bb:cc:dd:ee:01'; // ownLease()'s BackendData VtepMAC

describe('checkPeers: one rule per row', () => {
  const rows: Array<{
    name: string;
    leases: () => Lease[];
    backend?: Record<string, unknown>;
    accepted: number[];
    rejected: Array<[number, string]>;
  }> = [
    {
      name: 'good peers pass',
      leases: () => [peer('10.5.2.0/24'), peer('10.5.3.0/24')],
      accepted: [0, 1],
      rejected: [],
    },
    {
      name: 'a subnet outside the cluster network',
      leases: () => [peer('10.6.2.0/24'), peer('10.5.3.0/24')],
      accepted: [1],
      rejected: [[0, 'outside_network']],
    },
    {
      name: 'an IPv6 subnet outside the IPv6 network',
      leases: () => [peer('10.5.2.0/24', {}, 'fd99::/64')],
      accepted: [],
      rejected: [[0, 'outside_network']],
    },
    {
      name: 'a subnet overlapping ours (wider than ours)',
      leases: () => [peer('10.5.0.0/20')],
      accepted: [],
      rejected: [[0, 'overlaps_own']],
    },
    {
      name: 'our own subnet under another key',
      leases: () => [peer('10.5.1.0/25')],
      accepted: [],
      rejected: [[0, 'overlaps_own']],
    },
    {
      name: 'a wrong VNI',
      leases: () => [
        peer('10.5.2.0/24', { backendData: { VNI: 2, VtepMAC: '0a:00:00:00:00:99' } }),
      ],
      accepted: [],
      rejected: [[0, 'backend_data']],
    },
    {
      name: 'an unusable VtepMAC',
      leases: () => [peer('10.5.2.0/24', { backendData: { VNI: 1, VtepMAC: 'nope' } })],
      accepted: [],
      rejected: [[0, 'backend_data']],
    },
    {
      name: 'a multicast or all-zero VtepMAC',
      leases: () => [
        peer('10.5.2.0/24', { backendData: { VNI: 1, VtepMAC: '01:00:5e:00:00:01' } }),
        peer('10.5.3.0/24', { backendData: { VNI: 1, VtepMAC: '00:00:00:00:00:00' } }),
      ],
      accepted: [],
      rejected: [
        [0, 'backend_data'],
        [1, 'backend_data'],
      ],
    },
    {
      name: 'a VtepMAC equal to ours',
      leases: () => [peer('10.5.2.0/24', { backendData: { VNI: 1, VtepMAC: OWN_MAC } })],
      accepted: [],
      rejected: [[0, 'vtep_mac']],
    },
    {
      name: "a VtepMAC equal to an older peer's: the newer is skipped",
      leases: () => {
        const a = peer('10.5.2.0/24');
        return [a, peer('10.5.3.0/24', { backendData: a.attrs.backendData })];
      },
      accepted: [0],
      rejected: [[1, 'vtep_mac']],
    },
    {
      name: 'two peers overlapping: the older wins',
      leases: () => [peer('10.5.2.0/24'), peer('10.5.2.0/23'), peer('10.5.4.0/24')],
      accepted: [0, 2],
      rejected: [[1, 'overlaps_peer']],
    },
    {
      name: 'overlap found on either side of the sorted spans',
      leases: () => [
        peer('10.5.8.0/22'),
        peer('10.5.9.0/24'),
        peer('10.5.4.0/22'),
        peer('10.5.7.128/25'),
      ],
      accepted: [0, 2],
      rejected: [
        [1, 'overlaps_peer'],
        [3, 'overlaps_peer'],
      ],
    },
    {
      name: 'host-gw: vxlan data is not looked at, the subnets are',
      backend: { Type: 'host-gw' },
      leases: () => [
        peer('10.5.2.0/24', { backendType: 'host-gw', backendData: undefined }),
        peer('10.5.3.0/24', { backendData: { VNI: 9, VtepMAC: OWN_MAC } }),
        peer('10.5.2.0/24'),
      ],
      accepted: [0, 1],
      rejected: [[2, 'overlaps_peer']],
    },
  ];
  for (const row of rows) {
    test(row.name, () => {
      const leases = row.leases();
      const r = checkPeers(leases, config(row.backend));
      assert.deepEqual(
        r.accepted.map((l) => leases.indexOf(l)),
        row.accepted,
      );
      assert.deepEqual(
        r.rejected.map((x) => [leases.indexOf(x.lease), x.reason]),
        row.rejected,
      );
    });
  }

  test('a rejection names the lease it clashes with', () => {
    const a = peer('10.5.2.0/24');
    const b = peer('10.5.2.0/24');
    const r = checkPeers([a, b], config());
    assert.equal(r.rejected[0]!.other, a);
    assert.match(r.rejected[0]!.detail, /10\.5\.2\.0\/24 overlaps an older peer's/);
  });

  test('byAge: reservations first, then the earliest written, then key order', () => {
    const at = (l: Lease, ms: number | null): Lease => ({
      ...l,
      expiration: ms === null ? null : new Date(ms),
    });
    const a = at(peer('10.5.2.0/24'), 2000);
    const b = at(peer('10.5.3.0/24'), 1000);
    const c = at(peer('10.5.4.0/24'), null);
    assert.deepEqual(byAge([a, b, c]), [c, b, a]);
  });
});

/** A small deterministic PRNG (mulberry32): the same sequence on every run. */
function rng(seed: number): () => number {
  let a = seed;
  return () => {
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

async function* feed(batches: LeaseEvent[][]): AsyncIterable<LeaseEvent[]> {
  for (const b of batches) yield b;
}

async function collect(
  batches: LeaseEvent[][],
  cfg = config(),
  onOwn?: (l: Lease) => void,
): Promise<{ out: Array<Array<[string, string]>>; metrics: Registry }> {
  const metrics = new Registry();
  const out: Array<Array<[string, string]>> = [];
  for await (const b of checkedPeerEvents(feed(batches), cfg, {
    log,
    metrics,
    ...(onOwn ? { onOwnVtepMACTaken: onOwn } : {}),
  })) {
    out.push(b.map((e) => [e.type, e.lease.key]));
  }
  return { out, metrics };
}

async function conflicts(metrics: Registry): Promise<Record<string, number>> {
  const m = await metrics.getSingleMetric('weft_lease_conflicts_total')!.get();
  return Object.fromEntries(m.values.map((v) => [String(v.labels.reason), v.value]));
}

const add = (lease: Lease): LeaseEvent => ({ type: 'added', lease });
const del = (lease: Lease): LeaseEvent => ({ type: 'removed', lease });

describe('checkedPeerEvents', () => {
  test('a newer overlapping peer is held back until the older one goes, counted once', async () => {
    const a = peer('10.5.2.0/24');
    const b = peer('10.5.2.0/24');
    const b2 = { ...b, attrs: { ...b.attrs, publicIP: '192.168.1.99' } };
    const good = peer('10.5.3.0/24');
    const { out, metrics } = await collect([[add(a), add(good)], [add(b)], [add(b2)], [del(a)]]);
    assert.deepEqual(out, [
      [
        ['added', a.key],
        ['added', good.key],
      ],
      [
        ['removed', a.key],
        ['added', b.key],
      ],
    ]);
    const c = await conflicts(metrics);
    assert.deepEqual(c, {
      outside_network: 0,
      overlaps_own: 0,
      backend_data: 0,
      vtep_mac: 0,
      overlaps_peer: 1,
    });
  });

  test('the startup snapshot is passed on even when empty; leases are ordered by age in it', async () => {
    const older = { ...peer('10.5.2.0/24'), expiration: new Date(1000) };
    const newer = { ...peer('10.5.2.0/24'), expiration: new Date(2000) };
    const { out } = await collect([[], [add(newer), add(older)]]);
    assert.deepEqual(out, [[], [['added', newer.key]]]);
    const first = await collect([[add(newer), add(older)]]);
    assert.deepEqual(first.out, [[['added', older.key]]]);
  });

  test('a lease that turns bad is removed downstream and counted', async () => {
    const a = peer('10.5.2.0/24');
    const bad = {
      ...a,
      attrs: { ...a.attrs, backendData: { VNI: 7, VtepMAC: '0a:00:00:00:00:77' } },
    };
    const { out, metrics } = await collect([[add(a)], [add(bad)]]);
    assert.deepEqual(out, [[['added', a.key]], [['removed', a.key]]]);
    assert.equal((await conflicts(metrics)).backend_data, 1);
  });

  test('our VtepMAC in the startup snapshot: we are the newcomer and are told', async () => {
    const clash = peer('10.5.2.0/24', { backendData: { VNI: 1, VtepMAC: OWN_MAC } });
    const told: Lease[] = [];
    const { out, metrics } = await collect([[add(clash)]], config(), (l) => told.push(l));
    assert.deepEqual(told, [clash]);
    assert.deepEqual(out, [[]]);
    assert.equal((await conflicts(metrics)).vtep_mac, 1);
  });

  test('our VtepMAC on a peer that comes later: the peer is the newcomer, skipped', async () => {
    const clash = peer('10.5.2.0/24', { backendData: { VNI: 1, VtepMAC: OWN_MAC } });
    const told: Lease[] = [];
    const { out, metrics } = await collect([[], [add(clash)]], config(), (l) => told.push(l));
    assert.deepEqual(told, []);
    assert.deepEqual(out, [[]]);
    assert.equal((await conflicts(metrics)).vtep_mac, 1);
  });
});

describe('checkedPeerEvents: the startup snapshot in parts', () => {
  /** `lease` written `i` seconds in (the snapshot's age order). */
  const aged = (l: Lease, i: number): Lease => ({ ...l, expiration: new Date(i * 1000) });
  /** The batches a snapshot of `leases` is handed on in, `part` leases checked at a time. */
  async function parts(
    leases: Lease[],
    part: number | undefined,
    onOwn?: (l: Lease) => void,
  ): Promise<Array<{ keys: string[]; continued: boolean }>> {
    const cfg = config();
    const out: Array<{ keys: string[]; continued: boolean }> = [];
    const events = checkedPeerEvents(
      feed([leases.map(add)]),
      cfg,
      { log, metrics: new Registry(), ...(onOwn ? { onOwnVtepMACTaken: onOwn } : {}) },
      part === undefined ? {} : { part },
    );
    for await (const b of events) {
      out.push({ keys: b.map((e) => e.lease.key), continued: continuesSnapshot(b) });
    }
    return out;
  }

  test('a snapshot larger than a part comes in parts, all but the last continued; together the whole check’s batch', async () => {
    const leases = [2, 3, 4, 5, 6].map((t, i) => aged(peer(`10.5.${t}.0/24`), 5 - i));
    const got = await parts(leases, 2);
    assert.deepEqual(
      got.map((b) => [b.keys.length, b.continued]),
      [
        [2, true],
        [2, true],
        [1, false],
      ],
    );
    const whole = await parts(leases, undefined); // (no part size: one batch)
    assert.deepEqual(whole.length, 1);
    assert.deepEqual(
      got.flatMap((b) => b.keys),
      whole[0]!.keys,
    );
    // oldest first: the last lease written first
    assert.equal(got[0]!.keys[0], leases[4]!.key);
  });

  test('a part all skipped is not passed on; the last part always is, and ends the snapshot', async () => {
    const bad = { backendData: { VNI: 7, VtepMAC: '0a:00:00:00:00:77' } };
    const leases = [
      aged(peer('10.5.2.0/24'), 1),
      aged(peer('10.5.3.0/24'), 2),
      aged(peer('10.5.4.0/24', bad), 3),
      aged(peer('10.5.5.0/24', bad), 4),
      aged(peer('10.5.6.0/24', bad), 5),
    ];
    const got = await parts(leases, 2);
    assert.deepEqual(got, [
      { keys: [leases[0]!.key, leases[1]!.key], continued: true },
      { keys: [], continued: false },
    ]);
  });

  test('our VtepMAC on a peer of a later part: we are the newcomer and are told', async () => {
    const clash = aged(peer('10.5.3.0/24', { backendData: { VNI: 1, VtepMAC: OWN_MAC } }), 2);
    const told: Lease[] = [];
    await parts([aged(peer('10.5.2.0/24'), 1), clash], 1, (l) => told.push(l));
    assert.deepEqual(told, [clash]);
  });
});

describe('checkedPeerEvents: a startup snapshot that comes in parts from upstream', () => {
  /** `lease` written `i` seconds in (the snapshot's age order). */
  const aged = (l: Lease, i: number): Lease => ({ ...l, expiration: new Date(i * 1000) });
  /** Runs `upstream` (each batch but the last marked continued, as kube's list pages are). */
  async function run(
    upstream: LeaseEvent[][],
    opts: { part?: number; later?: LeaseEvent[][]; onOwn?: (l: Lease) => void } = {},
  ) {
    const marked = upstream.map((b, i) => (i < upstream.length - 1 ? snapshotPart(b) : b));
    const out: Array<{ events: Array<[string, string]>; continued: boolean; checked: boolean }> =
      [];
    let checked = false;
    const metrics = new Registry();
    for await (const b of checkedPeerEvents(
      feed([...marked, ...(opts.later ?? [])]),
      config(),
      {
        log,
        metrics,
        onSnapshotChecked: () => (checked = true),
        ...(opts.onOwn ? { onOwnVtepMACTaken: opts.onOwn } : {}),
      },
      opts.part === undefined ? {} : { part: opts.part },
    )) {
      out.push({
        events: b.map((e) => [e.type, e.lease.key]),
        continued: continuesSnapshot(b),
        checked,
      });
    }
    return { out, metrics };
  }

  test('each upstream part is checked and passed on as a part at once; the last ends the snapshot', async () => {
    const [a, b, c] = [2, 3, 4].map((t) => peer(`10.5.${t}.0/24`));
    const { out } = await run([[add(a!)], [add(b!)], [add(c!)]], { part: 500 });
    assert.deepEqual(out, [
      { events: [['added', a!.key]], continued: true, checked: false },
      { events: [['added', b!.key]], continued: true, checked: false },
      // the snapshot is checked (onSnapshotChecked) before its last part is passed on
      { events: [['added', c!.key]], continued: false, checked: true },
    ]);
  });

  test('a lease an older lease of a later part rejects is removed when the snapshot ends', async () => {
    const newer = aged(peer('10.5.2.0/24'), 2);
    const older = aged(peer('10.5.2.0/23'), 1); // (overlaps newer)
    const other = aged(peer('10.5.4.0/24'), 3);
    const { out, metrics } = await run([[add(newer)], [add(older)], [add(other)]], { part: 500 });
    assert.deepEqual(out, [
      { events: [['added', newer.key]], continued: true, checked: false },
      // (older, arriving later, is held back meanwhile: its part passes nothing on)
      {
        // the whole snapshot's verdicts: the older lease holds the subnet
        events: [
          ['removed', newer.key],
          ['added', older.key],
          ['added', other.key],
        ],
        continued: false,
        checked: true,
      },
    ]);
    assert.equal((await conflicts(metrics)).overlaps_peer, 2); // (each held back in turn)
  });

  test('without a part size nothing is passed on before the last part, which is the whole snapshot', async () => {
    const [a, b, c] = [2, 3, 4].map((t, i) => aged(peer(`10.5.${t}.0/24`), 3 - i));
    const { out } = await run([[add(a!)], [add(b!)], [add(c!)]]);
    assert.deepEqual(out, [
      {
        // oldest first, as a whole snapshot
        events: [
          ['added', c!.key],
          ['added', b!.key],
          ['added', a!.key],
        ],
        continued: false,
        checked: true,
      },
    ]);
  });

  test('our VtepMAC on a peer of an upstream part: we are the newcomer and are told', async () => {
    const clash = peer('10.5.3.0/24', { backendData: { VNI: 1, VtepMAC: OWN_MAC } });
    const told: Lease[] = [];
    await run([[add(peer('10.5.2.0/24'))], [add(clash)], []], {
      part: 500,
      onOwn: (l) => told.push(l),
    });
    assert.deepEqual(told, [clash]);
  });

  test('random leases in random parts end where the whole snapshot ends, with or without a part size', async () => {
    const r = rng(11);
    const leases = new Map<string, Lease>();
    for (let i = 0; i < 400; i++) {
      // /23../26 inside 10.5.0.0/16 (overlaps among them), every tenth MAC shared
      const prefix = 23 + Math.floor(r() * 4);
      const size = 2 ** (32 - prefix);
      const addr = 0x0a050000 + Math.floor((r() * 65536) / size) * size;
      const mac = `0a:00:00:00:${(i % 10 === 0 ? 1 : (i >> 8) + 2).toString(16).padStart(2, '0')}:${(i & 255).toString(16).padStart(2, '0')}`;
      const l = aged(
        peer(`10.5.${(addr >> 8) & 255}.${addr & 255}/${prefix}`, {
          backendData: { VNI: 1, VtepMAC: i % 10 === 0 ? '0a:00:00:00:01:00' : mac },
        }),
        Math.floor(r() * 1000),
      );
      if (!leases.has(l.key)) leases.set(l.key, l);
    }
    const all = [...leases.values()];
    /** What downstream holds at the end of the snapshot. */
    const held = (out: Array<{ events: Array<[string, string]> }>) => {
      const keys = new Set<string>();
      for (const b of out) {
        for (const [type, key] of b.events) {
          if (type === 'added') keys.add(key);
          else keys.delete(key);
        }
      }
      return [...keys].sort();
    };
    const whole = held((await run([all.map(add)])).out);
    assert.ok(whole.length > 50 && whole.length < all.length, 'some accepted, some held back');
    // arrival in random order, in random parts
    const shuffled = [...all].sort(() => r() - 0.5);
    const upstream: LeaseEvent[][] = [];
    for (let i = 0; i < shuffled.length;) {
      const n = 1 + Math.floor(r() * 60);
      upstream.push(shuffled.slice(i, i + n).map(add));
      i += n;
    }
    assert.deepEqual(held((await run(upstream, { part: 500 })).out), whole);
    assert.deepEqual(held((await run(upstream)).out), whole);
  });

  test('batches after the snapshot are plain changes', async () => {
    const [a, b] = [2, 3].map((t) => peer(`10.5.${t}.0/24`));
    const { out } = await run([[add(a!)], []], { part: 500, later: [[add(b!)], [del(a!)]] });
    assert.deepEqual(
      out.map((x) => [x.events, x.continued]),
      [
        [[['added', a!.key]], true],
        [[], false],
        [[['added', b!.key]], false],
        [[['removed', a!.key]], false],
      ],
    );
  });
});

describe('PeerChecker: verdicts kept at the cost of what changed', () => {
  test('after every batch of random adds, updates and removals it agrees with checkPeers over all leases', () => {
    const cfg = config();
    for (let seed = 1; seed <= 20; seed++) {
      const r = rng(seed);
      const pick = <T>(xs: readonly T[]): T => xs[Math.floor(r() * xs.length)]!;
      const v4s = ['10.5.2.0/24', '10.5.3.0/24', '10.5.2.0/23', '10.5.8.0/22', '10.5.9.0/24'];
      const v4s2 = [...v4s, '10.6.0.0/24', '10.5.1.0/25', '10.5.4.0/24', '10.5.5.0/24'];
      const macs = ['0a:00:00:00:00:01', '0a:00:00:00:00:02', '0a:00:00:00:00:03', OWN_MAC];
      const data = () => ({ VNI: r() < 0.9 ? 1 : 2, VtepMAC: pick(macs) });
      const fresh = () => peer(pick(v4s2), { backendData: data() });
      const checker = new PeerChecker(cfg);
      /** The reference: every lease, oldest first, as checkedPeerEvents keeps them. */
      const all = new Map<string, Lease>();
      const first = Array.from({ length: 4 }, fresh);
      checker.apply(first.map(add), true);
      for (const l of byAge(first)) all.set(l.key, l);
      for (let step = 0; step < 60; step++) {
        const batch: LeaseEvent[] = [];
        for (let k = 1 + Math.floor(r() * 3); k > 0; k--) {
          const known = [...all.values()];
          const x = r();
          if (x < 0.45 || known.length === 0) {
            const l = fresh();
            batch.push(add(l));
            all.delete(l.key); // (a re-added key is newer than every other)
            all.set(l.key, l);
          } else if (x < 0.75) {
            const l = pick(known);
            batch.push(del(l));
            all.delete(l.key);
          } else {
            const l = pick(known);
            // half of the updates change only the public IP (no check reads it)
            const attrs =
              r() < 0.5
                ? { ...l.attrs, publicIP: `192.168.9.${step}` }
                : { ...l.attrs, backendData: data() };
            const u = { ...l, attrs };
            batch.push(add(u));
            all.set(l.key, u);
          }
        }
        checker.apply(batch, false);
        const want = checkPeers(all.values(), cfg);
        const where = `seed ${seed} step ${step}`;
        assert.deepEqual([...checker.accepted.values()], want.accepted, where);
        assert.deepEqual(
          [...checker.rejected.values()].map((x) => [x.lease.key, x.reason, x.lease]),
          want.rejected.map((x) => [x.lease.key, x.reason, x.lease]),
          where,
        );
      }
    }
  });

  test('overlaps among 1,500 random subnets are judged as a plain scan judges them, with removals between', () => {
    const cfg = config();
    const r = rng(7);
    let macs = 0;
    const lease = (): Lease => {
      const prefix = r() < 0.02 ? 22 : 25 + Math.floor(r() * 4); // a few /22, the rest /25 … /28
      const size = 2 ** (32 - prefix);
      const addr = 0x0a050000 + Math.floor((r() * 65536) / size) * size; // inside 10.5.0.0/16
      const v4 = `10.5.${(addr >> 8) & 255}.${addr & 255}/${prefix}`;
      const mac = (++macs)
        .toString(16)
        .padStart(4, '0')
        .replace(/(..)(..)/, '00:00:$1:$2');
      return peer(v4, {
        backendData: { VNI: 1, VtepMAC: `0a:00:${mac}` },
        backendV6Data: { VNI: 1, VtepMAC: `0e:00:${mac}` },
      });
    };
    /** The reference: every verdict by a scan of the leases accepted before it. */
    const plainScan = (leases: readonly Lease[]) => {
      const span = (l: Lease) => {
        const n = l.subnet!;
        const start = Number(n.addr) - (Number(n.addr) % 2 ** (32 - n.prefix));
        return { start, end: start + 2 ** (32 - n.prefix) - 1, key: l.key };
      };
      const own = span(ownLease());
      const accepted: Array<ReturnType<typeof span>> = [];
      const verdicts: Array<[string, string, string | null]> = [];
      for (const l of leases) {
        const s = span(l);
        if (s.start <= own.end && own.start <= s.end) {
          verdicts.push([l.key, 'overlaps_own', ownLease().key]);
          continue;
        }
        // (the accepted span starting at or before it, else the first one after it)
        const before = accepted
          .filter((a) => a.start <= s.start)
          .sort((a, b) => b.start - a.start)[0];
        const after = accepted
          .filter((a) => a.start > s.start)
          .sort((a, b) => a.start - b.start)[0];
        const other =
          before && before.end >= s.start ? before : after && after.start <= s.end ? after : null;
        if (other) verdicts.push([l.key, 'overlaps_peer', other.key]);
        else {
          accepted.push(s);
          verdicts.push([l.key, 'accepted', null]);
        }
      }
      return verdicts;
    };
    const verdictsOf = (checker: PeerChecker, leases: readonly Lease[]) =>
      leases.map((l): [string, string, string | null] => {
        const x = checker.rejected.get(l.key);
        return x ? [l.key, x.reason, x.other?.key ?? null] : [l.key, 'accepted', null];
      });
    const leases = new Map<string, Lease>();
    for (let i = 0; i < 1500; i++) {
      const l = lease();
      leases.set(l.key, l); // (a key drawn again keeps its first place, as a store's would)
    }
    const checker = new PeerChecker(cfg);
    checker.apply([...leases.values()].map(add), true);
    const order = byAge([...leases.values()]);
    assert.ok(checker.accepted.size > 300, `${checker.accepted.size} accepted`);
    assert.deepEqual(verdictsOf(checker, order), plainScan(order));
    // Accepted leases that hold nothing back leave (their spans come out of the list), and
    // newcomers are checked against what is left.
    const blocking = new Set([...checker.rejected.values()].map((x) => x.other?.key));
    const gone = [...checker.accepted.keys()].filter((k) => !blocking.has(k)).slice(0, 150);
    const newcomers = Array.from({ length: 300 }, lease).filter((l) => !leases.has(l.key));
    checker.apply([...gone.map((k) => del(leases.get(k)!)), ...newcomers.map(add)], false);
    assert.equal(checker.fullChecks, 1, 'the removals and newcomers were judged incrementally');
    const now = [...order.filter((l) => !gone.includes(l.key)), ...newcomers];
    assert.deepEqual(verdictsOf(checker, now), plainScan(now));
  });

  test('newcomers, removals and updates that change no verdict run no whole re-check', () => {
    const checker = new PeerChecker(config());
    const mac = (i: number) => `0a:00:00:01:00:${i.toString(16).padStart(2, '0')}`;
    const own = (v4: string, i: number) =>
      peer(v4, {
        backendData: { VNI: 1, VtepMAC: mac(i) },
        backendV6Data: { VNI: 1, VtepMAC: mac(100 + i) },
      });
    const leases = Array.from({ length: 50 }, (_, i) => own(`10.5.${10 + i}.0/24`, i));
    checker.apply(leases.slice(0, 25).map(add), true);
    assert.equal(checker.fullChecks, 1);
    for (const l of leases.slice(25)) checker.apply([add(l)], false);
    for (const l of leases.slice(0, 10)) checker.apply([del(l)], false);
    const l = leases[20]!;
    checker.apply([add({ ...l, attrs: { ...l.attrs, publicIP: '192.168.7.7' } })], false);
    // a newer lease blocked by an older one, and the older one staying
    const blocked = own('10.5.30.0/24', 99);
    checker.apply([add(blocked)], false);
    assert.equal(checker.rejected.get(blocked.key)?.reason, 'overlaps_peer');
    assert.equal(checker.fullChecks, 1);
    assert.equal(checker.accepted.size, 40);
    // its blocker leaving is what may change other verdicts: then every lease is checked again
    checker.apply([del(leases[20]!)], false);
    assert.equal(checker.fullChecks, 2);
    assert.ok(checker.accepted.has(blocked.key));
  });
});
