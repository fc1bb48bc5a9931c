/**
 * The native peer table (native/src/peer_table.cc): longest-prefix match over IPv4 and IPv6
 * subnets from the one-buffer record format, against the TypeScript reference decoder; broken
 * buffers are refused by both with the same rule.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ipToBytes, parseIP } from '../../src/common/ip.js';
import { loadDataplaneBinding } from '../../src/dataplane/binding.js';
import {
  JsPeerTable,
  PEER_RECORD_SIZE,
  applyPeerDelta,
  encodePeerTable,
  peerEntry,
} from '../../src/dataplane/peer-table.js';
import type { PeerEntry } from '../../src/dataplane/peer-table.js';
import { Rng } from '../helpers/packets.js';

const native = loadDataplaneBinding();
const a = (s: string) => ipToBytes(parseIP(s)!);

describe('peer table longest-prefix match', () => {
  const buf = encodePeerTable([
    peerEntry('10.0.0.0/8', '192.0.2.1', 8285),
    peerEntry('10.5.0.0/16', '192.0.2.2', 8285),
    peerEntry('10.5.3.0/24', '192.0.2.3', 8285),
    peerEntry('10.5.3.128/25', '192.0.2.4', 8285),
    peerEntry('10.5.3.200/32', '192.0.2.5', 8285),
    peerEntry('fc00::/48', '192.0.2.6', 8285),
    peerEntry('fc00:0:0:7::/64', 'fd00::1', 8285),
    peerEntry('0.0.0.0/0', '192.0.2.9', 8285),
  ]);

  for (const [addr, want] of [
    ['10.1.2.3', 0],
    ['10.5.9.9', 1],
    ['10.5.3.1', 2],
    ['10.5.3.129', 3],
    ['10.5.3.200', 4],
    ['10.5.3.201', 3],
    ['11.0.0.1', 7],
    ['fc00:0:0:7::9', 6],
    ['fc00:0:0:8::9', 5],
    ['fc01::1', -1],
  ] as const) {
    it(`${addr} → record ${want}`, () => {
      assert.equal(native.peerLookup(buf, a(addr)), want);
    });
  }

  it('host bits in a record are ignored (the subnet is masked)', () => {
    const b = encodePeerTable([peerEntry('10.5.3.77/24', '192.0.2.3', 8285)]);
    assert.equal(native.peerLookup(b, a('10.5.3.1')), 0);
  });

  it('an empty table matches nothing', () => {
    assert.equal(native.peerLookup(Buffer.alloc(0), a('10.0.0.1')), -1);
  });

  it('agrees with the reference on 10,000 peers and 20,000 random lookups', () => {
    const rng = new Rng(7);
    const entries: PeerEntry[] = [];
    const seen = new Set<string>();
    while (entries.length < 10000) {
      const v6 = rng.chance(0.3);
      const prefix = v6 ? rng.pick([48, 56, 64, 80]) : rng.pick([16, 20, 24, 26, 28]);
      const addr = v6
        ? `fc00:${rng.int(4).toString(16)}:${rng.int(65536).toString(16)}:${rng.int(65536).toString(16)}::`
        : `10.${rng.int(4)}.${rng.int(256)}.${rng.int(256)}`;
      const e = peerEntry(`${addr}/${prefix}`, `192.0.${rng.int(256)}.${rng.int(256)}`, 8472);
      const key = `${e.subnet.family}/${e.subnet.addr >> BigInt((v6 ? 128 : 32) - prefix)}/${prefix}`;
      if (seen.has(key)) continue;
      seen.add(key);
      entries.push(e);
    }
    const b = encodePeerTable(entries);
    const ref = new JsPeerTable(b);
    const addrs: Buffer[] = [];
    for (let i = 0; i < 20000; i++) {
      const v6 = rng.chance(0.3);
      addrs.push(
        v6
          ? Buffer.concat([Buffer.from([0xfc, 0, 0, rng.int(4)]), rng.bytes(12)])
          : Buffer.from([10, rng.int(4), rng.int(256), rng.int(256)]),
      );
    }
    // One native table for all 20,000 lookups (built per call, it would take minutes).
    const got = native.peerLookup(b, addrs);
    addrs.forEach((addr, i) => {
      const want = ref.lookup({
        family: addr.length === 4 ? 4 : 6,
        addr: BigInt('0x' + addr.toString('hex')),
      });
      assert.equal(got[i], want ? want.index : -1, addr.toString('hex'));
    });
    assert.ok(
      got.filter((g) => g >= 0).length > 1000,
      'enough lookups hit a peer to compare matches',
    );
  });
});

describe('peer table buffers that are refused', () => {
  const good = encodePeerTable([peerEntry('10.5.1.0/24', '192.0.2.1', 8285)]);
  const cases: [string, Buffer, RegExp][] = [
    [
      'a length that is not a multiple of the record size',
      good.subarray(0, PEER_RECORD_SIZE - 1),
      /not a multiple/,
    ],
    ['subnet family 5', patch(good, 0, 5), /subnet family/],
    ['prefix 33 for IPv4', patch(good, 1, 33), /prefix length/],
    ['public family 0', patch(good, 3, 0), /public address family/],
    ['unknown flags', patch(good, 2, 0x80), /unknown flags/],
    ['a repeated subnet', Buffer.concat([good, good]), /repeats/],
  ];
  for (const [name, buf, rule] of cases) {
    it(`${name}: native and reference both refuse it`, () => {
      assert.throws(() => native.peerLookup(buf, a('10.5.1.1')), rule);
      assert.throws(() => new JsPeerTable(buf), rule);
    });
  }
});

function patch(b: Buffer, off: number, v: number): Buffer {
  const c = Buffer.from(b);
  c[off] = v;
  return c;
}

/** Records sorted by their bytes: two tables hold the same peers when these are equal. */
function sortedRecords(buf: Buffer): string[] {
  const out: string[] = [];
  for (let o = 0; o < buf.length; o += PEER_RECORD_SIZE) {
    out.push(buf.subarray(o, o + PEER_RECORD_SIZE).toString('hex'));
  }
  return out.sort();
}

