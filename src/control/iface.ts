/**
 * Choosing the external interface, as flanneld does (pkg/ipmatch LookupExtIface), without
 * netlink and without running `ip`:
 *
 *   names, indexes, MTUs, flags   /sys/class/net/<name>/{ifindex,mtu,flags}
 *   addresses                     os.networkInterfaces()
 *   default route                 /proc/net/route, /proc/net/ipv6_route (main table)
 *   --iface-can-reach ADDR        a UDP socket connect() (no packet leaves): the kernel picks
 *                                 the source address it would use, whose interface we take
 *
 * Order: each --iface (name or address), then each --iface-regex (addresses first, then names),
 * then --iface-can-reach; with none of them, the interface holding --public-ip (flannel looks
 * there first) or else the default route's interface. The first candidate that has an MTU and
 * an address for every family the network config enables wins; rejected candidates are logged
 * and listed in the final error. Loopback is skipped unless named by --iface.
 * --public-ip / --public-ipv6 replace the address published in the lease.
 */
import dgram from 'node:dgram';
import { readdirSync, readFileSync } from 'node:fs';
import { endianness, networkInterfaces } from 'node:os';
import { join } from 'node:path';
import { usageError, WeftError, errorMessage } from '../common/errors.js';
import { familyOf, parseIP, sameIP, type Family } from '../common/ip.js';
import { logger } from '../common/log.js';
import type { ExternalInterface } from './backend/backend.js';

export interface IfaceSelection {
  readonly iface: readonly string[];
  readonly ifaceRegex: readonly string[];
  readonly ifaceCanReach: string;
  readonly publicIP: string;
  readonly publicIPv6: string;
}

/** The families the network config enables (an address is required for each). */
export interface IPFamilies {
  readonly ipv4: boolean;
  readonly ipv6: boolean;
}

export interface LinkInfo {
  readonly name: string;
  readonly index: number;
  readonly mtu: number;
  readonly loopback: boolean;
  /** Addresses in kernel order. */
  readonly ipv4: readonly string[];
  readonly ipv6: readonly string[];
}

const SYS_NET = '/sys/class/net';
const IFF_LOOPBACK = 0x8;
const RTF_UP = 0x1;
const RTF_REJECT = 0x200;

// ---------------------------------------------------------------------------------------------
// What the host has

function readSysNumber(name: string, attr: string, radix = 10): number | null {
  try {
    const text = readFileSync(join(SYS_NET, name, attr), 'utf8').trim();
    const n = radix === 16 ? parseInt(text.replace(/^0x/, ''), 16) : parseInt(text, 10);
    return Number.isNaN(n) ? null : n;
  } catch {
    return null;
  }
}

/** Every link of this network namespace with its addresses, ordered by ifindex. */
export function listLinks(): LinkInfo[] {
  const addrs = networkInterfaces();
  const links: LinkInfo[] = [];
  for (const name of readdirSync(SYS_NET)) {
    const index = readSysNumber(name, 'ifindex');
    if (index === null) continue; // e.g. bonding_masters
    const own = addrs[name] ?? [];
    links.push({
      name,
      index,
      mtu: readSysNumber(name, 'mtu') ?? 0,
      loopback: ((readSysNumber(name, 'flags', 16) ?? 0) & IFF_LOOPBACK) !== 0,
      ipv4: own.filter((a) => a.family === 'IPv4').map((a) => a.address),
      ipv6: own.filter((a) => a.family === 'IPv6').map((a) => a.address),
    });
  }
  return links.sort((a, b) => a.index - b.index);
}

export interface RouteEntry {
  readonly iface: string;
  readonly family: Family;
  readonly dst: bigint;
  readonly prefix: number;
  readonly gateway: bigint;
  readonly metric: number;
  readonly flags: number;
}

/** Reads the bytes of a u32 printed in host order (`%08X`) back into network order. */
function hostHexToAddr(hex: string, order: 'LE' | 'BE'): bigint {
  const v = parseInt(hex, 16) >>> 0;
  if (order === 'BE') return BigInt(v);
  const swapped = ((v & 0xff) << 24) | ((v & 0xff00) << 8) | ((v >>> 8) & 0xff00) | (v >>> 24);
  return BigInt(swapped >>> 0);
}

