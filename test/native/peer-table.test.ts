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
