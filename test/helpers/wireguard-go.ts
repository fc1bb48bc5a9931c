/**
 * Debian's wireguard-go as a test peer: where it keeps its UAPI sockets, and how a test stops it
 * and removes what it left (test/netns/wireguard-go-interop.test.ts,
 * test/netns/dataplane-wireguard.test.ts).
 */
import type { ChildProcess } from 'node:child_process';
import { existsSync, readdirSync, rmdirSync } from 'node:fs';

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

/** Removes UAPI_DIR when it was not there before the test (`wasThere`) and is empty again. */
export function removeUapiDir(wasThere: boolean): void {
  if (!wasThere && existsSync(UAPI_DIR) && readdirSync(UAPI_DIR).length === 0) rmdirSync(UAPI_DIR);
}
