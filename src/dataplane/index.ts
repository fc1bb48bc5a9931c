/**
 * The Dataplane seam: a TUN ⇄ UDP packet engine for the userspace backends (udp, vxlan).
 *
 *   startDataplane(opts) → the TUN device exists (not addressed: the backend does that with
 *                          netlink), sockets are bound, workers are in their loops
 *   setPeers(entries)    → the whole peer table is replaced (one buffer); packets in flight
 *                          finish with the old table, later ones see the new one
 *   updatePeerTable(d)   → the same for a change (records removed, added or replaced by
 *                          subnet), at the cost of the change
 *   stats()              → counters read without stopping anything
 *   close()              → workers leave their loops, threads exit, every fd is closed, the
 *                          TUN device disappears with its addresses and routes (unless
 *                          `persist`: then it stays, detached, for the next engine)
 *
 * Engines (each in its own module, sharing only the contract in engine.ts): `native`
 * (native-engine.ts: the addon's packet loops on a piscina pool), `bpf` (bpf-engine.ts: TC-BPF
 * encap/decap in the kernel in front of the native engine, which stays the slow path) and `js`
 * (js-engine.ts: the reference codec per packet on dgram, one queue, for when speed does not
 * matter or the native engine is unwanted).
 */
import { WeftError, errorMessage } from '../common/errors.js';
import { logger } from '../common/log.js';
import { startBpfEngine } from './bpf-engine.js';
import { removeBpfPins } from './bpf-pins.js';
import type { Dataplane, DataplaneOptions } from './engine.js';
import { startJsEngine } from './js-engine.js';
import { startNativeEngine } from './native-engine.js';

export type {
  Dataplane,
  DataplaneEngine,
  DataplaneFormat,
  DataplaneOptions,
  PodBridge,
} from './engine.js';

/**
 * Starts the engine asked for. `bpf` falls back to `native` when its programs cannot load, probe
 * or attach here (logged once, with the step that failed); the result's `engine` says which runs.
 * Any other engine first removes what a bpf engine left pinned on this TUN (bpf-pins.ts), so no
 * earlier program goes on forwarding in front of it with an old peer table.
 */
export async function startDataplane(opts: DataplaneOptions): Promise<Dataplane> {
  const log = opts.log ?? logger('dataplane');
  if (opts.engine === 'js') {
    removeBpfPins(opts.tunName, log);
    return startJsEngine(opts);
  }
  if (opts.engine === 'bpf') {
    try {
      return await startBpfEngine(opts);
    } catch (err) {
      if (!(err instanceof WeftError) || err.code !== 'WEFT_ERR_BPF_UNAVAILABLE') throw err;
      log.warn(
        { err: errorMessage(err), code: err.code },
        'bpf engine unavailable; the native engine runs instead',
      );
    }
  }
  removeBpfPins(opts.tunName, log);
  return startNativeEngine({ ...opts, engine: 'native' });
}
