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
 * Engines: `native` (the addon; one worker thread per TUN queue, each parked in C++) and `js`
 * (js-engine.ts: the reference codec per packet on dgram, one queue, for when speed does not
 * matter or the native engine is unwanted).
 */
import { Worker } from 'node:worker_threads';
import { WeftError } from '../common/errors.js';
import { logger } from '../common/log.js';
import type { Logger } from '../common/log.js';
import { TUN_OFFLOADS, loadDataplaneBinding, offloadsFromEnv } from './binding.js';
import { startJsEngine } from './js-engine.js';
import type { WorkerMessage, WorkerStart } from './messages.js';
import { encodePeerTable } from './peer-table.js';
import type { PeerEntry } from './peer-table.js';
import { COUNTERS, DROP_REASONS, OFFLOAD_FEATURES, decodeCounters } from './stats.js';
import type { DataplaneStats, OffloadFeature } from './stats.js';

export type DataplaneFormat = 'udp' | 'vxlan';
export type DataplaneEngine = 'native' | 'js';

export interface DataplaneOptions {
  readonly format: DataplaneFormat;
  readonly engine: DataplaneEngine;
  readonly tunName: string;
  /** Worker threads = TUN queues = UDP sockets (native engine; the js engine uses one). */
  readonly workers: number;
  /** The address the UDP sockets bind (the external interface's address). */
  readonly bindIp: string;
  readonly port: number;
  readonly tunMtu: number;
  readonly vni: number;
  /** Our VtepMAC (VXLAN); ignored by udp. */
  readonly vtepMac: Buffer;
  /** TUN_F_* offloads wanted (binding.ts TUN_OFFLOADS); default: WEFT_DATAPLANE_OFFLOADS. */
  readonly offloads?: number;
  readonly log?: Logger;
}

export interface Dataplane {
  readonly engine: DataplaneEngine;
  readonly tunName: string;
  setPeers(entries: readonly PeerEntry[]): void;
  stats(): DataplaneStats;
  close(): Promise<void>;
}

export async function startDataplane(opts: DataplaneOptions): Promise<Dataplane> {
  if (opts.engine === 'js') return startJsEngine(opts);
  return startNative(opts);
}

/**
 * A worker thread running worker.js. Under tsx (sources are .ts) a worker does not inherit the
 * loader, so a small bootstrap registers tsx first.
 */
function spawnWorker(data: WorkerStart): Worker {
  if (!import.meta.url.endsWith('.ts')) {
    return new Worker(new URL('./worker.js', import.meta.url), { workerData: data });
  }
  const tsx = import.meta.resolve('tsx/esm/api');
  const file = new URL('./worker.ts', import.meta.url).href;
  const code = `import(${JSON.stringify(tsx)}).then((m) => { m.register(); return import(${JSON.stringify(file)}); });`;
  return new Worker(code, { eval: true, workerData: data });
}

async function startNative(opts: DataplaneOptions): Promise<Dataplane> {
  const log = opts.log ?? logger('dataplane');
  const native = loadDataplaneBinding();
  const want = [...COUNTERS, ...DROP_REASONS.map((r) => `drop_${r}`)].join(',');
  if (native.counterNames().join(',') !== want) {
    throw new WeftError(
      'WEFT_ERR_NATIVE_UNAVAILABLE',
      'native addon counters do not match this build of weft (rebuild the addon)',
      { details: { native: native.counterNames(), expected: want } },
    );
  }
  let created: ReturnType<typeof native.engineCreate>;
  try {
    created = native.engineCreate({
      format: opts.format,
      tunName: opts.tunName,
      workers: opts.workers,
      bindIp: opts.bindIp,
      port: opts.port,
      tunMtu: opts.tunMtu,
      vni: opts.vni,
      vtepMac: opts.vtepMac,
      offloads: opts.offloads ?? offloadsFromEnv(),
    });
  } catch (err) {
    throw new WeftError('WEFT_ERR_DATAPLANE', (err as Error).message, {
      cause: err,
      details: { tun: opts.tunName, bind: `${opts.bindIp}:${opts.port}` },
    });
  }
  const id = created.id;
  const threads: Worker[] = [];
  const exited: Promise<void>[] = [];
  let closing = false;
  try {
    const started: Promise<void>[] = [];
    for (let w = 0; w < opts.workers; w++) {
      const data: WorkerStart = { engineId: id, worker: w };
      const t = spawnWorker(data);
      threads.push(t);
      started.push(
        new Promise<void>((resolve, reject) => {
          t.on('message', (m: WorkerMessage) => {
            if (m.type === 'started') resolve();
            else if (m.type === 'error')
              reject(new WeftError('WEFT_ERR_DATAPLANE', `worker ${w}: ${m.message}`));
            else if (m.type === 'stopped' && (m.rc !== 0 || !closing)) {
              log.error({ worker: w, errno: m.rc }, 'dataplane worker left its loop');
            }
          });
          t.once('error', reject);
        }),
      );
      exited.push(new Promise<void>((resolve) => t.once('exit', () => resolve())));
    }
    await Promise.all(started);
  } catch (err) {
    closing = true;
    native.engineClose(id);
    await Promise.all(exited);
    throw err;
  }
  log.debug(
    {
      tun: created.tunName,
      workers: opts.workers,
      offloadsAccepted: created.offloadsAccepted,
      offloadsEnabled: created.offloadsEnabled,
    },
    'dataplane started',
  );
  const offloads = Object.fromEntries(
    OFFLOAD_FEATURES.map((f) => [f, (created.offloadsEnabled & TUN_OFFLOADS[f]) !== 0]),
  ) as Record<OffloadFeature, boolean>;
  let closed: Promise<void> | null = null;
  return {
    engine: 'native',
    tunName: created.tunName,
    setPeers(entries) {
      if (closing) return;
      native.engineSetPeers(id, encodePeerTable(entries));
    },
    stats() {
      if (closing) return decodeCounters('native', []);
      return { ...decodeCounters('native', native.engineCounters(id)), offloads };
    },
    close() {
      closed ??= (async () => {
        closing = true;
        native.engineClose(id);
        await Promise.all(exited);
        log.debug({ tun: created.tunName }, 'dataplane stopped');
      })();
      return closed;
    },
  };
}
