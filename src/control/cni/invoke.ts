/**
 * Runs a delegate plugin the way libcni's invoke package does: the first executable named
 * `type` in the CNI_PATH directories, the caller's environment with CNI_COMMAND set to the
 * delegated command, the config on stdin. Its stdout is the result (or, on a non-zero exit, a
 * CNI error object whose code is kept); its stderr goes to ours, i.e. to the runtime's log.
 */
import { spawn } from 'node:child_process';
import { constants } from 'node:fs';
import { access, stat } from 'node:fs/promises';
import { join } from 'node:path';
import type { CniCommand, CniEnv } from './cni-args.js';
import { isObject } from './cni-config.js';
import { CNI_ERR, CniError } from './cni-error.js';

export async function findPlugin(type: string, dirs: readonly string[]): Promise<string> {
  for (const dir of dirs) {
    const p = join(dir, type);
    try {
      if ((await stat(p)).isFile()) {
        await access(p, constants.X_OK);
        return p;
      }
    } catch {
      // not here (or not executable): try the next directory
    }
  }
  throw new CniError(
    CNI_ERR.DELEGATE_NOT_FOUND,
    `failed to find plugin ${JSON.stringify(type)} in path ${JSON.stringify(dirs)}`,
    'install the CNI plugins (Debian: containernetworking-plugins, in /usr/lib/cni) and list their directory in CNI_PATH',
  );
}

export interface ExecResult {
  exitCode: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
}

export function execPlugin(path: string, env: CniEnv, stdin: string): Promise<ExecResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(path, [], { env: { ...env }, stdio: ['pipe', 'pipe', 'inherit'] });
    child.on('error', reject);
    // A spawn that failed for want of fds (EMFILE) has no stdio: its 'error' says so.
    if (!child.stdout || !child.stdin) return;
    const out: Buffer[] = [];
    child.stdout.on('data', (b: Buffer) => out.push(b));
    // A delegate that exits without reading all of stdin would make the write fail with EPIPE;
    // its exit status and stdout tell the story, so that error is not the one to report.
    child.stdin.on('error', () => {});
    child.on('close', (exitCode, signal) => {
      resolve({ exitCode, signal, stdout: Buffer.concat(out).toString('utf8') });
    });
    child.stdin.end(stdin);
  });
}

/**
 * Runs `type` for `command` with `config` on stdin; returns its stdout (the result JSON for
 * ADD, usually empty for DEL/CHECK). A failure becomes a CniError: the delegate's own code and
 * message when it printed a CNI error, else DELEGATE_FAILED.
 */
export async function invokeDelegate(
  command: CniCommand,
  type: string,
  config: string,
  env: CniEnv,
  dirs: readonly string[],
): Promise<string> {
  const path = await findPlugin(type, dirs);
  let r: ExecResult;
  try {
    r = await execPlugin(path, { ...env, CNI_COMMAND: command }, config);
  } catch (err) {
    throw new CniError(CNI_ERR.DELEGATE_FAILED, `exec ${path}: ${(err as Error).message}`, '', {
      cause: err,
    });
  }
  if (r.exitCode === 0) return r.stdout;
  let reported: unknown = null;
  try {
    reported = JSON.parse(r.stdout);
  } catch {
    // not a CNI error object: handled below
  }
  const how = r.signal ? `killed by ${r.signal}` : `exit ${r.exitCode}`;
  if (isObject(reported) && typeof reported.code === 'number' && typeof reported.msg === 'string') {
    const details = typeof reported.details === 'string' ? reported.details : '';
    throw new CniError(reported.code, `delegate ${type} ${command}: ${reported.msg}`, details);
  }
  throw new CniError(
    CNI_ERR.DELEGATE_FAILED,
    `delegate ${type} ${command} failed (${how})`,
    r.stdout.trim().slice(0, 1000),
  );
}
