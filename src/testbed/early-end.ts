/**
 * A bench's testbed removed however the run ends early. A run builds namespaces with daemons
 * inside; a process that ends without removing them leaves those daemons running for good. The
 * ways a run ends early:
 *
 *   - SIGINT (Ctrl-C), SIGTERM, SIGHUP (its terminal closed);
 *   - an error nothing caught: a harness bug, or a reader gone from stdout or stderr
 *     (`npm run bench:scale 2>&1 | grep … | head`: the next `process.stderr.write` fails with
 *     EPIPE, an 'error' event nobody listens for; `console.log` ignores it). Node's default for
 *     both is to end the process at once.
 *
 * On each, `cleanup` runs once and the process exits: 128 + the signal's number, 1 after an
 * error. A second signal while it runs exits at once (the message says what is left). The run's
 * own end calls `off()` and cleans up itself.
 */
import { constants } from 'node:os';

export interface EarlyEnd {
  /** Whether a signal or an error has begun the cleanup (a loop should stop starting work). */
  readonly stopping: boolean;
  /** Removes the handlers: the run ended on its own. */
  off(): void;
}

const SIGNALS = ['SIGINT', 'SIGTERM', 'SIGHUP'] as const;

/**
 * Runs `cleanup` (then exits) when the run ends early; `name` prefixes the line that says so
 * ("bench:scale: interrupted (SIGHUP); removing the testbed"), `what` names what goes.
 */
export function onEarlyEnd(
  name: string,
  cleanup: () => Promise<unknown> | unknown,
  what = 'the testbed',
): EarlyEnd {
  let stopping = false;
  // A write to a stream whose reader is gone fails again (asynchronously: another error, which
  // arrives here and is ignored once stopping): say it, never throw from here.
  const say = (text: string) => {
    try {
      process.stderr.write(`\n${name}: ${text}\n`);
    } catch {
      // (stderr is gone)
    }
  };
  const end = (code: number) => {
    stopping = true;
    void Promise.resolve()
      .then(cleanup)
      .catch((err: unknown) => say(`cleanup failed: ${String(err)}`))
      .finally(() => process.exit(code));
  };
  const handlers = SIGNALS.map((signal) => {
    const number = constants.signals[signal];
    const handler = () => {
      if (stopping) {
        say(`${signal} again: exiting now; ${what} is left (ip netns list)`);
        process.exit(128 + number);
      }
      say(`interrupted (${signal}); removing ${what}`);
      end(128 + number);
    };
    process.on(signal, handler);
    return [signal, handler] as const;
  });
  const onError = (err: unknown) => {
    if (stopping) return;
    const text = err instanceof Error ? (err.stack ?? err.message) : String(err);
    say(`${text}\n${name}: removing ${what}`);
    end(1);
  };
  process.on('uncaughtException', onError);
  process.on('unhandledRejection', onError);
  return {
    get stopping() {
      return stopping;
    },
    off() {
      for (const [signal, handler] of handlers) process.off(signal, handler);
      process.off('uncaughtException', onError);
      process.off('unhandledRejection', onError);
    },
  };
}
