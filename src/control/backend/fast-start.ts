/**
 * Fast start of a userspace node after a restart (issue 17 §1): forwarding resumes before the
 * store client is even loaded.
 *
 * While it runs, the userspace backend keeps a record of its dataplane beside the subnet file,
 * `<subnet file>.dataplane.json`: the engine options, the net-conf Backend block and the last peer
 * table it handed over (written at start, then after table changes, one write at a time and at
 * most one a second (RECORD_INTERVAL_MS), the latest table winning; the table is read when the
 * write begins, so a churn costs a write a second, not a table per change). On the next start, `startEarly` reads it first thing and, when the
 * persistent TUN it names is still there with no queue attached (a kill -9, a crash or a stop
 * left it), starts the same engine on it with that table — the table of a few seconds ago, so
 * pods' traffic flows while the daemon loads its store client, reads the config and acquires its
 * lease. Then, in the daemon's sequence:
 *
 *   forBackend(block)  → the config is loaded: a different Backend block ends the early engine
 *                        and removes its TUN and record (that backend would not use them)
 *   claim(options)     → the userspace backend's prepare: the same options → it takes the
 *                        running engine as its own; else the early engine stops first
 *   release()          → after prepare: an engine nobody claimed stops (its TUN stays)
 *
 * A node with two engines (wireguard in Mode separate on a dual-stack node: flannel-wg and
 * flannel-wg-v6) keeps a record per engine, the second named by its TUN (recordPath); each
 * starts early, each backend claims the engine on its own TUN, a backend that no longer runs a
 * TUN releases its engine before removing it (release(tun)), and the first engine's record
 * removes a second record of its own TUN (a node gone from two engines to one).
 *
 * Correctness: the early table only bridges the gap; the backend's run() hands over the table
 * planned from the store's first lease snapshot (even an empty one), which replaces it whole. A
 * peer that changed while we were down is wrong for that gap at most, as a kernel backend's
 * routes left by the last run are. The vxlan "Dataplane": "auto" handover writes no record (its
 * next start may pick the kernel device of the same name).
 */
import { readFileSync, readdirSync } from 'node:fs';
import { rename, rm, writeFile } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { errorMessage } from '../../common/errors.js';
import type { Logger } from '../../common/log.js';
import {
  type Dataplane,
  type DataplaneOptions,
  decodeWireguardPeers,
  removeBpfPins,
} from '../../dataplane/index.js';
import type { Netlink } from '../netlink/netlink.js';
import { VERSION } from '../version.js';
import { canAdoptTun } from './persistent-tun.js';

/**
 * The engine options a record keeps (DataplaneOptions without the logger; the MAC as hex, the
 * WireGuard keys as base64: the record is mode 0600, as the key file's directory is root's).
 */
export type SavedOptions = Omit<DataplaneOptions, 'log' | 'vtepMac' | 'wireguard'> & {
  readonly vtepMac: string;
  readonly wireguard?: {
    readonly privateKey: string;
    readonly psk?: string;
    readonly greet?: boolean;
  };
};

interface Record_ {
  readonly version: string;
  /** The net-conf Backend block the record was made under, as JSON text. */
  readonly backend: string;
  readonly options: SavedOptions;
  /** The last peer table handed to the engine (peer-table.ts layout), base64. */
  readonly peers: string;
  /** format wireguard: the last WireGuard peers (wireguard-peers.ts layout), base64. */
  readonly wgPeers?: string;
}

/**
 * The record of a node's engine: `<subnet file>.dataplane.json` for its first (most often only)
 * engine, `<subnet file>.<tun>.dataplane.json` for each further one (wireguard's flannel-wg-v6 in
 * Mode separate on a dual-stack node).
 */
export function recordPath(subnetFile: string, tun?: string): string {
  return tun === undefined ? `${subnetFile}.dataplane.json` : `${subnetFile}.${tun}.dataplane.json`;
}

const RECORD_SUFFIX = '.dataplane.json';

/** The further engines' records beside `subnetFile` (recordPath with a TUN), by name. */
function furtherRecords(subnetFile: string): string[] {
  const dir = dirname(subnetFile);
  const first = basename(recordPath(subnetFile));
  const prefix = `${basename(subnetFile)}.`;
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch {
    return [];
  }
  return names
    .filter((n) => n !== first && n.startsWith(prefix) && n.endsWith(RECORD_SUFFIX))
    .sort()
    .map((n) => join(dir, n));
}

