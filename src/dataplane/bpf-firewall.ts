/**
 * The host firewall rules the bpf engine would bypass. Its programs see the outer packets where
 * netfilter never does: weft_rx decapsulates at tc ingress (before PREROUTING and INPUT) and
 * weft_tx sends with bpf_redirect_neigh (no OUTPUT, no POSTROUTING). A rule on the tunnel port
 * that drops, rejects or hands the packet on (an operator quarantining a node:
 * `iptables -I INPUT -s <node> -p udp --dport 8472 -j DROP`) works with kernel vxlan and the
 * native engine and would silently not apply; the engine refuses to start where one exists, so
 * the native engine (whose sockets meet every rule) runs instead.
 *
 * What is read: `nft list ruleset` (nftables, iptables-nft and ip6tables-nft rules: tables of
 * family ip and inet, and ip6 where the underlay is IPv6), and `iptables-legacy-save` (and
 * `ip6tables-legacy-save` for an IPv6 underlay) where the legacy backend is installed. A rule counts when it
 * matches the port as UDP (or transport) destination or source port — a number, a range or a
 * set holding it — or, for IPIP (no port), IP protocol 4 (`-p 4`, which the tools print as
 * `ipencap`; `ipip` in /etc/protocols is 94) — in a chain on the input, output, prerouting or
 * postrouting hook or in a
 * regular chain (which such a chain may jump to), with a verdict other than accept (drop,
 * reject, queue, jump, goto). Rules on addresses alone (no port) are not looked at: they would
 * drop the inner traffic as well, which the TUN's own hooks still see.
 */
import { outputOf } from '../common/command.js';

const HOOKS = new Set(['input', 'output', 'prerouting', 'postrouting']);
const LEGACY_CHAINS = new Set(['INPUT', 'OUTPUT', 'PREROUTING', 'POSTROUTING']);
const BUILTIN_TARGETS = new Set(['ACCEPT', 'LOG', 'RETURN', 'MARK', 'CONNMARK', 'NOTRACK', 'CT']);

/** The tunnel's outer packets: UDP to this port, or IPIP (IP protocol 4). */
export type Tunnel = number | 'ipip';

/** Whether a protocol spec (ipencap, 4, { udp, ipencap }, 4,17) names IP protocol 4. */
function protoSpecIsIpip(spec: string): boolean {
  return spec
    .replace(/[{}]/g, ' ')
    .split(/[\s,]+/)
    .some((p) => p === 'ipencap' || p === '4');
}

/** Whether `spec` (8472, 8000-9000, { 53, 8472 }, 8000:9000, 53,8472) includes `port`. */
export function portSpecIncludes(spec: string, port: number): boolean {
  for (const part of spec.replace(/[{}]/g, ' ').split(/[\s,]+/)) {
    if (part === '') continue;
    const range = /^(\d+)[-:](\d+)$/.exec(part);
    if (range) {
      if (Number(range[1]) <= port && port <= Number(range[2])) return true;
    } else if (/^\d+$/.test(part) && Number(part) === port) return true;
  }
  return false;
}

/** The underlay families whose outer packets the programs send and take. */
export type UnderlayFamily = 4 | 6;

/**
 * The rules of an `nft list ruleset` text that match `tunnel` with a verdict other than accept,
 * in tables that see the outer packets of `families` (ip: IPv4, ip6: IPv6, inet: both).
 */
