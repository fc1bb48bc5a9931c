/**
 * flannel's lease algorithm, written once over any Registry (memory, embedded, etcd).
 *
 * Acquire (flannel's tryAcquireLease, with two fixes):
 *   1. a lease whose public address is ours is reused when it fits the config (same TTL kind:
 *      a reservation stays a reservation — flannel attaches a TTL and so breaks it), else deleted;
 *   2. else the previous subnet (from subnet.env) if it fits and is free;
 *   3. else a random pick among the lowest 100 free subnets between SubnetMin and SubnetMax.
 *   A create lost to another node is retried, up to 10 attempts (flannel gives up at once).
 * Renew: rewrite the value with a fresh TTL (a reservation keeps none).
 * Watch: list, then follow from revision + 1; malformed entries are skipped, logged once, counted.
 * watchLeases and watchOwnLease share one store watch (shared-watch.ts).
 */
import { WeftError, isWeftError } from '../../common/errors.js';
import { bits, formatCIDR, sameNet, sizeOf, type Family, type IPNet } from '../../common/ip.js';
import { LogOnce, logger, type Logger } from '../../common/log.js';
import {
  parseNetConfig,
  subnetFits,
  type FamilyConfig,
  type NetConfig,
} from '../config/net-config.js';
import { countLeaseEvents, createLeaseMetrics, type LeaseMetrics } from '../metrics/metrics.js';
import type { Registry, StoredLease, WatchBatch } from '../registry/registry.js';
import { decodeLease, encodeLeaseAttrs } from './lease-json.js';
import type { AcquireOptions, SubnetManager } from './manager.js';
import { SharedWatch, type SharedWatchOptions } from './shared-watch.js';
import { makeSubnetKey, parseSubnetKey } from './subnet-key.js';
import type { Lease, LeaseAttrs, LeaseEvent } from './types.js';
import { applyChanges, diffSnapshots, type LeaseSnapshot, type WatchChange } from './watcher.js';

/** flannel's subnetTTL. */
export const LEASE_TTL_MS = 24 * 60 * 60 * 1000;
/** Attempts at creating a subnet before giving up with WEFT_ERR_LEASE_RACE. */
export const ACQUIRE_ATTEMPTS = 10;
/** flannel picks randomly among this many of the lowest free subnets. */
export const FREE_CANDIDATES = 100;

export interface LocalManagerOptions {
  readonly ttlMs?: number;
  readonly random?: () => number;
  readonly log?: Logger;
  readonly metrics?: LeaseMetrics;
  readonly sharedWatch?: SharedWatchOptions;
}

export class LocalManager implements SubnetManager {
  readonly #registry: Registry;
  readonly #ttlMs: number;
  readonly #random: () => number;
  readonly #log: Logger;
  readonly #metrics: LeaseMetrics;
  readonly #malformedSeen = new LogOnce();
  /** watchLeases and watchOwnLease share one store watch. */
  readonly #watch: SharedWatch;

  constructor(registry: Registry, options: LocalManagerOptions = {}) {
    this.#registry = registry;
    this.#ttlMs = options.ttlMs ?? LEASE_TTL_MS;
    this.#random = options.random ?? Math.random;
    this.#log = options.log ?? logger('lease');
    this.#metrics = options.metrics ?? createLeaseMetrics();
    this.#watch = new SharedWatch(registry, options.sharedWatch);
  }

  get kind(): string {
    return this.#registry.kind;
  }

  async getNetworkConfig(signal?: AbortSignal): Promise<NetConfig> {
    return parseNetConfig(await this.#registry.getNetworkConfig(signal));
  }

  /** Decodes a stored entry; a malformed one is logged and counted once per key and value. */
  #decode(stored: StoredLease): Lease | null {
    const r = decodeLease(stored);
    if (r.ok) return r.value;
    if (this.#malformedSeen.first(`${stored.key}\0${stored.value}`)) {
      this.#metrics.malformed.inc({ store: this.#registry.kind });
      this.#log.warn({ key: stored.key, reason: r.reason }, 'skipping malformed lease');
    }
    return null;
  }

