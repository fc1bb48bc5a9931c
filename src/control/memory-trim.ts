/**
 * Gives the memory a large change freed back to the kernel once lease changes quiet down.
 *
 * A 5,000-lease snapshot or burst allocates tens of MB that are garbage a few seconds later; V8
 * returns its own pages, but what the native side and V8's off-heap allocations freed stays in
 * glibc's malloc arenas (one per contending thread, kept for reuse), so a udp daemon that had
 * taken a burst held ~6.5 MB of freed memory for good (kube × udp, 5,000 peers: 100.0 MB →
 * 93.5 MB after one `malloc_trim(0)`). After at least `minChanges` lease changes, once none has
 * come for `quietMs` (or `maxDelayMs` after the first of them, so steady churn trims too), one
 * trim runs, and up to three more 10 s apart while each gives back 1 MiB or more. With nothing
 * changing nothing runs; a trim costs a walk of the arenas (~1 ms).
 */
import type { LeaseEvent } from './lease/types.js';

/** Quiet time before a trim: V8's memory reducer collects ~8 s after allocation stops, and again. */
export const TRIM_QUIET_MS = 12_000;
/** A trim is worth it only after this many changes (one event frees next to nothing). */
export const TRIM_AFTER_CHANGES = 256;
/** The longest a trim waits after the first change it covers (steady churn is never quiet). */
export const TRIM_MAX_DELAY_MS = 120_000;
/**
 * A trim that gave back at least this much is followed by another `followUpMs` later (at most
 * `TRIM_FOLLOW_UPS` in a row): V8 frees a burst's garbage over several collections, and what
 * they free (buffers, off-heap allocations) lands in the arenas after the first trim.
 */
export const TRIM_FOLLOW_UP_BYTES = 1 << 20;
export const TRIM_FOLLOW_UP_MS = 10_000;
export const TRIM_FOLLOW_UPS = 3;

export interface MemoryTrimmerOptions {
  /** Returns freed memory to the kernel; → whether any went (the addon's mallocTrim). Must not throw. */
  trim: () => boolean;
  quietMs?: number;
  minChanges?: number;
  maxDelayMs?: number;
  followUpMs?: number;
  /** Resident bytes now (process.memoryUsage.rss by default). */
  rss?: () => number;
  /** Called after each trim with the resident bytes before and after it. */
  onTrim?: (before: number, after: number, released: boolean) => void;
  now?: () => number;
}

export class MemoryTrimmer {
  readonly #trim: () => boolean;
  readonly #quietMs: number;
  readonly #minChanges: number;
  readonly #maxDelayMs: number;
  readonly #followUpMs: number;
  readonly #rss: () => number;
  readonly #onTrim: MemoryTrimmerOptions['onTrim'];
  readonly #now: () => number;
  /** Changes since the last trim. */
  #pending = 0;
  /** When the first of them came. */
  #since = 0;
  #timer: NodeJS.Timeout | undefined;
  #closed = false;
  #trims = 0;

  constructor(o: MemoryTrimmerOptions) {
    this.#trim = o.trim;
    this.#quietMs = o.quietMs ?? TRIM_QUIET_MS;
    this.#minChanges = o.minChanges ?? TRIM_AFTER_CHANGES;
    this.#maxDelayMs = o.maxDelayMs ?? TRIM_MAX_DELAY_MS;
    this.#followUpMs = o.followUpMs ?? TRIM_FOLLOW_UP_MS;
    this.#rss = o.rss ?? (() => process.memoryUsage.rss());
    this.#onTrim = o.onTrim;
    this.#now = o.now ?? Date.now;
  }

  /** Trims run so far. */
  get trims(): number {
    return this.#trims;
  }

  /** Whether a trim is scheduled. */
  get armed(): boolean {
    return this.#timer !== undefined;
  }

  /** Counts `changes` lease changes; (re)arms the trim once there are enough. */
  note(changes: number): void {
    if (this.#closed || changes <= 0) return;
    const now = this.#now();
    if (this.#pending === 0) this.#since = now;
    this.#pending += changes;
    if (this.#pending < this.#minChanges) return;
    clearTimeout(this.#timer);
    const delay = Math.max(0, Math.min(this.#quietMs, this.#since + this.#maxDelayMs - now));
    this.#arm(delay, 0);
  }

  #arm(delay: number, followUp: number): void {
    this.#timer = setTimeout(() => this.#run(followUp), delay);
    this.#timer.unref();
  }

  #run(followUp: number): void {
    this.#timer = undefined;
    if (followUp === 0) this.#pending = 0;
    const before = this.#rss();
    const released = this.#trim();
    this.#trims++;
    const after = this.#rss();
    this.#onTrim?.(before, after, released);
    if (before - after >= TRIM_FOLLOW_UP_BYTES && followUp < TRIM_FOLLOW_UPS && !this.#closed)
      this.#arm(this.#followUpMs, followUp + 1);
  }

  close(): void {
    this.#closed = true;
    clearTimeout(this.#timer);
    this.#timer = undefined;
  }
}

/** Passes lease batches through, telling `trimmer` how many changes each carried. */
export async function* noteLeaseChanges(
  batches: AsyncIterable<LeaseEvent[]>,
  trimmer: MemoryTrimmer,
): AsyncIterable<LeaseEvent[]> {
  for await (const batch of batches) {
    trimmer.note(batch.length);
    yield batch;
  }
}
