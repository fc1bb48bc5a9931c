/**
 * The etcd v3 lease store, flannel-compatible (DESIGN.md §4):
 *   <prefix>/config          the network config JSON
 *   <prefix>/subnets/<key>   one lease, attached to an etcd lease with the TTL (24 h)
 * A key without an etcd lease is a reservation; updates with `ttlMs === null` keep it so.
 *
 * Built on weft's own client for etcd's JSON gateway (etcd-client.ts: each endpoint once per
 * call, a deadline per unary call (default 5 s), TLS, auth tokens). The bounded, cancellable
 * retry with backoff is here (then WEFT_ERR_STORE_UNAVAILABLE), and so is the watch: it resumes
 * from the last event's revision + 1, reconnects with backoff 100 ms → 5 s, and turns
 * compaction (or a watch message over the size cap) into a `resync` batch.
 *
 * Watch liveness: a stream that says nothing for `watchIdleMs` (default 60 s) is checked with
 * one cheap read (a count-only range of the config key: its header carries the store's
 * revision). If etcd has moved past the last revision the stream delivered, or does not answer,
 * the stream is presumed silent (a half-open connection, a stuck proxy) and is torn down and
 * opened again from that revision: nothing is lost and nothing repeats. An idle but live stream
 * on etcd that nobody wrote to costs one read per period and is kept. (The gateway's watch is
 * HTTP/1.1, half duplex: a `progress_request` cannot be sent on an open stream.)
 */
import { readFileSync } from 'node:fs';
import {
  WeftError,
  abortError,
  errorMessage,
  isWeftError,
  usageError,
} from '../../common/errors.js';
import { Inbox } from '../../common/inbox.js';
import { anySignal, backoffDelay, retry, sleep } from '../../common/lifecycle.js';
import { logger } from '../../common/log.js';
import {
  EtcdClient,
  type EtcdKv,
  type WatchItem,
  type WatchResponse,
  type WatchStream,
  isRecoverable,
} from './etcd-client.js';
import type {
  ListOptions,
  Registry,
  RegistryEvent,
  StoredLease,
  SubnetList,
  WatchBatch,
} from './registry.js';

const log = logger('registry-etcd');

export const DEFAULT_ETCD_PREFIX = '/coreos.com/network';
/** Watch reconnect backoff (flannel's). */
const WATCH_BACKOFF = { initialMs: 100, maxMs: 5000 };
/** A watch stream silent this long is checked (see the head of the file). */
export const DEFAULT_WATCH_IDLE_MS = 60_000;

export interface EtcdRegistryOptions {
  /** `http://host:port` or `https://host:port`; all of one scheme. */
  readonly endpoints: readonly string[];
  /** Key prefix (default `/coreos.com/network`). */
  readonly prefix?: string | undefined;
  /** Client key and certificate (PEM files) for TLS client authentication. */
  readonly keyFile?: string | undefined;
  readonly certFile?: string | undefined;
  /** CA bundle (PEM) to verify the servers; the system roots when absent. */
  readonly caFile?: string | undefined;
  readonly username?: string | undefined;
  readonly password?: string | undefined;
  /** Attempts per operation before WEFT_ERR_STORE_UNAVAILABLE (default 5). */
  readonly attempts?: number;
  /** Backoff between attempts (default 200 ms doubling to 2 s). */
  readonly retryInitialMs?: number;
  readonly retryMaxMs?: number;
  /** Deadline of one unary call (default 5 s). */
  readonly callTimeoutMs?: number;
  /** Silence on a watch stream after which it is checked (default DEFAULT_WATCH_IDLE_MS). */
  readonly watchIdleMs?: number;
  /** Cap of one etcd answer, bytes (default DEFAULT_MAX_RESPONSE_BYTES, 64 MiB). */
  readonly maxResponseBytes?: number;
}

/** What the watch loop reads: the stream's items, and the answer of an idle check. */
type LoopItem = WatchItem | { readonly kind: 'idle-check'; readonly revision: number | null };

function readPem(flag: string, path: string): Buffer {
  try {
    return readFileSync(path);
  } catch (err) {
    throw usageError(flag, `cannot read ${path}: ${errorMessage(err)}`);
  }
}