function popcount32(v: number): number {
  let n = 0;
  for (let x = v >>> 0; x !== 0; x >>>= 1) n += x & 1;
  return n;
}

/**
 * Parses /proc/net/route (IPv4 main table). Addresses there are u32s in host byte order, so
 * the machine's endianness is needed to read them. Malformed lines are skipped.
 */
export function parseProcNetRoute(text: string, order: 'LE' | 'BE' = endianness()): RouteEntry[] {
  const out: RouteEntry[] = [];
  for (const line of text.split('\n').slice(1)) {
    const f = line.trim().split(/\s+/);
    if (f.length < 8) continue;
    const [iface, dst, gw, flags, , , metric, mask] = f as [string, ...string[]];
    if (
      ![dst, gw, flags, mask].every((h) => /^[0-9A-Fa-f]{1,8}$/.test(h!)) ||
      !/^\d+$/.test(metric!)
    ) {
      continue;
    }
    out.push({
      iface,
      family: 4,
      dst: hostHexToAddr(dst!, order),
      prefix: popcount32(parseInt(mask!, 16)),
      gateway: hostHexToAddr(gw!, order),
      metric: Number(metric),
      flags: parseInt(flags!, 16),
    });
  }
  return out;
}

/**
 * Parses /proc/net/ipv6_route: dst(32 hex) dst_len src src_len gateway metric refcnt use flags
 * device. Malformed lines are skipped.
 */
export function parseProcIPv6Route(text: string): RouteEntry[] {
  const out: RouteEntry[] = [];
  for (const line of text.split('\n')) {
    const f = line.trim().split(/\s+/);
    if (f.length < 10) continue;
    const [dst, dstLen, , , gw, metric, , , flags, iface] = f as string[];
    const hex32 = /^[0-9a-fA-F]{32}$/;
    const hex = /^[0-9a-fA-F]{1,8}$/;
    if (
      !hex32.test(dst!) ||
      !hex32.test(gw!) ||
      ![dstLen, metric, flags].every((h) => hex.test(h!))
    ) {
      continue;
    }
    out.push({
      iface: iface!,
      family: 6,
      dst: BigInt(`0x${dst}`),
      prefix: parseInt(dstLen!, 16),
      gateway: BigInt(`0x${gw}`),
      metric: parseInt(metric!, 16),
      flags: parseInt(flags!, 16),
    });
  }
  return out;
}

/**
 * The interface of the usable default route with the lowest metric (the first on a tie), or
 * null. Rejected (unreachable) routes and routes that are not up are ignored.
 */
export function defaultRouteIface(routes: readonly RouteEntry[]): string | null {
  let best: RouteEntry | null = null;
  for (const r of routes) {
    if (r.prefix !== 0 || r.dst !== 0n) continue;
    if ((r.flags & RTF_UP) === 0 || (r.flags & RTF_REJECT) !== 0) continue;
    if (best === null || r.metric < best.metric) best = r;
  }
  return best?.iface ?? null;
}

function readDefaultRouteIface(family: Family): string | null {
  const path = family === 4 ? '/proc/net/route' : '/proc/net/ipv6_route';
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch {
    return null; // no IPv6 in this kernel, say
  }
  return defaultRouteIface(family === 4 ? parseProcNetRoute(text) : parseProcIPv6Route(text));
}

/**
 * The local address the kernel would use to reach `dest`: a connected UDP socket gets its
 * source address from the route lookup, and connect() on UDP sends nothing.
 */
export function sourceAddressFor(dest: string): Promise<string> {
  const family = familyOf(dest);
  if (family === null) return Promise.reject(new TypeError(`not an IP address: ${dest}`));
  return new Promise((resolve, reject) => {
    const sock = dgram.createSocket(family === 4 ? 'udp4' : 'udp6');
    const done = (err: Error | null, addr?: string) => {
      sock.close();
      if (err) reject(err);
      else resolve(addr!);
    };
    sock.once('error', (err) => done(err));
    sock.connect(9, dest, () => {
      try {
        done(null, sock.address().address);
      } catch (err) {
        done(err as Error);
      }
    });
  });
}

// ---------------------------------------------------------------------------------------------
// Selection

