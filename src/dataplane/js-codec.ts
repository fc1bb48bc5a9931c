/**
 * The reference codec: flannel-udp, VXLAN and IPIP per packet in plain TypeScript, the same
 * formats and the same decisions as native/src (flannel_udp.cc, vxlan.cc, ipip.cc, codec.cc,
 * packet.cc). The js engine runs on it (udp and vxlan: Node has no raw sockets for IPIP), and
 * test/native/codec.test.ts proves the native codec equal to it byte for byte.
 * Results use the same drop reason names as the native engine (DROP_REASONS).
 */
import { ipFromBytes, ipToBytes } from '../common/ip.js';
import type { IP } from '../common/ip.js';
import type { DropReason } from './stats.js';
import type { DecodedPeer, JsPeerTable } from './peer-table.js';

export const VNET_HDR_LEN = 10;
export const VXLAN_HDR_LEN = 8;
export const ETH_HDR_LEN = 14;
export const VXLAN_ENCAP_LEN = VXLAN_HDR_LEN + ETH_HDR_LEN;
export const MAX_UDP_PAYLOAD = 65507;
export const ICMP_REPLY_MAX = 1280;
export const VXLAN_SRC_PORT_MIN = 32768;
export const VXLAN_SRC_PORT_MAX = 61000;
/** The outer IPv4 header IPIP adds (RFC 2003; native/src/ipip.h states every field's value). */
export const IPIP_HDR_LEN = 20;
export const PROTO_IPIP = 4;
const VNET_F_NEEDS_CSUM = 1;
const VNET_GSO_TCPV4 = 1;
const VNET_GSO_TCPV6 = 4;
const PROTO_ICMP = 1;
const PROTO_TCP = 6;
const PROTO_UDP = 17;
const PROTO_ICMPV6 = 58;

export type Format = 'udp' | 'vxlan' | 'ipip';

export interface CodecConfig {
  readonly vni: number;
  /** Our VtepMAC (6 bytes); unused by flannel-udp. */
  readonly vtepMac: Uint8Array;
  readonly tunMtu: number;
  /** IPIP: our IPv4 address (4 bytes), the outer source; absent = 0.0.0.0. */
  readonly localIp?: Uint8Array;
}

/** Bytes a framing writes before the inner packet (native EncapHeadroom). */
export function encapHeadroom(format: Format): number {
  return format === 'vxlan' ? VXLAN_ENCAP_LEN : format === 'ipip' ? IPIP_HDR_LEN : 0;
}

export interface EncapOutcome {
  readonly drop: DropReason;
  /** Index of the destination peer record; null when dropped. */
  readonly peer: number | null;
  /** The UDP payload to send (IPIP: the whole outer IPv4 packet); null when dropped. */
  readonly payload: Buffer | null;
  /** An ICMP unreachable to write back into the TUN, or null. */
  readonly icmp: Buffer | null;
}

export interface DecapOutcome {
  readonly drop: DropReason;
  /** virtio_net_hdr (10 bytes) + the inner packet, as written to the TUN; null when dropped. */
  readonly tun: Buffer | null;
}

interface IpInfo {
  readonly version: 4 | 6;
  readonly proto: number;
  readonly l4Off: number;
  readonly len: number;
  readonly srcOff: number;
  readonly dstOff: number;
  readonly addrLen: 4 | 16;
}

// ---- checksums ----

function fold(sum: number): number {
  while (sum > 0xffff) sum = (sum & 0xffff) + Math.floor(sum / 0x10000);
  return sum;
}

/** Ones'-complement sum of big-endian 16-bit words, plus `initial`, folded; not inverted. */
export function checksumSum(b: Uint8Array, start: number, end: number, initial = 0): number {
  let sum = initial;
  let i = start;
  for (; i + 1 < end; i += 2) {
    sum += (b[i]! << 8) | b[i + 1]!;
    if (sum > 0x3fffffff) sum = fold(sum);
  }
  if (i < end) sum += b[i]! << 8;
  return fold(sum);
}

export function checksum(b: Uint8Array, start = 0, end = b.length, initial = 0): number {
  return ~checksumSum(b, start, end, initial) & 0xffff;
}

