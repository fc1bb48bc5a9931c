/** tcpdump in the namespace tests: waiting until a capture really listens. */
import type { ChildProcess } from 'node:child_process';

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
