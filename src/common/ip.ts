/**
 * IPv4/IPv6 addresses and prefixes as bigints, so one code path serves both families.
 * Text forms follow Go's net package (what flannel prints): dotted quads, and RFC 5952 for IPv6
 * (lowercase, longest zero run of two or more groups compressed, the first on a tie).
 */
import { isIPv4, isIPv6 } from 'node:net';

export type Family = 4 | 6;
export const FAMILIES: readonly Family[] = [4, 6];

export interface IP {
  readonly family: Family;
  readonly addr: bigint;
}

export interface IPNet {
  readonly family: Family;
  /** The network address as written (not necessarily masked; see `isAligned`). */
  readonly addr: bigint;
  readonly prefix: number;
}

export function bits(family: Family): number {
  return family === 4 ? 32 : 128;
}

export function familyOf(text: string): Family | null {
  if (isIPv4(text)) return 4;
  // (every IPv6 text has a colon; node's IPv6 pattern costs ~9 ms to compile on its first use,
  // which an IPv4 cluster's daemon then never pays: `--iface=eth0` asked for it at every start)
  if (text.includes(':') && isIPv6(text)) return 6;
  return null;
}

/** Parses an address; null when it is not one (IPv4-mapped IPv6 stays IPv6). */
export function parseIP(text: string): IP | null {
  const family = familyOf(text);
  if (family === 4) {
    // (digits and three dots, familyOf checked: summed as a Number, one BigInt made)
    let v = 0;
    let part = 0;
    for (let i = 0; i < text.length; i++) {
      const c = text.charCodeAt(i);
      if (c === 0x2e) {
        v = v * 256 + part;
        part = 0;
      } else {
        part = part * 10 + (c - 0x30);
      }
    }
    return { family, addr: BigInt(v * 256 + part) };
  }
  if (family === 6) {
    let s = text;
    const zone = s.indexOf('%');
    if (zone >= 0) return null;
    // An embedded IPv4 tail becomes two groups.
    const v4 = /(\d+\.\d+\.\d+\.\d+)$/.exec(s);
    if (v4) {
      const t = parseIP(v4[1]!)!.addr;
      s = s.slice(0, v4.index) + ((t >> 16n).toString(16) + ':' + (t & 0xffffn).toString(16));
    }
    const [head, tail] = s.includes('::') ? s.split('::') : [s, undefined];
    const h = head ? head.split(':') : [];
    const t = tail === undefined ? [] : tail ? tail.split(':') : [];
    const groups =
      tail === undefined ? h : [...h, ...Array<string>(8 - h.length - t.length).fill('0'), ...t];
    let v = 0n;
    for (const g of groups) v = (v << 16n) | BigInt(parseInt(g, 16));
    return { family, addr: v };
  }
  return null;
}

export function formatIP(family: Family, addr: bigint): string {
  if (family === 4) {
    const n = Number(addr & 0xffffffffn);
    return `${n >>> 24}.${(n >>> 16) & 0xff}.${(n >>> 8) & 0xff}.${n & 0xff}`;
  }
  const groups: number[] = [];
  for (let i = 7; i >= 0; i--) groups.push(Number((addr >> BigInt(i * 16)) & 0xffffn));
  let bestStart = -1;
  let bestLen = 0;
  for (let i = 0; i < 8;) {
    if (groups[i] !== 0) {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && groups[j] === 0) j++;
    if (j - i > bestLen) {
      bestStart = i;
      bestLen = j - i;
    }
    i = j;
  }
  const hex = groups.map((g) => g.toString(16));
  if (bestLen < 2) return hex.join(':');
  const left = hex.slice(0, bestStart).join(':');
  const right = hex.slice(bestStart + bestLen).join(':');
  return `${left}::${right}`;
}

/** Whether two address texts name the same address (`::1` and `0:0::1` alike); false if either is not one. */
export function sameIP(a: string, b: string): boolean {
  const x = parseIP(a);
  const y = parseIP(b);
  return x !== null && y !== null && x.family === y.family && x.addr === y.addr;
}