function pseudoHeaderSum(b: Uint8Array, ip: IpInfo, l4Len: number): number {
  let sum = checksumSum(b, ip.srcOff, ip.srcOff + ip.addrLen);
  sum = checksumSum(b, ip.dstOff, ip.dstOff + ip.addrLen, sum);
  if (ip.addrLen === 4) sum += ip.proto + (l4Len & 0xffff);
  else sum += Math.floor(l4Len / 0x10000) + (l4Len & 0xffff) + ip.proto;
  return fold(sum);
}

/** The pseudo-header sum (folded, not inverted) of an L4 segment from `src` to `dst`. */
export function pseudoSumFor(
  src: Uint8Array,
  dst: Uint8Array,
  proto: number,
  l4Len: number,
): number {
  let sum = checksumSum(src, 0, src.length);
  sum = checksumSum(dst, 0, dst.length, sum);
  if (src.length === 4) sum += proto + (l4Len & 0xffff);
  else sum += Math.floor(l4Len / 0x10000) + (l4Len & 0xffff) + proto;
  return fold(sum);
}

/** RFC 1624 eqn. 3. */
function checksumUpdate16(check: number, oldWord: number, newWord: number): number {
  return ~fold((~check & 0xffff) + (~oldWord & 0xffff) + newWord) & 0xffff;
}

// ---- IP ----

function parseIp(b: Buffer, off: number, avail: number): IpInfo | DropReason {
  if (avail < 1) return 'truncated';
  const version = b[off]! >> 4;
  if (version === 4) {
    if (avail < 20) return 'truncated';
    const ihl = (b[off]! & 0x0f) * 4;
    const tot = b.readUInt16BE(off + 2);
    if (ihl < 20 || tot < ihl) return 'malformed';
    if (tot > avail) return 'truncated';
    return {
      version: 4,
      proto: b[off + 9]!,
      l4Off: ihl,
      len: tot,
      srcOff: off + 12,
      dstOff: off + 16,
      addrLen: 4,
    };
  }
  if (version === 6) {
    if (avail < 40) return 'truncated';
    const tot = 40 + b.readUInt16BE(off + 4);
    if (tot > avail) return 'truncated';
    return {
      version: 6,
      proto: b[off + 6]!,
      l4Off: 40,
      len: tot,
      srcOff: off + 8,
      dstOff: off + 24,
      addrLen: 16,
    };
  }
  return 'malformed';
}

function addrAt(b: Buffer, off: number, len: number): IP {
  return ipFromBytes(b.subarray(off, off + len));
}

function decrementTtl(b: Buffer, off: number, ip: IpInfo): boolean {
  if (ip.version === 4) {
    if (b[off + 8]! <= 1) return false;
    const oldWord = b.readUInt16BE(off + 8);
    b[off + 8] = b[off + 8]! - 1;
    const newWord = b.readUInt16BE(off + 8);
    b.writeUInt16BE(checksumUpdate16(b.readUInt16BE(off + 10), oldWord, newWord), off + 10);
    return true;
  }
  if (b[off + 7]! <= 1) return false;
  b[off + 7] = b[off + 7]! - 1;
  return true;
}

function checkSource(table: JsPeerTable, outerSrc: IP, b: Buffer, ip: IpInfo): DropReason {
  const peer = table.lookup(addrAt(b, ip.srcOff, ip.addrLen));
  if (peer && peer.publicIP.family === outerSrc.family && peer.publicIP.addr === outerSrc.addr) {
    return 'none';
  }
  if (!table.hasPublic(outerSrc)) return 'unknown_source';
  return 'spoofed_source';
}

