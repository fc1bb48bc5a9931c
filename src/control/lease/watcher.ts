/**
 * The pure lease diff. A watcher keeps a snapshot (key → Lease) of OTHER nodes' leases; store
 * events and re-lists become added/removed events against it. "added" also means "changed":
 * backends treat it as an upsert, as flannel's do.
 */
import type { Lease, LeaseEvent } from './types.js';

export type LeaseSnapshot = Map<string, Lease>;

function sameLease(a: Lease, b: Lease): boolean {
  return (
    a.key === b.key &&
    a.attrs.publicIP === b.attrs.publicIP &&
    a.attrs.publicIPv6 === b.attrs.publicIPv6 &&
    a.attrs.backendType === b.attrs.backendType &&
    JSON.stringify(a.attrs.backendData) === JSON.stringify(b.attrs.backendData) &&
    JSON.stringify(a.attrs.backendV6Data) === JSON.stringify(b.attrs.backendV6Data)
  );
}

/** Events that turn `prev` into `next`; `ownKey` is excluded from both. Does not mutate. */
export function diffSnapshots(
  prev: LeaseSnapshot,
  next: LeaseSnapshot,
  ownKey?: string,
): LeaseEvent[] {
  const out: LeaseEvent[] = [];
  for (const [key, lease] of prev) {
    if (key !== ownKey && !next.has(key)) out.push({ type: 'removed', lease });
  }
  for (const [key, lease] of next) {
    if (key === ownKey) continue;
    const before = prev.get(key);
    if (!before || !sameLease(before, lease)) out.push({ type: 'added', lease });
  }
  return out;
}

/**
 * diffSnapshots for one node's lease, without building two maps: `before` and `after` are what
 * was known under one name and what is known now (either may be absent, their keys may differ).
 */
export function diffLease(
  before: Lease | undefined,
  after: Lease | null,
  ownKey?: string,
): LeaseEvent[] {
  const out: LeaseEvent[] = [];
  if (before && before.key !== ownKey && (!after || after.key !== before.key)) {
    out.push({ type: 'removed', lease: before });
  }
  if (after && after.key !== ownKey) {
    if (!before || before.key !== after.key || !sameLease(before, after)) {
      out.push({ type: 'added', lease: after });
    }
  }
  return out;
}

export type WatchChange =
  { type: 'put'; key: string; lease: Lease | null } | { type: 'delete'; key: string };

/**
 * Applies store changes to `snapshot` in place and returns the resulting events. A put whose
 * value could not be decoded (`lease: null`) removes what was known under that key: a lease
 * that became garbage no longer describes a reachable peer.
 */
export function applyChanges(
  snapshot: LeaseSnapshot,
  changes: readonly WatchChange[],
  ownKey?: string,
): LeaseEvent[] {
  const out: LeaseEvent[] = [];
  for (const c of changes) {
    if (c.key === ownKey) continue;
    const before = snapshot.get(c.key);
    if (c.type === 'put' && c.lease) {
      snapshot.set(c.key, c.lease);
      if (!before || !sameLease(before, c.lease)) out.push({ type: 'added', lease: c.lease });
    } else if (before) {
      snapshot.delete(c.key);
      out.push({ type: 'removed', lease: before });
    }
  }
  return out;
}
