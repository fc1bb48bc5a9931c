/**
 * Peer leases are checked here, once, before any backend sees them (issue #17.3): the daemon
 * passes its peer lease stream through `checkedPeerEvents`, so host-gw, vxlan (both dataplanes)
 * and udp program only leases that passed. A lease is skipped when
 *
 *   outside_network  one of its subnets is not inside the cluster network
 *   overlaps_own     one of its subnets overlaps ours
 *   backend_data     it is a vxlan lease and our backend is vxlan: its VNI is not ours, or its
 *                    VtepMAC is unusable (not a unicast MAC)
 *   vtep_mac         its VtepMAC is ours, or an older peer's (issue #12.1)
 *   overlaps_peer    one of its subnets overlaps an older peer's
 *
 * "Older" is arrival order: leases present at start are ordered by when they were last written
 * (expiration − TTL where the store looked it up; a reservation first; then by key, so every node
 * picks the same one), and a lease that arrives later is newer than every lease already known. When the older lease goes away, the newer one
 * is programmed. Each skipped lease is logged once (with the lease it clashes with) and counted
 * in `weft_lease_conflicts_total{reason}` when it becomes skipped.
 *
 * A peer that was there before us and publishes our VtepMAC means WE are the newcomer: the
 * daemon is told (`onOwnVtepMACTaken`) and chooses a new MAC.
 */
import { type Counter, type Registry as PromRegistry, counterOn } from '../../common/metrics.js';
import {
  type Family,
  type IPNet,
  bits,
  canonical,
  containsNet,
  formatCIDR,
  maskOf,
} from '../../common/ip.js';
import { jsonField } from '../../common/json-field.js';
import { LogOnce, type Logger } from '../../common/log.js';
import type { NetConfig } from '../config/net-config.js';
import { continuesSnapshot, snapshotPart } from '../lease/snapshot-parts.js';
import type { Lease, LeaseEvent } from '../lease/types.js';
import { clusterNetwork, enabledFamilies, leaseSubnet } from './kernel-common.js';
import { leaseVtepMACs, peerVtepMAC } from './vtep-mac.js';
import { VXLAN, parseVxlanConfig } from './vxlan.js';

export const CONFLICT_REASONS = [
  'outside_network',
  'overlaps_own',
  'backend_data',
  'vtep_mac',
  'overlaps_peer',
] as const;
export type ConflictReason = (typeof CONFLICT_REASONS)[number];

export interface PeerCheckConfig {
  readonly netConfig: NetConfig;
  /** Our lease (its subnets and VtepMACs). */
  readonly own: Lease;
  /** Our VNI when our backend is vxlan (vxlan peers are then checked); null otherwise. */
  readonly vni: number | null;
}

/** The check for our backend: vxlan peers are checked against our VNI when we run vxlan. */
export function peerCheckConfig(netConfig: NetConfig, own: Lease): PeerCheckConfig {
  const vxlan = netConfig.backend.type.toLowerCase() === VXLAN;
  return { netConfig, own, vni: vxlan ? parseVxlanConfig(netConfig.backend.raw).vni : null };
}

export interface Rejection {
  readonly lease: Lease;
  readonly reason: ConflictReason;
  readonly detail: string;
  /** The lease it clashes with (ours or a peer's), when there is one. */
  readonly other: Lease | null;
}

export interface PeerCheck {
  readonly accepted: Lease[];
  readonly rejected: Rejection[];
}

interface Span {
  readonly start: bigint;
  readonly end: bigint;
  readonly lease: Lease;
}

function spanOf(net: IPNet): { start: bigint; end: bigint } {
  const mask = maskOf(net.family, net.prefix);
  const start = net.addr & mask;
  // the host bits: the family's all-ones mask without the network's
  return { start, end: start | (maskOf(net.family, bits(net.family)) ^ mask) };
}

/** Spans per chunk of the sorted list, at most (a fuller one is split in two). */
const SPAN_CHUNK = 128;

/**
 * Accepted subnets of one family, sorted by start and disjoint (so one binary search finds a
 * clash), in chunks of at most SPAN_CHUNK: an insert moves the rest of one chunk, not of the
 * whole list. (A start's snapshot adds its 5,000 subnets in the leases' age order, not the
 * subnets' order; in one array the inserts took ~40 ms of a 5,000-lease check.)
 */
