/**
 * flannel's iptables rules (DESIGN §4), as the exact lines `iptables-save` prints, built once per
 * family. Pure: the restore script and the check both derive from these lists.
 *
 * nat (with --ip-masq), N = cluster network, S = own subnet:
 *   POSTROUTING  -m comment --comment "flanneld masq" -j FLANNEL-POSTRTG   (first rule)
 *   FLANNEL-POSTRTG, in order:
 *     -m mark --mark 0x4000/0x4000 … RETURN      (kube-proxy's mark: no double NAT)
 *     -s S -d N … RETURN ; -s N -d S … RETURN ; ! -s N -d S … RETURN
 *     -s N ! -d 224.0.0.0/4 … MASQUERADE --random-fully   (IPv6: ff00::/8)
 *     ! -s N -d N … MASQUERADE --random-fully
 *   (without --random-fully under --ip-masq-fully-random-disable)
 * filter (with --iptables-forward-rules):
 *   FORWARD  -m comment --comment "flanneld forward" -j FLANNEL-FWD   (first rule)
 *   FLANNEL-FWD: -s N … ACCEPT ; -d N … ACCEPT
 *                [-i T … ACCEPT: the userspace engine's egress TAP T (weft's own, tap_gso:
 *                 its encapsulated frames are forwarded from the TAP to the underlay)]
 */
import { type Family, type IPNet, formatCIDR } from '../../common/ip.js';

export const MASQ_CHAIN = 'FLANNEL-POSTRTG';
export const FWD_CHAIN = 'FLANNEL-FWD';
export const MASQ_COMMENT = 'flanneld masq';
export const FWD_COMMENT = 'flanneld forward';
export const KUBE_PROXY_MARK = '0x4000/0x4000';

/** One table's part: the jump from a built-in chain into ours, and our chain's rules in order. */
export interface ChainRules {
  readonly table: 'nat' | 'filter';
  /** The built-in chain that jumps to ours (POSTROUTING, FORWARD). */
  readonly parent: string;
  readonly chain: string;
  readonly comment: string;
  /** The jump rule, as iptables-save prints it (without `-A <parent> `). */
  readonly jump: string;
  /** Our chain's rules, as iptables-save prints them (without `-A <chain> `). */
  readonly rules: readonly string[];
}

function c(comment: string): string {
  return `-m comment --comment "${comment}"`;
}

export function masqRules(
  family: Family,
  network: IPNet,
  subnet: IPNet,
  fullyRandom = true,
): ChainRules {
  const N = formatCIDR(network);
  const S = formatCIDR(subnet);
  const m = c(MASQ_COMMENT);
  const multicast = family === 4 ? '224.0.0.0/4' : 'ff00::/8';
  const masquerade = fullyRandom ? 'MASQUERADE --random-fully' : 'MASQUERADE';
  return {
    table: 'nat',
    parent: 'POSTROUTING',
    chain: MASQ_CHAIN,
    comment: MASQ_COMMENT,
    jump: `${m} -j ${MASQ_CHAIN}`,
    rules: [
      `-m mark --mark ${KUBE_PROXY_MARK} ${m} -j RETURN`,
      `-s ${S} -d ${N} ${m} -j RETURN`,
      `-s ${N} -d ${S} ${m} -j RETURN`,
      `! -s ${N} -d ${S} ${m} -j RETURN`,
      `-s ${N} ! -d ${multicast} ${m} -j ${masquerade}`,
      `! -s ${N} -d ${N} ${m} -j ${masquerade}`,
    ],
  };
}

export function forwardRules(network: IPNet, egressTap: string | null = null): ChainRules {
  const N = formatCIDR(network);
  const m = c(FWD_COMMENT);
  const tap = egressTap ? [`-i ${egressTap} ${m} -j ACCEPT`] : [];
  return {
    table: 'filter',
    parent: 'FORWARD',
    chain: FWD_CHAIN,
    comment: FWD_COMMENT,
    jump: `${m} -j ${FWD_CHAIN}`,
    rules: [`-s ${N} ${m} -j ACCEPT`, `-d ${N} ${m} -j ACCEPT`, ...tap],
  };
}

/** `iptables-save` output, split by table: table → lines (`:CHAIN …` and `-A …`). */
export function parseSave(text: string): Map<string, string[]> {
  const out = new Map<string, string[]>();
  let cur: string[] | undefined;
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (line.startsWith('*')) {
      cur = [];
      out.set(line.slice(1), cur);
    } else if (line === 'COMMIT') {
      cur = undefined;
    } else if (cur && (line.startsWith('-A ') || line.startsWith(':'))) {
      cur.push(line);
    }
  }
  return out;
}

/** The rules of `chain` in a parsed table, in order (without `-A <chain> `). */
export function chainRules(lines: readonly string[], chain: string): string[] {
  const prefix = `-A ${chain} `;
  return lines.filter((l) => l.startsWith(prefix)).map((l) => l.slice(prefix.length));
}

/** Whether the kernel's rules are exactly ours: the jump first in the parent, our chain in order. */
export function isInPlace(lines: readonly string[], want: ChainRules): boolean {
  const parent = chainRules(lines, want.parent);
  const ours = chainRules(lines, want.chain);
  const jumps = parent.filter((r) => r.includes(`"${want.comment}"`));
  return (
    parent[0] === want.jump &&
    jumps.length === 1 &&
    ours.length === want.rules.length &&
    ours.every((r, i) => r === want.rules[i])
  );
}

/**
 * The `iptables-restore --noflush` script that puts `want` in place whole: declaring our chain
 * flushes it (stale rules from an earlier network or subnet go with it), every rule in the parent
 * chain carrying our comment is deleted (old jumps, flannel's older direct rules), then the jump
 * is inserted first and our rules appended in order.
 */
export function restoreScript(lines: readonly string[], want: ChainRules): string {
  const out = [`*${want.table}`, `:${want.chain} - [0:0]`];
  for (const r of chainRules(lines, want.parent)) {
    if (r.includes(`"${want.comment}"`)) out.push(`-D ${want.parent} ${r}`);
  }
  out.push(`-I ${want.parent} 1 ${want.jump}`);
  for (const r of want.rules) out.push(`-A ${want.chain} ${r}`);
  out.push('COMMIT', '');
  return out.join('\n');
}

/** Our chains as iptables-save names them: which table, which built-in chain jumps in, comment. */
export const OUR_CHAINS: ReadonlyArray<Pick<ChainRules, 'table' | 'parent' | 'chain' | 'comment'>> =
  [
    { table: 'nat', parent: 'POSTROUTING', chain: MASQ_CHAIN, comment: MASQ_COMMENT },
    { table: 'filter', parent: 'FORWARD', chain: FWD_CHAIN, comment: FWD_COMMENT },
  ];

/**
 * The `iptables-restore --noflush` script that removes our chain of one table and every jump
 * into it carrying our comment, or null when the table holds none of it (nftables mode cleans
 * up after an earlier iptables-mode run, as flannel does).
 */
export function removalScript(
  lines: readonly string[],
  id: Pick<ChainRules, 'table' | 'parent' | 'chain' | 'comment'>,
): string | null {
  const jumps = chainRules(lines, id.parent).filter((r) => r.includes(`"${id.comment}"`));
  const declared = lines.some((l) => l.startsWith(`:${id.chain} `));
  if (!declared && jumps.length === 0) return null;
  const out = [`*${id.table}`];
  for (const r of jumps) out.push(`-D ${id.parent} ${r}`);
  if (declared) out.push(`-F ${id.chain}`, `-X ${id.chain}`);
  out.push('COMMIT', '');
  return out.join('\n');
}
