/**
 * Userspace TSO (native/src/packet.cc SplitTso): a TCP super-packet from a TUN with TUN_F_TSO4/6
 * becomes MSS-sized segments, each a valid packet on its own: IPv4 total length, id + i and
 * header checksum; IPv6 payload length; seq + i·gso_size; FIN/PSH only on the last, CWR only on
 * the first; a full TCP checksum. The payload is cut, not changed.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ipToBytes, parseIP } from '../../src/common/ip.js';
import { loadDataplaneBinding } from '../../src/dataplane/binding.js';
import { checksum, checksumSum } from '../../src/dataplane/js-codec.js';
import { Rng, makePacket } from '../helpers/packets.js';

const native = loadDataplaneBinding();
const a = (s: string) => ipToBytes(parseIP(s)!);

function vnet(gsoType: number, gsoSize: number, csumStart: number, hdrLen = 0): Buffer {
  const h = Buffer.alloc(10);
  h[0] = 1;
  h[1] = gsoType;
  h.writeUInt16LE(hdrLen, 2);
  h.writeUInt16LE(gsoSize, 4);
  h.writeUInt16LE(csumStart, 6);
  h.writeUInt16LE(16, 8);
  return h;
}

function tcpValid(seg: Buffer, l4: number, v6: boolean): boolean {
  const src = v6 ? seg.subarray(8, 24) : seg.subarray(12, 16);
  const dst = v6 ? seg.subarray(24, 40) : seg.subarray(16, 20);
  const len = seg.length - l4;
  let ps = checksumSum(src, 0, src.length);
  ps = checksumSum(dst, 0, dst.length, ps);
  ps += 6 + (len & 0xffff) + Math.floor(len / 0x10000);
  while (ps > 0xffff) ps = (ps & 0xffff) + (ps >>> 16);
  return checksumSum(seg, l4, seg.length, ps) === 0xffff;
}

describe('TSO split', () => {
  for (const v6 of [false, true]) {
    it(`IPv${v6 ? 6 : 4}: segments are valid, contiguous and carry the payload unchanged`, () => {
      const rng = new Rng(v6 ? 61 : 62);
      const pkt = makePacket(rng, {
        src: a(v6 ? 'fc00::1' : '10.5.1.2'),
        dst: a(v6 ? 'fc00::2' : '10.5.2.2'),
        proto: 6,
        payloadLen: 30000,
        partial: true,
      });
      const ipl = v6 ? 40 : 20;
      pkt[ipl + 13] = 0x80 | 0x10 | 0x08 | 0x01; // CWR ACK PSH FIN
      const thl = (pkt[ipl + 12]! >> 4) * 4;
      const mss = 1400;
      // hdr_len deliberately wrong: it must not be trusted.
      const segs = native.tsoSplit(Buffer.concat([vnet(v6 ? 4 : 1, mss, ipl, 7), pkt]));
      const payload = pkt.length - ipl - thl;
      assert.equal(segs.length, Math.ceil(payload / mss));
      const seq0 = pkt.readUInt32BE(ipl + 4);
      const parts: Buffer[] = [];
      segs.forEach((s, i) => {
        const last = i === segs.length - 1;
        if (v6) assert.equal(s.readUInt16BE(4), s.length - 40);
        else {
          assert.equal(s.readUInt16BE(2), s.length);
          assert.equal(s.readUInt16BE(4), (pkt.readUInt16BE(4) + i) & 0xffff);
          assert.equal(checksum(s, 0, 20), 0, 'IPv4 header checksum');
        }
        assert.equal(s.readUInt32BE(ipl + 4), (seq0 + i * mss) >>> 0);
        const f = s[ipl + 13]!;
        assert.equal((f & 0x09) !== 0, last, `FIN/PSH on segment ${i}`);
        assert.equal((f & 0x80) !== 0, i === 0, `CWR on segment ${i}`);
        assert.ok(tcpValid(s, ipl, v6), `TCP checksum of segment ${i}`);
        if (!last) assert.equal(s.length, ipl + thl + mss);
        parts.push(s.subarray(ipl + thl));
      });
      assert.deepEqual(Buffer.concat(parts), pkt.subarray(ipl + thl));
    });
  }

  for (const v6 of [false, true]) {
    it(`IPv${v6 ? 6 : 4}: the in-place split (headers only, payload left in the packet) makes the same segments`, () => {
      const rng = new Rng(v6 ? 63 : 64);
      const pkt = makePacket(rng, {
        src: a(v6 ? 'fc00::1' : '10.5.1.2'),
        dst: a(v6 ? 'fc00::2' : '10.5.2.2'),
        proto: 6,
        payloadLen: 20001, // an odd-length last segment
        partial: true,
      });
      const ipl = v6 ? 40 : 20;
      pkt[ipl + 13] = 0x18; // ACK PSH
      const gso = Buffer.concat([vnet(v6 ? 4 : 1, 1400, ipl), pkt]);
      const copied = native.tsoSplit(gso);
      assert.equal(copied.length, Math.ceil((pkt.length - ipl - 20) / 1400));
      assert.deepEqual(native.tsoSplit(gso, true), copied);
    });
  }

  it('refuses a GSO type that does not match the IP version, and a bad csum_start', () => {
    const rng = new Rng(63);
    const pkt = makePacket(rng, {
      src: a('10.5.1.2'),
      dst: a('10.5.2.2'),
      proto: 6,
      payloadLen: 5000,
    });
    assert.deepEqual(native.tsoSplit(Buffer.concat([vnet(4, 1400, 20), pkt])), []);
    assert.deepEqual(native.tsoSplit(Buffer.concat([vnet(1, 1400, 4990), pkt])), []);
    assert.deepEqual(native.tsoSplit(Buffer.concat([vnet(1, 0, 20), pkt])), []);
    const udp = makePacket(rng, {
      src: a('10.5.1.2'),
      dst: a('10.5.2.2'),
      proto: 17,
      payloadLen: 5000,
    });
    assert.deepEqual(native.tsoSplit(Buffer.concat([vnet(1, 1400, 20), udp])), []);
  });
});

function l4Valid(seg: Buffer, l4: number, v6: boolean, proto: number): boolean {
  const src = v6 ? seg.subarray(8, 24) : seg.subarray(12, 16);
  const dst = v6 ? seg.subarray(24, 40) : seg.subarray(16, 20);
  const len = seg.length - l4;
  let ps = checksumSum(src, 0, src.length);
  ps = checksumSum(dst, 0, dst.length, ps);
  ps += proto + (len & 0xffff) + Math.floor(len / 0x10000);
  while (ps > 0xffff) ps = (ps & 0xffff) + (ps >>> 16);
  return checksumSum(seg, l4, seg.length, ps) === 0xffff;
}

describe('USO split (UDP GSO from the TUN, TUN_F_USO4/6)', () => {
  for (const v6 of [false, true]) {
    it(`IPv${v6 ? 6 : 4}: datagrams of gso_size bytes, each with its length and a valid checksum`, () => {
      const rng = new Rng(v6 ? 81 : 82);
      const pkt = makePacket(rng, {
        src: a(v6 ? 'fc00::1' : '10.5.1.2'),
        dst: a(v6 ? 'fc00::2' : '10.5.2.2'),
        proto: 17,
        payloadLen: 12001, // a shorter last datagram
      });
      const ipl = v6 ? 40 : 20;
      const size = 1200;
      const gso = Buffer.concat([vnet(5, size, ipl), pkt]);
      gso.writeUInt16LE(6, 8); // csum_offset of UDP
      const segs = native.tsoSplit(gso);
      assert.equal(segs.length, Math.ceil(12001 / size));
      const ports = pkt.subarray(ipl, ipl + 4);
      const parts: Buffer[] = [];
      segs.forEach((s, i) => {
        if (v6) assert.equal(s.readUInt16BE(4), s.length - 40);
        else {
          assert.equal(s.readUInt16BE(2), s.length);
          assert.equal(s.readUInt16BE(4), (pkt.readUInt16BE(4) + i) & 0xffff);
          assert.equal(checksum(s, 0, 20), 0, 'IPv4 header checksum');
        }
        assert.deepEqual(s.subarray(ipl, ipl + 4), ports, 'ports');
        assert.equal(s.readUInt16BE(ipl + 4), s.length - ipl, `UDP length of datagram ${i}`);
        assert.notEqual(s.readUInt16BE(ipl + 6), 0, 'a checksum is present');
        assert.ok(l4Valid(s, ipl, v6, 17), `UDP checksum of datagram ${i}`);
        if (i < segs.length - 1) assert.equal(s.length, ipl + 8 + size);
        parts.push(s.subarray(ipl + 8));
      });
      assert.deepEqual(Buffer.concat(parts), pkt.subarray(ipl + 8));
      assert.deepEqual(native.tsoSplit(gso, true), segs, 'the in-place split agrees');
    });
  }

  it('refuses a UDP GSO header on a TCP packet', () => {
    const pkt = makePacket(new Rng(83), {
      src: a('10.5.1.2'),
      dst: a('10.5.2.2'),
      proto: 6,
      payloadLen: 5000,
    });
    assert.deepEqual(native.tsoSplit(Buffer.concat([vnet(5, 1200, 20), pkt])), []);
  });
});

describe('receive-side coalescing (userspace GRO: TCP, and UDP where the TUN has USO)', () => {
  const rng = new Rng(71);
  function train(v6: boolean, payloadLen: number): { pkt: Buffer; segs: Buffer[] } {
    const pkt = makePacket(rng, {
      src: a(v6 ? 'fc00::1' : '10.5.1.2'),
      dst: a(v6 ? 'fc00::2' : '10.5.2.2'),
      proto: 6,
      payloadLen,
      partial: true,
    });
    const ipl = v6 ? 40 : 20;
    pkt[ipl + 13] = 0x18; // ACK PSH
    return { pkt, segs: native.tsoSplit(Buffer.concat([vnet(v6 ? 4 : 1, 1400, ipl), pkt])) };
  }

  for (const v6 of [false, true]) {
    it(`IPv${v6 ? 6 : 4}: one flow's segments become one GSO write that splits back into them`, () => {
      const { segs } = train(v6, 20000);
      const writes = native.groCoalesce(segs, 1500);
      assert.equal(writes.length, 1);
      const w = writes[0]!;
      assert.equal(w[0], 1, 'NEEDS_CSUM');
      assert.equal(w[1], v6 ? 4 : 1, 'GSO type');
      assert.equal(w.readUInt16LE(4), 1400, 'gso_size');
      assert.deepEqual(native.tsoSplit(w), segs);
    });
  }

  it('a sequence gap, another flow or a bad checksum starts a new write', () => {
    const { segs } = train(false, 8000);
    const other = train(false, 3000).segs;
    const bad = Buffer.from(segs[3]!);
    bad[bad.length - 1] = bad[bad.length - 1]! ^ 0xff;
    const writes = native.groCoalesce(
      [segs[0]!, segs[1]!, other[0]!, segs[2]!, bad, segs[5]!],
      1500,
    );
    // [0,1] · other · [2] · bad (plain) · [5] (gap after 2 → new group)
    assert.equal(writes.length, 5);
    assert.equal(writes[0]![1], 1);
    assert.deepEqual(writes[3]!.subarray(10), bad);
    assert.equal(writes[3]![1], 0);
  });

  it('an authenticated segment (opened by WireGuard) joins its group without its checksum summed', () => {
    const { segs } = train(false, 8000);
    const bad = Buffer.from(segs[3]!);
    bad[bad.length - 1] = bad[bad.length - 1]! ^ 0xff;
    const run = [segs[0]!, segs[1]!, segs[2]!, bad, segs[4]!];
    for (const gather of [false, true]) {
      // not authenticated: the bad segment is written alone ([0..2] · bad · [4])
      assert.equal(native.groCoalesce(run, 1500, gather).length, 3);
      // authenticated (as the kernel's WireGuard marks what it decrypts CHECKSUM_UNNECESSARY)
      const writes = native.groCoalesce(run, 1500, gather, false, true);
      assert.equal(writes.length, 1);
      assert.equal(writes[0]![0], 1, 'NEEDS_CSUM');
      assert.equal(native.tsoSplit(writes[0]!).length, run.length);
    }
  });

  it('gathering (later payloads read in place) writes the same bytes as copying', () => {
    const v4 = train(false, 30000).segs;
    const v6 = train(true, 9000).segs;
    const other = train(false, 3000).segs;
    const bad = Buffer.from(v4[3]!);
    bad[bad.length - 1] = bad[bad.length - 1]! ^ 0xff;
    const mixed = [...v4.slice(0, 3), other[0]!, bad, ...v4.slice(4), ...v6, ...other.slice(1)];
    const copied = native.groCoalesce(mixed, 1500);
    assert.ok(copied.length >= 5 && copied.length < mixed.length);
    assert.deepEqual(native.groCoalesce(mixed, 1500, true), copied);
  });

  /** Datagrams of `size` payload bytes, as a pod's UDP GSO send is cut into (IDs id, id + 1, …). */
  function datagrams(v6: boolean, payloadLen: number, size: number, df = false): Buffer[] {
    const pkt = makePacket(rng, {
      src: a(v6 ? 'fc00::1' : '10.5.1.2'),
      dst: a(v6 ? 'fc00::2' : '10.5.2.2'),
      proto: 17,
      payloadLen,
    });
    if (!v6) {
      pkt.writeUInt16BE(df ? 0x4000 : 0, 6);
      pkt.writeUInt16BE(0, 10);
      pkt.writeUInt16BE(checksum(pkt, 0, 20), 10);
    }
    const gso = Buffer.concat([vnet(5, size, v6 ? 40 : 20), pkt]);
    gso.writeUInt16LE(6, 8);
    return native.tsoSplit(gso);
  }

  for (const v6 of [false, true]) {
    it(`IPv${v6 ? 6 : 4}: one flow's UDP datagrams become one USO write that splits back into them`, () => {
      const dgrams = datagrams(v6, 64 * 40 + 10, 64); // 40 full datagrams and a short last one
      for (const gather of [false, true]) {
        const writes = native.groCoalesce(dgrams, 1500, gather, true);
        assert.equal(writes.length, 1);
        const w = writes[0]!;
        assert.equal(w[0], 1, 'NEEDS_CSUM');
        assert.equal(w[1], 5, 'GSO type UDP_L4');
        assert.equal(w.readUInt16LE(2), (v6 ? 40 : 20) + 8, 'hdr_len');
        assert.equal(w.readUInt16LE(4), 64, 'gso_size');
        assert.equal(w.readUInt16LE(8), 6, 'csum_offset');
        assert.deepEqual(native.tsoSplit(w), dgrams);
      }
    });
  }

  it('UDP datagrams are written one by one where the TUN has no USO', () => {
    const dgrams = datagrams(false, 64 * 8, 64);
    const writes = native.groCoalesce(dgrams, 1500, true);
    assert.deepEqual(
      writes.map((w) => w.subarray(10)),
      dgrams,
    );
    assert.ok(writes.every((w) => w[1] === 0));
  });

  it('an IPv4 ID out of sequence (without DF), a zero UDP checksum or a bad one starts a new write', () => {
    const dgrams = datagrams(false, 64 * 12, 64);
    const gap = Buffer.from(dgrams[3]!);
    gap.writeUInt16BE((gap.readUInt16BE(4) + 7) & 0xffff, 4);
    gap.writeUInt16BE(0, 10);
    gap.writeUInt16BE(checksum(gap, 0, 20), 10);
    const zero = Buffer.from(dgrams[6]!);
    zero.writeUInt16BE(0, 26);
    const bad = Buffer.from(dgrams[9]!);
    bad[bad.length - 1] = bad[bad.length - 1]! ^ 0xff;
    const input = [
      ...dgrams.slice(0, 3),
      gap,
      ...dgrams.slice(4, 6),
      zero,
      ...dgrams.slice(7, 9),
      bad,
    ];
    const writes = native.groCoalesce(input, 1500, true, true);
    // [0–2] · [gap] (its successors follow the true sequence) · [4–5] · zero · [7–8] · bad
    assert.deepEqual(
      writes.map((w) => (w[1] === 5 ? (w.length - 38) / 64 : 0)),
      [3, 0, 2, 0, 2, 0],
    );
    assert.deepEqual(writes[3]!.subarray(10), zero);
    assert.deepEqual(writes[5]!.subarray(10), bad);
  });

  it('with DF set, IPv4 IDs need not count up', () => {
    const dgrams = datagrams(false, 64 * 6, 64, true).map((d, i) => {
      const b = Buffer.from(d);
      b.writeUInt16BE(i % 2 ? 0 : 1234, 4);
      b.writeUInt16BE(0, 10);
      b.writeUInt16BE(checksum(b, 0, 20), 10);
      return b;
    });
    const writes = native.groCoalesce(dgrams, 1500, true, true);
    assert.equal(writes.length, 1);
    assert.equal(writes[0]![1], 5);
    const back = native.tsoSplit(writes[0]!);
    assert.deepEqual(
      back.map((d) => d.subarray(20)),
      dgrams.map((d) => d.subarray(20)),
    );
  });

  it('a segment larger than the TUN MTU or without payload is written on its own', () => {
    const { segs } = train(false, 4000);
    const ack = Buffer.from(segs[0]!.subarray(0, 40));
    ack.writeUInt16BE(40, 2);
    ack.writeUInt16BE(0, 10);
    ack.writeUInt16BE(checksum(ack, 0, 20), 10);
    const writes = native.groCoalesce([ack, ...segs], 1000);
    assert.equal(writes.length, 1 + segs.length);
  });
});
