/**
 * The Dataplane seam: a TUN ⇄ UDP packet engine for the userspace backends (udp, vxlan).
 *
 *   startDataplane(opts) → the TUN device exists (not addressed: the backend does that with
 *                          netlink), sockets are bound, workers are in their loops
 *   setPeers(entries)    → the whole peer table is replaced (one buffer); packets in flight
 *                          finish with the old table, later ones see the new one
 *   stats()              → counters read without stopping anything
 *   close()              → workers leave their loops, threads exit, every fd is closed, the
 *                          TUN device disappears with its addresses and routes
 *
 * Engines (each in its own module, sharing only the contract in engine.ts): `native`
 * (native-engine.ts: the addon's packet loops on a piscina pool) and `js` (js-engine.ts: the
 * reference codec per packet on dgram, one queue, for when speed does not matter or the native
 * engine is unwanted).
 */
import type { Dataplane, DataplaneOptions } from './engine.js';
import { startJsEngine } from './js-engine.js';
import { startNativeEngine } from './native-engine.js';

export type { Dataplane, DataplaneEngine, DataplaneFormat, DataplaneOptions } from './engine.js';

export async function startDataplane(opts: DataplaneOptions): Promise<Dataplane> {
  if (opts.engine === 'js') return startJsEngine(opts);
  return startNativeEngine(opts);
}
