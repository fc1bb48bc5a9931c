/** tcpdump in the namespace tests: waiting until a capture really listens. */
import type { ChildProcess } from 'node:child_process';
import type { NetnsScope } from '../../src/testbed/netns.js';

/** Resolves once tcpdump (spawned with its stderr piped) says "listening on"; 10 s at most. */
export function tcpdumpListening(cap: ChildProcess): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    const t = setTimeout(() => reject(new Error('tcpdump did not start')), 10_000);
    cap.stderr!.on('data', (d: Buffer) => {
      if (/listening on/.test(d.toString())) {
        clearTimeout(t);
        resolve();
      }
    });
  });
}

/**
 * tcpdump's text lines (at most `count` packets matching `filter` on `dev` in namespace `ns`)
 * while `during` runs; the capture ends at `count` packets or 3 s after `during` returns.
 */
export async function captureText(
  scope: NetnsScope,
  ns: string,
  filter: string,
  count: number,
  during: () => Promise<unknown>,
  dev = 'eth0',
): Promise<string> {
  const cap = scope.spawn(ns, 'tcpdump', [
    '-n',
    '-l',
    '--immediate-mode',
    '-i',
    dev,
    '-c',
    String(count),
    filter,
  ]);
  let out = '';
  cap.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  const done = new Promise((r) => cap.once('exit', r));
  await tcpdumpListening(cap);
  await during();
  const stop = setTimeout(() => cap.kill('SIGINT'), 3000);
  await done;
  clearTimeout(stop);
  return out;
}
