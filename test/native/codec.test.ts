/**
 * The native codec (native/src: flannel_udp, vxlan, packet, checksum) against the TypeScript
 * reference (src/dataplane/js-codec.ts), byte for byte, on thousands of random packets, IPv4 and
 * IPv6, valid and broken, both directions, both formats.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ipFromBytes, ipToBytes, parseCIDR, parseIP } from '../../src/common/ip.js';
import { loadDataplaneBinding } from '../../src/dataplane/binding.js';
import * as js from '../../src/dataplane/js-codec.js';
import type { Format } from '../../src/dataplane/js-codec.js';
import { JsPeerTable, encodePeerTable, peerEntry } from '../../src/dataplane/peer-table.js';
import { Rng, corrupt, makePacket } from '../helpers/packets.js';

const native = loadDataplaneBinding();
const OUR_MAC = Buffer.from([0x02, 0x11, 0x22, 0x33, 0x44, 0x55]);
const cfg = { vni: 1, vtepMac: OUR_MAC, tunMtu: 1450 };

// Peers: nested prefixes on purpose (a /16 holding /24s and a /28), IPv6 /64s and a /56.
const entries = [
  peerEntry('10.5.0.0/16', '192.168.1.1', 8472, '02:00:00:00:00:01'),
  peerEntry('10.5.1.0/24', '192.168.1.2', 8472, '02:00:00:00:00:02'),
  peerEntry('10.5.2.0/24', '192.168.1.3', 8472, '02:00:00:00:00:03'),
  peerEntry('10.5.2.16/28', '192.168.1.4', 8472, '02:00:00:00:00:04'),
  peerEntry('10.6.0.0/24', '192.168.1.5', 8285),
  peerEntry('fc00:0:0:1::/64', '192.168.1.2', 8472, '02:00:00:00:00:02'),
  peerEntry('fc00:0:0:2::/64', 'fd00::7', 8472, '02:00:00:00:00:07'),
  peerEntry('fc00:0:1::/56', '192.168.1.8', 8285),
];
const tableBuf = encodePeerTable(entries);
const table = new JsPeerTable(tableBuf);

function addrIn(rng: Rng, cidr: string): Buffer {
  const net = parseCIDR(cidr)!;
  const bitsTotal = net.family === 4 ? 32 : 128;
  const host = BigInt(rng.u32()) * 2n ** 32n + BigInt(rng.u32());
  const span = 1n << BigInt(bitsTotal - net.prefix);
  return ipToBytes({ family: net.family, addr: net.addr + (host % span) });
}

function randomAddr(rng: Rng, v6: boolean): Buffer {
  if (rng.chance(0.8)) {
    const subnets = entries.filter((e) => (e.subnet.family === 6) === v6);
    const e = rng.pick(subnets);
    return addrIn(
      rng,
      `${e.subnet.family === 4 ? ipv4(e.subnet.addr) : ipv6(e.subnet.addr)}/${e.subnet.prefix}`,
    );
  }
  if (!v6 && rng.chance(0.1)) return Buffer.from([0, 0, 0, 0]);
  if (!v6 && rng.chance(0.1)) return Buffer.from([224 + rng.int(16), 0, 0, 1]);
  return rng.bytes(v6 ? 16 : 4);
}
function ipv4(a: bigint): string {
  return [24n, 16n, 8n, 0n].map((s) => String((a >> s) & 0xffn)).join('.');
}
function ipv6(a: bigint): string {
  const parts: string[] = [];
  for (let s = 112n; s >= 0n; s -= 16n) parts.push(((a >> s) & 0xffffn).toString(16));
  return parts.join(':');
}

function randomPacket(rng: Rng): Buffer {
  const v6 = rng.chance(0.4);
  const big = rng.chance(0.1);
  const p = makePacket(rng, {
    src: randomAddr(rng, v6),
    dst: randomAddr(rng, v6),
    proto: big ? 6 : undefined,
    payloadLen: big ? 1500 + rng.int(30000) : undefined,
    ttl: rng.chance(0.1) ? rng.int(3) : undefined,
    partial: rng.chance(0.3),
  });
  return rng.chance(0.15) ? corrupt(rng, p) : p;
}

function vxlanFrame(rng: Rng, inner: Buffer): Buffer {
  const h = Buffer.alloc(22);
  h[0] = 0x08;
  h.writeUIntBE(rng.chance(0.9) ? cfg.vni : rng.int(1 << 24), 4, 3);
  (rng.chance(0.9) ? OUR_MAC : rng.bytes(6)).copy(h, 8);
  rng.bytes(6).copy(h, 14);
  const v = inner.length > 0 ? inner[0]! >> 4 : 4;
  h.writeUInt16BE(
    rng.chance(0.95) ? (v === 6 ? 0x86dd : 0x0800) : rng.pick([0x0806, 0x0800, 0x86dd, 0]),
    20,
  );
  if (rng.chance(0.03)) h[rng.pick([0, 1, 2, 3, 7])] = rng.int(256);
  const f = Buffer.concat([h, inner]);
  return rng.chance(0.03) ? f.subarray(0, rng.int(f.length)) : f;
}

function outerSource(rng: Rng, inner: Buffer): Buffer {
  // Mostly the peer that owns the inner source; sometimes another peer; sometimes a stranger.
  const v = inner.length > 0 ? inner[0]! >> 4 : 4;
  const srcOff = v === 6 ? 8 : 12;
  const len = v === 6 ? 16 : 4;
  if (inner.length >= srcOff + len && rng.chance(0.7)) {
    const owner = table.lookup(ipFromBytes(inner.subarray(srcOff, srcOff + len)));
    if (owner) return ipToBytes(owner.publicIP);
  }
  if (rng.chance(0.5)) return ipToBytes(rng.pick(table.peers).publicIP);
  return rng.bytes(rng.chance(0.8) ? 4 : 16);
}

describe('native codec == TypeScript reference', () => {
  for (const format of ['udp', 'vxlan'] as Format[]) {
    it(`${format} encap matches on 5000 random packets`, () => {
      const rng = new Rng(format === 'udp' ? 11 : 12);
      const seen = new Set<string>();
      for (let i = 0; i < 5000; i++) {
        const p = randomPacket(rng);
        const n = native.codecEncap(format, tableBuf, cfg, p);
        const r = js.encap(format, table, cfg, p);
        seen.add(r.drop);
        assert.equal(n.drop, r.drop, `packet ${i} ${p.toString('hex')}`);
        assert.equal(n.peer, r.peer, `packet ${i}`);
        assert.deepEqual(n.payload, r.payload, `packet ${i} payload`);
        assert.deepEqual(n.icmp, r.icmp, `packet ${i} icmp`);
      }
      // The generator must reach the interesting branches, or the comparison proves little.
      for (const d of ['none', 'no_route', 'ttl_expired', 'truncated', 'malformed']) {
        if (format === 'vxlan' && d === 'ttl_expired') continue;
        assert.ok(seen.has(d), `no packet ended as ${d}`);
      }
    });

    it(`${format} decap matches on 5000 random datagrams`, () => {
      const rng = new Rng(format === 'udp' ? 21 : 22);
      const seen = new Set<string>();
      let gso = 0;
      let needsCsum = 0;
      for (let i = 0; i < 5000; i++) {
        const p = randomPacket(rng);
        const d = format === 'vxlan' ? vxlanFrame(rng, p) : p;
        const src = outerSource(rng, p);
        const n = native.codecDecap(format, tableBuf, cfg, src, d);
        const r = js.decap(format, table, cfg, ipFromBytes(src), d);
        seen.add(r.drop);
        assert.equal(n.drop, r.drop, `datagram ${i} ${d.toString('hex')}`);
        assert.deepEqual(n.tun, r.tun, `datagram ${i} tun write`);
        if (r.tun && r.tun[1] !== 0) gso++;
        if (r.tun && r.tun[0] === 1) needsCsum++;
      }
      const want = ['none', 'unknown_source', 'spoofed_source', 'truncated', 'malformed'];
      if (format === 'vxlan') want.push('bad_vni', 'bad_mac', 'bad_ethertype');
      else want.push('ttl_expired');
      for (const d of want) assert.ok(seen.has(d), `no datagram ended as ${d}`);
      assert.ok(gso > 0, 'no oversized TCP packet became a GSO write');
      assert.ok(needsCsum > gso, 'no partial checksum became NEEDS_CSUM');
    });
  }

  it('VXLAN source ports match and stay in the kernel range', () => {
    const rng = new Rng(31);
    const ports = new Set<number>();
    for (let i = 0; i < 3000; i++) {
      const p = randomPacket(rng);
      const n = native.vxlanSourcePort(p);
      assert.equal(n, js.vxlanSourcePort(p), `packet ${i}`);
      if (n >= 0) {
        assert.ok(n >= js.VXLAN_SRC_PORT_MIN && n < js.VXLAN_SRC_PORT_MAX);
        ports.add(n);
      }
    }
    assert.ok(ports.size > 1000, 'source ports do not spread');
  });

  it('checksum matches on random lengths (odd and even, up to 64 KB)', () => {
    const rng = new Rng(41);
    for (let i = 0; i < 500; i++) {
      const b = rng.bytes(i < 100 ? i : rng.int(65536));
      assert.equal(native.checksum(b), js.checksum(b), `length ${b.length}`);
    }
  });

  it('checksum matches on all-ones buffers and unaligned starts (the widest carries)', () => {
    const ones = Buffer.alloc(65535 + 7, 0xff);
    for (const [off, len] of [
      [0, 65535],
      [1, 65534],
      [3, 4097],
      [7, 128],
      [5, 127],
    ] as const) {
      const b = ones.subarray(off, off + len);
      assert.equal(native.checksum(b), js.checksum(b), `offset ${off} length ${len}`);
    }
  });
});

describe('codec behaviour (fixed packets)', () => {
  const rng = new Rng(51);
  const a = (s: string) => ipToBytes(parseIP(s)!);

  it('flannel-udp encap decrements the TTL and keeps the IPv4 header checksum valid', () => {
    const p = makePacket(rng, { src: a('10.9.0.2'), dst: a('10.5.1.7'), proto: 1, ttl: 64 });
    const n = native.codecEncap('udp', tableBuf, cfg, p);
    assert.equal(n.drop, 'none');
    assert.equal(n.peer, 1);
    assert.equal(n.payload![8], 63);
    assert.equal(js.checksum(n.payload!, 0, 20), 0);
  });

  it('VXLAN encap writes 08 00 00 00, VNI<<8, the peer VtepMAC, our VtepMAC, 0x86DD for IPv6', () => {
    const p = makePacket(rng, { src: a('fc00:0:0:9::2'), dst: a('fc00:0:0:2::5'), proto: 17 });
    const n = native.codecEncap('vxlan', tableBuf, { ...cfg, vni: 0x123456 }, p);
    assert.equal(n.drop, 'none');
    assert.equal(n.payload!.subarray(0, 8).toString('hex'), '0800000012345600');
    assert.equal(n.payload!.subarray(8, 14).toString('hex'), '020000000007');
    assert.deepEqual(n.payload!.subarray(14, 20), OUR_MAC);
    assert.equal(n.payload!.readUInt16BE(20), 0x86dd);
    assert.deepEqual(n.payload!.subarray(22), p);
  });

  it('no route answers with ICMP net-unreachable from the original destination', () => {
    const p = makePacket(rng, { src: a('10.9.0.2'), dst: a('10.77.0.1'), proto: 6 });
    const n = native.codecEncap('udp', tableBuf, cfg, p);
    assert.equal(n.drop, 'no_route');
    const icmp = n.icmp!;
    assert.equal(icmp[9], 1);
    assert.deepEqual(icmp.subarray(12, 16), a('10.77.0.1'));
    assert.deepEqual(icmp.subarray(16, 20), a('10.9.0.2'));
    assert.equal(icmp[20], 3);
    assert.equal(icmp[21], 0);
    assert.equal(js.checksum(icmp, 0, 20), 0);
    assert.equal(js.checksum(icmp, 20, icmp.length), 0);
    assert.deepEqual(icmp.subarray(28), p.subarray(0, 28));
  });

  it('an ICMP error with no route gets no ICMP reply', () => {
    const p = makePacket(rng, { src: a('10.9.0.2'), dst: a('10.77.0.1'), proto: 1 });
    p[20] = 3;
    assert.equal(native.codecEncap('udp', tableBuf, cfg, p).icmp, null);
  });

  it('decap drops an inner source outside the sending peer subnet (spoofing)', () => {
    const p = makePacket(rng, { src: a('10.5.2.9'), dst: a('10.9.0.2') });
    assert.equal(
      native.codecDecap('udp', tableBuf, cfg, a('192.168.1.2'), p).drop,
      'spoofed_source',
    );
    assert.equal(native.codecDecap('udp', tableBuf, cfg, a('192.168.1.3'), p).drop, 'none');
    assert.equal(
      native.codecDecap('udp', tableBuf, cfg, a('192.0.2.99'), p).drop,
      'unknown_source',
    );
  });

  it('a 64 KB TCP packet with a partial checksum from a kernel vxlan sender becomes one GSO write', () => {
    const p = makePacket(rng, {
      src: a('10.5.1.9'),
      dst: a('10.9.0.2'),
      proto: 6,
      payloadLen: 64000,
      partial: true,
    });
    const frame = Buffer.concat([
      Buffer.from('0800000000000100', 'hex'),
      OUR_MAC,
      Buffer.alloc(6),
      Buffer.from([8, 0]),
      p,
    ]);
    const n = native.codecDecap('vxlan', tableBuf, cfg, a('192.168.1.2'), frame);
    assert.equal(n.drop, 'none');
    const h = n.tun!;
    const thl = (p[32]! >> 4) * 4;
    assert.equal(h[0], 1, 'NEEDS_CSUM');
    assert.equal(h[1], 1, 'GSO TCPV4');
    assert.equal(h.readUInt16LE(2), 20 + thl, 'hdr_len');
    assert.equal(h.readUInt16LE(4), 1450 - 20 - thl, 'gso_size');
    assert.equal(h.readUInt16LE(6), 20, 'csum_start');
    assert.equal(h.readUInt16LE(8), 16, 'csum_offset');
    assert.deepEqual(h.subarray(10), p);
  });
});
