import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { parseIP, type Family } from '../../../../src/common/ip.js';
import { PeerRecords, planPeers } from '../../../../src/control/backend/peer-plan.js';
import { underlayBinds } from '../../../../src/control/backend/userspace.js';
import type { Lease, LeaseEvent } from '../../../../src/control/lease/types.js';
import {
  JsPeerTable,
  PEER_RECORD_SIZE,
  applyPeerDelta,
  encodePeerTable,
} from '../../../../src/dataplane/peer-table.js';
import { EXT, peerLease } from './fixtures.js';

const lease = (i: number): Lease =>
  peerLease(
    { publicIP: `192.168.${i >> 8}.${i & 255}` },
    { v4: `10.${6 + (i >> 8)}.${i & 255}.0/24`, v6: `fc00:0:${(i + 0x100).toString(16)}::/64` },
  );

function context(families: Family[] = [4, 6]) {
  const calls: string[] = [];
  return {
    calls,
    ctx: {
      families,
      underlay: 4 as Family,
      ownKey: lease(0).key,
      peerFor(l: Lease, family: Family, publicIP: string) {
        calls.push(`${l.key}/${family}`);
        if (publicIP === '192.168.0.13') return { skip: 'bad public IP' };
        return {
          subnet: family === 4 ? l.subnet! : l.ipv6Subnet!,
          publicIP: parseIP(publicIP)!,
          port: 8285,
          vtepMac: null,
        };
      },
    },
  };
}

describe('planPeers', () => {
  test('an event about one peer parses that peer only (once per family)', () => {
    const { calls, ctx } = context();
    const changes = planPeers([{ type: 'added', lease: lease(7) }], ctx);
    assert.deepEqual(calls, [`${lease(7).key}/4`, `${lease(7).key}/6`]);
    assert.equal(changes.length, 1);
    assert.equal(changes[0]!.entries.length, 2);
  });

  test('a removal parses nothing; our own lease is never a peer; skips are data', () => {
    const { calls, ctx } = context([4]);
    const changes = planPeers(
      [
        { type: 'removed', lease: lease(7) },
        { type: 'added', lease: lease(0) },
        { type: 'added', lease: lease(13) },
      ],
      ctx,
    );
    assert.deepEqual(calls, [`${lease(13).key}/4`]);
    assert.deepEqual(changes, [
      { key: lease(7).key, entries: [], skipped: [] },
      { key: lease(13).key, entries: [], skipped: ['bad public IP'] },
    ]);
  });
});

describe('PeerRecords', () => {
  test('one change among 5,000 peers re-encodes that peer; the table holds every record', () => {
    const { calls, ctx } = context([4]);
    const records = new PeerRecords();
    const all: LeaseEvent[] = [];
    for (let i = 1; i <= 5000; i++) all.push({ type: 'added', lease: lease(i) });
    assert.equal(records.apply(planPeers(all, ctx)), true);
    calls.length = 0;
    const moved = peerLease(
      { publicIP: '192.168.200.1' },
      { v4: `10.6.42.0/24`, v6: `fc00:0:${(42 + 0x100).toString(16)}::/64` },
    );
    assert.equal(records.apply(planPeers([{ type: 'added', lease: moved }], ctx)), true);
    assert.deepEqual(calls, [`${moved.key}/4`]);
    assert.equal(records.apply(planPeers([{ type: 'removed', lease: lease(43) }], ctx)), true);
    const table = new JsPeerTable(records.table());
    assert.equal(table.peers.length, 5000 - 2); // lease 13 skipped, lease 43 removed
    assert.equal(
      table.lookup(parseIP('10.6.42.9')!)?.publicIP.addr,
      parseIP('192.168.200.1')!.addr,
    );
    assert.equal(table.lookup(parseIP('10.6.43.9')!), null);
  });

  test('an unchanged lease changes nothing; the table matches encodePeerTable', () => {
    const { ctx } = context([4]);
    const records = new PeerRecords();
    const changes = planPeers(
      [
        { type: 'added', lease: lease(1) },
        { type: 'added', lease: lease(2) },
      ],
      ctx,
    );
    records.apply(changes);
    assert.equal(records.apply(planPeers([{ type: 'added', lease: lease(1) }], ctx)), false);
    assert.deepEqual(records.table(), encodePeerTable(changes.flatMap((c) => c.entries)));
  });
});

