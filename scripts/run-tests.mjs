#!/usr/bin/env node
// Runs the suite with node:test through tsx. Node 20's --test takes no globs, so the files are
// found here. Arguments narrow the run to directories or files (default: all of test/).
//
// Two lanes run side by side, each one file at a time: the files that make network namespaces,
// devices or daemons (test/netns, test/integration) in one, the rest (test/unit, test/native:
// no namespace, no device, nothing outside the process and its temp dirs) in the other. The
// namespace lane's output streams; the other lane's is held and printed whole when it ends.
//
// The run is guarded: the root network namespace (links, addresses, routes, rules, iptables,
// nftables, /var/lib/cni, /sys/fs/bpf) is snapshotted before and after, and any difference fails
// the run naming what changed (scripts/root-guard.mjs). Tests only touch namespaces they create.
import { spawn } from 'node:child_process';
import { readdirSync, statSync } from 'node:fs';
import { join, relative, sep } from 'node:path';
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

/** Whether a test file makes namespaces, devices or daemons (its lane runs them one at a time). */
export function touchesNetwork(file) {
  const rel = relative(root, file).split(sep);
  return rel[0] === 'test' && (rel[1] === 'netns' || rel[1] === 'integration');
}

const targets = process.argv.slice(2).filter((a) => !a.startsWith('-'));
const flags = process.argv.slice(2).filter((a) => a.startsWith('-'));
const files = [];
for (const t of targets.length ? targets : ['test']) collect(join(root, t), files);
if (files.length === 0) {
  console.error('run-tests: no test files found');
  process.exit(1);
}
const lanes = [files.filter(touchesNetwork), files.filter((f) => !touchesNetwork(f))].filter(
  (l) => l.length > 0,
);

/** One `node --test` over `laneFiles`; `hold`: its output is printed whole when it ends. */
function runLane(laneFiles, hold) {
  const args = [
    '--import',
    'tsx',
    '--test',
    '--test-concurrency=1',
    '--test-reporter=spec',
    ...flags,
    ...laneFiles.map((f) => relative(process.cwd(), f)),
  ];
  return new Promise((resolve) => {
    const child = spawn(process.execPath, args, {
      stdio: hold ? ['inherit', 'pipe', 'pipe'] : 'inherit',
    });
    const held = [];
    if (hold) {
      child.stdout.on('data', (d) => held.push(d));
      child.stderr.on('data', (d) => held.push(d));
    }
    child.on('close', (code, signal) => {
      if (hold) process.stdout.write(Buffer.concat(held));
      resolve(code ?? (signal ? 1 : 0));
    });
  });
}

const before = snapshot();
const codes = await Promise.all(lanes.map((l, i) => runLane(l, i > 0)));
const status = codes.find((c) => c !== 0) ?? 0;
const changed = diffSnapshots(before, snapshot());
if (changed.length > 0) {
  console.error(
    `\nrun-tests: the run changed the root network namespace (tests must only touch namespaces ` +
      `and temp dirs they create):\n${formatDiff(changed)}`,
  );
  process.exit(status || 1);
}
process.exit(status);