/** A candidate interface plus addresses the way it was found already fixes (by IP, by regex). */
interface Candidate {
  readonly link: LinkInfo;
  readonly preferred: Partial<Record<Family, string>>;
  /** Named by --iface: loopback and its addresses are allowed. */
  readonly explicit: boolean;
}

/** A rejected candidate: what was tried and why it does not do. */
class Rejected extends Error {}

function addrsOf(link: LinkInfo, family: Family): readonly string[] {
  return family === 4 ? link.ipv4 : link.ipv6;
}

function isLinkLocal(family: Family, addr: bigint): boolean {
  return family === 4 ? addr >> 16n === 0xa9fen : addr >> 118n === 0x3fan;
}

/** Go's net.IP.IsGlobalUnicast (private ranges included). */
function isGlobalUnicast(family: Family, addr: bigint): boolean {
  if (family === 4) {
    return !(
      addr === 0n ||
      addr >> 24n === 127n ||
      addr >> 28n === 0xen ||
      addr === 0xffffffffn ||
      isLinkLocal(4, addr)
    );
  }
  return !(addr === 0n || addr === 1n || addr >> 120n === 0xffn || isLinkLocal(6, addr));
}

/** flannel's choice: the first global unicast address, else the first link-local one. */
function pickAddress(link: LinkInfo, family: Family, anyScope: boolean): string | null {
  const parsed = addrsOf(link, family)
    .map((text) => ({ text, ip: parseIP(text) }))
    .filter((a) => a.ip !== null);
  const global = parsed.find((a) => isGlobalUnicast(family, a.ip!.addr));
  const local = parsed.find((a) => isLinkLocal(family, a.ip!.addr));
  return global?.text ?? local?.text ?? (anyScope ? (parsed[0]?.text ?? null) : null);
}

function linkOwning(links: readonly LinkInfo[], addr: string): LinkInfo | undefined {
  return links.find((l) => [...l.ipv4, ...l.ipv6].some((a) => sameIP(a, addr)));
}

function byNameOrAddress(links: readonly LinkInfo[], entry: string): Candidate {
  const family = familyOf(entry);
  if (family !== null) {
    const link = linkOwning(links, entry);
    if (!link) throw new Rejected(`no interface has address ${entry}`);
    return { link, preferred: { [family]: entry }, explicit: true };
  }
  const link = links.find((l) => l.name === entry);
  if (!link) throw new Rejected(`no interface named ${entry}`);
  return { link, preferred: {}, explicit: true };
}

function byRegex(links: readonly LinkInfo[], re: RegExp, families: readonly Family[]): Candidate {
  const usable = links.filter((l) => !l.loopback);
  for (const link of usable) {
    for (const family of families) {
      const hit = addrsOf(link, family).find((a) => re.test(a));
      if (hit !== undefined) return { link, preferred: { [family]: hit }, explicit: false };
    }
  }
  const named = usable.find((l) => re.test(l.name));
  if (named) return { link: named, preferred: {}, explicit: false };
  const seen = usable.map((l) => `${l.name}[${[...l.ipv4, ...l.ipv6].join(' ')}]`).join(', ');
  throw new Rejected(`matches no interface name or address (have ${seen || 'none'})`);
}

async function byCanReach(links: readonly LinkInfo[], dest: string): Promise<Candidate> {
  let src: string;
  try {
    src = await sourceAddressFor(dest);
  } catch (err) {
    throw new Rejected(`no route to ${dest} (${errorMessage(err)})`);
  }
  // With no route, the socket may still "connect" and keep the unspecified address.
  if (parseIP(src)?.addr === 0n) throw new Rejected(`no route to ${dest}`);
  const link = linkOwning(links, src);
  if (!link) throw new Rejected(`source address ${src} for ${dest} is on no interface`);
  return { link, preferred: { [familyOf(src)!]: src }, explicit: false };
}

function byDefaultRoute(links: readonly LinkInfo[], families: IPFamilies): Candidate {
  const find = (family: Family): LinkInfo => {
    const name = readDefaultRouteIface(family);
    if (name === null) throw new Rejected(`no IPv${family} default route (use --iface)`);
    const link = links.find((l) => l.name === name);
    if (!link) throw new Rejected(`IPv${family} default route interface ${name} is gone`);
    return link;
  };
  const link = find(families.ipv4 ? 4 : 6);
  if (families.ipv4 && families.ipv6) {
    const v6 = readDefaultRouteIface(6);
    if (v6 !== null && v6 !== link.name) {
      throw new Rejected(
        `IPv6 default route interface ${v6} must be the IPv4 default route interface ${link.name}`,
      );
    }
  }
  return { link, preferred: {}, explicit: false };
}

