/**
 * flannel's nftables rule set (EnableNFTables, flannel's pkg/trafficmngr/nftables), as `nft -f`
 * input. Pure. N = cluster network, S = own subnet, `ip` for IPv4 (`ip6`, ff00::/8 for IPv6):
 *
 *   table ip flannel-ipv4 { comment "rules for flannel-ipv4" }     (both tables always exist)
 *   chain postrtg (with --ip-masq) comment "chain to manage traffic masquerading by flannel"
 *         type nat hook postrouting priority srcnat
 *     meta mark 0x4000 return
 *     ip saddr S ip daddr N return
 *     ip saddr N ip daddr S return
 *     ip saddr != S ip daddr N return      (iptables mode has `! -s N -d S` here; nftables not)
 *     ip saddr N ip daddr != 224.0.0.0/4 masquerade fully-random
 *     ip saddr != N ip daddr N masquerade fully-random
 *   chain forward (with --iptables-forward-rules) comment "chain to accept flannel traffic"
 *         type filter hook forward priority filter
 *     ip saddr N accept
 *     ip daddr N accept
 *
 * `fully-random` is dropped with --ip-masq-fully-random-disable or when the kernel refuses it.
 */
import { type Family, type IPNet, formatCIDR } from '../../common/ip.js';

export const NFT_TABLES = {
  4: { family: 'ip', name: 'flannel-ipv4' },
  6: { family: 'ip6', name: 'flannel-ipv6' },
} as const;
export const NFT_MASQ_CHAIN = 'postrtg';
export const NFT_FWD_CHAIN = 'forward';
/** The chain flannel's probe adds (with `nft --check` only) to learn if fully-random works. */
export const NFT_PROBE_CHAIN = 'masqueradeTest';

/** What one family's table holds. */
export interface NftTableSpec {
  readonly family: Family;
  /** With --ip-masq: the cluster network and our subnet. */
  readonly masq?: { readonly network: IPNet; readonly subnet: IPNet };
  /**
   * With --iptables-forward-rules: the cluster network, and the userspace engine's egress TAP
   * (tap_gso) whose frames are forwarded to the underlay, if the backend may run one.
   */
  readonly forward?: { readonly network: IPNet; readonly egressTap?: string | null };
  /** `masquerade fully-random` (else plain `masquerade`). */
  readonly fullyRandom: boolean;
}

/** `ip flannel-ipv4` / `ip6 flannel-ipv6`. */
export function nftTableName(family: Family): string {
  const t = NFT_TABLES[family];
  return `${t.family} ${t.name}`;
}

/**
 * The `nft -f` lines that build the table from nothing, chains in flannel's order (postrtg is
 * set up before forward). Callers prefix `add table …; delete table …` to replace it atomically.
 */
export function nftTableScript(spec: NftTableSpec): string[] {
  const t = nftTableName(spec.family);
  const ipf = NFT_TABLES[spec.family].family;
  const out = [`add table ${t} { comment "rules for ${NFT_TABLES[spec.family].name}" ; }`];
  if (spec.masq) {
    const N = formatCIDR(spec.masq.network);
    const S = formatCIDR(spec.masq.subnet);
    const multicast = spec.family === 4 ? '224.0.0.0/4' : 'ff00::/8';
    const masquerade = spec.fullyRandom ? 'masquerade fully-random' : 'masquerade';
    const rule = (r: string) => `add rule ${t} ${NFT_MASQ_CHAIN} ${r}`;
    out.push(
      `add chain ${t} ${NFT_MASQ_CHAIN} { type nat hook postrouting priority srcnat ; ` +
        `comment "chain to manage traffic masquerading by flannel" ; }`,
      rule('meta mark 0x4000 return'),
      rule(`${ipf} saddr ${S} ${ipf} daddr ${N} return`),
      rule(`${ipf} saddr ${N} ${ipf} daddr ${S} return`),
      rule(`${ipf} saddr != ${S} ${ipf} daddr ${N} return`),
      rule(`${ipf} saddr ${N} ${ipf} daddr != ${multicast} ${masquerade}`),
      rule(`${ipf} saddr != ${N} ${ipf} daddr ${N} ${masquerade}`),
    );
  }
  if (spec.forward) {
    const N = formatCIDR(spec.forward.network);
    out.push(
      `add chain ${t} ${NFT_FWD_CHAIN} { type filter hook forward priority filter ; ` +
        `comment "chain to accept flannel traffic" ; }`,
      `add rule ${t} ${NFT_FWD_CHAIN} ${ipf} saddr ${N} accept`,
      `add rule ${t} ${NFT_FWD_CHAIN} ${ipf} daddr ${N} accept`,
    );
    const tap = spec.forward.egressTap;
    if (tap) out.push(`add rule ${t} ${NFT_FWD_CHAIN} iifname "${tap}" accept`);
  }
  return out;
}

/** The script that replaces the table whole, in one atomic transaction. */
export function nftReplaceScript(spec: NftTableSpec): string {
  const t = nftTableName(spec.family);
  return [`add table ${t}`, `delete table ${t}`, ...nftTableScript(spec), ''].join('\n');
}

/** The `nft --check -f` input flannel uses to learn whether masquerade fully-random works. */
export function nftFullyRandomProbe(): string {
  const t = nftTableName(4);
  return [
    `add table ${t}`,
    `add chain ${t} ${NFT_PROBE_CHAIN} { type nat hook postrouting priority srcnat ; }`,
    `add rule ${t} ${NFT_PROBE_CHAIN} ip saddr != 127.0.0.1 masquerade fully-random`,
    '',
  ].join('\n');
}
