/**
 * Subnet keys as flannel writes them under `<prefix>/subnets/`: the IPv4 subnet with its prefix
 * length after a dash (`10.5.34.0-24`), and for dual-stack `&` and the IPv6 subnet the same way
 * (`10.5.77.0-24&fc00:0:0:5d::-64`). An IPv6-only lease carries `0.0.0.0-0` as its IPv4 half.
 */
import { formatIP, isAligned, parseIP, type IPNet } from '../../common/ip.js';

const KEY_RE = /^(\d{1,3}(?:\.\d{1,3}){3})-(\d{1,2})(?:&([0-9a-fA-F:.]+)-(\d{1,3}))?$/;

export function makeSubnetKey(v4: IPNet | null, v6: IPNet | null): string {
  const four = v4 ? `${formatIP(4, v4.addr)}-${v4.prefix}` : '0.0.0.0-0';
  return v6 ? `${four}&${formatIP(6, v6.addr)}-${v6.prefix}` : four;
}

/** Parses a key; null when it is not a well-formed, aligned subnet key. */
export function parseSubnetKey(key: string): { v4: IPNet | null; v6: IPNet | null } | null {
  const m = KEY_RE.exec(key);
  if (!m) return null;
  const ip4 = parseIP(m[1]!);
  const p4 = Number(m[2]);
  if (!ip4 || ip4.family !== 4 || p4 > 32) return null;
  let v4: IPNet | null = { family: 4, addr: ip4.addr, prefix: p4 };
  if (p4 === 0 && ip4.addr === 0n) v4 = null;
  else if (!isAligned(v4)) return null;
  let v6: IPNet | null = null;
  if (m[3] !== undefined) {
    const ip6 = parseIP(m[3]);
    const p6 = Number(m[4]);
    if (!ip6 || ip6.family !== 6 || p6 > 128) return null;
    v6 = { family: 6, addr: ip6.addr, prefix: p6 };
    if (!isAligned(v6)) return null;
  }
  if (!v4 && !v6) return null;
  return { v4, v6 };
}
