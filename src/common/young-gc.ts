/**
 * A young-generation collection on demand, where the process was started with `--expose-gc`
 * (bin/weft's #! line does; `node bin/weft` and the tests do not, and then this does nothing).
 *
 * Why a daemon asks for one: every socket read is a new 64 KB ArrayBuffer, memory outside V8's
 * heap that only a collection frees. Code that reads many megabytes while allocating little on
 * the heap (a kube list cut before its parse: ~3 KB of heap per 17 KB Node) lets V8 go a long
 * way between scavenges, so the read buffers pile up (30+ MB for one 84 MB list), and V8, seeing
 * its external memory grow, answers with a mark-compact every few megabytes (with
 * --optimize-for-size: ~10 per list). A scavenge every megabyte read frees them at the cost of
 * well under a millisecond each (its live data is one page's cut Nodes).
 */
type Gc = (options: { type: 'minor' }) => void;

/** Collects the young generation now; false if the process cannot (no --expose-gc). */
export function collectYoung(): boolean {
  const gc = (globalThis as { gc?: Gc }).gc;
  if (typeof gc !== 'function') return false;
  gc({ type: 'minor' });
  return true;
}

/**
 * Calls collectYoung() after every `everyBytes` counted: feed it the size of each chunk read.
 */
export class YoungGcPacer {
  readonly #every: number;
  #bytes = 0;

  constructor(everyBytes: number) {
    this.#every = everyBytes;
  }

  read(bytes: number): void {
    this.#bytes += bytes;
    if (this.#bytes < this.#every) return;
    this.#bytes = 0;
    collectYoung();
  }
}
