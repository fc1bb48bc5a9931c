/** A queue between callbacks (a stream's events, a fan-out) and one async reader. */
export class Inbox<T> {
  readonly #items: T[] = [];
  #wake: (() => void) | null = null;

  push(item: T): void {
    this.#items.push(item);
    this.#wake?.();
  }

  /** The next item, or undefined once `signal` fires. */
  async shift(signal: AbortSignal): Promise<T | undefined> {
    while (this.#items.length === 0) {
      if (signal.aborted) return undefined;
      await new Promise<void>((resolve) => {
        const done = () => {
          this.#wake = null;
          signal.removeEventListener('abort', done);
          resolve();
        };
        this.#wake = done;
        signal.addEventListener('abort', done, { once: true });
      });
    }
    return signal.aborted ? undefined : this.#items.shift();
  }
}
