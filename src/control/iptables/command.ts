/**
 * Running the rule tools (iptables-save/-restore, nft): a command that cannot even be started
 * (EMFILE under fd pressure, a missing binary) is an ordinary failure the caller handles, never
 * an unhandled 'error' event that ends the process.
 */
import { type ChildProcess, type SpawnOptions, spawn } from 'node:child_process';
import { errorMessage } from '../../common/errors.js';

/** Runs a command with optional stdin and returns stdout (rejects with stderr on failure). */
export type CommandRunner = (
  cmd: string,
  args: readonly string[],
  input?: string,
) => Promise<string>;

/** How a command is started (node's `spawn`; tests pass one that fails). */
export type SpawnFn = (
  cmd: string,
  args: readonly string[],
  options: SpawnOptions,
) => Pick<ChildProcess, 'stdin' | 'stdout' | 'stderr' | 'on'>;

/**
 * A CommandRunner over `spawnFn`. A command that cannot be started (EMFILE under fd pressure,
 * ENOENT, …) rejects like one that fails: the 'error' handler is attached before anything else
 * touches the child, and a spawn that throws at once is caught, so neither can crash the process.
 */
export function commandRunner(spawnFn: SpawnFn = spawn): CommandRunner {
  return (cmd, args, input) =>
    new Promise((resolve, reject) => {
      const fail = (err: unknown): void =>
        reject(new Error(`${cmd}: cannot run: ${errorMessage(err)}`, { cause: err }));
      let p: ReturnType<SpawnFn>;
      try {
        p = spawnFn(cmd, args, {
          stdio: [input === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'],
        });
      } catch (err) {
        fail(err);
        return;
      }
      p.on('error', fail);
      let out = '';
      let err = '';
      p.stdout?.setEncoding('utf8').on('data', (d: string) => (out += d));
      p.stderr?.setEncoding('utf8').on('data', (d: string) => (err += d));
      p.on('close', (code) =>
        code === 0
          ? resolve(out)
          : reject(new Error(`${cmd} ${args.join(' ')}: ${err.trim() || `exit ${code}`}`)),
      );
      if (p.stdin) {
        // A command that exits without reading its input must not crash us with EPIPE.
        p.stdin.on('error', () => undefined);
        p.stdin.end(input);
      }
    });
}

export const runCommand: CommandRunner = commandRunner();

const RESOURCE_ERRNOS = new Set(['EMFILE', 'ENFILE', 'EAGAIN', 'ENOMEM']);

/** Whether `err` (or a cause of it) is a process that could not start for want of resources. */
export function isResourceShortage(err: unknown): boolean {
  for (let e = err; e instanceof Error; e = e.cause) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === 'string' && RESOURCE_ERRNOS.has(code)) return true;
  }
  return false;
}
