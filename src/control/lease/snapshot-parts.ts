/**
 * A snapshot handed on in parts. A peer lease stream's first batch is the snapshot of every
 * lease (backends resync on it); the peer check (checkedPeerEvents) may hand a large one on in
 * parts, each marked as continued by the next, so that a kernel backend programs the first
 * peers while the rest are still being checked (issue #28: with 5,000 peers the check took
 * ~0.15 s before the first route went to the kernel). The parts, put together in order, are the
 * batch the stream would otherwise have carried.
 *
 * Only a backend that says it takes parts (`Backend.snapshotParts`: the kernel backends, whose
 * runPlanned judges its first re-check after the last part) gets them; for any other the daemon
 * has the check hand the snapshot on whole.
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
