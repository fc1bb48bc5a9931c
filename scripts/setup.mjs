#!/usr/bin/env node
// Dependency-free setup, run by npm's pre-scripts (pretest, predemo, prebench) and by .ci/run.
// Installs what is missing and says what it is doing; when everything is there it costs a few
// stat() calls and one dpkg-query.
//   1. Debian packages the suite and the demo use (apt-get, as root)
//   2. npm dependencies (npm ci) when node_modules is missing or older than package-lock.json
//   3. the native addon (node-gyp via npm) when missing or older than its sources
//   4. the compiled JS (dist/) when missing or older than src/
//   --packages-only stops after step 1 (used by .ci/run before `npm ci`).
import { spawnSync } from 'node:child_process';
import { existsSync, readdirSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');

export const DEBIAN_PACKAGES = [
  'etcd-server',
  'etcd-client',
  'iperf3',
  'iproute2',
  'iptables',
  'iputils-ping',
  'containernetworking-plugins',
  'libmnl-dev',
  'prometheus',
  'openssl',
  'procps',
  'kmod',
  'clang', // libFuzzer for the bounded fuzz run of the packet decoder; the bpf target
  'libclang-rt-14-dev', // libFuzzer's and ASan's runtimes (not pulled in without recommends)
  'libbpf-dev', // the bpf engine's loader and program headers
  'bpftool',
  'nftables', // EnableNFTables mode
  'ethtool', // offload switches in the dataplane tests
];

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

function missingPackages() {
  const r = spawnSync('dpkg-query', ['-W', '-f=${Package} ${Status}\\n', ...DEBIAN_PACKAGES], {
    encoding: 'utf8',
  });
  if (r.error) return []; // not a Debian system: nothing we can install
  const installed = new Set(
    r.stdout
      .split('\n')
      .filter((l) => l.endsWith(' installed'))
      .map((l) => l.split(' ')[0]),
  );
  return DEBIAN_PACKAGES.filter((p) => !installed.has(p));
}

function ensurePackages() {
  const missing = missingPackages();
  if (missing.length === 0) return;
  if (process.getuid?.() !== 0) {
    say(`missing Debian packages: ${missing.join(' ')} — run as root (sudo) to install them`);
    process.exit(1);
  }
  say(`installing Debian packages: ${missing.join(' ')}`);
  const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
  run('apt-get', ['update', '-q'], { env });
  run('apt-get', ['install', '-y', '-q', '--no-install-recommends', ...missing], { env });
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

ensurePackages();
if (!process.argv.includes('--packages-only')) {
  ensureNodeModules();
  await ensureNative();
  await ensureDist();
}
