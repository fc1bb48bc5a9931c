/**
 * The underlay address a node sends from, for each family: --public-ip (--public-ipv6) when it is
 * an address of this host — a second address on the interface, say: every weft receiver checks a
 * datagram's source against the lease's PublicIP, so sending from the interface's first address
 * would get the node's traffic dropped as unknown_source — else the interface's own address (a
 * NAT's address: the NAT in front of the node rewrites the source to it). flannel HEAD sets its
 * vxlan device's `local` to the public IP unconditionally; weft does so where the address is
 * local, and keeps the interface address behind a NAT, where a foreign source could not leave.
 */
import { networkInterfaces } from 'node:os';
import { type Family, familyOf, sameIP } from '../../common/ip.js';
import type { ExternalInterface } from './backend.js';

/** Every address of this network namespace's interfaces, as text. */
export function localAddresses(): string[] {
  return Object.values(networkInterfaces()).flatMap((l) => (l ?? []).map((a) => a.address));
}

/** See the file comment; `local` lists the host's addresses (read only when needed). */
export function sendAddress(
  ext: ExternalInterface,
  family: Family,
  local: () => readonly string[] = localAddresses,
): string | null {
  const own = family === 4 ? ext.ifaceAddr : ext.ifaceAddrV6;
  const pub = family === 4 ? ext.publicIP : ext.publicIPv6;
  if (!pub || familyOf(pub) !== family || (own !== null && sameIP(own, pub))) return own;
  return local().some((a) => sameIP(a, pub)) ? pub : own;
}
