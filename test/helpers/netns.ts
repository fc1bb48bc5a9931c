/**
 * Namespace primitives for tests: unique names, commands inside a namespace, guaranteed cleanup.
 *
 * Names: namespaces `weft-<pid>-<n>`; devices (≤ 15 chars) `w<pid%10000><tag><n>`.
 * Every namespace made through `NetnsScope` is deleted by `scope.cleanup()` (call it from an
 * `after` hook); deleting a namespace removes its devices and, with `killAll`, its processes.
 * Nothing here runs a command in the root namespace except `ip netns add/del` and `ip link add`
 * of veth pairs that are moved into test namespaces at once (`vethBetween`).
 */
import {
  type ChildProcess,
  type SpawnOptions,
  execFile,
  execFileSync,
  spawn,
} from 'node:child_process';
import { deleteNamespace, isRoot } from '../../src/control/testbed/netns.js';

let counter = 0;

export function uniqueNs(): string {
  return `weft-${process.pid}-${counter++}`;
}

export function uniqueDev(tag = 'd'): string {
  const name = `w${process.pid % 10000}${tag}${counter++}`;
  if (name.length > 15) throw new Error(`device name too long: ${name}`);
  return name;
}

export { isRoot };

/** Runs a command in namespace `ns` and returns its stdout; throws with stderr on failure. */
export function nsExec(
  ns: string,
  cmd: string,
  args: readonly string[] = [],
  input?: string,
): string {
  try {
    return execFileSync('ip', ['netns', 'exec', ns, cmd, ...args], {
      encoding: 'utf8',
      stdio: ['pipe', 'pipe', 'pipe'],
      ...(input === undefined ? {} : { input }),
    });
  } catch (err) {
    const e = err as { stderr?: string; message: string };
    throw new Error(`[${ns}] ${cmd} ${args.join(' ')}: ${e.stderr?.trim() || e.message}`);
  }
}

/** Like nsExec, without blocking the event loop (for pings and iperf3 in parallel). */
export function nsExecAsync(
  ns: string,
  cmd: string,
  args: readonly string[] = [],
  timeoutMs = 30_000,
): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(
      'ip',
      ['netns', 'exec', ns, cmd, ...args],
      { encoding: 'utf8', timeout: timeoutMs },
      (err, stdout, stderr) => {
        if (err)
          reject(
            new Error(
              `[${ns}] ${cmd} ${args.join(' ')}: ${stderr.trim() || stdout.trim() || err.message}`,
            ),
          );
        else resolve(stdout);
      },
    );
  });
}

/** `ip <args>` inside `ns`. */
export function ip(ns: string, ...args: string[]): string {
  return nsExec(ns, 'ip', args);
}

/** Starts a long-running process inside `ns`. */
export function nsSpawn(
  ns: string,
  cmd: string,
  args: readonly string[],
  opts: SpawnOptions = {},
): ChildProcess {
  return spawn('ip', ['netns', 'exec', ns, cmd, ...args], { stdio: 'pipe', ...opts });
}

export class NetnsScope {
  readonly #namespaces: string[] = [];
  readonly #procs: ChildProcess[] = [];

  /** Creates a namespace with lo up. */
  add(name = uniqueNs()): string {
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
    this.#procs.push(p);
    return p;
  }

  spawn(ns: string, cmd: string, args: readonly string[], opts: SpawnOptions = {}): ChildProcess {
    return this.track(nsSpawn(ns, cmd, args, opts));
  }

  get namespaces(): readonly string[] {
    return this.#namespaces;
  }

  /** Kills tracked processes and anything left inside our namespaces, then deletes them. */
  async cleanup(): Promise<void> {
    for (const p of this.#procs) {
      if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
    }
    await Promise.all(this.#namespaces.reverse().map((ns) => deleteNamespace(ns)));
    this.#namespaces.length = 0;
  }
}