class Spans {
  /** Non-empty, each sorted, and every span of a chunk starts before the next chunk's. */
  readonly #chunks: Span[][] = [];

  /** The accepted lease `net` overlaps, or null. */
  clash(net: IPNet): Lease | null {
    const { start, end } = spanOf(net);
    // The span starting at or before us, and the one after it.
    const { c, i } = this.#after(start);
    const before = i > 0 ? this.#chunks[c]![i - 1]! : c > 0 ? this.#chunks[c - 1]!.at(-1)! : null;
    const after = c < this.#chunks.length ? this.#chunks[c]![i]! : null;
    if (before !== null && before.end >= start) return before.lease;
    if (after !== null && after.start <= end) return after.lease;
    return null;
  }

  add(net: IPNet, lease: Lease): void {
    const span = { ...spanOf(net), lease };
    const chunks = this.#chunks;
    if (chunks.length === 0) {
      chunks.push([span]);
      return;
    }
    let { c, i } = this.#after(span.start);
    if (c === chunks.length) {
      c--;
      i = chunks[c]!.length;
    }
    const chunk = chunks[c]!;
    chunk.splice(i, 0, span);
    if (chunk.length > SPAN_CHUNK) chunks.splice(c + 1, 0, chunk.splice(SPAN_CHUNK >> 1));
  }

  /** Forgets the span of `net` that `key` holds. */
  remove(net: IPNet, key: string): void {
    const { start } = spanOf(net);
    const chunks = this.#chunks;
    const first = firstWhere(chunks, (chunk) => chunk.at(-1)!.start >= start);
    for (let c = first; c < chunks.length; c++) {
      const chunk = chunks[c]!;
      for (let i = 0; i < chunk.length; i++) {
        const s = chunk[i]!;
        if (s.start < start) continue;
        if (s.start > start) return;
        if (s.lease.key !== key) continue;
        chunk.splice(i, 1);
        if (chunk.length === 0) chunks.splice(c, 1);
        return;
      }
    }
  }

