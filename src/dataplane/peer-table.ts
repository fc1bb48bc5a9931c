/**
 * The peer table as it crosses into the native engine: ONE buffer of fixed-size records, built
 * on every lease change and swapped whole (the packet loop never sees a partial table). The
 * layout mirrors native/src/peer_table.h byte for byte:
 *
 *   0  u8      subnet family (4 | 6)          16 u8[16]  subnet address (IPv4: first 4 bytes)
 *   1  u8      subnet prefix length           32 u8[16]  peer public address (IPv4: first 4)
 *   2  u8      flags (bit 0: VtepMAC set)     48 u8[16]  reserved, zero
 *   3  u8      public address family
 *   4  u16 BE  peer UDP port
 *   6  u8[6]   peer VtepMAC
 *   12 u8[4]   reserved, zero
 *
 * `JsPeerTable` decodes the same buffer for the js engine and as the reference the native
 * longest-prefix match is tested against.
 *
 * A change to a table travels as a `PeerDelta`, two buffers of the same records: the subnets of
 * `removed` leave the table, then each record of `upserts` is added or replaces the record of its
 * subnet (`applyPeerDelta` is the reference; the native engine applies it in place).
 */
import { WeftError } from '../common/errors.js';
import { ipFromBytes, ipToBytes, maskOf, parseCIDR, parseIP } from '../common/ip.js';
import type { IP, IPNet } from '../common/ip.js';

export const PEER_RECORD_SIZE = 64;
export const PEER_FLAG_VTEP_MAC = 1;

export interface PeerEntry {
  readonly subnet: IPNet;
  readonly publicIP: IP;
  readonly port: number;
  /** 6 bytes; null for a peer that does not speak VXLAN. */
  readonly vtepMac: Uint8Array | null;
}

/** Parses `aa:bb:cc:dd:ee:ff`; null when it is not a MAC address. */
export function parseMac(text: string): Buffer | null {
  if (!/^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$/.test(text)) return null;
  return Buffer.from(text.split(':').map((h) => parseInt(h, 16)));
}

export function formatMac(mac: Uint8Array): string {
  return [...mac].map((b) => b.toString(16).padStart(2, '0')).join(':');
}

function writeAddr(buf: Buffer, off: number, ip: IP): void {
  ipToBytes(ip).copy(buf, off);
}

export function encodePeerTable(entries: readonly PeerEntry[]): Buffer {
  const buf = Buffer.alloc(entries.length * PEER_RECORD_SIZE);
  entries.forEach((e, i) => {
    const o = i * PEER_RECORD_SIZE;
    buf[o] = e.subnet.family;
    buf[o + 1] = e.subnet.prefix;
    buf[o + 2] = e.vtepMac ? PEER_FLAG_VTEP_MAC : 0;
    buf[o + 3] = e.publicIP.family;
    buf.writeUInt16BE(e.port, o + 4);
    if (e.vtepMac) Buffer.from(e.vtepMac).copy(buf, o + 6, 0, 6);
    writeAddr(buf, o + 16, e.subnet);
    writeAddr(buf, o + 32, e.publicIP);
  });
  return buf;
}

/** A change to a peer table (records in the layout above; `removed` is read for subnets only). */
export interface PeerDelta {
  readonly removed: Buffer;
  readonly upserts: Buffer;
}

/**
 * The subnet of the record at `off` as a map key: family, prefix and the address with its host
 * bits cleared (as the engines canonicalise it).
 */
export function recordSubnetKey(buf: Buffer, off: number): string {
  const family = buf[off]!;
  const prefix = buf[off + 1]!;
  let key = `${family}/${prefix}/`;
  const len = family === 4 ? 4 : 16;
  for (let b = 0; b < len; b++) {
    const bits = prefix - b * 8;
    const mask = bits >= 8 ? 0xff : bits <= 0 ? 0 : (0xff << (8 - bits)) & 0xff;
    key += (buf[off + 16 + b]! & mask).toString(16).padStart(2, '0');
  }
  return key;
}

function checkLength(buf: Buffer, what: string): void {
  if (buf.length % PEER_RECORD_SIZE !== 0) {
    throw new WeftError(
      'WEFT_ERR_DATAPLANE',
      `${what}length ${buf.length} is not a multiple of ${PEER_RECORD_SIZE}`,
    );
  }
}

/**
 * The reference for a delta: the records of `table` changed by `delta` (replaced records keep
 * their place, new ones are appended). Throws, as the native engine refuses it, when a subnet
 * repeats within `removed` or within `upserts`, an upsert is malformed, or a removed subnet is
 * not in the table.
 */
