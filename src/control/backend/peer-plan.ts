/**
 * The userspace backends' plan (udp, vxlan-userspace), pure like the kernel backends' plans:
 * a batch of lease events → the peer records each named lease now stands for. Only the leases
 * an event names are parsed; `PeerRecords` keeps every lease's records pre-encoded, so a change
 * costs its own parse plus one copy of the table, never a re-parse of every peer.
 */
import type { Family } from '../../common/ip.js';
import { PEER_RECORD_SIZE, type PeerEntry, encodePeerTable } from '../../dataplane/peer-table.js';
import type { Lease, LeaseEvent } from '../lease/types.js';
import { leasePublicIP, leaseSubnet } from './kernel-common.js';

export interface PeerPlanContext {
  readonly families: readonly Family[];
  /** The underlay family (the one the dataplane bound: IPv4 when the node has it). */
  readonly underlay: Family;
  /**
   * Each family rides its own underlay (vxlan, as flannel): a record of family F goes to the
   * lease's public address of family F (PublicIP / PublicIPv6), and `underlay` is unused.
   */
  readonly perFamily?: boolean;
  /** Our own lease (never a peer). */
  readonly ownKey: string | null;
  /** The record for a lease and family, or why it cannot be one. */
  peerFor(lease: Lease, family: Family, publicIP: string): PeerEntry | { skip: string };
}

export interface PeerChange {
  readonly key: string;
  /** The lease's records now: empty when it was removed or is unusable. */
  readonly entries: readonly PeerEntry[];
  /** Why records of this lease were left out (one per family that failed). */
  readonly skipped: readonly string[];
}

/** Pure: what each event's lease now contributes to the peer table. */
export function planPeers(events: readonly LeaseEvent[], ctx: PeerPlanContext): PeerChange[] {
  const out: PeerChange[] = [];
  for (const e of events) {
    const lease = e.lease;
    if (lease.key === ctx.ownKey) continue;
    if (e.type === 'removed') {
      out.push({ key: lease.key, entries: [], skipped: [] });
      continue;
    }
    const entries: PeerEntry[] = [];
    const skipped: string[] = [];
    for (const family of ctx.families) {
      if (!leaseSubnet(lease, family)) continue;
      const pub = leasePublicIP(lease, ctx.perFamily ? family : ctx.underlay);
      if (!pub) {
        skipped.push(ctx.perFamily ? `no public IPv${family} address` : 'no public address');
        continue;
      }
      const p = ctx.peerFor(lease, family, pub);
      if ('skip' in p) skipped.push(p.skip);
      else entries.push(p);
    }
    out.push({ key: lease.key, entries, skipped });
  }
  return out;
}

/**
 * The peer table as records kept per lease, encoded once when the lease changes. `table()` is
 * the buffer the dataplane takes (one copy of the records, no parsing).
 */
export class PeerRecords {
  readonly #byLease = new Map<string, Buffer>();
  #bytes = 0;

  /** Applies changes; returns whether the table differs. */
  apply(changes: readonly PeerChange[]): boolean {
    let changed = false;
    for (const c of changes) {
      const before = this.#byLease.get(c.key);
      if (c.entries.length === 0) {
        if (!before) continue;
        this.#byLease.delete(c.key);
        this.#bytes -= before.length;
        changed = true;
        continue;
      }
      const rec = encodePeerTable(c.entries);
      if (before?.equals(rec)) continue;
      this.#byLease.set(c.key, rec);
      this.#bytes += rec.length - (before?.length ?? 0);
      changed = true;
    }
    return changed;
  }

  get size(): number {
    return this.#bytes / PEER_RECORD_SIZE;
  }

  /** Every record, one buffer (what the native engine swaps in). */
  table(): Buffer {
    const out = Buffer.allocUnsafe(this.#bytes);
    let o = 0;
    for (const rec of this.#byLease.values()) o += rec.copy(out, o);
    return out;
  }
}