/** The first key after every key that starts with `prefix` (etcd's range_end for a prefix). */
function prefixEnd(prefix: Buffer): Buffer {
  const end = Buffer.from(prefix);
  for (let i = end.length - 1; i >= 0; i--) {
    if (end[i]! < 0xff) {
      end[i]! += 1;
      return end.subarray(0, i + 1);
    }
  }
  return Buffer.from([0]);
}

export class EtcdRegistry implements Registry {
  readonly kind = 'etcd';
  readonly #client: EtcdClient;
  readonly #endpoints: readonly string[];
  readonly #configKey: Buffer;
  readonly #subnetsPrefix: Buffer;
  readonly #subnetsEnd: Buffer;
  readonly #retry: { attempts: number; initialMs: number; maxMs: number };
  readonly #watchIdleMs: number;
  readonly #closeCtl = new AbortController();
  #closed = false;

  constructor(options: EtcdRegistryOptions) {
    if (options.endpoints.length === 0)
      throw usageError('etcd-endpoints', 'needs at least one endpoint');
    const prefix = (options.prefix ?? DEFAULT_ETCD_PREFIX).replace(/\/+$/, '');
    this.#endpoints = options.endpoints;
    this.#configKey = Buffer.from(`${prefix}/config`);
    this.#subnetsPrefix = Buffer.from(`${prefix}/subnets/`);
    this.#subnetsEnd = prefixEnd(this.#subnetsPrefix);
    this.#retry = {
      attempts: options.attempts ?? 5,
      initialMs: options.retryInitialMs ?? 200,
      maxMs: options.retryMaxMs ?? 2000,
    };
    const callTimeoutMs = options.callTimeoutMs ?? 5000;
    this.#watchIdleMs = options.watchIdleMs ?? DEFAULT_WATCH_IDLE_MS;

