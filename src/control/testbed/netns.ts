/**
 * Network-namespace primitives for the local testbeds (`weft demo`, `weft bench`) and the tests.
 * Everything runs inside namespaces this process creates; the only commands that run in the
 * root namespace are `ip netns add/del` and process signals. Names are unique per process:
 * namespaces `weft-<pid>-<n>` (or a caller's prefix), and `Netns.cleanup()` kills every process
 * left inside them and deletes them, so a failure or Ctrl-C leaves nothing behind.
 */
import {
  execFile,
  execFileSync,
  spawn,
  type ChildProcess,
  type SpawnOptions,
} from 'node:child_process';
import { existsSync, readdirSync, readlinkSync, statSync } from 'node:fs';
import { promisify } from 'node:util';

const execFileP = promisify(execFile);

let counter = 0;

/** `weft-<pid>-<n>`, unique within this process. */
export function uniqueName(prefix = `weft-${process.pid}`): string {
  return `${prefix}-${counter++}`;
}

export function isRoot(): boolean {
  return process.getuid?.() === 0;
}

/** Runs `cmd args` inside namespace `ns`; resolves to stdout, rejects with stderr in the message. */
export async function nsRun(
  ns: string,
  cmd: string,
  args: readonly string[],
  opts: { input?: string; env?: NodeJS.ProcessEnv; timeoutMs?: number } = {},
): Promise<string> {
  try {
    if (opts.input !== undefined) {
      return execFileSync('ip', ['netns', 'exec', ns, cmd, ...args], {
        encoding: 'utf8',
        input: opts.input,
        env: opts.env,
        stdio: ['pipe', 'pipe', 'pipe'],
        timeout: opts.timeoutMs,
      });
    }
    const r = await execFileP('ip', ['netns', 'exec', ns, cmd, ...args], {
      encoding: 'utf8',
      env: opts.env,
      timeout: opts.timeoutMs,
      maxBuffer: 64 * 1024 * 1024,
    });
    return r.stdout;
  } catch (err) {
    const e = err as { stderr?: string; stdout?: string; message: string };
    const detail = (e.stderr?.trim() || e.message).split('\n').slice(-5).join('\n');
    throw Object.assign(new Error(`[${ns}] ${cmd} ${args.join(' ')}: ${detail}`), {
      stdout: e.stdout ?? '',
    });
  }
}

/** `ip <args>` inside `ns`. */
export function ipIn(ns: string, ...args: string[]): Promise<string> {
  return nsRun(ns, 'ip', args);
}

export function nsSpawn(
  ns: string,
  cmd: string,
  args: readonly string[],
  opts: SpawnOptions = {},
): ChildProcess {
  return spawn('ip', ['netns', 'exec', ns, cmd, ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
    ...opts,
  });
}

/** PIDs of processes living in namespace `ns` (matched by the namespace inode). */
export function pidsIn(ns: string): number[] {
  const path = `/run/netns/${ns}`;
  if (!existsSync(path)) return [];
  let ino: number;
  try {
    ino = statSync(path).ino;
  } catch {
    return [];
  }
  const out: number[] = [];
  for (const p of readdirSync('/proc')) {
    if (!/^\d+$/.test(p) || Number(p) === process.pid) continue;
    try {
      if (readlinkSync(`/proc/${p}/ns/net`) === `net:[${ino}]`) out.push(Number(p));
    } catch {
      /* exited meanwhile */
    }
  }
  return out;
}

/** Kills what runs in `ns` and deletes it; never throws. */
export async function deleteNamespace(ns: string): Promise<void> {
  for (let round = 0; round < 3; round++) {
    const pids = pidsIn(ns);
    if (pids.length === 0) break;
    for (const pid of pids) {
      try {
        process.kill(pid, round === 0 ? 'SIGTERM' : 'SIGKILL');
      } catch {
        /* gone */
      }
    }
    await new Promise((r) => setTimeout(r, round === 0 ? 300 : 100));
  }
  try {
    execFileSync('ip', ['netns', 'del', ns], { stdio: 'ignore' });
  } catch {
    /* already gone */
  }
}

/** A set of namespaces owned by one testbed; `cleanup()` removes all of them. */
export class Netns {
  readonly #names: string[] = [];
  readonly #procs = new Set<ChildProcess>();
  readonly prefix: string;

  constructor(prefix = `weft-${process.pid}`) {
    this.prefix = prefix;
  }

  /** Creates a namespace with lo up; the name is `<prefix>-<n>` unless given. */
  async add(name = uniqueName(this.prefix)): Promise<string> {
    execFileSync('ip', ['netns', 'add', name]);
    this.#names.push(name);
    await ipIn(name, 'link', 'set', 'lo', 'up');
    return name;
  }

  get names(): readonly string[] {
    return this.#names;
  }

  /** A veth pair made inside `a` with its peer moved to `b` (never in the root namespace). */
  async veth(a: string, aName: string, b: string, bName: string): Promise<void> {
    await ipIn(a, 'link', 'add', aName, 'type', 'veth', 'peer', 'name', bName, 'netns', b);
  }

  spawn(ns: string, cmd: string, args: readonly string[], opts: SpawnOptions = {}): ChildProcess {
    const p = nsSpawn(ns, cmd, args, opts);
    this.#procs.add(p);
    p.on('exit', () => this.#procs.delete(p));
    return p;
  }

  async cleanup(): Promise<void> {
    for (const p of this.#procs)
      if (p.exitCode === null && p.signalCode === null) p.kill('SIGTERM');
    await Promise.all([...this.#names].reverse().map((n) => deleteNamespace(n)));
    this.#names.length = 0;
  }
}
