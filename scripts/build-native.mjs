#!/usr/bin/env node
// Builds the native addon with npm's bundled node-gyp (no download: npm is set up to use the
// installed Node headers). Run by `npm install` / `npm ci` (our own install script) and by setup.
// A failed build is reported but does not fail the install: weft then runs with the js engine,
// and `npm test` (via scripts/setup.mjs) insists on a working addon.
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, readdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');

export function nodeGypPath() {
  const fromNpm = process.env.npm_config_node_gyp;
  if (fromNpm && existsSync(fromNpm)) return fromNpm;
  const npmCli = process.env.npm_execpath;
  const candidates = [];
  if (npmCli)
    candidates.push(join(dirname(npmCli), '..', 'node_modules', 'node-gyp', 'bin', 'node-gyp.js'));
  candidates.push(
    join(
      dirname(process.execPath),
      '..',
      'lib',
      'node_modules',
      'npm',
      'node_modules',
      'node-gyp',
      'bin',
      'node-gyp.js',
    ),
  );
  for (const c of candidates) if (existsSync(c)) return c;
  return null;
}

/**
 * Builds native/build/weft-tun (native/tun-helper/weft-tun.c: libc only, no node-gyp), the
 * js engine's way to a TUN when the addon does not load. Reported, not fatal (unless strict).
 */
export function buildTunHelper({ strict = false } = {}) {
  const out = join(root, 'native', 'build', 'weft-tun');
  mkdirSync(dirname(out), { recursive: true });
  const src = join(root, 'native', 'tun-helper', 'weft-tun.c');
  const r = spawnSync(process.env.CC || 'cc', ['-std=c99', '-O2', '-Wall', '-o', out, src], {
    stdio: ['ignore', 'inherit', 'inherit'],
  });
  if (r.status !== 0) {
    const msg = `weft: tun helper build failed (${r.error?.message ?? `cc exit ${r.status}`}); the js engine needs the addon to open a TUN`;
    if (strict) throw new Error(msg);
    console.error(msg);
    return false;
  }
  return true;
}

/**
 * The SHA-256 the programs' object carries: over every source in native/bpf (*.c and *.h by
 * name: each name, a NUL, its bytes), so a changed weft_abi.h makes an old object stale too.
 * src/dataplane/bpf-binding.ts bpfSourceHash computes the same to check an object.
 */
export function bpfSourceHash(dir = join(root, 'native', 'bpf')) {
  const h = createHash('sha256');
  for (const name of readdirSync(dir)
    .filter((n) => /\.[ch]$/.test(n))
    .sort())
    h.update(name)
      .update('\0')
      .update(readFileSync(join(dir, name)));
  return h.digest('hex');
}

/**
 * Builds native/build/weft.bpf.o (native/bpf/weft.bpf.c, the bpf engine's programs) with
 * `clang -target bpf`. Reported, not fatal: without it `--dataplane-engine=auto` falls back to
 * the native engine and `bpf` refuses to start, naming this file.
 */
export function buildBpf({ strict = false } = {}) {
  const out = join(root, 'native', 'build', 'weft.bpf.o');
  mkdirSync(dirname(out), { recursive: true });
  const arch = spawnSync(process.env.CC || 'cc', ['-dumpmachine'], { encoding: 'utf8' });
  const multiarch = arch.status === 0 ? arch.stdout.trim() : 'x86_64-linux-gnu';
  const src = join(root, 'native', 'bpf', 'weft.bpf.c');
  // The object carries its sources' hash; the engine refuses it once a source changed.
  const sha = bpfSourceHash(dirname(src));
  const r = spawnSync(
    process.env.BPF_CLANG || 'clang',
    [
      '-O2',
      '-g',
      '-Wall',
      '-target',
      'bpf',
      `-I/usr/include/${multiarch}`,
      `-DWEFT_SOURCE_SHA256="${sha}"`,
      '-c',
      src,
      '-o',
      out,
    ],
    { stdio: ['ignore', 'inherit', 'inherit'] },
  );
  if (r.status !== 0) {
    const msg = `weft: bpf programs build failed (${r.error?.message ?? `clang exit ${r.status}`}); the bpf engine is unavailable (are clang and libbpf-dev installed?)`;
    if (strict) throw new Error(msg);
    console.error(msg);
    return false;
  }
  return true;
}

export function buildNative({ strict = false } = {}) {
  // The helper and the bpf programs are built after node-gyp (whose `rebuild` empties
  // native/build) and whether or not the addon builds: the helper is what the js engine uses
  // when the addon cannot load.
  try {
    return buildAddon({ strict });
  } finally {
    buildTunHelper({ strict });
    buildBpf({ strict });
  }
}

function buildAddon({ strict }) {
  const gyp = nodeGypPath();
  if (!gyp) {
    const msg = 'weft: cannot find node-gyp (npm bundles it); the native addon was not built';
    if (strict) throw new Error(msg);
    console.error(msg);
    return false;
  }
  console.error('weft: building the native addon (native/build/Release/weft.node)');
  // Build against the installed Node headers; never download them (this machine has no network
  // but the package registries). npm sets npm_config_nodedir for its own scripts.
  const env = { ...process.env };
  if (!env.npm_config_nodedir && existsSync('/usr/include/node/node.h'))
    env.npm_config_nodedir = '/usr';
  const r = spawnSync(process.execPath, [gyp, 'rebuild', '--directory', join(root, 'native')], {
    stdio: ['ignore', 'inherit', 'inherit'],
    env,
  });
  if (r.status !== 0) {
    const msg =
      'weft: native addon build failed (are libmnl-dev, libbpf-dev and libssl-dev installed?); the js engine remains';
    if (strict) throw new Error(msg);
    console.error(msg);
    return false;
  }
  return true;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  // --bpf: only the programs (`npm run build`: a changed weft.bpf.c never runs stale).
  if (process.argv.includes('--bpf')) buildBpf();
  else buildNative();
}
