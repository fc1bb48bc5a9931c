/**
 * Whether this host forwards the native engine's egress-TAP frames (tap_gso, native/src/tap_tx.h).
 * They enter the stack on the TAP with our own underlay address as their source and leave
 * forwarded out of the underlay device — a path a fresh namespace always allows and a hardened
 * host may not: where it does not, TCP would blackhole while ping (which leaves by the UDP
 * sockets) still works, so the userspace backends start the engine without the TAP instead
 * (userspace.ts offloadsOption), saying why once.
 */
import { readFileSync } from 'node:fs';
import { outputOf } from '../../common/command.js';

/** What decides whether the host forwards the egress TAP's frames (readHostForwardPath). */
export interface HostForwardPath {
  /** net.ipv4.conf.all.rp_filter ('0' off, '1' strict, '2' loose; '' unreadable). */
  readonly rpFilterAll: string;
  /** Where the host's FORWARD hook has a policy of drop (e.g. `nft ip filter FORWARD`). */
  readonly forwardDrop: readonly string[];
}

/**
 * Why the host would drop the egress TAP's frames (TCP would then blackhole while ping, which
 * leaves by the sockets, still works), or null. The TAP's frames enter the stack on the TAP
 * with our own underlay address as their source and are forwarded out of the underlay device:
 *   - reverse-path filtering: the TAP has no address of its own, so the kernel's reverse-path
 *     check refuses every frame in strict and in loose mode alike, and the effective mode of a
 *     device is the larger of its own and `all`'s, which the TAP cannot lower;
 *   - a FORWARD hook whose policy is drop, with weft's forward rules off
 *     (--iptables-forward-rules=false): nothing accepts the frames (weft's rules do, by name).
 */
export function egressTapBlocked(host: HostForwardPath, forwardRules: boolean): string | null {
  if (host.rpFilterAll === '1' || host.rpFilterAll === '2') {
    const mode = host.rpFilterAll === '1' ? 'strict' : 'loose';
    return `${mode} reverse-path filtering (net.ipv4.conf.all.rp_filter=${host.rpFilterAll}) drops the TAP's frames (it has no address)`;
  }
  if (!forwardRules && host.forwardDrop.length > 0) {
    return `the FORWARD policy is drop (${host.forwardDrop.join(', ')}) and --iptables-forward-rules=false: nothing accepts the TAP's frames`;
  }
  return null;
}

/** `nft list chains` text → the chains hooked on forward with policy drop (`family table chain`). */
export function nftForwardDrops(text: string): string[] {
  const out: string[] = [];
  let table = '';
  let chain = '';
  for (const line of text.split('\n')) {
    const t = line.trim();
    const tm = /^table (\S+ \S+) \{/.exec(t);
    if (tm) table = tm[1]!;
    const cm = /^chain (\S+) \{/.exec(t);
    if (cm) chain = cm[1]!;
    if (/\bhook forward\b/.test(t) && /\bpolicy drop\b/.test(t)) out.push(`nft ${table} ${chain}`);
  }
  return out;
}

/** `iptables-legacy-save` text → ['iptables-legacy FORWARD'] when its filter FORWARD policy is DROP. */
export function legacyForwardDrops(text: string): string[] {
  let filter = false;
  for (const line of text.split('\n')) {
    if (line.startsWith('*')) filter = line === '*filter';
    if (filter && /^:FORWARD DROP\b/.test(line)) return ['iptables-legacy FORWARD'];
  }
  return [];
}

/**
 * Reads the host's forward path as it stands: rp_filter, `nft list chains` (nftables, and
 * iptables-nft's tables) and `iptables-legacy-save` (which lists only tables that exist, never
 * creating one).
 */
export function readHostForwardPath(): HostForwardPath {
  let rpFilterAll = '';
  try {
    rpFilterAll = readFileSync('/proc/sys/net/ipv4/conf/all/rp_filter', 'utf8').trim();
  } catch {
    // no IPv4 sysctls here: nothing to say
  }
  return {
    rpFilterAll,
    forwardDrop: [
      ...nftForwardDrops(outputOf('nft', ['list', 'chains'], 5000) ?? ''),
      ...legacyForwardDrops(outputOf('iptables-legacy-save', [], 5000) ?? ''),
    ],
  };
}