/** The ICMP net-unreachable (v4) / no-route (v6) reply to the packet at `off`, or null. */
function buildNetUnreachable(b: Buffer, off: number, ip: IpInfo): Buffer | null {
  const l4Len = ip.len - ip.l4Off;
  const src = b.subarray(ip.srcOff, ip.srcOff + ip.addrLen);
  const dst = b.subarray(ip.dstOff, ip.dstOff + ip.addrLen);
  if (ip.version === 4) {
    if ((b.readUInt16BE(off + 6) & 0x1fff) !== 0) return null;
    if (src.every((x) => x === 0) || src[0]! >= 224 || dst[0]! >= 224) return null;
    if (ip.proto === PROTO_ICMP) {
      if (l4Len < 1) return null;
      if ([3, 4, 5, 11, 12].includes(b[off + ip.l4Off]!)) return null;
    }
    const quoted = ip.l4Off + Math.min(l4Len, 8);
    const out = Buffer.alloc(28 + quoted);
    out[0] = 0x45;
    out.writeUInt16BE(out.length, 2);
    out[8] = 64;
    out[9] = PROTO_ICMP;
    dst.copy(out, 12);
    src.copy(out, 16);
    out.writeUInt16BE(checksum(out, 0, 20), 10);
    out[20] = 3;
    out[21] = 0;
    b.copy(out, 28, off, off + quoted);
    out.writeUInt16BE(checksum(out, 20, out.length), 22);
    return out;
  }
  if (src.every((x) => x === 0) || src[0] === 0xff || dst[0] === 0xff) return null;
  if (ip.proto === PROTO_ICMPV6) {
    if (l4Len < 1) return null;
    if (b[off + ip.l4Off]! < 128) return null;
  }
  const quoted = Math.min(ip.len, ICMP_REPLY_MAX - 48);
  const out = Buffer.alloc(48 + quoted);
  out[0] = 0x60;
  out.writeUInt16BE(8 + quoted, 4);
  out[6] = PROTO_ICMPV6;
  out[7] = 64;
  dst.copy(out, 8);
  src.copy(out, 24);
  out[40] = 1;
  out[41] = 0;
  b.copy(out, 48, off, off + quoted);
  const pseudo = pseudoSumFor(out.subarray(8, 24), out.subarray(24, 40), PROTO_ICMPV6, 8 + quoted);
  out.writeUInt16BE(checksum(out, 40, out.length, pseudo), 42);
  return out;
}

/** The virtio_net_hdr for writing the packet at `off` into the TUN (see PrepareTunWrite). */
function prepareTunWrite(b: Buffer, off: number, ip: IpInfo, tunMtu: number): Buffer {
  const h = Buffer.alloc(VNET_HDR_LEN);
  if (ip.proto !== PROTO_TCP && ip.proto !== PROTO_UDP) return h;
  if (ip.version === 4 && (b.readUInt16BE(off + 6) & 0x3fff) !== 0) return h;
  const l4Len = ip.len - ip.l4Off;
  const csumOff = ip.proto === PROTO_TCP ? 16 : 6;
  if (l4Len < (ip.proto === PROTO_TCP ? 20 : 8)) return h;
  const l4 = off + ip.l4Off;
  const field = b.readUInt16BE(l4 + csumOff);
  if (ip.proto === PROTO_UDP && ip.version === 4 && field === 0) return h;
  const pseudo = pseudoHeaderSum(b, ip, l4Len);
  const gso = ip.proto === PROTO_TCP && ip.len > tunMtu;
  if (field !== pseudo && !gso) return h;
  const valid = checksumSum(b, l4, l4 + l4Len, pseudo) === 0xffff;
  const partial = field === pseudo && !valid;
  if (gso) {
    const thl = (b[l4 + 12]! >> 4) * 4;
    if (thl < 20 || thl > l4Len) return h;
    if (!partial && !valid) return h;
    const hdrs = ip.l4Off + thl;
    if (tunMtu <= hdrs) return h;
    b.writeUInt16BE(pseudo, l4 + csumOff);
    h[0] = VNET_F_NEEDS_CSUM;
    h[1] = ip.version === 4 ? VNET_GSO_TCPV4 : VNET_GSO_TCPV6;
    h.writeUInt16LE(hdrs, 2);
    h.writeUInt16LE(tunMtu - hdrs, 4);
    h.writeUInt16LE(ip.l4Off, 6);
    h.writeUInt16LE(csumOff, 8);
    return h;
  }
  if (partial) {
    h[0] = VNET_F_NEEDS_CSUM;
    h.writeUInt16LE(ip.l4Off, 6);
    h.writeUInt16LE(csumOff, 8);
  }
  return h;
}

// ---- the codecs ----

function dropped(drop: DropReason, icmp: Buffer | null = null): EncapOutcome {
  return { drop, peer: null, payload: null, icmp };
}