describe('PeerRecords deltas (what changed since the last handover)', () => {
  const plan = (records: PeerRecords, events: LeaseEvent[]) =>
    records.apply(planPeers(events, context().ctx));
  const sorted = (b: Buffer) => {
    const out: string[] = [];
    for (let o = 0; o < b.length; o += PEER_RECORD_SIZE)
      out.push(b.subarray(o, o + PEER_RECORD_SIZE).toString('hex'));
    return out.sort();
  };
  /** Records holding these leases, the whole table just handed over. */
  const handedOver = (...leases: Lease[]) => {
    const records = new PeerRecords();
    plan(
      records,
      leases.map((l) => ({ type: 'added', lease: l })),
    );
    records.takeTable();
    return records;
  };
  const recordsOf = (l: Lease) =>
    encodePeerTable(planPeers([{ type: 'added', lease: l }], context().ctx)[0]!.entries);

  test('a lease added after the handover: its records are the upserts', () => {
    const records = handedOver(lease(1));
    plan(records, [{ type: 'added', lease: lease(2) }]);
    const d = records.takeDelta();
    assert.deepEqual(sorted(d.upserts), sorted(recordsOf(lease(2))));
    assert.equal(d.removed.length, 0);
    assert.equal(d.changes, 2); // its IPv4 and IPv6 records
  });

  test('a lease removed: its records are the removed ones', () => {
    const records = handedOver(lease(1), lease(2));
    plan(records, [{ type: 'removed', lease: lease(1) }]);
    const d = records.takeDelta();
    assert.deepEqual(sorted(d.removed), sorted(recordsOf(lease(1))));
    assert.equal(d.upserts.length, 0);
  });

  test('a lease whose public address changed: its records are upserted, none removed', () => {
    const records = handedOver(lease(1));
    const moved = peerLease(
      { publicIP: '192.168.200.1' },
      { v4: '10.6.1.0/24', v6: 'fc00:0:101::/64' },
    );
    plan(records, [{ type: 'added', lease: moved }]);
    const d = records.takeDelta();
    assert.deepEqual(sorted(d.upserts), sorted(recordsOf(moved)));
    assert.equal(d.removed.length, 0);
  });

  test('a lease added and removed within one window is no change', () => {
    const records = handedOver(lease(1));
    plan(records, [{ type: 'added', lease: lease(2) }]);
    plan(records, [{ type: 'removed', lease: lease(2) }]);
    assert.equal(records.takeDelta().changes, 0);
  });

  test('a lease removed and added back unchanged within one window is no change', () => {
    const records = handedOver(lease(1));
    plan(records, [{ type: 'removed', lease: lease(1) }]);
    plan(records, [{ type: 'added', lease: lease(1) }]);
    assert.equal(records.takeDelta().changes, 0);
  });

  test('the handed-over table with every delta applied is the table, over a random run', () => {
    const records = new PeerRecords();
    let engine: Buffer = Buffer.alloc(0);
    let n = 0;
    const live: number[] = [];
    let seed = 3;
    const rand = (k: number) => (seed = (seed * 1103515245 + 12345) % 2 ** 31) % k;
    for (let step = 0; step < 200; step++) {
      const events: LeaseEvent[] = [];
      for (let k = rand(5); k > 0; k--) {
        live.push(++n);
        events.push({ type: 'added', lease: lease(n) });
      }
      for (let k = rand(5); k > 0 && live.length > 0; k--) {
        const [gone] = live.splice(rand(live.length), 1);
        events.push({ type: 'removed', lease: lease(gone!) });
      }
      plan(records, events);
      if (step % 50 === 0) engine = records.takeTable();
      else engine = applyPeerDelta(engine, records.takeDelta());
      assert.deepEqual(sorted(engine), sorted(records.table()), `after step ${step}`);
    }
  });
});

describe('planPeers, each family on its own underlay (vxlan, as flannel)', () => {
  const perFamily = () => {
    const seen: string[] = [];
    return {
      seen,
      ctx: {
        families: [4, 6] as Family[],
        underlay: 4 as Family,
        perFamily: true,
        ownKey: null,
        peerFor(l: Lease, family: Family, publicIP: string) {
          seen.push(`${family} ${publicIP}`);
          return {
            subnet: family === 4 ? l.subnet! : l.ipv6Subnet!,
            publicIP: parseIP(publicIP)!,
            port: 8472,
            vtepMac: null,
          };
        },
      },
    };
  };

  test('IPv4 pods go to PublicIP, IPv6 pods to PublicIPv6', () => {
    const { seen, ctx } = perFamily();
    const l = peerLease({ publicIP: '192.168.1.7', publicIPv6: '2001:db8:1::7' });
    const [c] = planPeers([{ type: 'added', lease: l }], ctx);
    assert.deepEqual(seen, ['4 192.168.1.7', '6 2001:db8:1::7']);
    assert.deepEqual(c!.skipped, []);
  });

  test('a lease without a PublicIPv6 gets no IPv6 record, and says why', () => {
    const { ctx } = perFamily();
    const l = peerLease({ publicIP: '192.168.1.7', publicIPv6: null });
    const [c] = planPeers([{ type: 'added', lease: l }], ctx);
    assert.equal(c!.entries.length, 1);
    assert.equal(c!.entries[0]!.subnet.family, 4);
    assert.deepEqual(c!.skipped, ['no public IPv6 address']);
  });
});

describe('underlayBinds', () => {
  const ext = EXT;
  test('one family per underlay: dual-stack binds both, IPv6-only the IPv6 address', () => {
    assert.deepEqual(underlayBinds(ext, [4, 6], true), {
      bindIp: EXT.ifaceAddr,
      bindIp6: EXT.ifaceAddrV6,
    });
    assert.deepEqual(underlayBinds(ext, [6], true), { bindIp: EXT.ifaceAddrV6 });
    assert.deepEqual(underlayBinds(ext, [4], true), { bindIp: EXT.ifaceAddr });
    assert.deepEqual(underlayBinds({ ...ext, ifaceAddrV6: null }, [4, 6], true), { bindIp: null });
  });
  test('a --public-ip that is an address of this host is the bind (and send) address', () => {
    const links = () => [EXT.ifaceAddr!, '192.0.2.77', EXT.ifaceAddrV6!];
    const second = { ...ext, publicIP: '192.0.2.77' };
    assert.deepEqual(underlayBinds(second, [4], true, links), { bindIp: '192.0.2.77' });
    assert.deepEqual(underlayBinds(second, [4, 6], false, links), { bindIp: '192.0.2.77' });
    // a NAT address (no interface has it): the interface's own, the NAT rewrites the source
    const nat = { ...ext, publicIP: '203.0.113.9' };
    assert.deepEqual(underlayBinds(nat, [4], true, links), { bindIp: EXT.ifaceAddr });
  });
  test('one underlay for every family (udp): IPv4 when the node has it', () => {
    assert.deepEqual(underlayBinds(ext, [4, 6], false), { bindIp: EXT.ifaceAddr });
    assert.deepEqual(underlayBinds({ ...ext, ifaceAddr: null }, [4, 6], false), {
      bindIp: EXT.ifaceAddrV6,
    });
  });
});
