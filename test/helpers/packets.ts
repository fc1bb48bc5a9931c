/**
 * Random inner packets and peer tables for the codec tests and the fuzz corpus: valid IPv4/IPv6
 * headers with correct checksums (TCP, UDP, ICMP, ICMPv6, other), some with the TCP/UDP checksum
 * left partial (as a same-host kernel vxlan sender leaves it), some larger than the TUN MTU, and
 * a share of deliberately broken ones. Deterministic for a given seed.
 */
import { checksum, checksumSum } from '../../src/dataplane/js-codec.js';

/** xorshift32: small, fast, seedable. */
export class Rng {
  #s: number;
  constructor(seed: number) {
    this.#s = seed >>> 0 || 1;
  }
  u32(): number {
    let x = this.#s;
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    this.#s = x >>> 0;
    return this.#s;
  }
  int(n: number): number {
    return this.u32() % n;
  }
  chance(p: number): boolean {
    return this.u32() / 2 ** 32 < p;
  }
  bytes(n: number): Buffer {
    const b = Buffer.alloc(n);
    for (let i = 0; i < n; i++) b[i] = this.u32() & 0xff;
    return b;
  }
  pick<T>(xs: readonly T[]): T {
    return xs[this.int(xs.length)]!;
  }
}

function pseudo(src: Buffer, dst: Buffer, proto: number, len: number): number {
  let s = checksumSum(src, 0, src.length);
  s = checksumSum(dst, 0, dst.length, s);
  s += proto + (len & 0xffff) + Math.floor(len / 0x10000);
  while (s > 0xffff) s = (s & 0xffff) + (s >>> 16);
  return s;
}

export interface PacketOptions {
  readonly src: Buffer; // 4 or 16 bytes
  readonly dst: Buffer;
  readonly proto?: number;
  readonly payloadLen?: number;
  readonly ttl?: number;
  /** Leave the TCP/UDP checksum field holding the pseudo-header sum. */
  readonly partial?: boolean;
}

/** A well-formed IP packet. */
export function makePacket(rng: Rng, o: PacketOptions): Buffer {
  const v6 = o.src.length === 16;
  const proto = o.proto ?? rng.pick(v6 ? [6, 17, 58, 47] : [6, 17, 1, 47]);
  const l4h =
    proto === 6 ? 20 + 4 * rng.int(3) : proto === 17 || proto === 1 || proto === 58 ? 8 : 0;
  const payloadLen = o.payloadLen ?? rng.int(1400);
  const l4 = Buffer.concat([Buffer.alloc(l4h), rng.bytes(payloadLen)]);
  if (proto === 6) {
    rng.bytes(12).copy(l4, 0);
    l4[12] = (l4h / 4) << 4;
    l4[13] = rng.pick([0x10, 0x18, 0x02, 0x11]);
    l4.writeUInt16BE(rng.int(65536), 14);
    l4.writeUInt16BE(0, 16);
  } else if (proto === 17) {
    rng.bytes(4).copy(l4, 0);
    l4.writeUInt16BE(l4.length, 4);
    l4.writeUInt16BE(0, 6);
  } else if (proto === 1 || proto === 58) {
    l4[0] = rng.pick(proto === 1 ? [8, 0, 3, 11] : [128, 129, 1, 3]);
    l4[1] = 0;
    l4.writeUInt16BE(0, 2);
  }
  const hl = v6 ? 40 : 20;
  const h = Buffer.alloc(hl);
  const ttl = o.ttl ?? 1 + rng.int(255);
  if (v6) {
    h[0] = 0x60;
    h.writeUInt16BE(l4.length, 4);
    h[6] = proto;
    h[7] = ttl;
    o.src.copy(h, 8);
    o.dst.copy(h, 24);
  } else {
    h[0] = 0x45;
    h[1] = rng.int(256) & 0xfc;
    h.writeUInt16BE(hl + l4.length, 2);
    h.writeUInt16BE(rng.int(65536), 4);
    h.writeUInt16BE(rng.chance(0.5) ? 0x4000 : 0, 6);
    h[8] = ttl;
    h[9] = proto;
    o.src.copy(h, 12);
    o.dst.copy(h, 16);
    h.writeUInt16BE(checksum(h), 10);
  }
  const csumOff = proto === 6 ? 16 : proto === 17 ? 6 : proto === 1 || proto === 58 ? 2 : -1;
  if (csumOff >= 0) {
    const ps = proto === 1 ? 0 : pseudo(o.src, o.dst, proto, l4.length);
    if (o.partial && (proto === 6 || proto === 17)) {
      l4.writeUInt16BE(ps, csumOff);
    } else {
      let c = checksum(l4, 0, l4.length, ps);
      if (proto === 17 && c === 0) c = 0xffff;
      l4.writeUInt16BE(c, csumOff);
    }
  }
  return Buffer.concat([h, l4]);
}

/** Breaks a packet in one of several ways (or returns random bytes). */
export function corrupt(rng: Rng, p: Buffer): Buffer {
  const b = Buffer.from(p);
  switch (rng.int(6)) {
    case 0:
      return b.subarray(0, rng.int(b.length));
    case 1:
      b[0] = (rng.int(16) << 4) | (b[0]! & 0x0f);
      return b;
    case 2:
      b[0] = (b[0]! & 0xf0) | rng.int(16);
      return b;
    case 3:
      b.writeUInt16BE(rng.int(65536), b[0]! >> 4 === 6 ? 4 : 2);
      return b;
    case 4:
      return Buffer.concat([b, rng.bytes(rng.int(16))]);
    default:
      return rng.bytes(rng.int(80));
  }
}
