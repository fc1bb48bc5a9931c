/**
 * Progress on stderr for long commands (demo, bench): one line per step with its duration; on a
 * terminal the running step shows a spinner. No colours when NO_COLOR is set or not a TTY.
 */
const FRAMES = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

export class Progress {
  readonly #out: NodeJS.WriteStream;
  readonly #tty: boolean;

  constructor(out: NodeJS.WriteStream = process.stderr) {
    this.#out = out;
    this.#tty = Boolean(out.isTTY) && !process.env.NO_COLOR;
  }

  note(msg: string): void {
    this.#out.write(`  ${msg}\n`);
  }

  /** Runs `fn` as one step: spinner while it runs, ✓/✗ with the time after. */
  async step<T>(label: string, fn: () => Promise<T>, detail?: (v: T) => string): Promise<T> {
    const t0 = Date.now();
    let frame = 0;
    const timer = this.#tty
      ? setInterval(() => this.#out.write(`\r${FRAMES[frame++ % FRAMES.length]} ${label} `), 100)
      : null;
    if (!this.#tty) this.#out.write(`… ${label}\n`);
    try {
      const v = await fn();
      this.#end('✓', label, t0, detail?.(v));
      return v;
    } catch (err) {
      this.#end('✗', label, t0, (err as Error).message.split('\n')[0]);
      throw err;
    } finally {
      if (timer) clearInterval(timer);
    }
  }

  #end(mark: string, label: string, t0: number, detail?: string): void {
    const secs = ((Date.now() - t0) / 1000).toFixed(1);
    const line = `${mark} ${label} (${secs}s)${detail ? ` — ${detail}` : ''}`;
    this.#out.write(this.#tty ? `\r\x1b[2K${line}\n` : `${line}\n`);
  }
}
