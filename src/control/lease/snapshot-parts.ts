/**
 * A snapshot handed on in parts. A peer lease stream's first batch is the snapshot of every
 * lease (backends resync on it); the peer check (checkedPeerEvents) may hand a large one on in
 * parts, each marked as continued by the next, so that a kernel backend programs the first
 * peers while the rest are still being checked (issue #28: with 5,000 peers the check took
 * ~0.15 s before the first route went to the kernel). The parts, put together in order, are the
 * batch the stream would otherwise have carried.
 *
 * A consumer that understands parts (runPlanned: it judges its first re-check only after the
 * last part) says so (`Backend.snapshotParts`); any other gets the snapshot whole
 * (`wholeSnapshots`).
 */
import type { LeaseEvent } from './types.js';

/** The batches marked as a part of a snapshot that more parts follow. */
const continued = new WeakSet<readonly LeaseEvent[]>();

/** Marks `part` as a part of a snapshot that continues in the next batch; returns it. */
export function snapshotPart(part: LeaseEvent[]): LeaseEvent[] {
  continued.add(part);
  return part;
}

/** Whether `batch` is a part of a snapshot that continues in the next batch. */
export function continuesSnapshot(batch: readonly LeaseEvent[]): boolean {
  return continued.has(batch);
}

/** The stream with every snapshot given in parts put back together into one batch. */
export async function* wholeSnapshots(
  batches: AsyncIterable<LeaseEvent[]>,
): AsyncIterable<LeaseEvent[]> {
  let parts: LeaseEvent[] | null = null;
  for await (const batch of batches) {
    if (continuesSnapshot(batch)) {
      parts ??= [];
      for (let i = 0; i < batch.length; i++) parts.push(batch[i]!);
      continue;
    }
    if (parts === null) {
      yield batch;
      continue;
    }
    for (let i = 0; i < batch.length; i++) parts.push(batch[i]!);
    const whole = parts;
    parts = null;
    yield whole;
  }
}
