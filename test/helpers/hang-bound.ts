/**
 * A bound that turns a hang into a failure, not a latency check: `p`, or what `onHang` returns
 * (or throws) once `ms` have passed without it. Its timer is cleared as soon as the race is
 * decided, so a bound never holds a test file's process open after its tests.
 */
import { sleep } from '../../src/common/lifecycle.js';

export async function orHang<T, H>(p: Promise<T>, ms: number, onHang: () => H): Promise<T | H> {
  const guard = new AbortController();
  try {
    return await Promise.race([
      p,
      sleep(ms, guard.signal).then(onHang, () => undefined as never), // aborted: `p` won
    ]);
  } finally {
    guard.abort();
  }
}
