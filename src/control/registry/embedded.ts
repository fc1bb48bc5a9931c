/**
 * The embedded lease store: a directory shared by the weft daemons of one host (different network
 * namespaces, one filesystem and pid namespace). No server: every daemon reads the files and
 * changes them under a store-wide lock.
 *
 * Layout of `<dir>` (mode 0700):
 *   config              the network config JSON, raw text
 *   revision            the store revision (decimal), written last by every change
 *   compacted           highest revision whose tombstone was pruned (watches from below resync)
 *   lock/               the store-wide lock (dir-lock.ts: generations gen.<n>, released.<n>)
 *   subnets/<key>       one lease: a header line `{"revision":N,"expiration":ms|null}` then the
 *                       value, byte for byte. An operator may write a reservation by hand with
 *                       `{"revision":0,"expiration":null}`.
 *   deleted/<key>       tombstone `{"revision":N,"at":ms}`: the last delete (or expiry) of <key>
 *   tmp/                temp files `<pid>-<starttime>-<random>`; a dead writer's are removed
 *
 * Changes (create, update, delete, and the purge of lapsed keys that precedes each of them) run
 * under the lock: read the snapshot, apply, write the `revision` file last. Create links a
 * complete temp file to its final name, so even without the lock two creators cannot both win.
 * Reads take no lock: files are replaced by rename, and a reader reads `revision` first, so a
 * change in flight has a revision above the one it reports.
 *
 * Watches are snapshot diffs: live keys and tombstones with a revision in [next, revision] are
 * the events (several changes to one key between two looks collapse into the last one). A watch
 * reads every file once, then is driven by inotify: fs.watch on subnets/ and deleted/ names the
 * keys that changed, and only their files are read again (on `<dir>` it sees the `revision`
 * rename). It also wakes on the next expiry, and re-reads everything every 60 s as a safety net
 * (every 1 s without inotify). When it cannot tell what changed (tombstones pruned, revision
 * went back) it yields a resync.
 */
import { watch as fsWatch, type FSWatcher, readFileSync, readdirSync } from 'node:fs';
import { link, mkdir, open, readFile, readdir, rename, unlink } from 'node:fs/promises';
import { setImmediate as nextTurn, setTimeout as sleepMs } from 'node:timers/promises';
import { join } from 'node:path';
import { WeftError, abortError, errorMessage, isWeftError } from '../../common/errors.js';
import { LogOnce, logger } from '../../common/log.js';
import { acquireDirLock, ownerAlive, ownerFromName, tempName } from './dir-lock.js';
import type { Registry, RegistryEvent, StoredLease, SubnetList, WatchBatch } from './registry.js';

const log = logger('registry-embedded');

/** Poll of a watch when inotify is unavailable. */
const POLL_MS = 1000;
/** Safety re-read of every file by a watch that has inotify (a lost event is repaired then). */
const RESCAN_MS = 60_000;
/** Tombstones older than this are pruned (watches from before them resync). */
const TOMBSTONE_TTL_MS = 24 * 60 * 60 * 1000;
/** Subnet keys: addresses, prefix lengths, `-`, `&`, `:`; never a path separator. */
const KEY_RE = /^[0-9A-Za-z.:&-]{1,200}$/;
/**
 * Lease and tombstone files are read synchronously (open, read, close: microseconds for a file of
 * a few hundred bytes on the local disk the store lives on; through the thread pool each cost
 * four round trips, and 5,000 of them took seconds), and the event loop is let go between
 * groups of this many files.
 */
const READS_PER_TURN = 256;
/** How long a watch woken by inotify gathers more events before reading the files they name. */
const COALESCE_MS = 5;

export interface EmbeddedRegistryOptions {
  /** Give up waiting for the store lock after this long (default 10 s). */
  lockTimeoutMs?: number;
  /** Poll interval of watches in ms where inotify is unavailable (default 1000). */
  pollMs?: number;
  /** Safety re-read of the whole directory by a watch that has inotify (default 60 s). */
  rescanMs?: number;
  /**
   * Read-only (`weft leases`, `weft config get`): the store must exist; nothing is created,
   * cleaned or written, and a write is refused.
   */
  readOnly?: boolean;
}

