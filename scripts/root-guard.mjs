// The root-namespace guard of the test runner: a snapshot of the host's own network state
// (links, routes, iptables, nftables, BPF pins, and the host paths weft and CNI write by default)
// taken before and after a run, normalised so that only real changes differ (no counters,
// timestamps, or expiry timers), and a diff that names each changed line. Tests must only touch namespaces they create and temp dirs
// (DESIGN §10); anything this finds is a test (or product) writing host state.
//
// Only the root namespace is read: other runs on the same machine create and delete their own
// namespaces meanwhile (`ip netns list` would change), which is no business of this guard.
import { spawnSync } from 'node:child_process';
import { readdirSync, lstatSync } from 'node:fs';
import { join } from 'node:path';

/** What is snapshotted: a name, how to read it, and its normaliser. */
export const SOURCES = [
  { name: 'ip -o link', cmd: ['ip', '-o', 'link'], normalise: normaliseLinks },
  { name: 'ip -o addr', cmd: ['ip', '-o', 'addr'], normalise: normaliseAddrs },
  { name: 'ip rule', cmd: ['ip', 'rule'], normalise: lines },
  { name: 'ip -6 rule', cmd: ['ip', '-6', 'rule'], normalise: lines },
  { name: 'ip route', cmd: ['ip', 'route'], normalise: normaliseRoutes },
  { name: 'ip -6 route', cmd: ['ip', '-6', 'route'], normalise: normaliseRoutes },
  { name: 'iptables-save', cmd: ['iptables-save'], normalise: normaliseIptables },
  { name: 'ip6tables-save', cmd: ['ip6tables-save'], normalise: normaliseIptables },
  { name: 'nft list ruleset', cmd: ['nft', 'list', 'ruleset'], normalise: normaliseNft },
  { name: '/var/lib/cni', dir: '/var/lib/cni' },
  { name: '/sys/fs/bpf', dir: '/sys/fs/bpf' },
  // weft's and CNI's default host paths: subnet.env, the embedded store, plugins and configs.
  { name: '/run/flannel', dir: '/run/flannel' },
  { name: '/var/lib/weft', dir: '/var/lib/weft' },
  { name: '/etc/cni', dir: '/etc/cni' },
  { name: '/opt/cni', dir: '/opt/cni' },
];

/** Non-empty lines with runs of whitespace collapsed. */
export function lines(text) {
  return text
    .split('\n')
    .map((l) => l.replace(/\s+/g, ' ').trim())
    .filter((l) => l !== '');
}

/**
 * `ip -o link`: one line per device without its ifindex (a device deleted and re-created is the
 * same state) and without the ` \` line joins of -o. Addresses, flags, MTU, master, state stay.
 */
export function normaliseLinks(text) {
  return lines(text.replace(/\\/g, ' ')).map((l) => l.replace(/^\d+: /, ''));
}

/** `ip -o addr`: without ifindex and the lifetimes that count down (DHCP, SLAAC). */
export function normaliseAddrs(text) {
  return normaliseLinks(text).map((l) =>
    l.replace(/ valid_lft \S+ preferred_lft \S+/, '').replace(/ dynamic/, ''),
  );
}

/** Routes: `expires 123sec` (RA routes, temporary addresses) ticks; nothing else does. */
export function normaliseRoutes(text) {
  return lines(text).map((l) => l.replace(/ expires -?\d+sec/, ''));
}

/**
 * iptables-save: drop the `# Generated/Completed ... on <date>` comments and the chain counters
 * (`:FORWARD ACCEPT [12:3456]` → `:FORWARD ACCEPT`); rule counters appear only with -c.
 */
export function normaliseIptables(text) {
  return lines(text)
    .filter((l) => !l.startsWith('#'))
    .map((l) => l.replace(/ \[\d+:\d+\]$/, ''));
}

/** nft: counters (`counter packets N bytes M`), quotas used, set element timers. */
export function normaliseNft(text) {
  return lines(text).map((l) =>
    l
      .replace(/counter packets \d+ bytes \d+/g, 'counter')
      .replace(/ used \d+ \w+/g, '')
      .replace(/ expires [\dhms.]+/g, ''),
  );
}

/** Every path under `dir` (relative, sorted; directories end in `/`); [] when it does not exist. */
export function listTree(dir) {
  const out = [];
  const walk = (rel) => {
    let entries;
    try {
      entries = readdirSync(join(dir, rel));
    } catch (err) {
      if (rel === '' && err.code === 'ENOENT') return;
      out.push(`${rel || '.'}: unreadable (${err.code})`);
      return;
    }
    for (const e of entries.sort()) {
      const p = rel ? `${rel}/${e}` : e;
      let isDir = false;
      try {
        isDir = lstatSync(join(dir, p)).isDirectory();
      } catch {
        /* removed meanwhile */
      }
      out.push(isDir ? `${p}/` : p);
      if (isDir) walk(p);
    }
  };
  walk('');
  return out;
}

/**
 * Reads every source. A command that is missing or fails (not root, no nft) records why in one
 * line, the same way before and after, so it never shows as a change by itself.
 */
export function snapshot(sources = SOURCES) {
  const snap = {};
  for (const s of sources) {
    if (s.dir) {
      snap[s.name] = listTree(s.dir);
      continue;
    }
    const [cmd, ...args] = s.cmd;
    const r = spawnSync(cmd, args, { encoding: 'utf8', timeout: 20_000 });
    if (r.error) snap[s.name] = [`(unavailable: ${r.error.code ?? r.error.message})`];
    else if (r.status !== 0) snap[s.name] = [`(failed: exit ${r.status ?? r.signal})`];
    else snap[s.name] = s.normalise(r.stdout);
  }
  return snap;
}

/**
 * Lines that appeared (`+`) or disappeared (`-`) per source, as a multiset difference (order
 * changes alone are not changes). Returns [] when nothing changed.
 */
export function diffSnapshots(before, after) {
  const out = [];
  for (const name of new Set([...Object.keys(before), ...Object.keys(after)])) {
    const count = new Map();
    for (const l of before[name] ?? []) count.set(l, (count.get(l) ?? 0) + 1);
    const added = [];
    for (const l of after[name] ?? []) {
      const n = count.get(l) ?? 0;
      if (n > 0) count.set(l, n - 1);
      else added.push(l);
    }
    const removed = [];
    for (const [l, n] of count) for (let i = 0; i < n; i++) removed.push(l);
    if (added.length || removed.length) out.push({ source: name, added, removed });
  }
  return out;
}

/** The diff as text for the runner's failure message. */
export function formatDiff(diff) {
  return diff
    .map(
      (d) =>
        `  ${d.source}:\n` +
        [...d.removed.map((l) => `    - ${l}`), ...d.added.map((l) => `    + ${l}`)].join('\n'),
    )
    .join('\n');
}