  async acquireLease(attrs: LeaseAttrs, options: AcquireOptions = {}): Promise<Lease> {
    const { signal } = options;
    const cfg = await this.getNetworkConfig(signal);
    for (let attempt = 0; attempt < ACQUIRE_ATTEMPTS; attempt++) {
      const { leases } = await this.#registry.listSubnets(signal);
      const lease = await this.#tryAcquire(cfg, attrs, leases, options);
      if (lease) return lease;
      this.#metrics.acquireRetries.inc();
      this.#log.debug({ attempt }, 'subnet taken by another node; retrying');
    }
    throw new WeftError(
      'WEFT_ERR_LEASE_RACE',
      `lost the race for a subnet ${ACQUIRE_ATTEMPTS} times in a row`,
    );
  }

  /** One attempt; null when another node took the subnet first. */
  async #tryAcquire(
    cfg: NetConfig,
    attrs: LeaseAttrs,
    stored: readonly StoredLease[],
    { previous, signal }: AcquireOptions,
  ): Promise<Lease | null> {
    const value = encodeLeaseAttrs(attrs);
    const mine = stored
      .map((s) => this.#decode(s))
      .find((l): l is Lease => l !== null && isOwnedBy(cfg, l.attrs, attrs));
    if (mine) {
      if (leaseFits(cfg, mine.subnet, mine.ipv6Subnet)) {
        const ttl = mine.expiration === null ? null : this.#ttlMs;
        try {
          const expiration = await this.#registry.updateSubnet(mine.key, value, ttl, signal);
          this.#log.info({ key: mine.key, reservation: ttl === null }, 'reusing existing lease');
          return { ...mine, attrs, expiration };
        } catch (err) {
          if (isWeftError(err, 'WEFT_ERR_STORE_NOT_FOUND')) return null; // lapsed meanwhile
          throw err;
        }
      }
      this.#log.info({ key: mine.key }, 'deleting our lease: it does not fit the network config');
      await this.#registry.deleteSubnet(mine.key, signal).catch((err: unknown) => {
        if (!isWeftError(err, 'WEFT_ERR_STORE_NOT_FOUND')) throw err;
      });
    }

    // Keys, not values, decide what is taken: a malformed value still holds its subnet.
    const taken = stored.flatMap((s) => {
      const nets = parseSubnetKey(s.key);
      return nets ? [nets.v4, nets.v6].filter((n): n is IPNet => n !== null) : [];
    });
    const isFree = (n: IPNet | null) => n === null || !taken.some((t) => sameNet(t, n));

    let v4: IPNet | null = null;
    let v6: IPNet | null = null;
    const prev = previous ?? { subnet: null, ipv6Subnet: null };
    if (
      leaseFits(cfg, prev.subnet, prev.ipv6Subnet) &&
      isFree(prev.subnet) &&
      isFree(prev.ipv6Subnet)
    ) {
      v4 = cfg.ipv4 ? prev.subnet : null;
      v6 = cfg.ipv6 ? prev.ipv6Subnet : null;
    } else {
      if (cfg.ipv4) v4 = this.#pickFree(cfg.ipv4, taken);
      if (cfg.ipv6) v6 = this.#pickFree(cfg.ipv6, taken);
    }
    const key = makeSubnetKey(v4, v6);
    let expiration: Date;
    try {
      expiration = await this.#registry.createSubnet(key, value, this.#ttlMs, signal);
    } catch (err) {
      if (isWeftError(err, 'WEFT_ERR_STORE_KEY_EXISTS')) return null;
      throw err;
    }
    if (v4 && v6 && (await this.#lostDualStackRace(key, v4, v6, signal))) return null;
    this.#log.info({ key }, 'acquired lease');
    return { key, subnet: v4, ipv6Subnet: v6, attrs, expiration };
  }

  /**
   * A dual-stack key names both subnets, so create-if-absent cannot see two nodes that picked
   * the same IPv4 subnet with different IPv6 ones (or the reverse). After creating, look again:
   * when another key shares either subnet and was written first (lower revision, then key order),
   * this node lost — delete the key and try again.
   */
  async #lostDualStackRace(
    key: string,
    v4: IPNet,
    v6: IPNet,
    signal?: AbortSignal,
  ): Promise<boolean> {
    const { leases } = await this.#registry.listSubnets(signal);
    const ours = leases.find((l) => l.key === key);
    if (!ours) return true; // gone already: someone else resolved the clash against us
    const clash = leases.some((l) => {
      if (l.key === key) return false;
      const nets = parseSubnetKey(l.key);
      const shares = (nets?.v4 && sameNet(nets.v4, v4)) || (nets?.v6 && sameNet(nets.v6, v6));
      return (
        Boolean(shares) &&
        (l.revision < ours.revision || (l.revision === ours.revision && l.key < key))
      );
    });
    if (!clash) return false;
    this.#log.info({ key }, 'another node took one of these subnets first; trying again');
    await this.#registry.deleteSubnet(key, signal).catch((err: unknown) => {
      if (!isWeftError(err, 'WEFT_ERR_STORE_NOT_FOUND')) throw err;
    });
    return true;
  }

  #pickFree(fc: FamilyConfig, taken: readonly IPNet[]): IPNet {
    const family: Family = fc.network.family;
    const step = 1n << BigInt(bits(family) - fc.subnetLen);
    const mine = taken.filter((t) => t.family === family);
    // Same-size subnets are matched by address; others (a config that changed SubnetLen) by overlap.
    const takenAddrs = new Set(mine.filter((t) => t.prefix === fc.subnetLen).map((t) => t.addr));
    const odd = mine.filter((t) => t.prefix !== fc.subnetLen);
    const free: bigint[] = [];
    for (let a = fc.subnetMin; a <= fc.subnetMax && free.length < FREE_CANDIDATES; a += step) {
      const n = { family, addr: a, prefix: fc.subnetLen };
      if (!takenAddrs.has(a) && !odd.some((t) => overlapsNet(t, n))) free.push(a);
    }
    if (free.length === 0) {
      throw new WeftError(
        'WEFT_ERR_LEASE_OUT_OF_SUBNETS',
        `out of subnets: every /${fc.subnetLen} of ${formatCIDR(fc.network)} is leased`,
      );
    }
    const pick = free[Math.floor(this.#random() * free.length)]!;
    return { family, addr: pick, prefix: fc.subnetLen };
  }

  async renewLease(lease: Lease, signal?: AbortSignal): Promise<Lease> {
    const ttl = lease.expiration === null ? null : this.#ttlMs;
    try {
      const expiration = await this.#registry.updateSubnet(
        lease.key,
        encodeLeaseAttrs(lease.attrs),
        ttl,
        signal,
      );
      this.#metrics.renewals.inc({ result: 'ok' });
      return { ...lease, expiration };
    } catch (err) {
      this.#metrics.renewals.inc({ result: 'error' });
      if (isWeftError(err, 'WEFT_ERR_STORE_NOT_FOUND')) throw revoked(lease.key);
      throw err;
    }
  }

  async releaseLease(lease: Lease, signal?: AbortSignal): Promise<void> {
    await this.#registry.deleteSubnet(lease.key, signal).catch((err: unknown) => {
      if (!isWeftError(err, 'WEFT_ERR_STORE_NOT_FOUND')) throw err;
    });
  }

  #snapshotOf(stored: readonly StoredLease[]): LeaseSnapshot {
    const snap: LeaseSnapshot = new Map();
    for (const s of stored) {
      const l = this.#decode(s);
      if (l) snap.set(s.key, l);
    }
    return snap;
  }

  async otherLeases(
    attrs: Pick<LeaseAttrs, 'publicIP' | 'publicIPv6'>,
    signal?: AbortSignal,
  ): Promise<Lease[]> {
    const cfg = await this.getNetworkConfig(signal);
    const { leases } = await this.#registry.listSubnets(signal);
    return leases
      .map((s) => this.#decode(s))
      .filter((l): l is Lease => l !== null && !isOwnedBy(cfg, l.attrs, attrs));
  }

  async *watchLeases(own: Lease, signal: AbortSignal): AsyncIterable<LeaseEvent[]> {
    const { snapshot, batches, leave } = await this.#joinPeers(own, signal);
    try {
      yield* this.#follow(own, snapshot, batches);
    } finally {
      leave();
    }
  }

  /**
   * Joins the shared watch and turns its list into the peers' snapshot. A plain async method, so
   * that the list (every lease record as the store holds it) dies when it returns: a generator's
   * locals live as long as the generator, here the daemon's life.
   */
  async #joinPeers(
    own: Lease,
    signal: AbortSignal,
  ): Promise<{ snapshot: LeaseSnapshot; batches: AsyncIterable<WatchBatch>; leave(): void }> {
    const { list, batches, leave } = await this.#watch.join(signal);
    try {
      const snapshot = this.#snapshotOf(list.leases);
      snapshot.delete(own.key);
      return { snapshot, batches, leave };
    } catch (err) {
      leave();
      throw err;
    }
  }

  async *#follow(
    own: Lease,
    start: LeaseSnapshot,
    batches: AsyncIterable<WatchBatch>,
  ): AsyncIterable<LeaseEvent[]> {
    let snapshot = start;
    const first = diffSnapshots(new Map(), snapshot, own.key);
    this.#count(first, snapshot);
    yield first;
    for await (const batch of batches) {
      let events: LeaseEvent[];
      if (batch.kind === 'resync') {
        this.#metrics.watchResyncs.inc({ store: this.#registry.kind });
        const next = this.#snapshotOf(batch.leases);
        next.delete(own.key);
        events = diffSnapshots(snapshot, next, own.key);
        snapshot = next;
      } else {
        const changes: WatchChange[] = batch.events.map((e) =>
          e.type === 'put'
            ? { type: 'put', key: e.lease.key, lease: this.#decode(e.lease) }
            : { type: 'delete', key: e.key },
        );
        events = applyChanges(snapshot, changes, own.key);
      }
      if (events.length > 0) {
        this.#count(events, snapshot);
        yield events;
      }
    }
  }

  #count(events: readonly LeaseEvent[], snapshot: LeaseSnapshot): void {
    countLeaseEvents(this.#metrics, events, snapshot.size);
  }

  async *watchOwnLease(own: Lease, signal: AbortSignal): AsyncIterable<Lease> {
    const { batches, leave } = await this.#joinOwn(own, signal);
    try {
      yield* this.#followOwn(own, batches);
    } finally {
      leave();
    }
  }

  /** Joins the shared watch if the list still holds `own` (else revoked); keeps no list. */
  async #joinOwn(
    own: Lease,
    signal: AbortSignal,
  ): Promise<{ batches: AsyncIterable<WatchBatch>; leave(): void }> {
    const { list, batches, leave } = await this.#watch.join(signal);
    if (!list.leases.some((l) => l.key === own.key)) {
      leave();
      throw revoked(own.key);
    }
    return { batches, leave };
  }

  async *#followOwn(own: Lease, batches: AsyncIterable<WatchBatch>): AsyncIterable<Lease> {
    for await (const batch of batches) {
      if (batch.kind === 'resync') {
        const s = batch.leases.find((l) => l.key === own.key);
        if (!s) throw revoked(own.key);
        const l = this.#decode(s);
        if (l) yield l;
        continue;
      }
      for (const e of batch.events) {
        if (e.type === 'delete' && e.key === own.key) throw revoked(own.key);
        if (e.type === 'put' && e.lease.key === own.key) {
          const l = this.#decode(e.lease);
          if (l) yield l;
        }
      }
    }
  }

  async close(): Promise<void> {
    await this.#registry.close();
  }
}