export function ipToString(ip: IP): string {
  return formatIP(ip.family, ip.addr);
}

/** Parses `a.b.c.d/n` or `x::/n`; null when malformed or the prefix is out of range. */
export function parseCIDR(text: string): IPNet | null {
  const slash = text.lastIndexOf('/');
  if (slash < 0) return null;
  const ip = parseIP(text.slice(0, slash));
  const p = text.slice(slash + 1);
  if (!ip || !/^\d{1,3}$/.test(p)) return null;
  const prefix = Number(p);
  if (prefix > bits(ip.family)) return null;
  return { family: ip.family, addr: ip.addr, prefix };
}

export function formatCIDR(net: IPNet): string {
  return `${formatIP(net.family, net.addr)}/${net.prefix}`;
}

export function maskOf(family: Family, prefix: number): bigint {
  const known = MASKS[family][prefix];
  if (known !== undefined) return known;
  const b = BigInt(bits(family));
  const mask = ((1n << b) - 1n) ^ ((1n << (b - BigInt(prefix))) - 1n);
  // (kept for prefixes 0..bits only: a table of at most 33 + 129 values)
  if (Number.isInteger(prefix) && prefix >= 0 && prefix <= bits(family))
    MASKS[family][prefix] = mask;
  return mask;
}

/** maskOf's values by family and prefix, made once each (every BigInt is a heap allocation). */
const MASKS: Record<Family, bigint[]> = { 4: [], 6: [] };

/** The prefix with host bits cleared. */
export function canonical(net: IPNet): IPNet {
  return {
    family: net.family,
    addr: net.addr & maskOf(net.family, net.prefix),
    prefix: net.prefix,
  };
}

export function isAligned(net: IPNet): boolean {
  return (net.addr & maskOf(net.family, net.prefix)) === net.addr;
}

/** Number of addresses a prefix spans (2^(bits - prefix)). */
export function sizeOf(net: IPNet): bigint {
  return 1n << BigInt(bits(net.family) - net.prefix);
}

export function containsIP(net: IPNet, ip: IP): boolean {
  return (
    ip.family === net.family &&
    (ip.addr & maskOf(net.family, net.prefix)) === (net.addr & maskOf(net.family, net.prefix))
  );
}

/** Whether `inner` lies entirely within `outer`. */
export function containsNet(outer: IPNet, inner: IPNet): boolean {
  return (
    inner.family === outer.family &&
    inner.prefix >= outer.prefix &&
    containsIP(outer, { family: inner.family, addr: inner.addr })
  );
}

export function overlaps(a: IPNet, b: IPNet): boolean {
  return a.family === b.family && (containsNet(a, b) || containsNet(b, a));
}

export function sameNet(a: IPNet, b: IPNet): boolean {
  return a.family === b.family && a.addr === b.addr && a.prefix === b.prefix;
}

/** The n-th address of a prefix (n = 1 gives flannel's FLANNEL_SUBNET address). */
export function nthAddress(net: IPNet, n: bigint): IP {
  return { family: net.family, addr: (net.addr & maskOf(net.family, net.prefix)) + n };
}

/** 4 or 16 bytes, network order. */
export function ipToBytes(ip: IP): Buffer {
  const len = ip.family === 4 ? 4 : 16;
  const b = Buffer.alloc(len);
  let v = ip.addr;
  for (let i = len - 1; i >= 0; i--) {
    b[i] = Number(v & 0xffn);
    v >>= 8n;
  }
  return b;
}

export function ipFromBytes(b: Uint8Array): IP {
  if (b.length !== 4 && b.length !== 16) throw new RangeError(`bad address length ${b.length}`);
  let v = 0n;
  for (const x of b) v = (v << 8n) | BigInt(x);
  return { family: b.length === 4 ? 4 : 6, addr: v };
}