export function nftRulesOnPort(
  ruleset: string,
  tunnel: Tunnel,
  families: readonly UnderlayFamily[] = [4],
): string[] {
  const tables = new Set(['inet']);
  if (families.includes(4)) tables.add('ip');
  if (families.includes(6)) tables.add('ip6');
  const found: string[] = [];
  let family = '';
  let table = '';
  let chain = '';
  let hook: string | null = null;
  for (const raw of ruleset.split('\n')) {
    const line = raw.trim();
    let m: RegExpExecArray | null;
    if ((m = /^table (\S+) (\S+) \{/.exec(line))) {
      [family, table] = [m[1]!, m[2]!];
      continue;
    }
    if ((m = /^chain (\S+) \{/.exec(line))) {
      chain = m[1]!;
      hook = null;
      continue;
    }
    if ((m = /^type \S+ hook (\S+)/.exec(line))) {
      hook = m[1]!;
      continue;
    }
    if (!tables.has(family)) continue;
    if (hook !== null && !HOOKS.has(hook)) continue;
    if (!/\b(drop|reject|queue|jump|goto)\b/.test(line)) continue;
    let hit: boolean;
    if (tunnel === 'ipip') {
      const protos = [...line.matchAll(/\b(?:ip protocol|meta l4proto) (?:!= )?(\{[^}]*\}|\S+)/g)];
      hit = protos.some((p) => !p[0].includes('!=') && protoSpecIsIpip(p[1]!));
    } else {
      if (/\bicmp\b|\btcp\b/.test(line) && !/\b(udp|th)\b/.test(line)) continue;
      const ports = [...line.matchAll(/\b(?:udp|th) [sd]port (?:!= )?(\{[^}]*\}|\S+)/g)];
      hit = ports.some((p) => !p[0].includes('!=') && portSpecIncludes(p[1]!, tunnel));
    }
    if (hit) {
      found.push(`nft ${family} ${table} ${chain}${hook ? ` (hook ${hook})` : ''}: ${line}`);
    }
  }
  return found;
}

/**
 * The rules of an `iptables-save` (or `ip6tables-save`) text that match `tunnel` with a target
 * other than ACCEPT; `tool` names where they came from.
 */
export function iptablesRulesOnPort(
  save: string,
  tunnel: Tunnel,
  tool = 'iptables-legacy',
): string[] {
  const found: string[] = [];
  const builtin = new Set<string>();
  let table = '';
  for (const line of save.split('\n')) {
    if (line.startsWith('*')) table = line.slice(1).trim();
    const decl = /^:(\S+) (\S+)/.exec(line);
    if (decl && decl[2] !== '-') builtin.add(`${table}/${decl[1]}`);
    const m = /^-A (\S+) (.*)$/.exec(line);
    if (!m) continue;
    const chain = m[1]!;
    // Built-in chains of other hooks (FORWARD) never see the outer packets.
    if (builtin.has(`${table}/${chain}`) && !LEGACY_CHAINS.has(chain)) continue;
    const target = /-[jg] (\S+)/.exec(m[2]!)?.[1];
    if (!target || BUILTIN_TARGETS.has(target)) continue;
    if (tunnel === 'ipip') {
      const proto = /(!\s+)?-p (\S+)/.exec(m[2]!);
      if (proto && !proto[1] && protoSpecIsIpip(proto[2]!)) found.push(`${tool} ${table}: ${line}`);
      continue;
    }
    if (!/-p udp\b/.test(m[2]!)) continue;
    const ports = [
      ...m[2]!.matchAll(
        /(!\s+)?--(?:dport|sport|dports|sports|destination-port|source-port) (\S+)/g,
      ),
    ];
    if (ports.some((p) => !p[1] && portSpecIncludes(p[2]!, tunnel))) {
      found.push(`${tool} ${table}: ${line}`);
    }
  }
  return found;
}

/**
 * The host's netfilter rules (this network namespace) on the tunnel (UDP port `tunnel`, or IPIP)
 * that the bpf engine's programs would bypass for an underlay of `families`; [] when there are
 * none or no firewall tool is installed.
 */
export function bypassedFirewallRules(
  tunnel: Tunnel,
  families: readonly UnderlayFamily[] = [4],
): string[] {
  const found: string[] = [];
  const nft = outputOf('nft', ['list', 'ruleset']);
  if (nft !== null) found.push(...nftRulesOnPort(nft, tunnel, families));
  if (families.includes(4)) {
    const legacy = outputOf('iptables-legacy-save', []);
    if (legacy !== null) found.push(...iptablesRulesOnPort(legacy, tunnel));
  }
  if (families.includes(6)) {
    const legacy6 = outputOf('ip6tables-legacy-save', []);
    if (legacy6 !== null) found.push(...iptablesRulesOnPort(legacy6, tunnel, 'ip6tables-legacy'));
  }
  return found;
}