interface Snapshot {
  /** The `revision` file, read before anything else. */
  readonly revision: number;
  readonly compacted: number;
  /** Every lease file, lapsed or not. */
  readonly live: Map<string, StoredLease>;
  /** key → revision of its last delete, and when it happened. */
  readonly tombs: Map<string, { revision: number; at: number }>;
  /** Lease files older than their key's tombstone: a delete in flight, or a crashed one. */
  readonly shadowed: string[];
}

export class EmbeddedRegistry implements Registry {
  readonly kind = 'embedded';
  readonly #dir: string;
  readonly #opts: Required<EmbeddedRegistryOptions>;
  #ready: Promise<void> | null = null;
  /** Serialises this process's changes before they contend for the file lock. */
  #chain: Promise<unknown> = Promise.resolve();
  #closed = false;
  readonly #closeCtl = new AbortController();
  readonly #badFiles = new LogOnce();
  #skippedFiles = 0;
  #fullScans = 0;
  /**
   * What the last listSubnets read, for a watch that starts right after it (the daemon lists,
   * then watches from that revision): while the `revision` file still says the same, the
   * directory is what was read, and the watch's first read of 5,000 files is not done twice.
   * Taken by the first watch that uses it.
   */
  #listed: Snapshot | null = null;

  constructor(dir: string, options: EmbeddedRegistryOptions = {}) {
    this.#dir = dir;
    this.#opts = {
      lockTimeoutMs: options.lockTimeoutMs ?? 10_000,
      pollMs: options.pollMs ?? POLL_MS,
      rescanMs: options.rescanMs ?? RESCAN_MS,
      readOnly: options.readOnly ?? false,
    };
  }

  get dir(): string {
    return this.#dir;
  }

  /** Full reads of the lease directory by watches (tests: inotify at work). */
  get fullScans(): number {
    return this.#fullScans;
  }

  /** Lease files skipped because they could not be parsed (each logged once per key). */
  get skippedFiles(): number {
    return this.#skippedFiles;
  }

  #path(...parts: string[]): string {
    return join(this.#dir, ...parts);
  }

  async #check(signal?: AbortSignal): Promise<void> {
    if (this.#closed) throw new WeftError('WEFT_ERR_STORE_UNAVAILABLE', 'embedded registry closed');
    if (signal?.aborted) throw abortError(signal);
    this.#ready ??= this.#init();
    try {
      await this.#ready;
    } catch (err) {
      this.#ready = null;
      throw storeError(`open ${this.#dir}`, err);
    }
  }

  async #init(): Promise<void> {
    if (this.#opts.readOnly) {
      await readdir(this.#path('subnets')); // the store exists: ENOENT otherwise
      return;
    }
    await mkdir(this.#dir, { recursive: true, mode: 0o700 });
    for (const sub of ['subnets', 'deleted', 'tmp', 'lock']) {
      await mkdir(this.#path(sub), { recursive: true, mode: 0o700 });
    }
    // A crashed writer leaves temp files behind: remove those whose owner is gone.
    for (const name of await readdir(this.#path('tmp'))) {
      const owner = ownerFromName(name);
      if (owner !== null && !ownerAlive(owner)) {
        await unlink(this.#path('tmp', name)).catch(() => {});
      }
    }
  }

  // ---- reading ----

  #readNumber(name: string): number {
    try {
      const n = Number(readFileSync(this.#path(name), 'utf8').trim());
      return Number.isSafeInteger(n) && n >= 0 ? n : 0;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return 0;
      throw err;
    }
  }

  #readLease(key: string): StoredLease | null {
    let buf: Buffer;
    try {
      buf = readFileSync(this.#path('subnets', key));
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
      throw err;
    }
    const nl = buf.indexOf(0x0a);
    try {
      if (nl < 0) throw new Error('no header line');
      const h = JSON.parse(buf.subarray(0, nl).toString('utf8')) as {
        revision?: unknown;
        expiration?: unknown;
      };
      if (
        typeof h.revision !== 'number' ||
        !(h.expiration === null || typeof h.expiration === 'number')
      ) {
        throw new Error('bad header');
      }
      const value = buf.subarray(nl + 1).toString('utf8');
      const expiration = h.expiration === null ? null : new Date(h.expiration);
      return { key, value, expiration, revision: h.revision };
    } catch (err) {
      this.#skippedFiles++;
      if (this.#badFiles.first(key)) {
        log.warn({ key, err: errorMessage(err) }, 'skipping malformed lease file');
      }
      return null;
    }
  }

  #readTomb(key: string): { revision: number; at: number } | null {
    try {
      const t = JSON.parse(readFileSync(this.#path('deleted', key), 'utf8')) as {
        revision?: unknown;
        at?: unknown;
      };
      if (typeof t.revision !== 'number') return null;
      return { revision: t.revision, at: typeof t.at === 'number' ? t.at : 0 };
    } catch {
      return null;
    }
  }

  /** Every file, read once (`READS_PER_TURN` at a time); `revision` first. */
  async #snapshot(): Promise<Snapshot> {
    const revision = this.#readNumber('revision');
    const compacted = this.#readNumber('compacted');
    const live = new Map<string, StoredLease>();
    const tombs = new Map<string, { revision: number; at: number }>();
    let reads = 0;
    for (const key of readdirSync(this.#path('subnets'))) {
      if (!KEY_RE.test(key)) continue;
      if (++reads % READS_PER_TURN === 0) await nextTurn();
      const l = this.#readLease(key);
      if (l) live.set(key, l);
    }
    for (const key of readdirSync(this.#path('deleted'))) {
      if (!KEY_RE.test(key)) continue;
      if (++reads % READS_PER_TURN === 0) await nextTurn();
      const t = this.#readTomb(key);
      if (t) tombs.set(key, t);
    }
    const shadowed: string[] = [];
    for (const [key, l] of live) {
      if (shadowedBy(tombs.get(key)?.revision, l)) {
        live.delete(key);
        shadowed.push(key);
      }
    }
    return { revision, compacted, live, tombs, shadowed };
  }

  // ---- writing (under the lock) ----

  /** Writes `data` to a fresh temp file (fsynced) and returns its path. */
  async #temp(data: string | Buffer): Promise<string> {
    const tmp = this.#path('tmp', tempName());
    const fh = await open(tmp, 'wx', 0o600);
    try {
      await fh.writeFile(data);
      await fh.sync();
    } finally {
      await fh.close();
    }
    return tmp;
  }

  async #replace(rel: string[], data: string | Buffer): Promise<void> {
    this.#writable();
    const tmp = await this.#temp(data);
    try {
      await rename(tmp, this.#path(...rel));
    } catch (err) {
      await unlink(tmp).catch(() => {});
      throw err;
    }
  }

  /** Runs `fn` under the store lock after purging lapsed keys; writes the revision last. */
  #writable(): void {
    if (this.#opts.readOnly)
      throw new WeftError('WEFT_ERR_STORE_UNAVAILABLE', `${this.#dir} is open read-only`);
  }

  async #mutate<T>(signal: AbortSignal | undefined, fn: (tx: Tx) => Promise<T>): Promise<T> {
    this.#writable();
    await this.#check(signal);
    const run = async (): Promise<T> => {
      const lock = await acquireDirLock(this.#path('lock'), {
        tmpDir: this.#path('tmp'),
        timeoutMs: this.#opts.lockTimeoutMs,
        signal,
        onBreak: (owner) => log.warn({ owner }, 'broke a stale store lock'),
      });
      try {
        const snap = await this.#snapshot();
        let rev = snap.revision;
        for (const l of snap.live.values()) rev = Math.max(rev, l.revision);
        for (const t of snap.tombs.values()) rev = Math.max(rev, t.revision);
        const start = rev;
        const now = Date.now();
        const tx: Tx = {
          snap,
          now,
          nextRevision: () => ++rev,
          writeLease: async (key, value, expiration, create) => {
            const r = ++rev;
            const header = JSON.stringify({
              revision: r,
              expiration: expiration?.getTime() ?? null,
            });
            const data = Buffer.concat([Buffer.from(`${header}\n`), Buffer.from(value, 'utf8')]);
            if (create) {
              const tmp = await this.#temp(data);
              try {
                await link(tmp, this.#path('subnets', key));
              } catch (err) {
                if ((err as NodeJS.ErrnoException).code === 'EEXIST') throw keyExists(key);
                throw err;
              } finally {
                await unlink(tmp).catch(() => {});
              }
            } else {
              await this.#replace(['subnets', key], data);
            }
            const lease: StoredLease = { key, value, expiration, revision: r };
            snap.live.set(key, lease);
            return lease;
          },
          removeLease: async (key) => {
            const r = ++rev;
            // Tombstone first: a reader never sees the key gone without a delete revision.
            await this.#replace(['deleted', key], JSON.stringify({ revision: r, at: now }));
            await unlink(this.#path('subnets', key)).catch((err: NodeJS.ErrnoException) => {
              if (err.code !== 'ENOENT') throw err;
            });
            snap.live.delete(key);
            snap.tombs.set(key, { revision: r, at: now });
          },
        };
        // Finish a delete a crashed writer left half done (tombstone written, file not removed).
        for (const key of snap.shadowed) {
          await unlink(this.#path('subnets', key)).catch(() => {});
        }
        for (const l of [...snap.live.values()]) {
          if (l.expiration && l.expiration.getTime() <= now) await tx.removeLease(l.key);
        }
        await this.#pruneTombs(snap, now);
        try {
          return await fn(tx);
        } finally {
          if (rev !== start) await this.#replace(['revision'], `${rev}\n`);
        }
      } finally {
        await lock.release();
      }
    };
    const p = this.#chain.then(run, run);
    this.#chain = p.catch(() => {});
    try {
      return await p;
    } catch (err) {
      throw storeError('change the embedded store', err);
    }
  }

  async #pruneTombs(snap: Snapshot, now: number): Promise<void> {
    let compacted = snap.compacted;
    for (const [key, t] of snap.tombs) {
      if (now - t.at < TOMBSTONE_TTL_MS) continue;
      await unlink(this.#path('deleted', key)).catch(() => {});
      snap.tombs.delete(key);
      compacted = Math.max(compacted, t.revision);
    }
    if (compacted !== snap.compacted) await this.#replace(['compacted'], `${compacted}\n`);
  }

  /** Test hook: prunes every tombstone now, as a long-lived store would after a day. */
  async compact(): Promise<void> {
    await this.#mutate(undefined, async (tx) => {
      let compacted = tx.snap.compacted;
      for (const [key, t] of tx.snap.tombs) {
        await unlink(this.#path('deleted', key)).catch(() => {});
        compacted = Math.max(compacted, t.revision);
      }
      // Everything up to now is history a watch can no longer replay.
      compacted = Math.max(compacted, tx.nextRevision());
      await this.#replace(['compacted'], `${compacted}\n`);
    });
  }

  // ---- Registry ----

  async getNetworkConfig(signal?: AbortSignal): Promise<string> {
    await this.#check(signal);
    try {
      return await readFile(this.#path('config'), 'utf8');
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') {
        throw new WeftError(
          'WEFT_ERR_CONFIG_NOT_FOUND',
          `no network config at ${this.#path('config')}`,
        );
      }
      throw storeError('read the network config', err);
    }
  }

  async setNetworkConfig(text: string, signal?: AbortSignal): Promise<void> {
    await this.#check(signal);
    try {
      await this.#replace(['config'], text);
    } catch (err) {
      throw storeError('write the network config', err);
    }
  }

  async listSubnets(signal?: AbortSignal): Promise<SubnetList> {
    await this.#check(signal);
    let snap: Snapshot;
    try {
      snap = await this.#snapshot();
    } catch (err) {
      throw storeError('list subnets', err);
    }
    this.#listed = snap;
    return { leases: visible(snap, Date.now()), revision: snap.revision };
  }

  async getSubnet(key: string, signal?: AbortSignal): Promise<StoredLease | null> {
    checkKey(key);
    await this.#check(signal);
    let l: StoredLease | null;
    try {
      l = this.#readLease(key);
      // A newer tombstone means a delete is in flight (or a crashed writer left the file).
      if (l && shadowedBy(this.#readTomb(key)?.revision, l)) l = null;
    } catch (err) {
      throw storeError(`read subnet ${key}`, err);
    }
    return l && !lapsed(l, Date.now()) ? l : null;
  }

  async createSubnet(
    key: string,
    value: string,
    ttlMs: number,
    signal?: AbortSignal,
  ): Promise<Date> {
    checkKey(key);
    return this.#mutate(signal, async (tx) => {
      if (tx.snap.live.has(key)) throw keyExists(key);
      const lease = await tx.writeLease(key, value, new Date(tx.now + ttlMs), true);
      return lease.expiration!;
    });
  }

  async updateSubnet(
    key: string,
    value: string,
    ttlMs: number | null,
    signal?: AbortSignal,
  ): Promise<Date | null> {
    checkKey(key);
    return this.#mutate(signal, async (tx) => {
      if (!tx.snap.live.has(key)) throw notFound(key);
      const expiration = ttlMs === null ? null : new Date(tx.now + ttlMs);
      await tx.writeLease(key, value, expiration, false);
      return expiration;
    });
  }

  async deleteSubnet(key: string, signal?: AbortSignal): Promise<void> {
    checkKey(key);
    await this.#mutate(signal, async (tx) => {
      if (!tx.snap.live.has(key)) throw notFound(key);
      await tx.removeLease(key);
    });
  }

  async *watchSubnets(fromRevision: number, signal: AbortSignal): AsyncIterable<WatchBatch> {
    await this.#check(signal);
    const stop = AbortSignal.any([signal, this.#closeCtl.signal]);
    let wake: (() => void) | null = null;
    let dirty = false;
    const poke = () => {
      dirty = true;
      wake?.();
    };
    // inotify on subnets/ and deleted/ names the keys that changed; on <dir> it sees the
    // `revision` rename that ends every change. A watcher that cannot open, or an event without
    // a name, means a full re-read.
    const changed = new Set<string>();
    let rescan = true;
    const watchers: FSWatcher[] = [];
    const onKey = (_ev: string, name: string | Buffer | null) => {
      if (typeof name === 'string' && name) changed.add(name);
      else rescan = true;
      poke();
    };
    let inotify = true;
    try {
      watchers.push(fsWatch(this.#path('subnets'), { persistent: false }, onKey));
      watchers.push(fsWatch(this.#path('deleted'), { persistent: false }, onKey));
      watchers.push(fsWatch(this.#dir, { persistent: false }, poke));
      for (const w of watchers) {
        w.on('error', () => {
          inotify = false; // the poll carries on, re-reading everything
          poke();
        });
      }
    } catch (err) {
      inotify = false;
      log.debug({ err: errorMessage(err) }, 'fs.watch unavailable, polling');
    }
    stop.addEventListener('abort', poke, { once: true });
    const next = fromRevision;
    let state: Snapshot | null = null;
    let lastScan = 0;
    /** The earliest expiration among the leases read (or earlier: a lease renewed since). */
    let soonest = Infinity;
    log.debug({ from: fromRevision, inotify }, 'embedded watch started');
    try {
      while (!stop.aborted) {
        dirty = false;
        const full =
          rescan || !inotify || state === null || Date.now() - lastScan >= this.#opts.rescanMs;
        const first: boolean = state === null;
        const before = state;
        let events: RegistryEvent[] = [];
        let keys: string[] = [];
        try {
          if (full) {
            rescan = false;
            changed.clear();
            // (the watchers are open: a change after this check is seen by them)
            const listed: Snapshot | null = first ? this.#takeListed() : null;
            if (listed) {
              state = listed;
            } else {
              state = await this.#snapshot();
              this.#fullScans++;
            }
            lastScan = Date.now();
          } else {
            // The files a burst names arrive as a trickle of inotify events, each a callback of
            // its own: gather them for a moment, so a burst is read and handed on in a few
            // batches instead of one per file.
            await sleepMs(COALESCE_MS);
            keys = [...changed];
            changed.clear();
            events = await this.#refresh(state!, keys);
          }
        } catch (err) {
          log.warn({ err: errorMessage(err) }, 'embedded watch read failed');
          rescan = true;
          await this.#waitFor(
            this.#opts.pollMs,
            stop,
            (w) => (wake = w),
            () => dirty,
          );
          continue;
        }
        const snap: Snapshot = state!;
        if (stop.aborted) return;
        const now = Date.now();
        const top = snap.revision;
        if (first) {
          // What the caller listed is what had a revision below `next`; after that, changes.
          if ((snap.compacted > 0 && next <= snap.compacted) || next > maxRevision(snap) + 1) {
            yield { kind: 'resync', leases: visible(snap, now), revision: top };
          } else {
            events = changesSince(snap, next, now);
          }
        } else if (full) {
          events = diffStates(before!, snap, now);
        }
        // After the first read, each key's events come from comparing what it was with what it
        // is: a key read again (inotify named it, or a safety re-read) may show a later change
        // than its event, and a change is never judged by a revision threshold it could miss.
        if (events.length > 0) {
          const last = rev(events[events.length - 1]!);
          yield { kind: 'events', events, revision: Math.max(top, last) };
        }
        if (stop.aborted) return;
        // Lapsed keys are deleted (with a revision) by whoever notices first. The soonest expiry
        // follows the files read; every lease is looked at only once that time has come.
        if (full) soonest = 0;
        for (const key of keys) {
          const exp = snap.live.get(key)?.expiration?.getTime();
          if (exp !== undefined) soonest = Math.min(soonest, exp);
        }
        let anyLapsed = false;
        if (soonest <= now) {
          soonest = Infinity;
          for (const l of snap.live.values()) {
            if (!l.expiration) continue;
            if (l.expiration.getTime() <= now) anyLapsed = true;
            else soonest = Math.min(soonest, l.expiration.getTime());
          }
        }
        if (anyLapsed) {
          await this.#mutate(undefined, async () => {}).catch((err: unknown) => {
            log.warn({ err: errorMessage(err) }, 'embedded expiry purge failed');
          });
          rescan = true;
          continue;
        }
        const nextScan = inotify ? lastScan + this.#opts.rescanMs : now + this.#opts.pollMs;
        const waitMs = Math.max(0, Math.min(nextScan, soonest + 1) - now);
        await this.#waitFor(
          waitMs,
          stop,
          (w) => (wake = w),
          () => dirty,
        );
      }
    } finally {
      for (const w of watchers) w.close();
      stop.removeEventListener('abort', poke);
      log.debug({ next }, 'embedded watch stopped');
    }
  }

  /**
   * Reads the files of `keys` (and the revision files) again into `snap` — no directory read —
   * and returns what changed for each key, in revision order.
   */
  /** The last list's snapshot when nothing changed since (no change ends without a revision). */
  #takeListed(): Snapshot | null {
    const listed = this.#listed;
    this.#listed = null;
    if (!listed) return null;
    // The revision file is written last, so a change in flight (its lease or tombstone file
    // written before the inotify watches opened, its revision not yet) leaves the revision as
    // listed: the names of the files must be the listed ones too. (An update of a lease in
    // flight keeps its name: its old expiration is corrected by the expiry purge, which reads
    // the files under the lock, or by the next re-scan.)
    const same =
      this.#readNumber('revision') === listed.revision &&
      this.#readNumber('compacted') === listed.compacted &&
      this.#sameNames(listed);
    return same ? listed : null;
  }

  /** Whether the lease and tombstone files present are the ones `snap` was read from. */
  #sameNames(snap: Snapshot): boolean {
    const leases = readdirSync(this.#path('subnets')).filter((k) => KEY_RE.test(k));
    if (leases.length !== snap.live.size + snap.shadowed.length) return false;
    if (leases.some((k) => !snap.live.has(k) && !snap.shadowed.includes(k))) return false;
    const tombs = readdirSync(this.#path('deleted')).filter((k) => KEY_RE.test(k));
    return tombs.length === snap.tombs.size && tombs.every((k) => snap.tombs.has(k));
  }

  async #refresh(snap: Snapshot, keys: readonly string[]): Promise<RegistryEvent[]> {
    const revision = this.#readNumber('revision');
    const compacted = this.#readNumber('compacted');
    Object.assign(snap, { revision, compacted });
    const now = Date.now();
    const events: RegistryEvent[] = [];
    let reads = 0;
    for (const key of keys) {
      if (!KEY_RE.test(key)) continue;
      if (++reads % READS_PER_TURN === 0) await nextTurn();
      const was = snap.live.get(key);
      const l = this.#readLease(key);
      const t = this.#readTomb(key);
      if (t) snap.tombs.set(key, t);
      else snap.tombs.delete(key);
      if (l && !shadowedBy(t?.revision, l)) snap.live.set(key, l);
      else snap.live.delete(key);
      const e = keyChange(key, was, snap, now);
      if (e) events.push(e);
    }
    return events.sort((a, b) => rev(a) - rev(b));
  }

  /** Waits `ms`, or until `poke` runs (fs event, abort); returns at once if already dirty. */
  #waitFor(
    ms: number,
    stop: AbortSignal,
    setWake: (w: (() => void) | null) => void,
    isDirty: () => boolean,
  ): Promise<void> {
    if (isDirty() || stop.aborted) return Promise.resolve();
    return new Promise<void>((resolve) => {
      const done = () => {
        clearTimeout(timer);
        setWake(null);
        resolve();
      };
      const timer = setTimeout(done, ms);
      setWake(done);
    });
  }

  async close(): Promise<void> {
    this.#closed = true;
    this.#closeCtl.abort();
    await this.#chain;
  }
}

interface Tx {
  readonly snap: Snapshot;
  readonly now: number;
  nextRevision(): number;
  writeLease(
    key: string,
    value: string,
    expiration: Date | null,
    create: boolean,
  ): Promise<StoredLease>;
  removeLease(key: string): Promise<void>;
}

function lapsed(l: StoredLease, now: number): boolean {
  return !!l.expiration && l.expiration.getTime() <= now;
}

/**
 * Whether a tombstone newer than the lease file says the key is deleted. Revision 0 marks a file
 * written by hand (an operator's reservation), never shadowed.
 */
function shadowedBy(tombRevision: number | undefined, l: StoredLease): boolean {
  return l.revision > 0 && tombRevision !== undefined && tombRevision > l.revision;
}

function visible(snap: Snapshot, now: number): StoredLease[] {
  return [...snap.live.values()].filter((l) => !lapsed(l, now));
}

/** Every put and delete with a revision at or above `from` (a watch's first read), in order. */
function changesSince(snap: Snapshot, from: number, now: number): RegistryEvent[] {
  const events: RegistryEvent[] = [];
  for (const l of snap.live.values()) {
    if (l.revision >= from && !lapsed(l, now)) events.push({ type: 'put', lease: l });
  }
  for (const [key, t] of snap.tombs) {
    if (t.revision >= from && !snap.live.has(key))
      events.push({ type: 'delete', key, revision: t.revision });
  }
  return events.sort((a, b) => rev(a) - rev(b));
}

/** What changed for `key` between its lease `was` and its state in `snap` (null: nothing). */
function keyChange(
  key: string,
  was: StoredLease | undefined,
  snap: Snapshot,
  now: number,
): RegistryEvent | null {
  const is = snap.live.get(key);
  // (a key that lapsed since it was read was reported live: its removal is a delete)
  const wasVisible = was !== undefined;
  if (is && !lapsed(is, now)) {
    return wasVisible && was.revision === is.revision ? null : { type: 'put', lease: is };
  }
  if (!wasVisible) return null;
  return { type: 'delete', key, revision: snap.tombs.get(key)?.revision ?? snap.revision };
}

/** The changes between two full reads, in revision order. */
function diffStates(before: Snapshot, after: Snapshot, now: number): RegistryEvent[] {
  const events: RegistryEvent[] = [];
  for (const key of new Set([...before.live.keys(), ...after.live.keys()])) {
    const e = keyChange(key, before.live.get(key), after, now);
    if (e) events.push(e);
  }
  return events.sort((a, b) => rev(a) - rev(b));
}

/** The highest revision a full read holds (the revision file, or a file written after it). */
function maxRevision(snap: Snapshot): number {
  let m = snap.revision;
  for (const l of snap.live.values()) m = Math.max(m, l.revision);
  for (const t of snap.tombs.values()) m = Math.max(m, t.revision);
  return m;
}

function rev(e: RegistryEvent): number {
  return e.type === 'put' ? e.lease.revision : e.revision;
}

function checkKey(key: string): void {
  if (!KEY_RE.test(key) || key === '.' || key === '..') {
    throw new WeftError('WEFT_ERR_LEASE_MALFORMED', `not a subnet key: ${JSON.stringify(key)}`, {
      details: { key },
    });
  }
}

function keyExists(key: string): WeftError {
  return new WeftError('WEFT_ERR_STORE_KEY_EXISTS', `subnet ${key} is already leased`, {
    details: { key },
  });
}

function notFound(key: string): WeftError {
  return new WeftError('WEFT_ERR_STORE_NOT_FOUND', `subnet ${key} not found`, { details: { key } });
}

function storeError(what: string, err: unknown): WeftError {
  if (isWeftError(err)) return err;
  return new WeftError('WEFT_ERR_STORE_UNAVAILABLE', `${what}: ${errorMessage(err)}`, {
    cause: err,
  });
}