    const secure = options.endpoints.some((e) => e.startsWith('https:'));
    let tls: { ca?: Buffer; cert?: Buffer; key?: Buffer } | undefined;
    if (secure || options.caFile || options.certFile || options.keyFile) {
      if (Boolean(options.certFile) !== Boolean(options.keyFile)) {
        throw usageError(
          options.certFile ? 'etcd-keyfile' : 'etcd-certfile',
          'give both --etcd-certfile and --etcd-keyfile',
        );
      }
      tls = {
        ...(options.caFile ? { ca: readPem('etcd-cafile', options.caFile) } : {}),
        ...(options.keyFile && options.certFile
          ? {
              key: readPem('etcd-keyfile', options.keyFile),
              cert: readPem('etcd-certfile', options.certFile),
            }
          : {}),
      };
    }
    try {
      this.#client = new EtcdClient({
        endpoints: options.endpoints,
        ...(tls ? { tls } : {}),
        ...(options.username
          ? { auth: { username: options.username, password: options.password ?? '' } }
          : {}),
        callTimeoutMs,
        ...(options.maxResponseBytes !== undefined
          ? { maxResponseBytes: options.maxResponseBytes }
          : {}),
      });
    } catch (err) {
      throw usageError('etcd-endpoints', errorMessage(err));
    }
  }

  // ---- plumbing ----

  #checkOpen(signal?: AbortSignal): void {
    if (this.#closed) throw new WeftError('WEFT_ERR_STORE_UNAVAILABLE', 'etcd registry closed');
    if (signal?.aborted) throw abortError(signal);
  }

  /** One etcd operation with bounded retries on transient failures. */
  async #call<T>(what: string, signal: AbortSignal | undefined, fn: () => Promise<T>): Promise<T> {
    this.#checkOpen(signal);
    const sig = anySignal(signal, this.#closeCtl.signal);
    try {
      return await retry(() => raceAbort(fn(), sig), {
        ...this.#retry,
        signal: sig,
        isRetriable: isRecoverable,
        onRetry: (err, attempt, delayMs) =>
          log.debug(
            { op: what, attempt, delayMs, err: errorMessage(err) },
            'etcd call failed, retrying',
          ),
      });
    } catch (err) {
      if (isWeftError(err)) throw err;
      throw new WeftError('WEFT_ERR_STORE_UNAVAILABLE', `etcd ${what}: ${errorMessage(err)}`, {
        cause: err,
        details: { endpoints: this.#endpoints },
      });
    }
  }

  #subnetKey(key: string): Buffer {
    return Buffer.concat([this.#subnetsPrefix, Buffer.from(key)]);
  }

  /** Expirations of the given etcd leases ('0' = none): null, or a Date (now when lapsed). */
  async #expirations(
    leaseIds: Iterable<string>,
    signal?: AbortSignal,
  ): Promise<Map<string, Date | null>> {
    const out = new Map<string, Date | null>([['0', null]]);
    const ids = [...new Set(leaseIds)].filter((id) => id !== '0');
    await Promise.all(
      ids.map(async (id) => {
        const r = await this.#call('lease timetolive', signal, () =>
          this.#client.leaseTimeToLive(id, false, signal),
        );
        const ttl = Number(r.TTL);
        out.set(id, new Date(Date.now() + Math.max(0, ttl) * 1000));
      }),
    );
    return out;
  }

  /**
   * Keys as StoredLeases. With `expirations`, one TimeToLive RPC per distinct etcd lease (what a
   * user sees in `weft leases`); without, a key with an etcd lease has `expiration: undefined`
   * and costs nothing (the daemon's list and watch: 5,000 peers would be 5,000 RPCs).
   */
  async #toLeases(
    kvs: readonly EtcdKv[],
    expirations: boolean,
    signal?: AbortSignal,
  ): Promise<StoredLease[]> {
    const exp = expirations
      ? await this.#expirations(
          kvs.map((kv) => kv.lease),
          signal,
        )
      : null;
    const now = Date.now();
    const out: StoredLease[] = [];
    for (const kv of kvs) {
      const expiration = exp ? (exp.get(kv.lease) ?? null) : kv.lease === '0' ? null : undefined;
      if (expiration && expiration.getTime() <= now) continue; // lapsed, delete pending
      out.push({
        key: kv.key.subarray(this.#subnetsPrefix.length).toString('utf8'),
        value: kv.value.toString('utf8'),
        expiration,
        revision: Number(kv.mod_revision),
      });
    }
    return out;
  }

  /** Revokes an etcd lease no key uses any more (best effort: it lapses anyway). */
  async #dropLeaseIfUnused(id: string): Promise<void> {
    if (id === '0') return;
    try {
      const r = await this.#client.leaseTimeToLive(id, true);
      if (Number(r.TTL) > 0 && r.keys.length === 0) await this.#client.leaseRevoke(id);
    } catch (err) {
      log.debug({ lease: id, err: errorMessage(err) }, 'could not revoke an unused etcd lease');
    }
  }

  async #grant(ttlMs: number, signal?: AbortSignal): Promise<{ id: string; expiration: Date }> {
    const ttl = Math.max(1, Math.ceil(ttlMs / 1000));
    const r = await this.#call('lease grant', signal, () => this.#client.leaseGrant(ttl, signal));
    return { id: r.ID, expiration: new Date(Date.now() + Number(r.TTL) * 1000) };
  }

  // ---- Registry ----

  async getNetworkConfig(signal?: AbortSignal): Promise<string> {
    const r = await this.#call('get config', signal, () =>
      this.#client.range({ key: this.#configKey }, signal),
    );
    const kv = r.kvs[0];
    if (!kv) {
      throw new WeftError(
        'WEFT_ERR_CONFIG_NOT_FOUND',
        `no network config at ${this.#configKey.toString()} in etcd`,
        {
          details: { key: this.#configKey.toString() },
        },
      );
    }
    return kv.value.toString('utf8');
  }

  async setNetworkConfig(text: string, signal?: AbortSignal): Promise<void> {
    await this.#call('put config', signal, () =>
      this.#client.put({ key: this.#configKey, value: Buffer.from(text, 'utf8') }, signal),
    );
  }

  async listSubnets(signal?: AbortSignal, options: ListOptions = {}): Promise<SubnetList> {
    const r = await this.#call('list subnets', signal, () =>
      this.#client.range({ key: this.#subnetsPrefix, range_end: this.#subnetsEnd }, signal),
    );
    return {
      leases: await this.#toLeases(r.kvs, options.expirations ?? false, signal),
      revision: Number(r.header.revision),
    };
  }

  async getSubnet(key: string, signal?: AbortSignal): Promise<StoredLease | null> {
    const r = await this.#call(`get ${key}`, signal, () =>
      this.#client.range({ key: this.#subnetKey(key) }, signal),
    );
    return (await this.#toLeases(r.kvs, true, signal))[0] ?? null;
  }

  /** True when the etcd lease `id` has run out (its key is about to be deleted by etcd). */
  async #lapsed(id: string, signal?: AbortSignal): Promise<boolean> {
    if (id === '0') return false;
    const exp = (await this.#expirations([id], signal)).get(id);
    return exp != null && exp.getTime() <= Date.now();
  }

  async createSubnet(
    key: string,
    value: string,
    ttlMs: number,
    signal?: AbortSignal,
  ): Promise<Date> {
    const k = this.#subnetKey(key);
    const lease = await this.#grant(ttlMs, signal);
    let won = false;
    try {
      for (let round = 0; round < 2 && !won; round++) {
        const r = await this.#call(`create ${key}`, signal, () =>
          this.#client.txn({
            compare: [{ key: k, target: 'VERSION', result: 'EQUAL', version: 0 }],
            success: [
              { request_put: { key: k, value: Buffer.from(value, 'utf8'), lease: lease.id } },
            ],
            failure: [{ request_range: { key: k } }],
          }),
        );
        const existing = r.responses[0]?.response_range?.kvs[0];
        // A retried txn whose first attempt landed finds the key on our own etcd lease.
        won = r.succeeded || existing?.lease === lease.id;
        if (won || !existing || !(await this.#lapsed(existing.lease, signal))) break;
        // Expired but not yet removed by etcd (it revokes every 500 ms): remove it ourselves,
        // only if nobody touched it since we looked, then try once more.
        await this.#call(`delete lapsed ${key}`, signal, () =>
          this.#client.txn({
            compare: [
              { key: k, target: 'MOD', result: 'EQUAL', mod_revision: existing.mod_revision },
            ],
            success: [{ request_delete_range: { key: k } }],
            failure: [],
          }),
        );
      }
    } finally {
      if (!won) {
        await this.#client.leaseRevoke(lease.id).catch(() => {});
      }
    }
    if (!won) {
      throw new WeftError('WEFT_ERR_STORE_KEY_EXISTS', `subnet ${key} is already leased`, {
        details: { key },
      });
    }
    return lease.expiration;
  }

  /**
   * Reads the key, refuses a lapsed one (etcd has not deleted it yet, but it is gone for the
   * contract), then puts the value on a new etcd lease (or none) if the key did not change
   * meanwhile. The old etcd lease is revoked once no key uses it (flannel leaves it to run out).
   */
  async updateSubnet(
    key: string,
    value: string,
    ttlMs: number | null,
    signal?: AbortSignal,
  ): Promise<Date | null> {
    const k = this.#subnetKey(key);
    const lease = ttlMs === null ? null : await this.#grant(ttlMs, signal);
    const newId = lease?.id ?? '0';
    let ok = false;
    let oldId: string | null = null;
    try {
      for (let round = 0; round < 5 && !ok; round++) {
        const cur = await this.#call(`get ${key}`, signal, () =>
          this.#client.range({ key: k }, signal),
        );
        const kv = cur.kvs[0];
        if (!kv) break;
        if (round > 0 && newId !== '0' && kv.lease === newId) {
          ok = true; // a retried txn had landed
          break;
        }
        if (await this.#lapsed(kv.lease, signal)) break;
        oldId ??= kv.lease;
        const r = await this.#call(`update ${key}`, signal, () =>
          this.#client.txn({
            compare: [{ key: k, target: 'MOD', result: 'EQUAL', mod_revision: kv.mod_revision }],
            success: [{ request_put: { key: k, value: Buffer.from(value, 'utf8'), lease: newId } }],
            failure: [],
          }),
        );
        ok = r.succeeded;
      }
      if (ok && oldId !== null && oldId !== newId) await this.#dropLeaseIfUnused(oldId);
    } finally {
      if (!ok && lease) {
        await this.#client.leaseRevoke(lease.id).catch(() => {});
      }
    }
    if (!ok) {
      throw new WeftError('WEFT_ERR_STORE_NOT_FOUND', `subnet ${key} not found`, {
        details: { key },
      });
    }
    return lease?.expiration ?? null;
  }

  async deleteSubnet(key: string, signal?: AbortSignal): Promise<void> {
    const r = await this.#call(`delete ${key}`, signal, () =>
      this.#client.deleteRange({ key: this.#subnetKey(key), prev_kv: true }, signal),
    );
    if (r.deleted === '0') {
      throw new WeftError('WEFT_ERR_STORE_NOT_FOUND', `subnet ${key} not found`, {
        details: { key },
      });
    }
    await this.#dropLeaseIfUnused(r.prev_kvs[0]?.lease ?? '0');
  }

  async *watchSubnets(fromRevision: number, signal: AbortSignal): AsyncIterable<WatchBatch> {
    this.#checkOpen(signal);
    const stop = anySignal(signal, this.#closeCtl.signal);
    let next = fromRevision;
    let attempt = 0;
    log.debug({ from: fromRevision }, 'etcd watch started');
    try {
      while (!stop.aborted) {
        const inbox = new Inbox<LoopItem>();
        let idleTimer: NodeJS.Timeout | undefined;
        /** This stream's loop has ended: a message that still comes must not re-arm the timer. */
        let streamDone = false;
        /**
         * (Re)starts the idle deadline; at it, etcd's revision is read (see the file's head).
         * Unref'd: it watches the stream's socket, which keeps the process alive on its own; a
         * watch left suspended by its consumer (never resumed, never returned) would otherwise
         * hold a closed registry's process open for up to watchIdleMs.
         */
        const armIdle = () => {
          clearTimeout(idleTimer);
          if (streamDone) return;
          idleTimer = setTimeout(() => {
            this.#client.range({ key: this.#configKey, count_only: true }, stop).then(
              (r) => inbox.push({ kind: 'idle-check', revision: Number(r.header.revision) }),
              () => inbox.push({ kind: 'idle-check', revision: null }),
            );
          }, this.#watchIdleMs);
          idleTimer.unref();
        };
        let stream: WatchStream;
        try {
          const opening = this.#client.watch(
            {
              key: this.#subnetsPrefix,
              range_end: this.#subnetsEnd,
              // etcd reads 0 as "from now"; the contract means "from the start".
              start_revision: Math.max(1, next),
              progress_notify: true,
            },
            (item) => {
              armIdle();
              inbox.push(item);
            },
          );
          // Stopped while it was opening: the stream that opens after all is closed at once.
          opening.then(
            (s) => stop.aborted && s.cancel(),
            () => {},
          );
          stream = await raceAbort(opening, stop);
        } catch (err) {
          if (stop.aborted) return;
          // Warn once per outage; the retries of one outage go to debug.
          (attempt === 0 ? log.warn : log.debug).call(
            log,
            { err: errorMessage(err), next, attempt },
            'etcd watch cannot open a stream',
          );
          await this.#watchBackoff(attempt++, stop);
          continue;
        }
        const cancel = () => {
          // Also on close while the consumer holds the generator suspended at a yield (its
          // finally below runs only when resumed): the timer goes with the stream.
          streamDone = true;
          clearTimeout(idleTimer);
          stream.cancel();
        };
        stop.addEventListener('abort', cancel, { once: true });
        armIdle();
        let failure: unknown = null;
        try {
          for (;;) {
            const item = await inbox.shift(stop);
            if (item === undefined) return;
            if (item.kind === 'idle-check') {
              // Etcd has not moved past what the stream delivered: silence is just quiet.
              if (item.revision !== null && item.revision < next) {
                armIdle();
                continue;
              }
              failure = new Error(
                item.revision === null
                  ? `watch silent for ${this.#watchIdleMs} ms and etcd did not answer a read`
                  : `watch silent for ${this.#watchIdleMs} ms while etcd is at revision ` +
                      `${item.revision} (next expected ${next}): presumed dead`,
              );
              break;
            }
            let resync = false;
            if (item.kind === 'error') {
              if (!isWeftError(item.err, 'WEFT_ERR_STORE_RESPONSE_TOO_LARGE')) {
                failure = item.err;
                break;
              }
              log.warn(
                { next, code: item.err.code, err: errorMessage(item.err) },
                'etcd watch message over the size cap skipped, re-listing',
              );
              resync = true;
            } else if (item.kind === 'end') {
              failure = new Error('watch stream ended');
              break;
            } else if (
              item.res.compact_revision !== '0' ||
              /compacted/.test(item.res.cancel_reason)
            ) {
              log.warn(
                { next, compactRevision: item.res.compact_revision },
                'etcd watch fell behind compaction, re-listing',
              );
              resync = true;
            }
            if (resync) {
              const list = await this.listSubnets(stop).catch((err: unknown) => {
                failure = err;
                return null;
              });
              if (list === null) break;
              yield { kind: 'resync', leases: list.leases, revision: list.revision };
              next = list.revision + 1;
              attempt = 0;
              break;
            }
            if (item.kind !== 'data') continue; // not reached: every other kind broke out above
            const res = item.res;
            if (res.canceled) {
              failure = new Error(`watch canceled: ${res.cancel_reason || 'no reason given'}`);
              break;
            }
            attempt = 0;
            if (res.created) continue;
            if (res.events.length === 0) {
              // Progress notification: every change up to the header revision was sent.
              next = Math.max(next, Number(res.header.revision) + 1);
              continue;
            }
            const events = this.#toEvents(res);
            const last = events[events.length - 1]!;
            next = eventRevision(last) + 1;
            yield { kind: 'events', events, revision: eventRevision(last) };
          }
        } finally {
          stop.removeEventListener('abort', cancel);
          cancel();
        }
        if (stop.aborted) return;
        if (failure !== null) {
          (attempt === 0 ? log.warn : log.debug).call(
            log,
            { err: errorMessage(failure), next, attempt },
            'etcd watch broken, reconnecting',
          );
          await this.#watchBackoff(attempt++, stop);
        }
      }
    } finally {
      log.debug({ next }, 'etcd watch stopped');
    }
  }

  /** A watch response as events: no RPC (expirations are not looked up, see #toLeases). */
  #toEvents(res: WatchResponse): RegistryEvent[] {
    return res.events.map((e): RegistryEvent => {
      const key = e.kv.key.subarray(this.#subnetsPrefix.length).toString('utf8');
      const revision = Number(e.kv.mod_revision);
      if (e.type === 'DELETE') return { type: 'delete', key, revision };
      const lease: StoredLease = {
        key,
        value: e.kv.value.toString('utf8'),
        expiration: e.kv.lease === '0' ? null : undefined,
        revision,
      };
      return { type: 'put', lease };
    });
  }

  async #watchBackoff(attempt: number, stop: AbortSignal): Promise<void> {
    // A token etcd forgot (a restart) was dropped by the client; the next open fetches one.
    await sleep(backoffDelay(attempt, WATCH_BACKOFF), stop).catch(() => {});
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#closeCtl.abort(new WeftError('WEFT_ERR_STORE_UNAVAILABLE', 'etcd registry closed'));
    this.#client.close();
  }
}

function eventRevision(e: RegistryEvent): number {
  return e.type === 'put' ? e.lease.revision : e.revision;
}

/** Settles with `p`, or rejects as soon as `signal` fires (p is left to settle on its own). */
function raceAbort<T>(p: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) {
    p.catch(() => {});
    return Promise.reject(abortError(signal));
  }
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(abortError(signal));
    signal.addEventListener('abort', onAbort, { once: true });
    p.then(
      (v) => {
        signal.removeEventListener('abort', onAbort);
        resolve(v);
      },
      (err: unknown) => {
        signal.removeEventListener('abort', onAbort);
        reject(err instanceof Error ? err : new Error(String(err)));
      },
    );
  });
}