export function saveOptions(o: DataplaneOptions): SavedOptions {
  const { log: _log, vtepMac, wireguard, ...rest } = o;
  return {
    ...rest,
    vtepMac: vtepMac.toString('hex'),
    ...(wireguard
      ? {
          wireguard: {
            privateKey: wireguard.privateKey.toString('base64'),
            ...(wireguard.psk ? { psk: wireguard.psk.toString('base64') } : {}),
            ...(wireguard.greet !== undefined ? { greet: wireguard.greet } : {}),
          },
        }
      : {}),
  };
}

/** The options a record's SavedOptions stand for (the logger added). */
function loadOptions(o: SavedOptions, log: Logger): DataplaneOptions {
  const { vtepMac, wireguard, ...rest } = o;
  return {
    ...rest,
    vtepMac: Buffer.from(vtepMac, 'hex'),
    ...(wireguard
      ? {
          wireguard: {
            privateKey: Buffer.from(wireguard.privateKey, 'base64'),
            ...(wireguard.psk ? { psk: Buffer.from(wireguard.psk, 'base64') } : {}),
            ...(wireguard.greet !== undefined ? { greet: wireguard.greet } : {}),
          },
        }
      : {}),
    persist: true,
    log,
  };
}

/** Options compared as JSON with sorted keys (undefined fields left out). */
function sameOptions(a: SavedOptions, b: SavedOptions): boolean {
  const norm = (o: SavedOptions) =>
    JSON.stringify(Object.fromEntries(Object.entries(o).sort(([x], [y]) => (x < y ? -1 : 1))));
  return norm(a) === norm(b);
}

/** The least time between two writes of the record while tables change. */
export const RECORD_INTERVAL_MS = 1000;

/** Waits `ms`, or less when `signal` fires first. */
export type Pause = (ms: number, signal: AbortSignal) => Promise<void>;

const pause: Pause = (ms, signal) =>
  new Promise((resolve) => {
    const t = setTimeout(done, ms);
    t.unref();
    signal.addEventListener('abort', done, { once: true });
    function done() {
      clearTimeout(t);
      signal.removeEventListener('abort', done);
      resolve();
    }
  });

/**
 * The record file, written by the running backend: one write in flight at a time, the latest
 * table pending behind it, and RECORD_INTERVAL_MS between the starts of two writes (a burst or
 * a churn of lease changes costs a write a second, not one each); flush() and remove() do not
 * wait for the interval.
 */
export class DataplaneRecord {
  readonly #path: string;
  /** The path a further engine's record on this TUN would have (see start()); null for those. */
  readonly #subnetFile: string | null;
  readonly #log: Logger;
  readonly #intervalMs: number;
  readonly #pause: Pause;
  #head: Omit<Record_, 'peers'> | null = null;
  #peers: (() => Buffer) | null = null;
  #wgPeers: (() => Buffer) | null = null;
  #writing: Promise<void> | null = null;
  #dirty = false;
  #removed = false;
  #lastWrite = -Infinity;
  #hurry = new AbortController();
  /** The removal start() began of a stale record (the writes wait for it: flush() covers it). */
  #staleGone: Promise<void> = Promise.resolve();

  /** `tun`: the record of a further engine (recordPath), not the node's first. */
  constructor(
    subnetFile: string,
    log: Logger,
    opts: { tun?: string; intervalMs?: number; pause?: Pause } = {},
  ) {
    this.#path = recordPath(subnetFile, opts.tun);
    this.#subnetFile = opts.tun === undefined ? subnetFile : null;
    this.#log = log;
    this.#intervalMs = opts.intervalMs ?? RECORD_INTERVAL_MS;
    this.#pause = opts.pause ?? pause;
  }

