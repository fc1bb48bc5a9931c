/**
 * A bench's testbed is removed when the run ends early (src/testbed/early-end.ts), here by a
 * child that holds a namespace with a process inside, as a bench holds its nodes. Found when a
 * `bench:scale … 2>&1 | grep … | head` ended its run with an EPIPE: four daemons kept running in
 * namespaces nobody removed.
 */
import assert from 'node:assert/strict';
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { once } from 'node:events';
import { readFileSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { afterEach, describe, test } from 'node:test';
import { deleteNamespace, isRoot } from '../../src/testbed/netns.js';

const skip = isRoot() ? false : 'needs root (network namespaces)';
const CHILD = fileURLToPath(new URL('../helpers/early-end-child.ts', import.meta.url));

const namespaces = () => execFileSync('ip', ['netns', 'list'], { encoding: 'utf8' });
/** Whether `pid` runs (a zombie, killed and not yet reaped by its new parent, does not). */
const alive = (pid: number) => {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z';
  } catch {
    return false;
  }
};

interface Started {
  child: ChildProcess;
  ns: string;
  sleeper: number;
  exit: Promise<[number | null, NodeJS.Signals | null]>;
}

describe('onEarlyEnd removes the testbed', { skip }, () => {
  let started: Started | null = null;

  /** The child, once it holds its namespace (its first line on stdout). */
  async function start(): Promise<Started> {
    const child = spawn(process.execPath, ['--import', 'tsx', CHILD], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const exit = once(child, 'exit') as Promise<[number | null, NodeJS.Signals | null]>;
    let stderr = '';
    child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
    const lines = createInterface({ input: child.stdout! });
    const first = await Promise.race([
      once(lines, 'line').then(([l]) => String(l)),
      exit.then(() => `exited early: ${stderr}`),
    ]);
    const m = /^ready (\S+) (\d+)$/.exec(first);
    assert.ok(m, first);
    started = { child, ns: m[1]!, sleeper: Number(m[2]), exit };
    return started;
  }

  afterEach(async () => {
    const s = started;
    started = null;
    if (!s) return;
    s.child.kill('SIGKILL');
    if (namespaces().includes(s.ns)) await deleteNamespace(s.ns);
  });

  test('SIGHUP (the terminal closed): the namespace and its process go, exit 129', async () => {
    const s = await start();
    assert.ok(namespaces().includes(s.ns));
    s.child.kill('SIGHUP');
    const [code] = await s.exit;
    assert.equal(code, 129);
    assert.ok(!namespaces().includes(s.ns), `${s.ns} left behind`);
    assert.equal(alive(s.sleeper), false, 'the process inside is left running');
  });

  test('a reader gone from stdout (EPIPE): the namespace and its process go, exit 1', async () => {
    const s = await start();
    s.child.stdout!.destroy(); // the next write fails with EPIPE
    const [code] = await s.exit;
    assert.equal(code, 1);
    assert.ok(!namespaces().includes(s.ns), `${s.ns} left behind`);
    assert.equal(alive(s.sleeper), false, 'the process inside is left running');
  });
});
