/** flannel's nftables tables as `nft list table` prints them (nftables mode tests). */
import type { Family } from '../../src/common/ip.js';

/** `nft list table` as flannel's tables print (flannel's e2e golden text plus the table comment). */
export function nftGolden(
  family: Family,
  N: string,
  S: string,
  fullyRandom = true,
  egressTap: string | null = null,
): string {
  const ipf = family === 4 ? 'ip' : 'ip6';
  const name = family === 4 ? 'flannel-ipv4' : 'flannel-ipv6';
  const mc = family === 4 ? '224.0.0.0/4' : 'ff00::/8';
  const masq = fullyRandom ? 'masquerade fully-random' : 'masquerade';
  return [
    `table ${ipf} ${name} {`,
    `\tcomment "rules for ${name}"`,
    '\tchain postrtg {',
    '\t\tcomment "chain to manage traffic masquerading by flannel"',
    '\t\ttype nat hook postrouting priority srcnat; policy accept;',
    '\t\tmeta mark 0x00004000 return',
    `\t\t${ipf} saddr ${S} ${ipf} daddr ${N} return`,
    `\t\t${ipf} saddr ${N} ${ipf} daddr ${S} return`,
    `\t\t${ipf} saddr != ${S} ${ipf} daddr ${N} return`,
    `\t\t${ipf} saddr ${N} ${ipf} daddr != ${mc} ${masq}`,
    `\t\t${ipf} saddr != ${N} ${ipf} daddr ${N} ${masq}`,
    '\t}',
    '',
    '\tchain forward {',
    '\t\tcomment "chain to accept flannel traffic"',
    '\t\ttype filter hook forward priority filter; policy accept;',
    `\t\t${ipf} saddr ${N} accept`,
    `\t\t${ipf} daddr ${N} accept`,
    ...(egressTap ? [`\t\tiifname "${egressTap}" accept`] : []),
    '\t}',
    '}',
    '',
  ].join('\n');
}