function finish(c: Candidate, families: IPFamilies, sel: IfaceSelection): ExternalInterface {
  const { link } = c;
  const anyScope = c.explicit && link.loopback;
  const ifaceAddr = c.preferred[4] ?? pickAddress(link, 4, anyScope);
  const ifaceAddrV6 = c.preferred[6] ?? pickAddress(link, 6, anyScope);
  if (families.ipv4 && ifaceAddr === null) {
    throw new Rejected(`interface ${link.name} has no IPv4 address`);
  }
  if (families.ipv6 && ifaceAddrV6 === null) {
    throw new Rejected(`interface ${link.name} has no IPv6 address`);
  }
  if (link.mtu <= 0) throw new Rejected(`interface ${link.name} has no MTU (reads ${link.mtu})`);
  return Object.freeze({
    name: link.name,
    index: link.index,
    mtu: link.mtu,
    ifaceAddr,
    ifaceAddrV6,
    publicIP: sel.publicIP || (families.ipv4 ? ifaceAddr : null),
    publicIPv6: sel.publicIPv6 || (families.ipv6 ? ifaceAddrV6 : null),
  });
}

function compileRegex(source: string): RegExp {
  try {
    return new RegExp(source);
  } catch (err) {
    throw usageError('--iface-regex', `invalid regex "${source}" (${errorMessage(err)})`);
  }
}

/**
 * Picks the external interface (see the file comment for the order). Throws WEFT_ERR_IFACE
 * naming every candidate tried and what it lacks; WEFT_ERR_USAGE for a bad regex.
 */
export async function selectExternalInterface(
  sel: IfaceSelection,
  families: IPFamilies,
  links: readonly LinkInfo[] = listLinks(),
): Promise<ExternalInterface> {
  const log = logger('iface');
  if (!families.ipv4 && !families.ipv6) {
    throw new WeftError('WEFT_ERR_IFACE', 'neither IPv4 nor IPv6 is enabled in the network config');
  }
  const fams: Family[] = [
    ...(families.ipv4 ? [4 as const] : []),
    ...(families.ipv6 ? [6 as const] : []),
  ];
  const regexes = sel.ifaceRegex.map((s) => [s, compileRegex(s)] as const);

  const attempts: [string, () => Candidate | Promise<Candidate>][] = [];
  for (const entry of sel.iface)
    attempts.push([`--iface ${entry}`, () => byNameOrAddress(links, entry)]);
  for (const [source, re] of regexes) {
    attempts.push([`--iface-regex ${source}`, () => byRegex(links, re, fams)]);
  }
  if (sel.ifaceCanReach) {
    attempts.push([
      `--iface-can-reach ${sel.ifaceCanReach}`,
      () => byCanReach(links, sel.ifaceCanReach),
    ]);
  }
  if (attempts.length === 0) {
    // flannel first looks for the interface holding --public-ip; weft falls back to the
    // default route when no local interface has it (the address is then a NAT address).
    const pub = sel.publicIP || sel.publicIPv6;
    if (pub && linkOwning(links, pub)) {
      attempts.push([`interface holding ${pub}`, () => byNameOrAddress(links, pub)]);
    }
    attempts.push(['default route', () => byDefaultRoute(links, families)]);
  }

  const reasons: string[] = [];
  for (const [label, attempt] of attempts) {
    try {
      const ext = finish(await attempt(), families, sel);
      log.info(
        { iface: ext.name, addr: ext.ifaceAddr, addrV6: ext.ifaceAddrV6, mtu: ext.mtu, via: label },
        'using interface',
      );
      return ext;
    } catch (err) {
      if (!(err instanceof Rejected)) throw err;
      log.info({ via: label, reason: err.message }, 'interface candidate rejected');
      reasons.push(`${label}: ${err.message}`);
    }
  }
  throw new WeftError('WEFT_ERR_IFACE', `no usable external interface: ${reasons.join('; ')}`, {
    details: { tried: reasons },
  });
}
