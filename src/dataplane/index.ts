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
 *
 * This module is the whole of the dataplane that control sees (issue #30.1; the import-graph test
 * holds control to it): the engine choice (choose-engine.ts), the start, and the vocabulary
 * control speaks to an engine in (peer records, offload names, pins, metrics, cleanup). It stays
 * light: the engines load on the first start, so a kernel backend's daemon never loads them.
 */
import { removeBpfPins } from './bpf-pins.js';
import type { Dataplane, DataplaneOptions } from './engine.js';
import { startChosen } from './choose-engine.js';

export type {
  Dataplane,
  DataplaneEngine,
  DataplaneFormat,
  DataplaneOptions,
  PodBridge,
} from './engine.js';
export {
  ENGINE_FORMATS,
  ENGINE_REQUESTS,
  type EngineAsk,
  type EngineRequest,
  chooseEngine,
} from './choose-engine.js';
export { type OffloadName, egressTapName, offloadListError, offloadsFromEnv } from './offloads.js';
export {
  PEER_RECORD_SIZE,
  type PeerDelta,
  type PeerEntry,
  encodePeerTable,
  parseMac,
  recordSubnetKey,
} from './peer-table.js';
export {
  WG_PEER_RECORD_SIZE,
  type WireguardPeer,
  type WireguardPeerState,
  type WireguardState,
  encodeWireguardPeers,
  decodeWireguardPeers,
} from './wireguard-peers.js';
export {
  UAPI_DIR_ENV,
  UAPI_SOCKET_DIR,
  uapiSocketDir,
  type UapiSecrets,
  type WireguardUapi,
  type WireguardUapiOptions,
  startWireguardUapi,
  x25519PublicKey,
} from './wireguard-uapi.js';
export { registerDataplaneMetrics } from './stats-metrics.js';
export { type DataplaneStats, sumStats } from './stats.js';
export { removeBpfPins } from './bpf-pins.js';
export { type CleanupReport, cleanupHost } from './cleanup.js';

/**
 * Starts the engine `opts.engine` names (chooseEngine's choice), with the bpf → native fallback
 * (choose-engine.ts startChosen); the result's `engine` says which runs.
 */
export async function startDataplane(opts: DataplaneOptions): Promise<Dataplane> {
  return startChosen(opts, {
    native: async (o) => (await import('./native-engine.js')).startNativeEngine(o),
    bpf: async (o) => (await import('./bpf-engine.js')).startBpfEngine(o),
    js: async (o) => (await import('./js-engine.js')).startJsEngine(o),
    removeBpfPins,
  });
}
