#!/usr/bin/env node
// Runs the suite with node:test through tsx. Node 20's --test takes no globs, so the files are
// found here. Arguments narrow the run to directories or files (default: all of test/).
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
const flags = process.argv.slice(2).filter((a) => a.startsWith('-'));
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
const before = snapshot();
const r = spawnSync(process.execPath, args, { stdio: 'inherit' });
const changed = diffSnapshots(before, snapshot());
if (changed.length > 0) {
  console.error(
    `\nrun-tests: the run changed the root network namespace (tests must only touch namespaces ` +
      `and temp dirs they create):\n${formatDiff(changed)}`,
  );
  process.exit(r.status || 1);
}
process.exit(r.status ?? 1);
