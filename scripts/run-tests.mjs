#!/usr/bin/env node
// Runs the suite with node:test through tsx. Node 20's --test takes no globs, so the files are
// found here. Arguments narrow the run to directories or files (default: all of test/); the
// flag --source starts the testbed's weft from the sources instead of a fresh dist/ build.
//
// Two lanes run side by side: the namespace lane (test/netns, test/integration: namespaces,
// daemons, etcd, traffic) and the process lane (test/unit, test/native: no namespace, no device,
// no daemon), one file at a time. The namespace tests spend most of their time waiting on
// daemons and handshakes, so the namespace lane runs two of its files at once (largest first, so
// the longest files do not start last; --namespace-concurrency=N changes the two), and the
// process lane's ~3 minutes fit beside it. The namespace lane is the run's length, so the process
// lane runs niced (10): on a machine of few CPUs it takes what the namespace lane leaves (its
// files wait on daemons, handshakes and timers) instead of slowing it (npm test on 2 vCPUs:
// 897 s → 770–833 s); a test must not judge by time in either lane. Every namespace test works
// in namespaces and temp dirs of its own; what the host has only one of (wireguard-go's UAPI
// directory) is taken under a lock (test/helpers/host-lock.ts). The namespace lane prints as it
// runs, a file's report whole when its turn comes; the process lane's report follows it.
// --serial runs every file in one lane, one at a time.
//
// The run is guarded: the root network namespace (links, addresses, routes, rules, iptables,
// nftables, /var/lib/cni, /sys/fs/bpf) is snapshotted before and after, and any difference fails
// the run naming what changed (scripts/root-guard.mjs). Tests only touch namespaces they create.
import { spawn, spawnSync } from 'node:child_process';
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
const serial = process.argv.includes('--serial');
const NS_CONCURRENCY_FLAG = '--namespace-concurrency=';
const nsConcurrencyArg = process.argv.find((a) => a.startsWith(NS_CONCURRENCY_FLAG));
const nsConcurrency = serial ? 1 : Number(nsConcurrencyArg?.slice(NS_CONCURRENCY_FLAG.length) ?? 2);
if (!Number.isInteger(nsConcurrency) || nsConcurrency < 1) {
  console.error(`run-tests: ${NS_CONCURRENCY_FLAG}N takes a whole number ≥ 1`);
  process.exit(2);
}
const flags = process.argv
  .slice(2)
  .filter(
    (a) =>
      a.startsWith('-') &&
      a !== '--source' &&
      a !== '--serial' &&
      !a.startsWith(NS_CONCURRENCY_FLAG),
  );
const files = [];
for (const t of targets.length ? targets : ['test']) collect(join(root, t), files);
if (files.length === 0) {
  console.error('run-tests: no test files found');
  process.exit(1);
}
/** Files that create namespaces, daemons or etcd: they run in their own lane. */
const NAMESPACE_DIRS = ['test/netns/', 'test/integration/'];
const inNamespaceLane = (f) => NAMESPACE_DIRS.some((d) => relative(root, f).startsWith(d));
/** Largest first: a file's size is a fair guess at its running time, and the longest go first. */
const bySizeDown = (a, b) => statSync(b).size - statSync(a).size || a.localeCompare(b);
const lanes = (
  serial
    ? [{ files, concurrency: 1 }]
    : [
        { files: files.filter(inNamespaceLane).sort(bySizeDown), concurrency: nsConcurrency },
        // niced: see the file's head
        { files: files.filter((f) => !inNamespaceLane(f)), concurrency: 1, nice: 10 },
      ]
).filter((l) => l.files.length > 0);
const argsFor = (lane) => [
  '--import',
  'tsx',
  '--test',
  `--test-concurrency=${lane.concurrency}`,
  '--test-reporter=spec',
  ...flags,
  ...lane.files.map((f) => relative(process.cwd(), f)),
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
const env = { ...process.env, WEFT_TEST_LAUNCHER: fromSource ? 'source' : 'dist' };

/**
 * Runs one lane: the first prints as it goes, the others are collected and printed after it
 * (two spec reports interleaved line by line could not be read). Resolves to the exit status
 * and what a collected lane printed.
 */
function runLane(lane, i) {
  const live = i === 0;
  return new Promise((resolve) => {
    const [cmd, args] = lane.nice
      ? ['nice', ['-n', String(lane.nice), process.execPath, ...argsFor(lane)]]
      : [process.execPath, argsFor(lane)];
    const child = spawn(cmd, args, {
      env,
      stdio: live ? 'inherit' : ['ignore', 'pipe', 'pipe'],
    });
    const out = [];
    child.stdout?.on('data', (d) => out.push(d));
    child.stderr?.on('data', (d) => out.push(d));
    child.on('close', (code, signal) =>
      resolve({ status: code ?? (signal ? 1 : 0), out: Buffer.concat(out) }),
    );
  });
}

const before = snapshot();
const running = lanes.map((lane, i) => runLane(lane, i));
const statuses = [];
// In lane order: the live lane's report first, then each collected one.
for (const [i, r] of running.entries()) {
  const { status, out } = await r;
  if (i > 0) {
    const dirs = new Set(
      lanes[i].files.map((f) => relative(root, f).split('/').slice(0, 2).join('/')),
    );
    process.stdout.write(
      `\n── run-tests: ${[...dirs].join(', ')} (ran beside the lane above) ──\n`,
    );
    process.stdout.write(out);
  }
  statuses.push(status);
}
const changed = diffSnapshots(before, snapshot());
const failed = statuses.find((s) => s !== 0) ?? 0;
if (changed.length > 0) {
  console.error(
    `\nrun-tests: the run changed the root network namespace (tests must only touch namespaces ` +
      `and temp dirs they create):\n${formatDiff(changed)}`,
  );
  process.exit(failed || 1);
}
if (lanes.length > 1) {
  console.log(`\nrun-tests: lanes exited ${statuses.join(', ')}`);
}
process.exit(failed);