  /** The engine now running under `backend` (the net-conf Backend block). */
  start(backend: unknown, options: DataplaneOptions): void {
    // The first engine's record speaks for its TUN now: a further engine's record of the same
    // TUN (left when a node went from two engines to this one) would only be a stale second.
    if (this.#subnetFile !== null) {
      this.#staleGone = rm(recordPath(this.#subnetFile, options.tunName), { force: true }).catch(
        () => undefined,
      );
    }
    this.#head = {
      version: VERSION,
      backend: JSON.stringify(backend),
      options: saveOptions(options),
    };
    this.#schedule();
  }

  /**
   * The table just handed to the engine changed: `table` gives it (a buffer kept as it is, or a
   * function called when the write begins).
   */
  peers(table: Buffer | (() => Buffer)): void {
    this.#peers = typeof table === 'function' ? table : () => table;
    this.#schedule();
  }

  /** format wireguard: the WireGuard peers just handed to the engine changed. */
  wgPeers(peers: () => Buffer): void {
    this.#wgPeers = peers;
    this.#schedule();
  }

  /** Resolves once what was asked so far is on disk (at once, without the interval). */
  async flush(): Promise<void> {
    this.#hurry.abort();
    while (this.#writing) await this.#writing;
    this.#hurry = new AbortController();
  }

  /** Removes the file (the TUN went with the lease); no write after this. */
  async remove(): Promise<void> {
    this.#removed = true;
    await this.flush();
    await rm(this.#path, { force: true });
  }

  #schedule(): void {
    if (this.#removed || !this.#head) return;
    this.#dirty = true;
    if (this.#writing) return;
    this.#writing = (async () => {
      while (this.#dirty && !this.#removed) {
        const wait = this.#lastWrite + this.#intervalMs - performance.now();
        if (wait > 0 && !this.#hurry.signal.aborted) {
          await this.#pause(wait, this.#hurry.signal);
          if (this.#removed) break;
        }
        this.#dirty = false;
        // the interval runs from the last write of a table (start's own write has none yet)
        if (this.#peers) this.#lastWrite = performance.now();
        const table = this.#peers?.() ?? Buffer.alloc(0);
        const wg = this.#wgPeers?.();
        const rec: Record_ = {
          ...this.#head!,
          peers: table.toString('base64'),
          ...(wg ? { wgPeers: wg.toString('base64') } : {}),
        };
        const tmp = `${this.#path}.tmp`;
        await this.#staleGone;
        try {
          await writeFile(tmp, JSON.stringify(rec), { mode: 0o600 });
          await rename(tmp, this.#path);
        } catch (err) {
          // a fast start is lost, nothing else: the next run starts the usual way
          this.#log.warn(
            { path: this.#path, err: errorMessage(err) },
            'dataplane record not written',
          );
        }
      }
      this.#writing = null;
    })();
  }
}

/** The dataplane `startEarly` started, waiting for the daemon to say whose it is. */
export interface EarlyDataplane {
  readonly options: SavedOptions;
  readonly peerCount: number;
  /**
   * The config is loaded: when its Backend block is not the one the engine was started under,
   * the engine stops and its TUN and record are removed (→ null); else the handle.
   */
  forBackend(backend: unknown): Promise<EarlyDataplane | null>;
  /** The backend's options: the running engine when they are the same (→ it is the caller's). */
  claim(options: DataplaneOptions): Promise<Dataplane | null>;
  /**
   * Stops the engine unless claimed (its TUN stays); with `tun`, only an engine on that TUN
   * (a backend that no longer runs it, before it removes the TUN).
   */
  release(tun?: string): Promise<void>;
}

export interface StartEarlyDeps {
  readonly openNetlink: () => Netlink;
  readonly startDataplane: (o: DataplaneOptions) => Promise<Dataplane>;
}

/** Reads the record; null when absent or not usable (logged at debug: nothing is wrong). */
function readRecord(path: string, log: Logger): Record_ | null {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch {
    return null;
  }
  try {
    const r = JSON.parse(text) as Record_;
    if (r.version !== VERSION || typeof r.backend !== 'string' || typeof r.peers !== 'string')
      throw new Error(`written by weft ${String(r.version)}`);
    if (r.options.engine === 'js') throw new Error('the js engine');
    return r;
  } catch (err) {
    log.debug({ path, err: errorMessage(err) }, 'dataplane record not used');
    return null;
  }
}

/**
 * Starts the dataplane the last run recorded, on the TUN it left, with its last peer table; null
 * when there is no record or no such TUN to attach to (never throws: the daemon then starts the
 * usual way).
 */
export async function startEarly(
  subnetFile: string,
  log: Logger,
  deps: StartEarlyDeps,
): Promise<EarlyDataplane | null> {
  const started: EarlyDataplane[] = [];
  for (const path of [recordPath(subnetFile), ...furtherRecords(subnetFile)]) {
    const early = await startOne(path, log, deps, started);
    if (early) started.push(early);
  }
  return started.length <= 1 ? (started[0] ?? null) : several(started);
}

/**
 * The engines of several records as one EarlyDataplane: each backend claims the engine on its
 * own TUN; a Backend block change or a release goes to all.
 */
function several(all: EarlyDataplane[]): EarlyDataplane {
  let live = all;
  const handle: EarlyDataplane = {
    options: all[0]!.options,
    peerCount: all.reduce((n, e) => n + e.peerCount, 0),
    async forBackend(backend) {
      const kept: EarlyDataplane[] = [];
      for (const e of live) {
        const k = await e.forBackend(backend);
        if (k) kept.push(k);
      }
      live = kept;
      return kept.length === 0 ? null : handle;
    },
    async claim(options) {
      const e = live.find((x) => x.options.tunName === options.tunName);
      return e ? e.claim(options) : null;
    },
    async release(tun) {
      for (const e of live) await e.release(tun);
    },
  };
  return handle;
}

/** startEarly for one record; `others`: engines already started (one engine per TUN). */
async function startOne(
  path: string,
  log: Logger,
  deps: StartEarlyDeps,
  others: readonly EarlyDataplane[],
): Promise<EarlyDataplane | null> {
  const rec = readRecord(path, log);
  if (!rec) return null;
  const o = rec.options;
  if (others.some((e) => e.options.tunName === o.tunName)) {
    log.debug({ path, tun: o.tunName }, 'dataplane record not used: another names its tun');
    return null;
  }
  let nl: Netlink | null = null;
  let dp: Dataplane;
  try {
    nl = deps.openNetlink();
    const link = await nl.getLink(o.tunName);
    if (!link || !canAdoptTun(link, o.engine) || !link.tun!.persist || link.tun!.queues > 0) {
      log.debug({ tun: o.tunName }, 'no persistent tun to start early on');
      return null;
    }
    dp = await deps.startDataplane(loadOptions(o, log));
  } catch (err) {
    log.info({ tun: o.tunName, err: errorMessage(err) }, 'early dataplane start failed');
    return null;
  } finally {
    nl?.close();
  }
  const table = Buffer.from(rec.peers, 'base64');
  let peerCount = 0;
  try {
    dp.setPeerTable(table);
    peerCount = table.length / 64;
  } catch (err) {
    log.warn({ err: errorMessage(err) }, 'recorded peer table refused');
  }
  if (rec.wgPeers && dp.setWireguardPeers) {
    try {
      dp.setWireguardPeers(decodeWireguardPeers(Buffer.from(rec.wgPeers, 'base64')));
    } catch (err) {
      log.warn({ err: errorMessage(err) }, 'recorded wireguard peers refused');
    }
  }
  log.info(
    { tun: dp.tunName, engine: dp.engine, peers: peerCount },
    'forwarding with the last run’s peers until the store answers',
  );
  let owner: 'none' | 'claimed' | 'released' = 'none';
  const stop = async () => {
    if (owner !== 'none') return;
    owner = 'released';
    await dp.close();
  };
  const handle: EarlyDataplane = {
    options: o,
    peerCount,
    async forBackend(backend) {
      if (JSON.stringify(backend) === rec.backend) return handle;
      await stop();
      log.info({ tun: o.tunName }, 'backend changed: removing the last run’s tun');
      removeBpfPins(o.tunName, log);
      const n = deps.openNetlink();
      try {
        await n.apply([{ op: 'delLink', dev: o.tunName }]);
      } finally {
        n.close();
      }
      await rm(path, { force: true });
      return null;
    },
    async claim(options) {
      if (owner !== 'none') return null;
      if (sameOptions(saveOptions(options), o)) {
        owner = 'claimed';
        return dp;
      }
      log.info({ tun: o.tunName }, 'dataplane options changed: restarting the early engine');
      await stop();
      return null;
    },
    release: (tun) => (tun === undefined || tun === o.tunName ? stop() : Promise.resolve()),
  };
  return handle;
}
