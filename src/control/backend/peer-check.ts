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
import { Counter, type Registry as PromRegistry } from 'prom-client';
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
  const start = net.addr & maskOf(net.family, net.prefix);
  return { start, end: start + (1n << BigInt(bits(net.family) - net.prefix)) - 1n };
}

/** Accepted subnets of one family, sorted and disjoint (so one binary search finds a clash). */
class Spans {
  readonly #spans: Span[] = [];

  /** The accepted lease `net` overlaps, or null. */
  clash(net: IPNet): Lease | null {
    const { start, end } = spanOf(net);
    const s = this.#spans;
    let lo = 0;
    let hi = s.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (s[mid]!.start <= start) lo = mid + 1;
      else hi = mid;
    }
    // s[lo-1] starts at or before us; s[lo] starts after us.
    if (lo > 0 && s[lo - 1]!.end >= start) return s[lo - 1]!.lease;
    if (lo < s.length && s[lo]!.start <= end) return s[lo]!.lease;
    return null;
  }

  add(net: IPNet, lease: Lease): void {
    const span = { ...spanOf(net), lease };
    const s = this.#spans;
    let lo = 0;
    let hi = s.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (s[mid]!.start < span.start) lo = mid + 1;
      else hi = mid;
    }
    s.splice(lo, 0, span);
  }
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
 * Pure: which of `leases` (oldest first; ours excluded) may be programmed, and why the others
 * may not. The first rule a lease breaks names its rejection.
 */
export function checkPeers(leases: Iterable<Lease>, cfg: PeerCheckConfig): PeerCheck {
  const families = enabledFamilies(cfg.netConfig);
  const spans = new Map<Family, Spans>(families.map((f) => [f, new Spans()]));
  const ownMacs = new Set(cfg.vni === null ? [] : leaseVtepMACs(cfg.own));
  const macOwner = new Map<string, Lease>();
  const accepted: Lease[] = [];
  const rejected: Rejection[] = [];
  for (const lease of leases) {
    const reject = (reason: ConflictReason, detail: string, other: Lease | null = null) =>
      rejected.push({ lease, reason, detail, other });
    const nets = families.flatMap((f) => {
      const n = leaseSubnet(lease, f);
      return n ? [{ f, n }] : [];
    });
    const outside = nets.find(({ f, n }) => !containsNet(clusterNetwork(cfg.netConfig, f)!, n));
    if (outside) {
      reject('outside_network', `subnet ${fmt(outside.n)} is outside the cluster network`);
      continue;
    }
    const ownClash = nets.find(({ f, n }) => {
      const own = leaseSubnet(cfg.own, f);
      return own !== null && overlapsSpan(own, n);
    });
    if (ownClash) {
      reject('overlaps_own', `subnet ${fmt(ownClash.n)} overlaps ours`, cfg.own);
      continue;
    }
    const vxlanPeer = cfg.vni !== null && lease.attrs.backendType === 'vxlan';
    if (vxlanPeer) {
      const problem = nets
        .map(({ f }) => vxlanDataProblem(lease, f, cfg.vni!))
        .find((p) => p !== null);
      if (problem) {
        reject('backend_data', problem);
        continue;
      }
    }
    const macs = vxlanPeer ? leaseVtepMACs(lease) : [];
    const ours = macs.find((m) => ownMacs.has(m));
    if (ours) {
      reject('vtep_mac', `VtepMAC ${ours} is ours`, cfg.own);
      continue;
    }
    const taken = macs.find((m) => macOwner.has(m));
    if (taken) {
      reject('vtep_mac', `VtepMAC ${taken} is an older peer's`, macOwner.get(taken)!);
      continue;
    }
    const peerClash = nets
      .map(({ f, n }) => ({ n, other: spans.get(f)!.clash(n) }))
      .find((c) => c.other !== null);
    if (peerClash) {
      reject(
        'overlaps_peer',
        `subnet ${fmt(peerClash.n)} overlaps an older peer's`,
        peerClash.other,
      );
      continue;
    }
    for (const { f, n } of nets) spans.get(f)!.add(n, lease);
    for (const m of macs) macOwner.set(m, lease);
    accepted.push(lease);
  }
  return { accepted, rejected };
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
  const name = 'weft_lease_conflicts_total';
  const existing = reg.getSingleMetric(name) as Counter<'reason'> | undefined;
  if (existing) return existing;
  const c = new Counter({
    name,
    help: 'Peer leases skipped because they conflict with the network config, our lease or an older peer lease, by reason',
    labelNames: ['reason'] as const,
    registers: [reg],
  });
  for (const r of CONFLICT_REASONS) c.inc({ reason: r }, 0);
  return c;
}

export interface PeerCheckHooks {
  readonly log: Logger;
  readonly metrics: PromRegistry;
  /** A peer that was there before us publishes our VtepMAC: we must choose another. */
  readonly onOwnVtepMACTaken?: (peer: Lease) => void;
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
 * Passes peer lease batches through, keeping back the leases `checkPeers` rejects: downstream
 * sees `added` for a lease that became acceptable (or changed while acceptable) and `removed` for
 * one it had that is gone or now rejected (removals first, so a freed subnet is cleared before
 * its new holder is programmed).
 */
export async function* checkedPeerEvents(
  batches: AsyncIterable<LeaseEvent[]>,
  cfg: PeerCheckConfig,
  hooks: PeerCheckHooks,
): AsyncIterable<LeaseEvent[]> {
  const counter = leaseConflictCounter(hooks.metrics);
  const once = new LogOnce();
  /** Every peer lease, oldest first (Map order: an update keeps its place). */
  const all = new Map<string, Lease>();
  /** What downstream holds. */
  let given = new Map<string, Lease>();
  /** Current rejection reason per key (a conflict is counted when it starts). */
  let skipped = new Map<string, ConflictReason>();
  let first = true;
  for await (const batch of batches) {
    const startup = first;
    if (first) {
      for (const l of byAge(batch.filter((e) => e.type === 'added').map((e) => e.lease)))
        all.set(l.key, l);
      first = false;
    } else {
      for (const e of batch) {
        if (e.type === 'added') all.set(e.lease.key, e.lease);
        else all.delete(e.lease.key);
      }
    }
    const result = checkPeers(all.values(), cfg);
    const nextSkipped = new Map<string, ConflictReason>();
    for (const r of result.rejected) {
      nextSkipped.set(r.lease.key, r.reason);
      if (skipped.get(r.lease.key) !== r.reason) counter.inc({ reason: r.reason });
      if (once.first(`${r.lease.key}|${r.reason}|${r.detail}`)) {
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
      if (startup && r.reason === 'vtep_mac' && r.other === cfg.own) {
        hooks.onOwnVtepMACTaken?.(r.lease);
      }
    }
    skipped = nextSkipped;
    const next = new Map(result.accepted.map((l) => [l.key, l]));
    const out: LeaseEvent[] = [];
    for (const [key, lease] of given) {
      if (!next.has(key)) out.push({ type: 'removed', lease });
    }
    for (const [key, lease] of next) {
      if (given.get(key) !== lease) out.push({ type: 'added', lease });
    }
    given = next;
    // The first batch is the snapshot: it is passed on even when empty (backends resync on it).
    if (out.length > 0 || startup) yield out;
  }
}
