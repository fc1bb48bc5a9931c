/**
 * The daemon's log of peer lease changes (flannel logs every subnet change). Each change is a
 * line of its own while they come slowly: at most `PEER_LINES_PER_SECOND` lines a second, and
 * none for a batch larger than `LOG_EACH_PEER_UP_TO` (a 5,000-peer snapshot). Beyond that the
 * changes are counted and summed up in one line, `peer leases changed {added, removed}`, once a
 * second at most: a churn of hundreds of changes a second would otherwise spend its time writing
 * log lines (stderr is written synchronously, and a slow reader of the pipe stalls the writer).
 */
import type { Logger } from '../common/log.js';
import type { LeaseEvent } from './lease/types.js';

/** Batches larger than this are one summary line. */
export const LOG_EACH_PEER_UP_TO = 16;
/** Per-change lines a second, at most; the rest is summed up. */
export const PEER_LINES_PER_SECOND = 20;

export async function* logPeerEvents(
  batches: AsyncIterable<LeaseEvent[]>,
  log: Logger,
  now: () => number = Date.now,
): AsyncIterable<LeaseEvent[]> {
  let windowStart = -Infinity;
  let lines = 0;
  let added = 0;
  let removed = 0;
  let timer: NodeJS.Timeout | undefined;
  const summary = () => {
    clearTimeout(timer);
    timer = undefined;
    if (added + removed > 0) log.info({ added, removed }, 'peer leases changed');
    added = 0;
    removed = 0;
  };
  try {
    for await (const batch of batches) {
      const t = now();
      if (t - windowStart >= 1000) {
        summary();
        windowStart = t;
        lines = 0;
      }
      if (batch.length <= LOG_EACH_PEER_UP_TO && lines + batch.length <= PEER_LINES_PER_SECOND) {
        lines += batch.length;
        for (const e of batch) {
          log.info(
            {
              key: e.lease.key,
              publicIP: e.lease.attrs.publicIP,
              backendType: e.lease.attrs.backendType,
            },
            e.type === 'added' ? 'peer lease added' : 'peer lease removed',
          );
        }
      } else {
        for (const e of batch) {
          if (e.type === 'added') added++;
          else removed++;
        }
        if (batch.length > LOG_EACH_PEER_UP_TO && lines === 0) {
          summary(); // a snapshot at a quiet time: at once
          lines++;
        } else {
          timer ??= setTimeout(summary, Math.max(0, windowStart + 1000 - t)).unref();
        }
      }
      yield batch;
    }
  } finally {
    summary();
  }
}
