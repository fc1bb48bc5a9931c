/**
 * The native codec (native/src: flannel_udp, vxlan, packet, checksum) against the TypeScript
 * reference (src/dataplane/js-codec.ts), byte for byte, on thousands of random packets, IPv4 and
 * IPv6, valid and broken, both directions, both formats.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ipFromBytes, ipToBytes, parseIP } from '../../src/common/ip.js';
import { loadDataplaneBinding } from '../../src/dataplane/binding.js';
import * as js from '../../src/dataplane/js-codec.js';
import type { Format } from '../../src/dataplane/js-codec.js';
import { Rng, makePacket } from '../helpers/packets.js';
import {
  OUR_MAC,
  LOCAL_IP,
  cfg,
  ipipFrame,
  outerSource,
  randomPacket,
  table,
  tableBuf,
  vxlanFrame,
} from '../helpers/codec-corpus.js';

const native = loadDataplaneBinding();
describe('native codec == TypeScript reference', () => {
  const seed: Record<Format, number> = { udp: 1, vxlan: 2, ipip: 3 };
  for (const format of ['udp', 'vxlan', 'ipip'] as Format[]) {
    it(`${format} encap matches on 5000 random packets`, () => {
      const rng = new Rng(10 + seed[format]);
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
        if (format !== 'udp' && d === 'ttl_expired') continue;
        assert.ok(seen.has(d), `no packet ended as ${d}`);
      }
    });

    it(`${format} decap matches on 5000 random datagrams`, () => {
      const rng = new Rng(20 + seed[format]);
      const seen = new Set<string>();
      let gso = 0;
      let needsCsum = 0;
      for (let i = 0; i < 5000; i++) {
        const p = randomPacket(rng);
        const d =
          format === 'vxlan' ? vxlanFrame(rng, p) : format === 'ipip' ? ipipFrame(rng, p) : p;
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
      else if (format === 'udp') want.push('ttl_expired');
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

describe('IPIP framing (RFC 2003, as the kernel flannel.ipip device sends it)', () => {
  const rng = new Rng(61);
  const a = (s: string) => ipToBytes(parseIP(s)!);
  const withTos = (p: Buffer, tos: number, df: boolean) => {
    const q = Buffer.from(p);
    q[1] = tos;
    q.writeUInt16BE(df ? 0x4000 : 0, 6);
    q.writeUInt16BE(0, 10);
    q.writeUInt16BE(js.checksum(q, 0, 20), 10);
    return q;
  };

  it('encap: 45, DSCP 0 + inner ECN, length, ID 0, inner DF, inner TTL, protocol 4, our address → the peer', () => {
    for (const [tos, df, ecn] of [
      [0xb8 | 1, true, 1],
      [0x20 | 2, false, 2],
      [0xfc | 3, true, 2], // CE is sent as ECT(0)
      [0, false, 0],
    ] as const) {
      const inner = withTos(
        makePacket(rng, { src: a('10.9.0.2'), dst: a('10.5.1.7'), proto: 6, ttl: 37 }),
        tos,
        df,
      );
      for (const out of [
        native.codecEncap('ipip', tableBuf, cfg, inner),
        js.encap('ipip', table, cfg, inner),
      ]) {
        assert.equal(out.drop, 'none');
        const o = out.payload!;
        assert.equal(o[0], 0x45);
        assert.equal(o[1], ecn);
        assert.equal(o.readUInt16BE(2), 20 + inner.length);
        assert.equal(o.readUInt16BE(4), 0);
        assert.equal(o.readUInt16BE(6), df ? 0x4000 : 0);
        assert.equal(o[8], 37);
        assert.equal(o[9], 4);
        assert.equal(js.checksum(o, 0, 20), 0);
        assert.deepEqual(o.subarray(12, 16), LOCAL_IP);
        assert.deepEqual(o.subarray(16, 20), a('192.168.1.2'));
        assert.deepEqual(o.subarray(20), inner, 'the inner packet goes unchanged (TTL too)');
      }
    }
  });

  it('encap: IPv6 cannot ride IPIP (no route, ICMPv6 back); a peer reached over IPv6 neither', () => {
    const v6 = makePacket(rng, { src: a('fc00:0:0:9::2'), dst: a('fc00:0:0:1::5'), proto: 17 });
    const n = native.codecEncap('ipip', tableBuf, cfg, v6);
    assert.equal(n.drop, 'no_route');
    assert.equal(n.icmp![6], 58);
  });

  it('decap: the inner packet unchanged, TTL kept; outer CE marks an ECT packet CE, drops a not-ECT one', () => {
    const src = a('192.168.1.2');
    const frame = (inner: Buffer, outerTos: number) => {
      const h = Buffer.alloc(20);
      h[0] = 0x45;
      h[1] = outerTos;
      h.writeUInt16BE(20 + inner.length, 2);
      h[8] = 12;
      h[9] = 4;
      return Buffer.concat([h, inner]);
    };
    const inner = withTos(
      makePacket(rng, { src: a('10.5.1.9'), dst: a('10.9.0.2'), proto: 1, ttl: 9 }),
      0x28 | 2,
      true,
    );
    for (const r of [
      native.codecDecap('ipip', tableBuf, cfg, src, frame(inner, 0)),
      js.decap('ipip', table, cfg, parseIP('192.168.1.2')!, frame(inner, 0)),
    ]) {
      assert.equal(r.drop, 'none');
      assert.deepEqual(r.tun!.subarray(10), inner);
    }
    for (const r of [
      native.codecDecap('ipip', tableBuf, cfg, src, frame(inner, 3)),
      js.decap('ipip', table, cfg, parseIP('192.168.1.2')!, frame(inner, 3)),
    ]) {
      assert.deepEqual(r.tun!.subarray(10), withTos(inner, 0x28 | 3, true));
    }
    const notEct = withTos(inner, 0x28, true);
    assert.equal(native.codecDecap('ipip', tableBuf, cfg, src, frame(notEct, 3)).drop, 'malformed');
    assert.equal(
      js.decap('ipip', table, cfg, parseIP('192.168.1.2')!, frame(notEct, 3)).drop,
      'malformed',
    );
  });
});