export function applyPeerDelta(table: Buffer, delta: PeerDelta): Buffer {
  checkLength(table, 'peer table ');
  checkLength(delta.removed, 'removed: peer table ');
  checkLength(delta.upserts, 'upserts: peer table ');
  const keys = (buf: Buffer, what: string): string[] => {
    const out: string[] = [];
    const seen = new Set<string>();
    for (let o = 0; o < buf.length; o += PEER_RECORD_SIZE) {
      const k = recordSubnetKey(buf, o);
      if (seen.has(k)) {
        throw new WeftError(
          'WEFT_ERR_DATAPLANE',
          `${what}: peer record ${o / PEER_RECORD_SIZE}: subnet repeats an earlier record`,
        );
      }
      seen.add(k);
      out.push(k);
    }
    return out;
  };
  const removed = keys(delta.removed, 'removed');
  const upserts = keys(delta.upserts, 'upserts');
  try {
    new JsPeerTable(delta.upserts); // the records' fields, as the engines check them
  } catch (err) {
    throw new WeftError('WEFT_ERR_DATAPLANE', `upserts: ${(err as Error).message}`);
  }
  const at = new Map<string, number>();
  for (let o = 0; o < table.length; o += PEER_RECORD_SIZE) at.set(recordSubnetKey(table, o), o);
  removed.forEach((k, i) => {
    if (!at.has(k)) {
      throw new WeftError(
        'WEFT_ERR_DATAPLANE',
        `removed: peer record ${i}: subnet not in the table`,
      );
    }
  });
  const gone = new Set(removed);
  const replaced = new Map<string, number>();
  upserts.forEach((k, i) => replaced.set(k, i * PEER_RECORD_SIZE));
  const parts: Buffer[] = [];
  for (let o = 0; o < table.length; o += PEER_RECORD_SIZE) {
    const k = recordSubnetKey(table, o);
    const u = replaced.get(k);
    if (u !== undefined && !gone.has(k)) {
      parts.push(delta.upserts.subarray(u, u + PEER_RECORD_SIZE));
      replaced.delete(k);
    } else if (!gone.has(k)) {
      parts.push(table.subarray(o, o + PEER_RECORD_SIZE));
    }
  }
  for (const u of replaced.values()) parts.push(delta.upserts.subarray(u, u + PEER_RECORD_SIZE));
  return Buffer.concat(parts);
}

/** A convenience for tests and tools: `{subnet: '10.5.1.0/24', publicIP: '192.0.2.1', ...}`. */
export function peerEntry(
  subnet: string,
  publicIP: string,
  port: number,
  vtepMac?: string,
): PeerEntry {
  const net = parseCIDR(subnet);
  const ip = parseIP(publicIP);
  const mac = vtepMac === undefined ? null : parseMac(vtepMac);
  if (!net || !ip || (vtepMac !== undefined && !mac)) {
    throw new RangeError(`bad peer entry ${subnet} ${publicIP} ${vtepMac ?? ''}`);
  }
  return { subnet: net, publicIP: ip, port, vtepMac: mac };
}

export interface DecodedPeer {
  readonly index: number;
  readonly subnet: IPNet;
  readonly publicIP: IP;
  readonly port: number;
  readonly vtepMac: Buffer | null;
}

function readAddr(buf: Buffer, off: number, family: number): IP {
  return ipFromBytes(buf.subarray(off, off + (family === 4 ? 4 : 16)));
}

/** One prefix length of one family: its subnets by network address. */
interface PrefixLevel {
  readonly family: number;
  readonly mask: bigint;
  readonly byNet: Map<bigint, DecodedPeer>;
}

/**
 * The reference decoder and longest-prefix match: one map per prefix length in use, tried from
 * the longest (subnets are unique, so a level holds at most one match).
 */
export class JsPeerTable {
  readonly peers: readonly DecodedPeer[];
  /** The records decoded (a copy: the caller may reuse its buffer). */
  readonly buffer: Buffer;
  readonly #levels: PrefixLevel[];
  readonly #publics: Set<string>;

  constructor(buf: Buffer) {
    if (buf.length % PEER_RECORD_SIZE !== 0) {
      throw new WeftError(
        'WEFT_ERR_DATAPLANE',
        `peer table length ${buf.length} is not a multiple of ${PEER_RECORD_SIZE}`,
      );
    }
    this.buffer = Buffer.from(buf);
    const peers: DecodedPeer[] = [];
    const seen = new Set<string>();
    for (let i = 0; i * PEER_RECORD_SIZE < buf.length; i++) {
      const o = i * PEER_RECORD_SIZE;
      const family = buf[o]!;
      const prefix = buf[o + 1]!;
      const flags = buf[o + 2]!;
      const pubFamily = buf[o + 3]!;
      const bad = (rule: string) =>
        new WeftError('WEFT_ERR_DATAPLANE', `peer record ${i}: ${rule}`);
      if (family !== 4 && family !== 6) throw bad('subnet family must be 4 or 6');
      if (prefix > (family === 4 ? 32 : 128)) throw bad('prefix length out of range');
      if (pubFamily !== 4 && pubFamily !== 6) throw bad('public address family must be 4 or 6');
      if ((flags & ~PEER_FLAG_VTEP_MAC) !== 0) throw bad('unknown flags');
      const raw = readAddr(buf, o + 16, family);
      const subnet: IPNet = { family, addr: raw.addr & maskOf(family, prefix), prefix };
      const key = `${family}/${subnet.addr}/${prefix}`;
      if (seen.has(key)) throw bad('subnet repeats an earlier record');
      seen.add(key);
      peers.push({
        index: i,
        subnet,
        publicIP: readAddr(buf, o + 32, pubFamily),
        port: buf.readUInt16BE(o + 4),
        vtepMac: flags & PEER_FLAG_VTEP_MAC ? Buffer.from(buf.subarray(o + 6, o + 12)) : null,
      });
    }
    this.peers = peers;
    const levels = new Map<string, PrefixLevel & { prefix: number }>();
    for (const p of peers) {
      const { family, prefix } = p.subnet;
      const key = `${family}/${prefix}`;
      let level = levels.get(key);
      if (!level) {
        level = { family, prefix, mask: maskOf(family, prefix), byNet: new Map() };
        levels.set(key, level);
      }
      level.byNet.set(p.subnet.addr, p);
    }
    this.#levels = [...levels.values()].sort((a, b) => b.prefix - a.prefix);
    this.#publics = new Set(peers.map((p) => `${p.publicIP.family}/${p.publicIP.addr}`));
  }

  lookup(addr: IP): DecodedPeer | null {
    for (const l of this.#levels) {
      if (l.family !== addr.family) continue;
      const p = l.byNet.get(addr.addr & l.mask);
      if (p) return p;
    }
    return null;
  }

  hasPublic(addr: IP): boolean {
    return this.#publics.has(`${addr.family}/${addr.addr}`);
  }
}