  /**
   * Where the first span starting after `start` is: chunk `c`, index `i` (c = the chunk count
   * when every span starts at or before it).
   */
  #after(start: bigint): { c: number; i: number } {
    const c = firstWhere(this.#chunks, (chunk) => chunk.at(-1)!.start > start);
    if (c === this.#chunks.length) return { c, i: 0 };
    return { c, i: firstWhere(this.#chunks[c]!, (s) => s.start > start) };
  }
}

/** The first index of `xs` where `past` holds, `past` being false up to some index, then true. */
function firstWhere<T>(xs: readonly T[], past: (x: T) => boolean): number {
  let lo = 0;
  let hi = xs.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (past(xs[mid]!)) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

/** Why a vxlan peer's backend data is unusable for family `f` (null: usable). */
function vxlanDataProblem(lease: Lease, family: Family, vni: number): string | null {
  const data =
    family === 6 && lease.attrs.backendV6Data !== undefined
      ? lease.attrs.backendV6Data
      : lease.attrs.backendData;
  const mac = peerVtepMAC(data);
  if ('reason' in mac) return mac.reason;
  const theirs = jsonField(data as Record<string, unknown>, 'VNI');
  if (theirs !== undefined && theirs !== vni) {
    return `VNI ${JSON.stringify(theirs)} is not ours (${vni})`;
  }
  return null;
}

/**
 * One check in progress: the config, our lease, and the peers accepted so far (their subnets per
 * family, their VtepMACs). `consider` takes leases oldest first; a lease considered after every
 * other (a newcomer) is checked exactly as `checkPeers` would check it at the end of the list.
 */
class CheckState {
  readonly #cfg: PeerCheckConfig;
  readonly #families: Family[];
  readonly #spans: Map<Family, Spans>;
  readonly #ownMacs: Set<string>;
  readonly #macOwner = new Map<string, Lease>();

  constructor(cfg: PeerCheckConfig) {
    this.#cfg = cfg;
    this.#families = enabledFamilies(cfg.netConfig);
    this.#spans = new Map(this.#families.map((f) => [f, new Spans()]));
    this.#ownMacs = new Set(cfg.vni === null ? [] : leaseVtepMACs(cfg.own));
  }

  #nets(lease: Lease): Array<{ f: Family; n: IPNet }> {
    const out: Array<{ f: Family; n: IPNet }> = [];
    for (let k = 0; k < this.#families.length; k++) {
      const f = this.#families[k]!;
      const n = leaseSubnet(lease, f);
      if (n) out.push({ f, n });
    }
    return out;
  }

  #macs(lease: Lease): string[] {
    return this.#cfg.vni !== null && lease.attrs.backendType === VXLAN ? leaseVtepMACs(lease) : [];
  }

  /**
   * Accepts `lease` (recording its subnets and MACs) or says why not; the first rule broken
   * names it. (Indexed loops, not find() with closures nor for-of: a start considers every
   * lease, 5,000 in a large cluster, before V8 has optimized this code, and what the
   * unoptimized code allocates, iterators included, is scavenged during the start.)
   */
  consider(lease: Lease): Rejection | null {
    const cfg = this.#cfg;
    const nets = this.#nets(lease);
    for (let k = 0; k < nets.length; k++) {
      const { f, n } = nets[k]!;
      if (!containsNet(clusterNetwork(cfg.netConfig, f)!, n)) {
        return rejection(
          lease,
          'outside_network',
          `subnet ${fmt(n)} is outside the cluster network`,
        );
      }
    }
    for (let k = 0; k < nets.length; k++) {
      const { f, n } = nets[k]!;
      const own = leaseSubnet(cfg.own, f);
      if (own !== null && overlapsSpan(own, n)) {
        return rejection(lease, 'overlaps_own', `subnet ${fmt(n)} overlaps ours`, cfg.own);
      }
    }
    if (cfg.vni !== null && lease.attrs.backendType === VXLAN) {
      for (let k = 0; k < nets.length; k++) {
        const problem = vxlanDataProblem(lease, nets[k]!.f, cfg.vni);
        if (problem !== null) return rejection(lease, 'backend_data', problem);
      }
    }
    const macs = this.#macs(lease);
    for (let k = 0; k < macs.length; k++) {
      const m = macs[k]!;
      if (this.#ownMacs.has(m))
        return rejection(lease, 'vtep_mac', `VtepMAC ${m} is ours`, cfg.own);
    }
    for (let k = 0; k < macs.length; k++) {
      const owner = this.#macOwner.get(macs[k]!);
      if (owner) {
        return rejection(lease, 'vtep_mac', `VtepMAC ${macs[k]} is an older peer's`, owner);
      }
    }
    for (let k = 0; k < nets.length; k++) {
      const { f, n } = nets[k]!;
      const other = this.#spans.get(f)!.clash(n);
      if (other) {
        return rejection(
          lease,
          'overlaps_peer',
          `subnet ${fmt(n)} overlaps an older peer's`,
          other,
        );
      }
    }
    this.#record(lease, nets, macs);
    return null;
  }

  #record(lease: Lease, nets: Array<{ f: Family; n: IPNet }>, macs: readonly string[]): void {
    for (let k = 0; k < nets.length; k++) this.#spans.get(nets[k]!.f)!.add(nets[k]!.n, lease);
    for (let k = 0; k < macs.length; k++) this.#macOwner.set(macs[k]!, lease);
  }

  /** Forgets an accepted lease: its subnets and MACs are free again. */
  forget(lease: Lease): void {
    for (const { f, n } of this.#nets(lease)) this.#spans.get(f)!.remove(n, lease.key);
    for (const m of this.#macs(lease)) {
      if (this.#macOwner.get(m)?.key === lease.key) this.#macOwner.delete(m);
    }
  }

  /** An accepted lease's new version with the same `checkSignature`: kept, as the newer object. */
  replace(old: Lease, lease: Lease): void {
    this.forget(old);
    this.#record(lease, this.#nets(lease), this.#macs(lease));
  }
}

/**
 * What the checks read of a lease besides its key (which fixes its subnets): two versions with
 * the same signature get the same verdict in the same place.
 */
function checkSignature(l: Lease): string {
  const a = l.attrs;
  return `${a.backendType}|${JSON.stringify(a.backendData ?? null)}|${JSON.stringify(a.backendV6Data ?? null)}`;
}

/**
 * Pure: which of `leases` (oldest first; ours excluded) may be programmed, and why the others
 * may not. The first rule a lease breaks names its rejection.
 */
export function checkPeers(leases: Iterable<Lease>, cfg: PeerCheckConfig): PeerCheck {
  const state = new CheckState(cfg);
  const accepted: Lease[] = [];
  const rejected: Rejection[] = [];
  for (const lease of leases) {
    const r = state.consider(lease);
    if (r) rejected.push(r);
    else accepted.push(lease);
  }
  return { accepted, rejected };
}

function rejection(
  lease: Lease,
  reason: ConflictReason,
  detail: string,
  other: Lease | null = null,
): Rejection {
  return { lease, reason, detail, other };
}

function overlapsSpan(a: IPNet, b: IPNet): boolean {
  const x = spanOf(a);
  const y = spanOf(b);
  return a.family === b.family && x.start <= y.end && y.start <= x.end;
}

function fmt(n: IPNet): string {
  return formatCIDR(canonical(n));
}

/**
 * Leases known at start, oldest first: reservations, then by last write (expiration − TTL, when
 * the store looked it up), then by key (the same order on every node).
 */
export function byAge(leases: readonly Lease[]): Lease[] {
  const t = (l: Lease) =>
    l.expiration === null ? -Infinity : l.expiration === undefined ? 0 : l.expiration.getTime();
  return [...leases].sort((a, b) => t(a) - t(b) || (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
}

/** `weft_lease_conflicts_total{reason}`, registered once per registry, every reason at 0. */
export function leaseConflictCounter(reg: PromRegistry): Counter<'reason'> {
  return counterOn(reg, {
    name: 'weft_lease_conflicts_total',
    help: 'Peer leases skipped because they conflict with the network config, our lease or an older peer lease, by reason',
    labelNames: ['reason'],
    known: { reason: CONFLICT_REASONS },
  });
}

export interface PeerCheckHooks {
  readonly log: Logger;
  readonly metrics: PromRegistry;
  /** A peer that was there before us publishes our VtepMAC: we must choose another. */
  readonly onOwnVtepMACTaken?: (peer: Lease) => void;
  /**
   * The startup snapshot's last lease is checked (called before its last part is passed on):
   * every peer present at start has been judged, so a VtepMAC none of them holds is ours.
   */
  readonly onSnapshotChecked?: () => void;
}

function describe(l: Lease): Record<string, unknown> {
  return {
    key: l.key,
    publicIP: l.attrs.publicIP,
    backendType: l.attrs.backendType,
    ...(l.attrs.backendData === undefined ? {} : { backendData: l.attrs.backendData }),
  };
}

/**
 * The checks kept up to date as peer leases come and go, at a cost proportional to what changed:
 * a newcomer is checked against the accepted peers (it is the newest), a removal or an update that
 * cannot change anyone else's verdict is applied in place. Only what may change other leases'
 * verdicts runs `checkPeers` over every lease again: an accepted lease leaving while a lease it
 * blocked waits, or a known lease changing what the checks read (`checkSignature`).
 */
export class PeerChecker {
  readonly #cfg: PeerCheckConfig;
  /** Every peer lease, oldest first (Map order: an update keeps its place). */
  readonly #all = new Map<string, Lease>();
  #state: CheckState;
  #accepted = new Map<string, Lease>();
  #rejected = new Map<string, Rejection>();
  /** Whole re-checks run (tests: the incremental path at work). */
  fullChecks = 0;

  constructor(cfg: PeerCheckConfig) {
    this.#cfg = cfg;
    this.#state = new CheckState(cfg);
  }

  get accepted(): ReadonlyMap<string, Lease> {
    return this.#accepted;
  }

  get rejected(): ReadonlyMap<string, Rejection> {
    return this.#rejected;
  }

  /**
   * Applies one batch; returns the keys whose verdict may have changed, or null when every lease
   * was checked again. `snapshot`: the batch is the full set (oldest-first order by `byAge`).
   */
  apply(batch: readonly LeaseEvent[], snapshot: boolean): Set<string> | null {
    if (snapshot) {
      for (const step of this.snapshot(batch, Infinity)) void step;
      return null;
    }
    const touched = new Set<string>();
    let full = false;
    for (const e of batch) {
      const key = e.lease.key;
      const old = this.#all.get(key);
      if (e.type === 'removed') {
        if (!old) continue;
        this.#all.delete(key);
        if (full) continue;
        touched.add(key);
        if (this.#rejected.delete(key)) continue;
        this.#accepted.delete(key);
        this.#state.forget(old);
        // A lease it blocked may be accepted now (and may then block newer ones): check all.
        for (const r of this.#rejected.values()) {
          if (r.other !== null && r.other.key === key) {
            full = true;
            break;
          }
        }
        continue;
      }
      const lease = e.lease;
      this.#all.set(key, lease);
      if (full) continue;
      touched.add(key);
      if (!old) {
        const r = this.#state.consider(lease);
        if (r) this.#rejected.set(key, r);
        else this.#accepted.set(key, lease);
        continue;
      }
      if (checkSignature(old) !== checkSignature(lease)) {
        full = true;
        continue;
      }
      const r = this.#rejected.get(key);
      if (r) {
        this.#rejected.set(key, { ...r, lease });
      } else {
        this.#state.replace(old, lease);
        this.#accepted.set(key, lease);
      }
    }
    if (!full) return touched;
    this.#full();
    return null;
  }

  /**
   * Takes `batch` as the full set (apply's snapshot) and checks it oldest first, `part` leases
   * at a time: yields the keys of each part once their verdicts are in, `last` on the last one
   * (empty when the set is). A part's verdicts are final when it is yielded: a lease is judged
   * against older leases only. Nothing else may be applied until the generator is done.
   */
  *snapshot(batch: readonly LeaseEvent[], part: number): Generator<SnapshotPartKeys> {
    this.#all.clear();
    const leases: Lease[] = [];
    for (let i = 0; i < batch.length; i++) {
      const e = batch[i]!;
      if (e.type === 'added') leases.push(e.lease);
    }
    for (const l of byAge(leases)) this.#all.set(l.key, l);
    yield* this.#check(part);
  }

  /**
   * After a snapshot that came in parts (each applied as it came, its leases judged as the
   * newest): the verdicts the whole snapshot gets. Only a lease held back by another peer's can
   * be judged otherwise in age order (the other reasons judge a lease alone, against the config
   * and our lease); with none, the verdicts stand and this returns false. Else every lease is
   * checked again, oldest first (true).
   */
  settle(): boolean {
    const own = this.#cfg.own;
    let byPeer = false;
    for (const r of this.#rejected.values()) {
      if (r.other !== null && r.other !== own) {
        byPeer = true;
        break;
      }
    }
    if (!byPeer) return false;
    const leases = byAge([...this.#all.values()]);
    this.#all.clear();
    for (const l of leases) this.#all.set(l.key, l);
    this.#full();
    return true;
  }

  #full(): void {
    for (const step of this.#check(Infinity)) void step;
  }

  /** Checks every lease again, oldest first, yielding the keys of each `part` checked. */
  *#check(part: number): Generator<SnapshotPartKeys> {
    this.fullChecks++;
    this.#state = new CheckState(this.#cfg);
    this.#accepted = new Map();
    this.#rejected = new Map();
    const total = this.#all.size;
    let n = 0;
    let keys: string[] = [];
    for (const lease of this.#all.values()) {
      const r = this.#state.consider(lease);
      if (r) this.#rejected.set(lease.key, r);
      else this.#accepted.set(lease.key, lease);
      keys.push(lease.key);
      const last = ++n === total;
      if (keys.length >= part || last) {
        yield { keys, last };
        keys = [];
      }
    }
    if (total === 0) yield { keys, last: true };
  }
}

/** A part of a snapshot checked by `PeerChecker.snapshot`: its keys, and whether it is the last. */
export interface SnapshotPartKeys {
  readonly keys: readonly string[];
  readonly last: boolean;
}

/**
 * Passes peer lease batches through, keeping back the leases `checkPeers` rejects: downstream
 * sees `added` for a lease that became acceptable (or changed while acceptable) and `removed` for
 * one it had that is gone or now rejected (removals first, so a freed subnet is cleared before
 * its new holder is programmed). The verdicts are kept by a `PeerChecker`: a batch costs what it
 * changes, not the number of peers.
 *
 * With `part` (a backend that takes the snapshot in parts: Backend.snapshotParts), the startup
 * snapshot is checked oldest first and handed on in parts of `part` leases (snapshot-parts.ts),
 * each as soon as its verdicts are in: they are final, since a lease is judged against older
 * leases only, so a kernel backend programs the first peers while the rest are checked. The
 * parts together are the batch a whole check gives, in the same order. Without, it is one batch.
 *
 * The snapshot may also come in parts from upstream (kube-manager's watchLeases, while the node
 * list is read). Each part's leases are then checked as they come, as newcomers, and with `part`
 * their events are passed on as parts at once; the last part (unmarked) ends it, and every lease
 * is checked again oldest first, so the verdicts are a whole snapshot's: a lease a later part's
 * older lease rejects is removed then (its events before that were provisional). Without `part`
 * nothing is passed on before the last part, which carries the whole snapshot.
 */
export async function* checkedPeerEvents(
  batches: AsyncIterable<LeaseEvent[]>,
  cfg: PeerCheckConfig,
  hooks: PeerCheckHooks,
  opts: { readonly checker?: PeerChecker; readonly part?: number } = {},
): AsyncIterable<LeaseEvent[]> {
  const checker = opts.checker ?? new PeerChecker(cfg);
  const part = opts.part ?? Infinity;
  const counter = leaseConflictCounter(hooks.metrics);
  const once = new LogOnce();
  /** What downstream holds. */
  const given = new Map<string, Lease>();
  /** Current rejection reason per key (a conflict is counted when it starts). */
  const skipped = new Map<string, ConflictReason>();
  /** The peers onOwnVtepMACTaken was called for (a snapshot in parts is judged again at its end). */
  const told = new Set<string>();
  /** The events for `keys` whose verdicts may have changed (removals first). */
  const eventsFor = (keys: Iterable<string>, startup: boolean): LeaseEvent[] => {
    const removed: LeaseEvent[] = [];
    const added: LeaseEvent[] = [];
    for (const key of keys) {
      const r = checker.rejected.get(key);
      if (r) {
        if (skipped.get(key) !== r.reason) counter.inc({ reason: r.reason });
        skipped.set(key, r.reason);
        if (once.first(`${key}|${r.reason}|${r.detail}`)) {
          hooks.log.warn(
            {
              reason: r.reason,
              detail: r.detail,
              lease: describe(r.lease),
              ...(r.other ? { conflictsWith: describe(r.other) } : {}),
            },
            'peer lease skipped: conflict',
          );
        }
        if (startup && r.reason === 'vtep_mac' && r.other === cfg.own && !told.has(key)) {
          told.add(key);
          hooks.onOwnVtepMACTaken?.(r.lease);
        }
      } else {
        skipped.delete(key);
      }
      const was = given.get(key);
      const now = checker.accepted.get(key);
      if (was && !now) {
        removed.push({ type: 'removed', lease: was });
        given.delete(key);
      } else if (now && was !== now) {
        added.push({ type: 'added', lease: now });
        given.set(key, now);
      }
    }
    return removed.length === 0 ? added : [...removed, ...added];
  };
  const everyKey = (): Set<string> =>
    new Set([
      ...checker.accepted.keys(),
      ...given.keys(),
      ...checker.rejected.keys(),
      ...skipped.keys(),
    ]);
  let first = true;
  /** The snapshot is coming in parts from upstream, checked as they come (see above). */
  let upstreamParts = false;
  /** Without a part size, the upstream parts so far: checked whole with the last one. */
  let held: LeaseEvent[] = [];
  for await (const upstream of batches) {
    let batch = upstream;
    if (first && continuesSnapshot(batch)) {
      if (part === Infinity) {
        for (const e of batch) held.push(e);
        continue;
      }
      upstreamParts = true;
      const touched = checker.apply(batch, false);
      const events = eventsFor(touched ?? everyKey(), true);
      if (events.length > 0) yield snapshotPart(events);
      continue;
    }
    if (first && held.length > 0) {
      batch = [...held, ...batch];
      held = [];
    }
    if (first && upstreamParts) {
      first = false;
      const touched = checker.apply(batch, false);
      const keys = checker.settle() ? everyKey() : (touched ?? everyKey());
      const events = eventsFor(keys, true);
      hooks.onSnapshotChecked?.();
      yield events;
      continue;
    }
    if (first) {
      first = false;
      // The snapshot, in parts: each but the last marked as continued. (Nothing is given yet,
      // so a part's keys are all that changed; a part all skipped is not passed on, the last
      // always is: the first batch is the snapshot, passed on even when empty.)
      for (const { keys, last } of checker.snapshot(batch, part)) {
        const events = eventsFor(keys, true);
        if (last) {
          hooks.onSnapshotChecked?.();
          yield events;
        } else if (events.length > 0) yield snapshotPart(events);
      }
      continue;
    }
    const touched = checker.apply(batch, false);
    // After a whole re-check every key is looked at: adds in age order, removals in given order.
    const out = eventsFor(touched ?? everyKey(), false);
    if (out.length > 0) yield out;
  }
}