function recordAt(buf: Buffer, index: number): string | null {
  return index < 0
    ? null
    : buf.subarray(index * PEER_RECORD_SIZE, (index + 1) * PEER_RECORD_SIZE).toString('hex');
}

describe('peer table deltas applied in place', () => {
  /** A random peer over a small space: overlapping prefixes, v4 and v6, shared public addresses. */
  function randomPeer(rng: Rng): PeerEntry {
    const v6 = rng.chance(0.35);
    const prefix = v6 ? rng.pick([48, 64, 120, 128]) : rng.pick([16, 24, 26, 32]);
    const subnet = v6
      ? `fc00:0:${rng.int(3).toString(16)}:${rng.int(64).toString(16)}::${rng.int(256).toString(16)}/${prefix}`
      : `10.${rng.int(3)}.${rng.int(64)}.${rng.int(256)}/${prefix}`;
    const pub = rng.chance(0.2) ? `fd00::${rng.int(40).toString(16)}` : `192.0.2.${rng.int(120)}`;
    const mac = rng.chance(0.5)
      ? undefined
      : `02:00:00:00:00:${rng.int(256).toString(16).padStart(2, '0')}`;
    return peerEntry(subnet, pub, rng.pick([8285, 8472, 4789]), mac);
  }
  const subnetOf = (e: PeerEntry) =>
    `${e.subnet.family}/${e.subnet.prefix}/${e.subnet.addr >> BigInt((e.subnet.family === 4 ? 32 : 128) - e.subnet.prefix)}`;

  function probes(rng: Rng, n: number): Buffer[] {
    return Array.from({ length: n }, () =>
      rng.chance(0.35)
        ? Buffer.concat([
            Buffer.from([0xfc, 0, 0, 0, 0, rng.int(3), 0, rng.int(64)]),
            Buffer.alloc(7),
            Buffer.from([rng.int(256)]),
          ])
        : Buffer.from([10, rng.int(3), rng.int(64), rng.int(256)]),
    );
  }
  const publics = [
    ...Array.from({ length: 125 }, (_, i) => a(`192.0.2.${i}`)),
    ...Array.from({ length: 45 }, (_, i) => a(`fd00::${i.toString(16)}`)),
  ];

  it('a random run of adds, removes and replaces gives, after every delta, the table a full build gives', () => {
    const rng = new Rng(11);
    const live = new Map<string, PeerEntry>();
    while (live.size < 600) {
      const e = randomPeer(rng);
      live.set(subnetOf(e), e);
    }
    const base = encodePeerTable([...live.values()]);
    const deltas: [Buffer, Buffer][] = [];
    const lookups = probes(rng, 3000);
    for (let step = 0; step < 60; step++) {
      const removed: PeerEntry[] = [];
      const upserts = new Map<string, PeerEntry>();
      const keys = [...live.keys()];
      for (let k = rng.int(12); k > 0; k--) {
        const key = keys[rng.int(keys.length)]!;
        if (!live.has(key) || upserts.has(key)) continue;
        removed.push(live.get(key)!);
        live.delete(key);
      }
      for (let k = rng.int(12); k > 0; k--) {
        const e =
          rng.chance(0.4) && keys.length > 0
            ? {
                ...randomPeer(rng),
                subnet: live.get(keys[rng.int(keys.length)]!)?.subnet ?? randomPeer(rng).subnet,
              }
            : randomPeer(rng);
        const key = subnetOf(e);
        if (upserts.has(key)) continue;
        upserts.set(key, e);
        live.set(key, e);
      }
      deltas.push([encodePeerTable(removed), encodePeerTable([...upserts.values()])]);
      const got = native.peerTableApply(base, deltas, lookups, publics);
      const want = native.peerTableApply(encodePeerTable([...live.values()]), [], lookups, publics);
      assert.deepEqual(
        sortedRecords(got.table),
        sortedRecords(want.table),
        `records after delta ${step}`,
      );
      assert.deepEqual(
        got.lookups.map((i) => recordAt(got.table, i)),
        want.lookups.map((i) => recordAt(want.table, i)),
        `lookups after delta ${step}`,
      );
      assert.deepEqual(got.publics, want.publics, `public addresses after delta ${step}`);
    }
    assert.ok(
      native.peerTableApply(base, deltas, lookups, publics).lookups.filter((i) => i >= 0).length >
        300,
      'enough lookups hit a peer to compare matches',
    );
  });

  it('agrees with the reference delta (applyPeerDelta)', () => {
    const rng = new Rng(5);
    const entries = Array.from({ length: 200 }, () => randomPeer(rng));
    const unique = [...new Map(entries.map((e) => [subnetOf(e), e])).values()];
    const base = encodePeerTable(unique.slice(0, 150));
    const delta = {
      removed: encodePeerTable(unique.slice(0, 40)),
      upserts: encodePeerTable([...unique.slice(150), { ...unique[60]!, port: 1 }]),
    };
    const got = native.peerTableApply(base, [[delta.removed, delta.upserts]], [], []);
    const want = native.peerTableApply(applyPeerDelta(base, delta), [], [], []);
    assert.deepEqual(sortedRecords(got.table), sortedRecords(want.table));
  });

  it('a subnet removed and added in one delta is replaced', () => {
    const old = peerEntry('10.5.1.0/24', '192.0.2.1', 8285);
    const now = peerEntry('10.5.1.0/24', '192.0.2.9', 8285);
    const got = native.peerTableApply(
      encodePeerTable([old]),
      [[encodePeerTable([old]), encodePeerTable([now])]],
      [a('10.5.1.7')],
      [a('192.0.2.1'), a('192.0.2.9')],
    );
    assert.deepEqual(sortedRecords(got.table), sortedRecords(encodePeerTable([now])));
    assert.deepEqual(got.publics, [false, true]);
  });

  const table = encodePeerTable([peerEntry('10.5.1.0/24', '192.0.2.1', 8285)]);
  const other = encodePeerTable([peerEntry('10.5.2.0/24', '192.0.2.2', 8285)]);
  const none = Buffer.alloc(0);
  for (const [name, removed, upserts, rule] of [
    [
      'a removed subnet that is not in the table',
      other,
      none,
      /removed: peer record 0: subnet not in the table/,
    ],
    [
      'a subnet twice among the upserts',
      none,
      Buffer.concat([other, other]),
      /upserts: peer record 1: subnet repeats/,
    ],
    [
      'a subnet twice among the removed',
      Buffer.concat([table, table]),
      none,
      /removed: peer record 1: subnet repeats/,
    ],
    ['a malformed upsert', none, patch(other, 1, 33), /upserts: peer record 0: prefix length/],
  ] as const) {
    it(`${name}: native and reference both refuse the delta`, () => {
      assert.throws(() => native.peerTableApply(table, [[removed, upserts]], [], []), rule);
      const ref = () => new JsPeerTable(applyPeerDelta(table, { removed, upserts }));
      assert.throws(ref, rule);
    });
  }
});
