/**
 * Cancellation and retry. Every loop and wait in weft takes an AbortSignal; every retry loop is
 * bounded (attempts or time) and carries the last failure as `cause`.
 */
import { abortError } from './errors.js';

/** Resolves after `ms`, or rejects with an abort error as soon as `signal` fires. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(abortError(signal));
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(abortError(signal));
    };
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

export interface BackoffOptions {
  /** First delay in ms. */
  initialMs: number;
  /** Upper bound of one delay in ms. */
  maxMs: number;
  /** Growth factor per attempt (default 2). */
  factor?: number;
  /** Fraction of random jitter, 0..1 (default 0.2). */
  jitter?: number;
}

/** Delay before attempt `attempt` (0-based: the delay after the first failure is attempt 0). */
export function backoffDelay(attempt: number, o: BackoffOptions, random = Math.random): number {
  const base = Math.min(o.maxMs, o.initialMs * (o.factor ?? 2) ** attempt);
  const j = o.jitter ?? 0.2;
  return Math.round(base * (1 - j + 2 * j * random()));
}

export interface RetryOptions extends BackoffOptions {
  /** Total attempts including the first (>= 1). */
  attempts: number;
  signal?: AbortSignal;
  /** Whether a failure is worth another attempt (default: every failure). */
  isRetriable?: (err: unknown) => boolean;
  /** Called before each wait (for debug logs and counters). */
  onRetry?: (err: unknown, attempt: number, delayMs: number) => void;
}

/** Runs `fn` until it succeeds, a failure is not retriable, attempts run out or the signal fires. */
export async function retry<T>(fn: (attempt: number) => Promise<T>, o: RetryOptions): Promise<T> {
  let last: unknown;
  for (let attempt = 0; attempt < o.attempts; attempt++) {
    if (o.signal?.aborted) throw abortError(o.signal);
    try {
      return await fn(attempt);
    } catch (err) {
      last = err;
      if (o.signal?.aborted) throw abortError(o.signal);
      if (o.isRetriable && !o.isRetriable(err)) throw err;
      if (attempt + 1 >= o.attempts) break;
      const delay = backoffDelay(attempt, o);
      o.onRetry?.(err, attempt, delay);
      await sleep(delay, o.signal);
    }
  }
  throw last;
}

/** A stack of cleanups run in reverse order; errors in one do not stop the others. */
export class DisposableStack {
  readonly #fns: Array<() => unknown> = [];

  defer(fn: () => unknown): void {
    this.#fns.push(fn);
  }

  async dispose(): Promise<unknown[]> {
    const errors: unknown[] = [];
    while (this.#fns.length > 0) {
      const fn = this.#fns.pop()!;
      try {
        await fn();
      } catch (err) {
        errors.push(err);
      }
    }
    return errors;
  }
}

/** A signal that fires when any of `signals` fires. */
export function anySignal(...signals: Array<AbortSignal | undefined>): AbortSignal {
  return AbortSignal.any(signals.filter((s): s is AbortSignal => s !== undefined));
}

/**
 * Races promises against a few that outlive the race (a stop signal, a failure), without the
 * leak of `Promise.race`: every race call leaves its handlers on each input still pending, so a
 * loop racing a promise that never settles keeps one more handler (and everything its awaiting
 * function holds) per turn, for as long as it runs — a daemon's event loop, for ever. A Racer
 * subscribes to its long-lived promises once; `race(p)` settles with `p`, or with the first of
 * them to settle, and leaves nothing behind once it has.
 */
export class Racer<S> {
  #outcome: { ok: true; value: S } | { ok: false; error: unknown } | null = null;
  readonly #waiting = new Set<{ resolve: (v: S) => void; reject: (e: unknown) => void }>();

  constructor(stops: Iterable<Promise<S>>) {
    for (const s of stops) {
      s.then(
        (value) => this.#end({ ok: true, value }),
        (error: unknown) => this.#end({ ok: false, error }),
      );
    }
  }

  /** Races in progress (tests: none is kept once settled). */
  get pending(): number {
    return this.#waiting.size;
  }

  race<T>(p: Promise<T>): Promise<T | S> {
    const o = this.#outcome;
    if (o) return o.ok ? Promise.resolve(o.value) : Promise.reject(o.error);
    return new Promise<T | S>((resolve, reject) => {
      const w = { resolve, reject };
      this.#waiting.add(w);
      p.then(
        (v) => {
          this.#waiting.delete(w);
          resolve(v);
        },
        (e: unknown) => {
          this.#waiting.delete(w);
          reject(e);
        },
      );
    });
  }

  #end(o: { ok: true; value: S } | { ok: false; error: unknown }): void {
    if (this.#outcome) return;
    this.#outcome = o;
    for (const w of this.#waiting) {
      if (o.ok) w.resolve(o.value);
      else w.reject(o.error);
    }
    this.#waiting.clear();
  }
}
