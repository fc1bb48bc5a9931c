/**
 * The daemon's log of peer lease changes (flannel logs every subnet change). Each change is a
 * line of its own while they come slowly: at most `PEER_LINES_PER_SECOND` lines a second, and
 * none for a batch larger than `LOG_EACH_PEER_UP_TO` (a 5,000-peer snapshot, whole or in parts:
 * snapshot-parts.ts). Beyond that the changes are counted and summed up in one line, `peer
 * leases changed {added, removed}`, once a second at most: a churn of hundreds of changes a
 * second would otherwise spend its time writing log lines (stderr is written synchronously, and
 * a slow reader of the pipe stalls the writer).
 */
import type { Logger } from '../common/log.js';
import { continuesSnapshot } from './lease/snapshot-parts.js';
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
  /** Changes counted and not yet summed up. */
  const counted = { added: 0, removed: 0 };
  /** The changes of a snapshot's parts so far (snapshot-parts.ts): counted with its last part. */
  const parts = { added: 0, removed: 0 };
  let timer: NodeJS.Timeout | undefined;
  const summary = () => {
    clearTimeout(timer);
    timer = undefined;
    const { added, removed } = counted;
    if (added + removed > 0) log.info({ added, removed }, 'peer leases changed');
    counted.added = 0;
    counted.removed = 0;
  };
  const count = (batch: readonly LeaseEvent[], into: { added: number; removed: number }) => {
    for (const e of batch) {
      if (e.type === 'added') into.added++;
      else into.removed++;
    }
  };
  const countParts = () => {
    counted.added += parts.added;
    counted.removed += parts.removed;
    parts.added = 0;
    parts.removed = 0;
  };
  try {
    for await (const batch of batches) {
      if (continuesSnapshot(batch)) {
        count(batch, parts);
        yield batch;
        continue;
      }
      const large = parts.added + parts.removed > 0 || batch.length > LOG_EACH_PEER_UP_TO;
      const t = now();
      if (t - windowStart >= 1000) {
        summary();
        windowStart = t;
        lines = 0;
      }
      if (!large && lines + batch.length <= PEER_LINES_PER_SECOND) {
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
        countParts();
        count(batch, counted);
        if (large && lines === 0) {
          summary(); // a snapshot at a quiet time: at once
          lines++;
        } else {
          timer ??= setTimeout(summary, Math.max(0, windowStart + 1000 - t)).unref();
        }
      }
      yield batch;
    }
  } finally {
    countParts();
    summary();
  }
}
