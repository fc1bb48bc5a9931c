/**
 * The userspace backends' plan (udp, vxlan-userspace), pure like the kernel backends' plans:
 * a batch of lease events → the peer records each named lease now stands for. Only the leases
 * an event names are parsed; `PeerRecords` keeps every lease's records pre-encoded and what
 * changed since the engine last heard, so a change costs its own parse and its own records.
 */
import type { Family } from '../../common/ip.js';
import {
  PEER_RECORD_SIZE,
  type PeerDelta,
  type PeerEntry,
  encodePeerTable,
  recordSubnetKey,
} from '../../dataplane/index.js';
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

/** A subnet's record as the engine last received it, and as it is now (null: absent). */
interface Pending {
  readonly before: Buffer | null;
  after: Buffer | null;
}

/**
 * The peer table as records kept per lease, encoded once when the lease changes. `table()` is
 * the buffer the dataplane takes whole (one copy of the records, no parsing); `takeDelta()` is
 * what changed since the last handover (`takeDelta` or `takeTable`), by subnet: the records
 * that left and the ones added or changed, so a flush costs what changed, not the table.
 */
export class PeerRecords {
  readonly #byLease = new Map<string, Buffer>();
  /** Each subnet's record now (a view into its lease's buffer). */
  readonly #bySubnet = new Map<string, Buffer>();
  /** Subnets changed since the last handover. */
  readonly #pending = new Map<string, Pending>();
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
        this.#track(before, null);
        changed = true;
        continue;
      }
      const rec = encodePeerTable(c.entries);
      if (before?.equals(rec)) continue;
      this.#byLease.set(c.key, rec);
      this.#bytes += rec.length - (before?.length ?? 0);
      this.#track(before ?? null, rec);
      changed = true;
    }
    return changed;
  }

  /** Notes, per subnet, a lease's records going from `before` to `after`. */
  #track(before: Buffer | null, after: Buffer | null): void {
    const now = new Map<string, Buffer>();
    for (let o = 0; after && o < after.length; o += PEER_RECORD_SIZE) {
      now.set(recordSubnetKey(after, o), after.subarray(o, o + PEER_RECORD_SIZE));
    }
    for (let o = 0; before && o < before.length; o += PEER_RECORD_SIZE) {
      const k = recordSubnetKey(before, o);
      // the subnet is this lease's no more (a subnet another lease holds stays that lease's)
      if (!now.has(k) && this.#bySubnet.get(k)?.equals(before.subarray(o, o + PEER_RECORD_SIZE)))
        this.#set(k, null);
    }
    for (const [k, r] of now) this.#set(k, r);
  }

  #set(key: string, rec: Buffer | null): void {
    if (!this.#pending.has(key))
      this.#pending.set(key, { before: this.#bySubnet.get(key) ?? null, after: rec });
    else this.#pending.get(key)!.after = rec;
    if (rec) this.#bySubnet.set(key, rec);
    else this.#bySubnet.delete(key);
  }

  get size(): number {
    return this.#bytes / PEER_RECORD_SIZE;
  }

  /** Every record, one buffer (what the native engine swaps in whole). */
  table(): Buffer {
    const out = Buffer.allocUnsafe(this.#bytes);
    let o = 0;
    for (const rec of this.#byLease.values()) o += rec.copy(out, o);
    return out;
  }

  /** The whole table, handed over: later deltas are relative to it. */
  takeTable(): Buffer {
    this.#pending.clear();
    return this.table();
  }

  /** What changed since the last handover (empty buffers when nothing did). */
  takeDelta(): PeerDelta & { readonly changes: number } {
    const removed: Buffer[] = [];
    const upserts: Buffer[] = [];
    for (const p of this.#pending.values()) {
      if (p.after === null) {
        if (p.before) removed.push(p.before);
      } else if (!p.before?.equals(p.after)) {
        upserts.push(p.after);
      }
    }
    this.#pending.clear();
    return {
      removed: Buffer.concat(removed),
      upserts: Buffer.concat(upserts),
      changes: removed.length + upserts.length,
    };
  }
}
