/**
 * Network-namespace primitives shared by `weft demo`, the benches and the tests (one module: the
 * cluster builder beside it and every namespace test use it).
 *
 * Names are unique per process: namespaces `weft-<pid>-<n>` (or a caller's prefix), devices
 * (≤ 15 chars) `w<pid%10000><tag><n>`. Everything runs inside namespaces this process creates;
 * the only commands run in the root namespace are `ip netns add/del` and process signals (veth
 * pairs are made inside a namespace with their peer moved to another). `NetnsScope.cleanup()`
 * kills every process left inside its namespaces and deletes them, so a failure or Ctrl-C
 * leaves nothing behind.
 */
import {
  type ChildProcess,
  type SpawnOptions,
  execFile,
  execFileSync,
  spawn,
} from 'node:child_process';
import { existsSync, readdirSync, readlinkSync, statSync } from 'node:fs';

let counter = 0;

/** `<prefix>-<n>` (default `weft-<pid>-<n>`), unique within this process. */
export function uniqueNs(prefix = `weft-${process.pid}`): string {
  return `${prefix}-${counter++}`;
}

/** A device name unique within this process, at most 15 characters. */
export function uniqueDev(tag = 'd'): string {
  const name = `w${process.pid % 10000}${tag}${counter++}`;
  if (name.length > 15) throw new Error(`device name too long: ${name}`);
  return name;
}

export function isRoot(): boolean {
  return process.getuid?.() === 0;
}

export interface ExecOptions {
  readonly input?: string;
  readonly env?: NodeJS.ProcessEnv;
  readonly timeoutMs?: number;
  readonly cwd?: string;
}

/** The error of a failed command: `[ns] cmd args: stderr`, with its stdout attached. */
function execError(ns: string, cmd: string, args: readonly string[], err: unknown): Error {
  const e = err as { stderr?: string; stdout?: string; message: string };
  const detail = String(e.stderr ?? '').trim() || String(e.stdout ?? '').trim() || e.message;
  return Object.assign(new Error(`[${ns}] ${cmd} ${args.join(' ')}: ${detail}`), {
    stdout: String(e.stdout ?? ''),
  });
}

/**
 * Runs a command in namespace `ns` and returns its stdout; throws with stderr in the message
 * (and the stdout as `.stdout`). A string as the 4th argument is the input.
 */
export function nsExec(
  ns: string,
  cmd: string,
  args: readonly string[] = [],
  opts: string | ExecOptions = {},
): string {
  const o: ExecOptions = typeof opts === 'string' ? { input: opts } : opts;
  try {
    return execFileSync('ip', ['netns', 'exec', ns, cmd, ...args], {
      encoding: 'utf8',
      stdio: ['pipe', 'pipe', 'pipe'],
      env: o.env,
      cwd: o.cwd,
      timeout: o.timeoutMs,
      maxBuffer: 64 * 1024 * 1024,
      ...(o.input === undefined ? {} : { input: o.input }),
    });
  } catch (err) {
    throw execError(ns, cmd, args, err);
  }
}

/** Like nsExec, without blocking the event loop (pings and iperf3 in parallel); default 30 s. */
export function nsExecAsync(
  ns: string,
  cmd: string,
  args: readonly string[] = [],
  opts: number | Omit<ExecOptions, 'input'> = {},
): Promise<string> {
  const o = typeof opts === 'number' ? { timeoutMs: opts } : opts;
  return new Promise((resolve, reject) => {
    execFile(
      'ip',
      ['netns', 'exec', ns, cmd, ...args],
      {
        encoding: 'utf8',
        timeout: o.timeoutMs ?? 30_000,
        env: o.env,
        cwd: o.cwd,
        maxBuffer: 64 * 1024 * 1024,
      },
      (err, stdout, stderr) => {
        if (err) reject(execError(ns, cmd, args, Object.assign(err, { stdout, stderr })));
        else resolve(stdout);
      },
    );
  });
}

/** `ip <args>` inside `ns`. */
export function ip(ns: string, ...args: string[]): string {
  return nsExec(ns, 'ip', args);
}

/**
 * Starts a long-running process inside `ns` (`ip netns exec` execs it: the pid is its own).
 * `via`: a command that execs the rest (e.g. nsenter into a mount namespace; bpffs.ts).
 */
export function nsSpawn(
  ns: string,
  cmd: string,
  args: readonly string[],
  opts: SpawnOptions = {},
  via: readonly string[] = [],
): ChildProcess {
  const argv = [...via, 'ip', 'netns', 'exec', ns, cmd, ...args];
  const p = spawn(argv[0]!, argv.slice(1), { stdio: 'pipe', ...opts });
  if (p.pid === undefined) {
    // It never started (out of fds or processes): its 'error' would come on the next tick with
    // nobody listening, and no 'exit' would follow for those waiting on one. Say so here.
    p.once('error', () => undefined);
    throw new Error(`[${ns}] ${cmd}: cannot start (spawn failed: out of fds or processes?)`);
  }
  return p;
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

/** The namespaces (and processes) one testbed or test owns; `cleanup()` removes all of them. */
export class NetnsScope {
  readonly #namespaces: string[] = [];
  readonly #procs = new Set<ChildProcess>();
  readonly prefix: string;

  constructor(prefix = `weft-${process.pid}`) {
    this.prefix = prefix;
  }

  /** Creates a namespace with lo up; the name is `<prefix>-<n>` unless given. */
  add(name = uniqueNs(this.prefix)): string {
    execFileSync('ip', ['netns', 'add', name]);
    this.#namespaces.push(name);
    ip(name, 'link', 'set', 'lo', 'up');
    return name;
  }

  /** A veth pair with one end in each namespace (created inside `a`, never in the root one). */
  vethBetween(a: string, aName: string, b: string, bName: string): void {
    ip(a, 'link', 'add', aName, 'type', 'veth', 'peer', 'name', bName, 'netns', b);
  }

  /** Tracks a process so cleanup kills it. */
  track(p: ChildProcess): ChildProcess {
    this.#procs.add(p);
    p.once('exit', () => this.#procs.delete(p));
    return p;
  }

  spawn(
    ns: string,
    cmd: string,
    args: readonly string[],
    opts: SpawnOptions = {},
    via: readonly string[] = [],
  ): ChildProcess {
    return this.track(nsSpawn(ns, cmd, args, opts, via));
  }

  get namespaces(): readonly string[] {
    return this.#namespaces;
  }

  /** Kills tracked processes and anything left inside our namespaces, then deletes them. */
  async cleanup(): Promise<void> {
    for (const p of this.#procs) {
      if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
    }
    await Promise.all([...this.#namespaces].reverse().map((ns) => deleteNamespace(ns)));
    this.#namespaces.length = 0;
  }
}
