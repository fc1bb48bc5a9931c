/**
 * Debian's wireguard-go as a test peer: where it keeps its UAPI sockets, and how a test stops it
 * and removes what it left (test/netns/wireguard-go-interop.test.ts,
 * test/netns/dataplane-wireguard.test.ts).
 */
import type { ChildProcess } from 'node:child_process';
import { existsSync, readdirSync, rmdirSync } from 'node:fs';
import { hostLock } from './host-lock.js';

/** wireguard-go's UAPI socket directory: one for the host, not per namespace. */
export const UAPI_DIR = '/var/run/wireguard';

/**
 * Stops a wireguard-go child with SIGTERM, on which it removes its UAPI socket (a scope's
 * SIGKILL would leave it), waiting up to 5 s for it to exit.
 */
export async function stopWireguardGo(p: ChildProcess | null): Promise<void> {
  if (!p || p.exitCode !== null || p.signalCode !== null) return;
  const gone = new Promise((r) => p.once('exit', r));
  p.kill('SIGTERM');
  await Promise.race([gone, new Promise((r) => setTimeout(r, 5000))]);
}

/**
 * Takes UAPI_DIR for a test (or a describe) until the returned release: test files run two at a
 * time, and "was the directory there before?" has one answer only for a holder of the lock. The
 * release removes the directory when it was not there before and is empty again, then lets the
 * next holder in.
 */
export async function claimUapiDir(): Promise<() => void> {
  const unlock = await hostLock('wireguard-uapi');
  const wasThere = existsSync(UAPI_DIR);
  return () => {
    try {
      if (!wasThere && existsSync(UAPI_DIR) && readdirSync(UAPI_DIR).length === 0) {
        rmdirSync(UAPI_DIR);
      }
    } finally {
      unlock();
    }
  };
}
