/**
 * Runs real `weft` processes (bin/weft → dist/) for integration tests, optionally inside a
 * network namespace (`ip netns exec`). Collects stderr JSON log lines for assertions; every
 * started process is tracked so `stopAll()` in an `after` hook leaves nothing behind.
 */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { createServer } from 'node:net';
import { fileURLToPath } from 'node:url';
import { canonical, parseCIDR } from '../../src/common/ip.js';
import { makeSubnetKey } from '../../src/control/lease/subnet-key.js';
import { readEnvFile, waitReadyz } from '../../src/testbed/cluster.js';

export const ROOT = fileURLToPath(new URL('../..', import.meta.url));
export const WEFT_BIN = `${ROOT}bin/weft`;

export interface LogLine {
  level: string;
  msg: string;
  [k: string]: unknown;
}

export interface WeftProcess {
  readonly proc: ChildProcess;
  readonly logs: LogLine[];
  readonly stdout: () => string;
  readonly stderr: () => string;
  /** Resolves with the exit code (or signal name). */
  readonly exited: Promise<number | string>;
  waitForLog(pred: (l: LogLine) => boolean, timeoutMs?: number): Promise<LogLine>;
  stop(signal?: NodeJS.Signals): Promise<number | string>;
}

const running = new Set<WeftProcess>();

export function startWeft(
  args: readonly string[],
  opts: { env?: Record<string, string | undefined>; netns?: string; cleanEnv?: boolean } = {},
): WeftProcess {
  const env: Record<string, string | undefined> = {
    ...(opts.cleanEnv ? { PATH: process.env.PATH } : process.env),
    ...opts.env,
  };
  // Never let the test runner's own FLANNELD_* variables leak into a daemon under test.
  for (const k of Object.keys(env))
    if (k.startsWith('FLANNELD_') && !(opts.env && k in opts.env)) delete env[k];
  const cmd = opts.netns ? 'ip' : process.execPath;
  const argv = opts.netns
    ? ['netns', 'exec', opts.netns, process.execPath, WEFT_BIN, ...args]
    : [WEFT_BIN, ...args];
  const proc = spawn(cmd, argv, { env, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  let partial = '';
  const logs: LogLine[] = [];
  const waiters = new Set<() => void>();
  proc.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  proc.stderr!.on('data', (d: Buffer) => {
    err += d.toString();
    partial += d.toString();
    const lines = partial.split('\n');
    partial = lines.pop()!;
    for (const line of lines) {
      try {
        logs.push(JSON.parse(line) as LogLine);
      } catch {
        /* plain text (usage errors) stays in stderr() */
      }
    }
    for (const w of waiters) w();
  });
  const exited = new Promise<number | string>((resolve) =>
    proc.on('exit', (code, sig) => {
      running.delete(p);
      for (const w of waiters) w();
      resolve(code ?? sig ?? 'unknown');
    }),
  );
  const p: WeftProcess = {
    proc,
    logs,
    stdout: () => out,
    stderr: () => err,
    exited,
    waitForLog(pred, timeoutMs = 10_000) {
      return new Promise((resolve, reject) => {
        const check = () => {
          const hit = logs.find(pred);
          if (hit) {
            done();
            resolve(hit);
          } else if (proc.exitCode !== null || proc.signalCode !== null) {
            done();
            reject(
              new Error(
                `process exited before the expected log line; stderr:\n${err.slice(-3000)}`,
              ),
            );
          }
        };
        const timer = setTimeout(() => {
          done();
          reject(new Error(`timed out waiting for a log line; stderr:\n${err.slice(-3000)}`));
        }, timeoutMs);
        const done = () => {
          clearTimeout(timer);
          waiters.delete(check);
        };
        waiters.add(check);
        check();
      });
    },
    async stop(signal = 'SIGTERM') {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill(signal);
      const timer = setTimeout(() => proc.kill('SIGKILL'), 10_000);
      const r = await exited;
      clearTimeout(timer);
      return r;
    },
  };
  running.add(p);
  return p;
}

/** Runs weft to completion; resolves with exit code, stdout and stderr. */
export async function runWeft(
  args: readonly string[],
  opts: { env?: Record<string, string | undefined>; netns?: string; input?: string } = {},
): Promise<{ code: number | string; stdout: string; stderr: string }> {
  const p = startWeft(args, opts);
  const code = await p.exited;
  return { code, stdout: p.stdout(), stderr: p.stderr() };
}

export async function stopAll(): Promise<void> {
  await Promise.all([...running].map((p) => p.stop('SIGKILL')));
}

export function freePort(host = '127.0.0.1'): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, host, () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

export async function httpGet(url: string): Promise<{ status: number; body: string }> {
  const res = await fetch(url, { signal: AbortSignal.timeout(3000) });
  return { status: res.status, body: await res.text() };
}

/**
 * GET `url` from inside namespace `ns` (a daemon there listens on the namespace's loopback,
 * which the test process in the root namespace cannot reach): a short node child run by
 * `ip netns exec`.
 */
export function nsHttpGet(ns: string, url: string): Promise<{ status: number; body: string }> {
  const script =
    'fetch(process.argv[1],{signal:AbortSignal.timeout(3000)}).then(async r=>' +
    'process.stdout.write(JSON.stringify({status:r.status,body:await r.text()})))';
  return new Promise((resolve, reject) => {
    execFile(
      'ip',
      ['netns', 'exec', ns, process.execPath, '-e', script, url],
      { encoding: 'utf8', timeout: 10_000 },
      (err, stdout, stderr) => {
        if (err) reject(new Error(`[${ns}] GET ${url}: ${stderr.trim() || err.message}`));
        else resolve(JSON.parse(stdout) as { status: number; body: string });
      },
    );
  });
}

/**
 * Waits until the daemon `p` answers 200 on /readyz (its health server on 127.0.0.1:`port`
 * inside `ns`) and returns its lease key, computed from the subnet file it wrote. Readiness is
 * read from the daemon, never from a log line.
 */
export async function waitReady(
  p: WeftProcess,
  o: { ns: string; port: number; subnetFile: string; timeoutMs?: number },
): Promise<{ key: string }> {
  try {
    await waitReadyz({ ns: o.ns, port: o.port, daemon: p.proc, timeoutMs: o.timeoutMs ?? 30_000 });
  } catch (err) {
    throw new Error(`${(err as Error).message}; stderr:\n${p.stderr().slice(-3000)}`);
  }
  const env = readEnvFile(o.subnetFile);
  const v4 = env.FLANNEL_SUBNET ? canonical(parseCIDR(env.FLANNEL_SUBNET)!) : null;
  const v6 = env.FLANNEL_IPV6_SUBNET ? canonical(parseCIDR(env.FLANNEL_IPV6_SUBNET)!) : null;
  return { key: makeSubnetKey(v4, v6) };
}
