#!/usr/bin/env node
// Runs the suite with node:test through tsx. Node 20's --test takes no globs, so the files are
// found here. Arguments narrow the run to directories or files (default: all of test/); the
// flag --source starts the testbed's weft from the sources instead of a fresh dist/ build.
//
// The run is guarded: the root network namespace (links, addresses, routes, rules, iptables,
// nftables, /var/lib/cni, /sys/fs/bpf) is snapshotted before and after, and any difference fails
// the run naming what changed (scripts/root-guard.mjs). Tests only touch namespaces they create.
import { spawnSync } from 'node:child_process';
import { readdirSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { diffSnapshots, formatDiff, snapshot } from './root-guard.mjs';

const root = new URL('..', import.meta.url).pathname;

function collect(p, out) {
  const st = statSync(p);
  if (st.isDirectory()) {
    for (const e of readdirSync(p).sort()) {
      if (e === 'node_modules' || e === 'fixtures') continue;
      collect(join(p, e), out);
    }
  } else if (p.endsWith('.test.ts')) {
    out.push(p);
  }
}

const targets = process.argv.slice(2).filter((a) => !a.startsWith('-'));
// --source: the testbed starts weft from the TypeScript sources through tsx (no build).
const fromSource = process.argv.includes('--source');
const flags = process.argv.slice(2).filter((a) => a.startsWith('-') && a !== '--source');
const files = [];
for (const t of targets.length ? targets : ['test']) collect(join(root, t), files);
if (files.length === 0) {
  console.error('run-tests: no test files found');
  process.exit(1);
}
const args = [
  '--import',
  'tsx',
  '--test',
  '--test-concurrency=1',
  '--test-reporter=spec',
  ...flags,
  ...files.map((f) => relative(process.cwd(), f)),
];
// The testbed's daemons and CLI calls run from dist/ (bin/weft, as weft ships), built here from
// the sources first so they are never stale: a start from dist/ skips compiling the TypeScript
// (~0.5 s a start on a quiet machine, several seconds under the suite's load).
if (!fromSource) {
  for (const step of [
    [join(root, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', 'tsconfig.build.json'],
    [join(root, 'scripts', 'build-cni.mjs')],
  ]) {
    const b = spawnSync(process.execPath, step, { cwd: root, stdio: 'inherit' });
    if (b.status !== 0) {
      console.error(
        `run-tests: building dist/ failed (${relative(root, step[0])}); --source skips it`,
      );
      process.exit(b.status || 1);
    }
  }
}
const before = snapshot();
const r = spawnSync(process.execPath, args, {
  stdio: 'inherit',
  env: { ...process.env, WEFT_TEST_LAUNCHER: fromSource ? 'source' : 'dist' },
});
const changed = diffSnapshots(before, snapshot());
if (changed.length > 0) {
  console.error(
    `\nrun-tests: the run changed the root network namespace (tests must only touch namespaces ` +
      `and temp dirs they create):\n${formatDiff(changed)}`,
  );
  process.exit(r.status || 1);
}
process.exit(r.status ?? 1);
