/**
 * One registry watch shared by a manager's watchers. A daemon follows the store twice (peer
 * leases for the backend, its own lease for revocation); each store watch has a price (etcd: a
 * stream; embedded: directory watches and their re-scans), so the two share one.
 *
 *   join(signal) → { list, next() }
 *
 * The watch starts from one list. A watcher that joins while the replay window is open (the
 * first REPLAY_MS, at most REPLAY_BATCHES batches: a daemon's two watchers join within
 * milliseconds) gets that list and every batch since. A later one lists again and is handed only
 * the events its list did not already hold (revision above the list's); resync batches always.
 * The watch stops when its last watcher leaves; a registry error ends every watcher with it.
 */
import { Inbox } from '../../common/inbox.js';
import type { Registry, SubnetList, WatchBatch } from '../registry/registry.js';

const REPLAY_MS = 5000;
const REPLAY_BATCHES = 256;

type Item = { batch: WatchBatch } | { error: unknown } | { end: true };

class Watcher {
  readonly #inbox = new Inbox<Item>();
  /** Events at or below this revision were in the watcher's own list. */
  skipUpTo = -1;

  push(item: Item): void {
    this.#inbox.push(item);
  }

  /** The next batch; undefined when the watch ended or `signal` fired. */
  async next(signal: AbortSignal): Promise<WatchBatch | undefined> {
    for (;;) {
      const item = await this.#inbox.shift(signal);
      if (item === undefined || 'end' in item) return undefined;
      if ('error' in item) throw item.error;
      const b = item.batch;
      if (b.kind === 'resync' || this.skipUpTo < 0) return b;
      const events = b.events.filter(
        (e) => (e.type === 'put' ? e.lease.revision : e.revision) > this.skipUpTo,
      );
      if (events.length > 0) return { ...b, events };
    }
  }
}

interface Source {
  readonly ctl: AbortController;
  readonly watchers: Set<Watcher>;
  /**
   * Settles once the first list is in and the replay window open (rejects when the list failed).
   * Not with the list itself: a settled promise holds its value for as long as the watch runs,
   * and the list is only needed in the replay window.
   */
  readonly started: Promise<void>;
  replay: { list: SubnetList; batches: WatchBatch[] } | null;
}

export interface Joined {
  readonly list: SubnetList;
  readonly batches: AsyncIterable<WatchBatch>;
  leave(): void;
}

export interface SharedWatchOptions {
  readonly replayMs?: number;
  readonly replayBatches?: number;
}

export class SharedWatch {
  readonly #registry: Registry;
  readonly #replayMs: number;
  readonly #replayBatches: number;
  #source: Source | null = null;

  constructor(registry: Registry, options: SharedWatchOptions = {}) {
    this.#registry = registry;
    this.#replayMs = options.replayMs ?? REPLAY_MS;
    this.#replayBatches = options.replayBatches ?? REPLAY_BATCHES;
  }

  /**
   * Joins the watch: the list to start from, and the batches after it. The iterator ends when
   * `signal` fires and rejects with the registry's error; `leave()` (idempotent; the iterator's
   * end calls it too) must run when the watcher is done, however it ends.
   */
  async join(signal: AbortSignal): Promise<Joined> {
    const src = this.#source ?? this.#start();
    const w = new Watcher();
    let list: SubnetList;
    try {
      await src.started;
      if (src.replay && this.#source === src) {
        list = src.replay.list;
        for (const batch of src.replay.batches) w.push({ batch });
        src.watchers.add(w);
      } else if (this.#source === src) {
        src.watchers.add(w);
        list = await this.#registry.listSubnets(signal);
        w.skipUpTo = list.revision;
      } else {
        // The watch ended between the start and now (its watchers all left): start another.
        return await this.join(signal);
      }
    } catch (err) {
      this.#leave(src, w);
      throw err;
    }
    const leave = () => this.#leave(src, w);
    const batches = async function* (): AsyncIterable<WatchBatch> {
      try {
        for (;;) {
          const b = await w.next(signal);
          if (b === undefined) return;
          yield b;
        }
      } finally {
        leave();
      }
    };
    return { list, batches: batches(), leave };
  }

  #start(): Source {
    const ctl = new AbortController();
    // settles once the replay window is open (or the list failed), never with the list
    const started = this.#registry.listSubnets(ctl.signal).then(
      (list) => {
        src.replay = { list, batches: [] };
        const timer = setTimeout(() => (src.replay = null), this.#replayMs);
        timer.unref();
        void this.#pump(src, list.revision + 1).finally(() => clearTimeout(timer));
      },
      (err: unknown) => {
        if (this.#source === src) this.#source = null;
        throw err;
      },
    );
    const src: Source = { ctl, watchers: new Set(), replay: null, started };
    this.#source = src;
    return src;
  }

  async #pump(src: Source, from: number): Promise<void> {
    let last: Item = { end: true };
    try {
      for await (const batch of this.#registry.watchSubnets(from, src.ctl.signal)) {
        for (const w of src.watchers) w.push({ batch });
        if (src.replay) {
          src.replay.batches.push(batch);
          if (src.replay.batches.length > this.#replayBatches) src.replay = null;
        }
      }
    } catch (err) {
      last = { error: err };
    } finally {
      if (this.#source === src) this.#source = null;
      src.replay = null;
      for (const w of src.watchers) w.push(last);
    }
  }

  #leave(src: Source, w: Watcher): void {
    if (!src.watchers.delete(w)) return;
    if (src.watchers.size > 0) return;
    // (a watcher may still be joining: it is added after `started`, so wait for it)
    queueMicrotask(() => {
      if (src.watchers.size > 0) return;
      if (this.#source === src) this.#source = null;
      src.ctl.abort();
    });
  }
}
