// Everything the suite runs is installed by scripts/setup.mjs on a fresh machine (issue 12.3):
// every external command the tests, the testbed, the bench and the daemon start (found by reading
// their sources) is mapped to the Debian package that ships it, and that package is in setup's
// list or in every Debian system. A new tool without a package here fails this test.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
// @ts-expect-error: a plain .mjs script without types
import * as setup from '../../../scripts/setup.mjs';

const ROOT = fileURLToPath(new URL('../../..', import.meta.url));

/** Command → Debian package (null: optional, its test skips and says why without it). */
const TOOLS: Record<string, string | null> = {
  ip: 'iproute2',
  bridge: 'iproute2',
  tc: 'iproute2',
  nstat: 'iproute2',
  ss: 'iproute2',
  iptables: 'iptables',
  'iptables-save': 'iptables',
  'iptables-restore': 'iptables',
  ip6tables: 'iptables',
  'ip6tables-save': 'iptables',
  'ip6tables-restore': 'iptables',
  'iptables-legacy-save': 'iptables',
  'ip6tables-legacy-save': 'iptables',
  nft: 'nftables',
  modprobe: 'kmod',
  etcd: 'etcd-server',
  etcdctl: 'etcd-client',
  iperf3: 'iperf3',
  'wireguard-go': 'wireguard-go',
  wg: 'wireguard-tools',
  ping: 'iputils-ping',
  promtool: 'prometheus',
  prometheus: 'prometheus',
  openssl: 'openssl',
  tcpdump: 'tcpdump',
  sysctl: 'procps',
  python3: 'python3',
  make: 'make',
  cc: 'g++', // gcc comes with g++
  clang: 'clang',
  'clang++': 'clang',
  bpftool: 'bpftool',
  ethtool: 'ethtool',
  prlimit: 'util-linux',
  unshare: 'util-linux',
  nsenter: 'util-linux',
  findmnt: 'util-linux',
  cat: 'coreutils',
  mkdir: 'coreutils',
  sleep: 'coreutils',
  chmod: 'coreutils',
  getconf: 'libc-bin',
  bash: 'bash',
  dpkg: 'dpkg',
  'dpkg-query': 'dpkg',
  'apt-get': 'apt',
  systemctl: null, // setup.mjs disables services only where systemd runs
  kubectl: null, // the fake API server's kubectl test skips without it
  git: null, // the fault suite names the commit it ran at ("unknown" without git)
};

/** Packages every Debian system has (Essential: yes, or apt itself). */
const ESSENTIAL = new Set(['coreutils', 'util-linux', 'libc-bin', 'bash', 'dpkg', 'apt']);

function sources(dir: string, out: string[] = []): string[] {
  for (const e of readdirSync(dir)) {
    if (e === 'node_modules' || e === 'fixtures' || e === 'results') continue;
    const p = join(dir, e);
    if (statSync(p).isDirectory()) sources(p, out);
    else if (/\.(ts|mjs)$/.test(e) && !e.endsWith('.d.mts')) out.push(p);
  }
  return out;
}

/** Commands started by name: by spawn/execFile and by the `ip netns exec` helpers (ns first). */
function commandsIn(text: string): string[] {
  const direct =
    /\b(?:spawn|spawnSync|execFile|execFileSync|execFileP|run|outputOf)\(\s*'([a-z0-9_.+-]+|\/usr\/bin\/time)'/g;
  const inNs = /\b(?:nsExec|nsExecAsync|nsSpawn|nsRun|spawn)\(\s*[\w.!\]\[]+,\s*'([a-z0-9_.+-]+)'/g;
  return [...text.matchAll(direct), ...text.matchAll(inNs)].map((m) => m[1]!);
}

test('every command the suite, testbed, bench and daemon start has a package setup installs', () => {
  const found = new Map<string, string>();
  for (const dir of ['src', 'test', 'bench', 'scripts']) {
    for (const f of sources(join(ROOT, dir))) {
      for (const c of commandsIn(readFileSync(f, 'utf8'))) found.set(c, f.slice(ROOT.length));
    }
  }
  assert.ok(found.has('tcpdump') && found.has('etcd') && found.has('ping'), 'the scan finds tools');
  const packages: string[] = setup.DEBIAN_PACKAGES;
  for (const [cmd, file] of found) {
    // Deliberately missing binaries (tests of a spawn that fails) need no package.
    if (cmd === '/usr/bin/time' || /no-such|nonexistent/.test(cmd)) continue;
    assert.ok(cmd in TOOLS, `${cmd} (started in ${file}) has no Debian package in this table`);
    const pkg = TOOLS[cmd];
    if (pkg === null || pkg === undefined) continue;
    assert.ok(
      packages.includes(pkg) || ESSENTIAL.has(pkg),
      `${cmd} needs Debian ${pkg}, which scripts/setup.mjs does not install`,
    );
  }
  assert.ok(packages.includes('time'), '/usr/bin/time (bench:footprint) needs Debian time');
});
