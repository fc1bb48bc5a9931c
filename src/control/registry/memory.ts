/**
 * An in-process Registry for unit tests and for driving the lease logic without a store.
 * Time comes from an injectable clock so TTL expiry is testable without sleeping; expiry is
 * noticed on every call and by `expireNow()`.
 */
import { WeftError, abortError } from '../../common/errors.js';
import type { Registry, StoredLease, SubnetList, WatchBatch, RegistryEvent } from './registry.js';

export interface Clock {
  now(): number;
}

interface Waiter {
  wake: () => void;
}

export class MemoryRegistry implements Registry {
  readonly kind = 'memory';
  readonly #clock: Clock;
  #config: string | null = null;
  readonly #subnets = new Map<string, StoredLease>();
  /** Every change in order; watches read from here. */
  readonly #log: RegistryEvent[] = [];
  #revision = 0;
  /** Revisions below this are gone (simulated compaction). */
  #compactedBelow = 0;
  #closed = false;
  readonly #waiters = new Set<Waiter>();

  constructor(options: { clock?: Clock; config?: string } = {}) {
    this.#clock = options.clock ?? { now: () => Date.now() };
    if (options.config !== undefined) this.#config = options.config;
  }

  #check(signal?: AbortSignal): void {
    if (this.#closed) throw new WeftError('WEFT_ERR_STORE_UNAVAILABLE', 'memory registry closed');
    if (signal?.aborted) throw abortError(signal);
    this.expireNow();
  }

  #record(ev: RegistryEvent): void {
    this.#log.push(ev);
    for (const w of this.#waiters) w.wake();
  }

  /** Drops lapsed leases (emitting deletes). Called by every operation. */
  expireNow(): void {
    const now = this.#clock.now();
    for (const [key, l] of this.#subnets) {
      if (l.expiration && l.expiration.getTime() <= now) {
        this.#subnets.delete(key);
        this.#record({ type: 'delete', key, revision: ++this.#revision });
      }
    }
  }

  /** Simulates etcd compaction: watches from older revisions get a resync. */
  compact(): void {
    this.#compactedBelow = this.#revision + 1;
  }

  async getNetworkConfig(signal?: AbortSignal): Promise<string> {
    this.#check(signal);
    if (this.#config === null) {
      throw new WeftError('WEFT_ERR_CONFIG_NOT_FOUND', 'no network config in the memory registry');
    }
    return this.#config;
  }

  async setNetworkConfig(text: string, signal?: AbortSignal): Promise<void> {
    this.#check(signal);
    this.#config = text;
  }

  async listSubnets(signal?: AbortSignal): Promise<SubnetList> {
    this.#check(signal);
    return { leases: [...this.#subnets.values()], revision: this.#revision };
  }

  async getSubnet(key: string, signal?: AbortSignal): Promise<StoredLease | null> {
    this.#check(signal);
    return this.#subnets.get(key) ?? null;
  }

  #put(key: string, value: string, ttlMs: number | null): Date | null {
    const expiration = ttlMs === null ? null : new Date(this.#clock.now() + ttlMs);
    const lease: StoredLease = { key, value, expiration, revision: ++this.#revision };
    this.#subnets.set(key, lease);
    this.#record({ type: 'put', lease });
    return expiration;
  }

  async createSubnet(
    key: string,
    value: string,
    ttlMs: number,
    signal?: AbortSignal,
  ): Promise<Date> {
    this.#check(signal);
    if (this.#subnets.has(key)) {
      throw new WeftError('WEFT_ERR_STORE_KEY_EXISTS', `subnet ${key} is already leased`, {
        details: { key },
      });
    }
    return this.#put(key, value, ttlMs)!;
  }

  async updateSubnet(
    key: string,
    value: string,
    ttlMs: number | null,
    signal?: AbortSignal,
  ): Promise<Date | null> {
    this.#check(signal);
    if (!this.#subnets.has(key)) {
      throw new WeftError('WEFT_ERR_STORE_NOT_FOUND', `subnet ${key} not found`, {
        details: { key },
      });
    }
    return this.#put(key, value, ttlMs);
  }

  /** Test hook: write a key exactly as given (malformed values, reservations). */
  putRaw(key: string, value: string, ttlMs: number | null): void {
    this.#put(key, value, ttlMs);
  }

  async deleteSubnet(key: string, signal?: AbortSignal): Promise<void> {
    this.#check(signal);
    if (!this.#subnets.delete(key)) {
      throw new WeftError('WEFT_ERR_STORE_NOT_FOUND', `subnet ${key} not found`, {
        details: { key },
      });
    }
    this.#record({ type: 'delete', key, revision: ++this.#revision });
  }

  async *watchSubnets(fromRevision: number, signal: AbortSignal): AsyncIterable<WatchBatch> {
    let next = fromRevision;
    while (!this.#closed && !signal.aborted) {
      this.expireNow();
      if (next < this.#compactedBelow) {
        yield { kind: 'resync', leases: [...this.#subnets.values()], revision: this.#revision };
        next = this.#revision + 1;
        continue;
      }
      const events = this.#log.filter((e) => eventRevision(e) >= next);
      if (events.length > 0) {
        next = eventRevision(events[events.length - 1]!) + 1;
        yield { kind: 'events', events, revision: next - 1 };
        continue;
      }
      await new Promise<void>((resolve) => {
        const w: Waiter = {
          wake: () => {
            this.#waiters.delete(w);
            signal.removeEventListener('abort', w.wake);
            resolve();
          },
        };
        this.#waiters.add(w);
        signal.addEventListener('abort', w.wake, { once: true });
      });
    }
  }

  async close(): Promise<void> {
    this.#closed = true;
    for (const w of [...this.#waiters]) w.wake();
  }
}

function eventRevision(e: RegistryEvent): number {
  return e.type === 'put' ? e.lease.revision : e.revision;
}