/** TUN → UDP for one inner packet (not modified; the result is a copy). */
export function encap(
  format: Format,
  table: JsPeerTable,
  cfg: CodecConfig,
  packet: Uint8Array,
): EncapOutcome {
  const vx = format === 'vxlan';
  const head = encapHeadroom(format);
  const b = Buffer.alloc(head + packet.length);
  b.set(packet, head);
  const ip = parseIp(b, head, packet.length);
  if (typeof ip === 'string') return dropped(ip);
  if (ip.len + head > (format === 'ipip' ? 0xffff : MAX_UDP_PAYLOAD)) return dropped('oversized');
  const peer: DecodedPeer | null =
    format === 'ipip' && ip.version !== 4 ? null : table.lookup(addrAt(b, ip.dstOff, ip.addrLen));
  if (!peer || (vx && !peer.vtepMac) || (format === 'ipip' && peer.publicIP.family !== 4))
    return dropped('no_route', buildNetUnreachable(b, head, ip));
  if (format === 'ipip') {
    writeIpipHeader(b, peer, cfg);
  } else if (vx) {
    b[0] = 0x08;
    b[4] = (cfg.vni >> 16) & 0xff;
    b[5] = (cfg.vni >> 8) & 0xff;
    b[6] = cfg.vni & 0xff;
    peer.vtepMac!.copy(b, 8);
    b.set(cfg.vtepMac.subarray(0, 6), 14);
    b.writeUInt16BE(ip.version === 4 ? 0x0800 : 0x86dd, 20);
  } else if (!decrementTtl(b, 0, ip)) {
    return dropped('ttl_expired');
  }
  return { drop: 'none', peer: peer.index, payload: b.subarray(0, head + ip.len), icmp: null };
}

/**
 * The outer IPIP header at b[0..20) for the IPv4 packet at b[20..): as the kernel's flannel.ipip
 * device (ttl inherit, tos 0, nopmtudisc) sends it: TTL and DF of the inner packet, DSCP 0 and
 * the inner ECN (CE sent as ECT(0)), ID 0 (the kernel picks one), our address → the peer's.
 */
function writeIpipHeader(b: Buffer, peer: DecodedPeer, cfg: CodecConfig): void {
  const ecn = b[IPIP_HDR_LEN + 1]! & 3;
  b[0] = 0x45;
  b[1] = ecn === 3 ? 2 : ecn;
  b.writeUInt16BE(IPIP_HDR_LEN + b.readUInt16BE(IPIP_HDR_LEN + 2), 2);
  b[6] = b[IPIP_HDR_LEN + 6]! & 0x40;
  b[8] = b[IPIP_HDR_LEN + 8]!;
  b[9] = PROTO_IPIP;
  if (cfg.localIp) b.set(cfg.localIp.subarray(0, 4), 12);
  ipToBytes(peer.publicIP).copy(b, 16);
  b.writeUInt16BE(checksum(b, 0, IPIP_HDR_LEN), 10);
}

/**
 * UDP → TUN for one datagram from `outerSrc` (not modified; the result is a copy). A source that
 * holds no lease is dropped before anything is parsed. IPIP: `datagram` is the whole IPv4 packet
 * a raw socket returns (outer header first).
 */
export function decap(
  format: Format,
  table: JsPeerTable,
  cfg: CodecConfig,
  outerSrc: IP,
  datagram: Uint8Array,
): DecapOutcome {
  if (!table.hasPublic(outerSrc)) return { drop: 'unknown_source', tun: null };
  const b = Buffer.from(datagram);
  let off = 0;
  if (format === 'vxlan') {
    if (b.length < VXLAN_HDR_LEN) return { drop: 'truncated', tun: null };
    if (b[0] !== 0x08 || b[1] !== 0 || b[2] !== 0 || b[3] !== 0 || b[7] !== 0) {
      return { drop: 'malformed', tun: null };
    }
    const vni = (b[4]! << 16) | (b[5]! << 8) | b[6]!;
    if (vni !== cfg.vni) return { drop: 'bad_vni', tun: null };
    if (b.length < VXLAN_ENCAP_LEN) return { drop: 'truncated', tun: null };
    if (!b.subarray(8, 14).equals(Buffer.from(cfg.vtepMac.subarray(0, 6))))
      return { drop: 'bad_mac', tun: null };
    const type = b.readUInt16BE(20);
    if (type !== 0x0800 && type !== 0x86dd) return { drop: 'bad_ethertype', tun: null };
    off = VXLAN_ENCAP_LEN;
    const ip = parseIp(b, off, b.length - off);
    if (typeof ip === 'string') return { drop: ip, tun: null };
    if (ip.version !== (type === 0x0800 ? 4 : 6)) return { drop: 'malformed', tun: null };
    return finishDecap(b, off, ip, table, cfg, outerSrc, false);
  }
  if (format === 'ipip') return decapIpip(b, table, cfg, outerSrc);
  const ip = parseIp(b, 0, b.length);
  if (typeof ip === 'string') return { drop: ip, tun: null };
  return finishDecap(b, 0, ip, table, cfg, outerSrc, true);
}