function revoked(key: string): WeftError {
  return new WeftError(
    'WEFT_ERR_LEASE_REVOKED',
    `lease ${key} was revoked (deleted from the store or expired)`,
    { details: { key } },
  );
}

function overlapsNet(a: IPNet, b: IPNet): boolean {
  const lo = (n: IPNet) => n.addr;
  const hi = (n: IPNet) => n.addr + sizeOf(n) - 1n;
  return lo(a) <= hi(b) && lo(b) <= hi(a);
}

/** Whether a lease's subnets fit the config: each enabled family present and inside its range. */
export function leaseFits(cfg: NetConfig, v4: IPNet | null, v6: IPNet | null): boolean {
  if (cfg.ipv4 && (!v4 || !subnetFits(cfg.ipv4, v4))) return false;
  if (cfg.ipv6 && (!v6 || !subnetFits(cfg.ipv6, v6))) return false;
  return true;
}

/** flannel matches our old lease by public address: IPv4 when enabled, else IPv6. */
function isOwnedBy(
  cfg: NetConfig,
  theirs: LeaseAttrs,
  ours: Pick<LeaseAttrs, 'publicIP' | 'publicIPv6'>,
): boolean {
  if (cfg.enableIPv4) return theirs.publicIP === ours.publicIP && ours.publicIP !== '0.0.0.0';
  return ours.publicIPv6 !== null && theirs.publicIPv6 === ours.publicIPv6;
}
