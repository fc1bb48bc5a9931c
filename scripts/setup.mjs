#!/usr/bin/env node
// Dependency-free setup, run by npm's pre-scripts (pretest, predemo, prebench) and by .ci/run.
// Installs what is missing and says what it is doing; when everything is there it costs a few
// stat() calls and one dpkg-query.
//   0. Node.js 20 or newer, or one sentence saying so (nothing else is tried)
//   1. Debian packages (apt-get, as root): what building and running the daemon needs, plus what
//      the tests, the demo and the bench use (--daemon: the first list only). No service a
//      package ships is started or left enabled (etcd-server and prometheus enable theirs).
//   2. npm dependencies (npm ci) when node_modules is missing or older than package-lock.json
//   3. the native addon (node-gyp via npm) when missing or older than its sources
//   4. the compiled JS (dist/) and the CNI bundle (dist/weft-cni.cjs) when older than src/
//   --packages-only stops after step 1 (used by .ci/run before `npm ci`).
import { spawnSync } from 'node:child_process';
import { chmodSync, existsSync, readdirSync, statSync, unlinkSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');

export const MIN_NODE_MAJOR = 20;

/** What building (node-gyp: the addon, the TUN helper) and running `weft daemon` need. */
export const DAEMON_PACKAGES = [
  'g++', // node-gyp's toolchain: the native addon and the TUN helper
  'make',
  'python3',
  'libmnl-dev', // the addon's netlink
  'libbpf-dev', // the addon's bpf loader (-lbpf), and the bpf programs' headers
  'libssl-dev', // the addon's WireGuard primitives (-lcrypto: X25519, ChaCha20-Poly1305, BLAKE2s)
  'clang', // the bpf engine's programs (clang -target bpf); libFuzzer for the fuzz test
  'iproute2', // ip and bridge: kernel ops without the addon
  'iptables', // --ip-masq
  'nftables', // EnableNFTables mode
  'kmod', // modprobe: vxlan, tun
];

/** What the tests, the demo and the bench use on top. */
export const TEST_PACKAGES = [
  'etcd-server',
  'etcd-client',
  'iperf3',
  'iputils-ping',
  'containernetworking-plugins', // the real bridge, host-local, loopback plugins
  'prometheus', // promtool check metrics; the server in test/netns/prometheus.test.ts
  'openssl',
  'procps',
  'time', // peak RSS in bench:footprint
  'libclang-rt-14-dev', // libFuzzer's and ASan's runtimes (not pulled in without recommends)
  'bpftool',
  'ethtool', // offload switches in the dataplane tests
  'tcpdump', // what the udp backend sends, in the mixed-cluster test
  'clang-format', // npm run lint checks native/ against native/.clang-format (lint:native)
  'wireguard-go', // the WireGuard interop test's reference peer (userspace, no kernel module)
  'wireguard-tools', // wg: configures that peer as flanneld configures a wireguard link
];

export const DEBIAN_PACKAGES = [...DAEMON_PACKAGES, ...TEST_PACKAGES];

/** Services that packages enable (and would start) on install; setup leaves them off. */
export const PACKAGE_SERVICES = {
  'etcd-server': ['etcd.service'],
  prometheus: ['prometheus.service'],
};

/** One sentence when this Node cannot run weft, else null. */
export function nodeVersionProblem(version = process.versions.node) {
  const major = Number(version.split('.')[0]);
  if (major >= MIN_NODE_MAJOR) return null;
  return (
    `weft needs Node.js ${MIN_NODE_MAJOR} or newer with npm, and this is Node ${version} ` +
    `(Debian 12's own nodejs package is 18, without npm): install Node.js ${MIN_NODE_MAJOR}+ ` +
    'from the NodeSource packages or the official binaries, then run this again.'
  );
}

/**
 * Runs `fn` with a policy-rc.d that forbids starting services (exit 101, Debian's "action not
 * allowed"), so packages that start their service on install do not; an existing policy is
 * kept as it is. The file is removed afterwards only if we wrote it.
 */
export function withServicesHeld(fn, policy = '/usr/sbin/policy-rc.d') {
  const ours = !existsSync(policy);
  if (ours) {
    writeFileSync(
      policy,
      '#!/bin/sh\n# written by weft scripts/setup.mjs while packages install\nexit 101\n',
    );
    chmodSync(policy, 0o755);
  }
  try {
    return fn();
  } finally {
    if (ours) unlinkSync(policy);
  }
}

/**
 * Disables (and on a running systemd, stops) the services that `installed` packages ship,
 * through systemctl's offline mode under `rootDir` (works without a running systemd). Returns
 * the units it disabled.
 */
export function disableServices(installed, rootDir = '/') {
  const units = installed.flatMap((p) => PACKAGE_SERVICES[p] ?? []);
  if (units.length === 0) return [];
  const systemctl = spawnSync('systemctl', ['--version'], { stdio: 'ignore' });
  if (systemctl.error) return []; // no systemd here: nothing can start them at boot
  const r = spawnSync('systemctl', [`--root=${resolve(rootDir)}`, 'disable', ...units], {
    encoding: 'utf8',
  });
  if (r.status !== 0) throw new Error(`systemctl disable ${units.join(' ')}: ${r.stderr.trim()}`);
  if (rootDir === '/' && existsSync('/run/systemd/system')) {
    spawnSync('systemctl', ['stop', ...units], { stdio: 'ignore' });
  }
  return units;
}

function say(msg) {
  console.error(`setup: ${msg}`);
}

function run(cmd, args, opts = {}) {
  say(`running ${cmd} ${args.join(' ')}`);
  const r = spawnSync(cmd, args, { stdio: ['ignore', 'inherit', 'inherit'], cwd: root, ...opts });
  if (r.status !== 0) {
    say(`${cmd} failed (exit ${r.status ?? r.signal})`);
    process.exit(1);
  }
}

function missingPackages(wanted) {
  const r = spawnSync('dpkg-query', ['-W', '-f=${Package} ${Status}\\n', ...wanted], {
    encoding: 'utf8',
  });
  if (r.error) return []; // not a Debian system: nothing we can install
  const installed = new Set(
    r.stdout
      .split('\n')
      .filter((l) => l.endsWith(' installed'))
      .map((l) => l.split(' ')[0]),
  );
  return wanted.filter((p) => !installed.has(p));
}

function ensurePackages(wanted) {
  const missing = missingPackages(wanted);
  if (missing.length === 0) return;
  if (process.getuid?.() !== 0) {
    say(`missing Debian packages: ${missing.join(' ')} — run as root (sudo) to install them`);
    process.exit(1);
  }
  say(`installing Debian packages: ${missing.join(' ')}`);
  const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
  run('apt-get', ['update', '-q'], { env });
  withServicesHeld(() =>
    run('apt-get', ['install', '-y', '-q', '--no-install-recommends', ...missing], { env }),
  );
  let disabled = [];
  try {
    disabled = disableServices(missing);
  } catch (err) {
    say(`warning: ${err.message}; disable them yourself (systemctl disable --now etcd prometheus)`);
  }
  if (disabled.length > 0)
    say(`left disabled and stopped (tests start their own): ${disabled.join(' ')}`);
}

function newestMtime(path) {
  if (!existsSync(path)) return 0;
  const st = statSync(path);
  if (!st.isDirectory()) return st.mtimeMs;
  let newest = st.mtimeMs;
  for (const e of readdirSync(path)) newest = Math.max(newest, newestMtime(join(path, e)));
  return newest;
}

function ensureNodeModules() {
  const marker = join(root, 'node_modules', '.package-lock.json');
  const lock = join(root, 'package-lock.json');
  if (existsSync(marker) && statSync(marker).mtimeMs >= newestMtime(lock)) return false;
  say('installing npm dependencies (npm ci)');
  const npm = process.env.npm_execpath
    ? [process.execPath, [process.env.npm_execpath, 'ci']]
    : ['npm', ['ci']];
  run(npm[0], npm[1]);
  return true;
}

async function ensureNative() {
  // The addon and the TUN helper (native/tun-helper: the js engine's way to a TUN when the
  // addon cannot load) are rebuilt together when either is missing or older than its sources.
  const fresh = (out, ...srcs) =>
    existsSync(out) && statSync(out).mtimeMs >= Math.max(...srcs.map((s) => newestMtime(s)));
  const addonFresh = fresh(
    join(root, 'native', 'build', 'Release', 'weft.node'),
    join(root, 'native', 'src'),
    join(root, 'native', 'binding.gyp'),
  );
  const helperFresh = fresh(
    join(root, 'native', 'build', 'weft-tun'),
    join(root, 'native', 'tun-helper'),
  );
  if (addonFresh && helperFresh) return;
  const { buildNative } = await import('./build-native.mjs');
  try {
    buildNative({ strict: true });
  } catch (err) {
    say(err.message);
    process.exit(1);
  }
}

async function ensureDist() {
  const fresh = (out) => existsSync(out) && statSync(out).mtimeMs >= newestMtime(join(root, 'src'));
  if (!fresh(join(root, 'dist', 'control', 'main.js'))) {
    say('compiling TypeScript (dist/)');
    run(process.execPath, [
      join(root, 'node_modules', 'typescript', 'bin', 'tsc'),
      '-p',
      'tsconfig.build.json',
    ]);
  }
  if (!fresh(join(root, 'dist', 'weft-cni.cjs'))) {
    say('bundling the CNI plugin (dist/weft-cni.cjs)');
    const { buildCni } = await import('./build-cni.mjs');
    await buildCni();
  }
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const problem = nodeVersionProblem();
  if (problem) {
    say(problem);
    process.exit(1);
  }
  ensurePackages(process.argv.includes('--daemon') ? DAEMON_PACKAGES : DEBIAN_PACKAGES);
  if (!process.argv.includes('--packages-only')) {
    ensureNodeModules();
    await ensureNative();
    await ensureDist();
  }
}