/** IPIP receive (native IpipDecap): outer IPv4 protocol 4, inner IPv4, ECN decapsulation. */
function decapIpip(b: Buffer, table: JsPeerTable, cfg: CodecConfig, outerSrc: IP): DecapOutcome {
  const outer = parseIp(b, 0, b.length);
  if (typeof outer === 'string') return { drop: outer, tun: null };
  if (outer.version !== 4 || outer.proto !== PROTO_IPIP) return { drop: 'malformed', tun: null };
  const off = outer.l4Off;
  const ip = parseIp(b, off, outer.len - off);
  if (typeof ip === 'string') return { drop: ip, tun: null };
  if (ip.version !== 4) return { drop: 'malformed', tun: null };
  const src = checkSource(table, outerSrc, b, ip);
  if (src !== 'none') return { drop: src, tun: null };
  if ((b[1]! & 3) === 3) {
    const ecn = b[off + 1]! & 3;
    if (ecn === 0) return { drop: 'malformed', tun: null };
    if (ecn !== 3) {
      const oldWord = b.readUInt16BE(off);
      b[off + 1] = b[off + 1]! | 3;
      const check = checksumUpdate16(b.readUInt16BE(off + 10), oldWord, b.readUInt16BE(off));
      b.writeUInt16BE(check, off + 10);
    }
  }
  const h = prepareTunWrite(b, off, ip, cfg.tunMtu);
  return { drop: 'none', tun: Buffer.concat([h, b.subarray(off, off + ip.len)]) };
}

function finishDecap(
  b: Buffer,
  off: number,
  ip: IpInfo,
  table: JsPeerTable,
  cfg: CodecConfig,
  outerSrc: IP,
  ttl: boolean,
): DecapOutcome {
  const src = checkSource(table, outerSrc, b, ip);
  if (src !== 'none') return { drop: src, tun: null };
  if (ttl && !decrementTtl(b, off, ip)) return { drop: 'ttl_expired', tun: null };
  const h = prepareTunWrite(b, off, ip, cfg.tunMtu);
  return { drop: 'none', tun: Buffer.concat([h, b.subarray(off, off + ip.len)]) };
}

/** The flow-hashed VXLAN outer source port (FNV-1a), or -1 when the packet does not parse. */
export function vxlanSourcePort(packet: Uint8Array): number {
  const b = Buffer.from(packet.buffer, packet.byteOffset, packet.byteLength);
  const ip = parseIp(b, 0, b.length);
  if (typeof ip === 'string') return -1;
  let h = 0x811c9dc5;
  const mix = (start: number, end: number) => {
    for (let i = start; i < end; i++) {
      h ^= b[i]!;
      h = Math.imul(h, 16777619) >>> 0;
    }
  };
  mix(ip.srcOff, ip.srcOff + ip.addrLen);
  mix(ip.dstOff, ip.dstOff + ip.addrLen);
  h ^= ip.proto;
  h = Math.imul(h, 16777619) >>> 0;
  const firstFragment = ip.version === 6 || (b.readUInt16BE(6) & 0x1fff) === 0;
  if (
    (ip.proto === PROTO_TCP || ip.proto === PROTO_UDP) &&
    firstFragment &&
    ip.len >= ip.l4Off + 4
  ) {
    mix(ip.l4Off, ip.l4Off + 4);
  }
  const range = VXLAN_SRC_PORT_MAX - VXLAN_SRC_PORT_MIN;
  return VXLAN_SRC_PORT_MIN + Math.floor((h * range) / 2 ** 32);
}
