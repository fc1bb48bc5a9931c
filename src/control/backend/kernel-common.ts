/**
 * Small pieces shared by the kernel backends (host-gw, vxlan): a lease's per-family fields,
 * the families a config enables, the NAT check, and their one reconcile-loop wiring.
 */
import {
  type Counter,
  type Histogram,
  type Registry as PromRegistry,
  TimedEvents,
  counterOn,
  histogramOn,
} from '../../common/metrics.js';
import { WeftError } from '../../common/errors.js';
import {
  type Family,
  type IPNet,
  canonical,
  containsIP,
  formatCIDR,
  formatIP,
  parseCIDR,
} from '../../common/ip.js';
import type { NetConfig } from '../config/net-config.js';
import type { Lease } from '../lease/types.js';
import { type Netlink, type Op, applyAll } from '../netlink/netlink.js';
import type { ExternalInterface } from './backend.js';
import type { Logger } from '../../common/log.js';
import type { LeaseEvent } from '../lease/types.js';
import {
  type Ownership,
  type Planner,
  Reconciler,
  type RecheckTrigger,
  type ReconcilerOptions,
  runPlanned,
} from './reconcile.js';

export function leaseSubnet(lease: Lease, family: Family): IPNet | null {
  return family === 4 ? lease.subnet : lease.ipv6Subnet;
}

/** The lease's public address of `family`, or null (flannel writes 0.0.0.0 for "none"). */
export function leasePublicIP(lease: Lease, family: Family): string | null {
  const v = family === 4 ? lease.attrs.publicIP : lease.attrs.publicIPv6;
  if (!v || v === '0.0.0.0') return null;
  return v;
}

export function subnetCIDR(net: IPNet): string {
  return formatCIDR(net);
}

/** The subnet's network address (the VXLAN gateway address of a peer, e.g. 10.5.34.0). */
export function subnetAddress(net: IPNet): string {
  return formatIP(net.family, net.addr);
}

/**
 * Puts the subnet's network address on a tunnel device as its only address inside the cluster
 * network (/32, /128) and sets the device up (flannel's EnsureV4AddressOnLink): addresses of an
 * earlier subnet are removed after ours is added, since the kernel flushes a device's routes
 * with its last IPv4 address. Returns the address.
 */
export async function ensureTunnelAddress(
  nl: Netlink,
  dev: string,
  subnet: IPNet,
  network: IPNet,
): Promise<string> {
  const addr = `${subnetAddress(subnet)}/${subnet.family === 4 ? 32 : 128}`;
  const ops: Op[] = [{ op: 'replaceAddr', addr, dev }];
  for (const a of await nl.listAddrs(subnet.family, dev)) {
    const net = parseCIDR(a.addr);
    if (a.addr !== addr && net && containsIP(network, net)) {
      ops.push({ op: 'delAddr', addr: a.addr, dev });
    }
  }
  ops.push({ op: 'setLink', dev, up: true });
  await applyAll(nl, ops);
  return addr;
}

/** The external interface's on-link networks of one family (DirectRouting's test). */
export async function onLinkNets(nl: Netlink, dev: string, family: Family): Promise<IPNet[]> {
  return (await nl.listAddrs(family, dev))
    .map((a) => parseCIDR(a.addr))
    .filter((n): n is IPNet => n !== null)
    .map(canonical);
}

export function enabledFamilies(cfg: NetConfig): Family[] {
  const out: Family[] = [];
  if (cfg.enableIPv4 && cfg.ipv4) out.push(4);
  if (cfg.enableIPv6 && cfg.ipv6) out.push(6);
  return out;
}

export function clusterNetwork(cfg: NetConfig, family: Family): IPNet | null {
  return (family === 4 ? cfg.ipv4 : cfg.ipv6)?.network ?? null;
}

/**
 * Refuses a node whose published address is not its interface's own (NAT): peers could not
 * route to it directly. host-gw needs this; flannel refuses the same way.
 */
export function assertNoNAT(
  backend: string,
  ext: ExternalInterface,
  families: readonly Family[],
): void {
  for (const f of families) {
    const pub = f === 4 ? ext.publicIP : ext.publicIPv6;
    const own = f === 4 ? ext.ifaceAddr : ext.ifaceAddrV6;
    if (pub !== null && own !== null && pub !== own) {
      throw new WeftError(
        'WEFT_ERR_BACKEND',
        `${backend}: the public IP ${pub} is not the address of ${ext.name} (${own}); ` +
          `${backend} cannot work behind NAT (use vxlan, or drop --public-ip)`,
        { details: { publicIP: pub, ifaceAddr: own, iface: ext.name } },
      );
    }
  }
}

export interface KernelMetrics {
  /** Kernel ops applied by the reconcile loop. */
  readonly ops: Counter;
  /** Kernel ops that failed (the peer is rolled back and retried). */
  readonly failures: Counter;
  /** Peer leases skipped because their backend data is unusable. */
  readonly skipped: Counter;
  /** Entries restored or removed by the re-check. */
  readonly repairs: Counter;
  /** Re-checks of the kernel state, by what started them. */
  readonly rechecks: Counter<'trigger'>;
  /** How long each batch of kernel ops took to apply (one rtnetlink batch of a flush). */
  readonly applyDuration: Histogram;
  /** How long each re-check of the kernel state took, by what started it. */
  readonly recheckDuration: Histogram<'trigger'>;
  /** Lease event received → the peer programmed, by where (kernel entries, engine table). */
  readonly programmed: Histogram<'target'>;
}

/** What started a re-check (reconcile.ts RecheckTrigger), as label values. */
export const RECHECK_TRIGGERS: readonly RecheckTrigger[] = ['change', 'overflow', 'periodic'];
/** Where a peer is programmed: the kernel backends' entries, or the userspace engines' table. */
export const PROGRAM_TARGETS = ['kernel', 'engine'] as const;

/** The backends' metrics (kernel and userspace alike), registered once per registry. */
export function kernelMetrics(reg: PromRegistry): KernelMetrics {
  const counter = (name: string, help: string): Counter => counterOn(reg, { name, help });
  return {
    ops: counter(
      'weft_backend_kernel_ops_total',
      'Kernel (rtnetlink) operations applied by the backend',
    ),
    failures: counter('weft_backend_kernel_op_failures_total', 'Kernel operations that failed'),
    skipped: counter(
      'weft_backend_peer_leases_skipped_total',
      'Peer leases skipped for unusable backend data',
    ),
    repairs: counter(
      'weft_backend_kernel_repairs_total',
      'Kernel entries restored or removed by the re-check',
    ),
    rechecks: counterOn(reg, {
      name: 'weft_backend_kernel_rechecks_total',
      help: 'Re-checks of the kernel state, by trigger: change (rtnetlink reported a change to weft entries or devices that weft did not make), overflow (notifications lost, or the watch failed), periodic (the safety net: every 5 min, or every 10 s while only a re-check can fix something)',
      labelNames: ['trigger'],
      known: { trigger: RECHECK_TRIGGERS },
    }),
    applyDuration: histogramOn(reg, {
      name: 'weft_backend_kernel_apply_duration_seconds',
      help: 'How long each batch of kernel operations took to apply (a flush of the pending peers: one rtnetlink batch)',
    }),
    recheckDuration: histogramOn(reg, {
      name: 'weft_backend_kernel_recheck_duration_seconds',
      help: 'How long each re-check of the kernel state took (dumps, comparison and repairs), by trigger',
      labelNames: ['trigger'],
      known: { trigger: RECHECK_TRIGGERS },
    }),
    programmed: histogramOn(reg, {
      name: 'weft_backend_peer_programmed_seconds',
      help: "From a peer lease event reaching the backend to the peer programmed, by target: kernel (its routes, neighbours and FDB entries applied) or engine (the userspace or bpf engine's peer table handed over)",
      labelNames: ['target'],
      known: { target: PROGRAM_TARGETS },
    }),
  };
}

/** `programmed`'s series for `target`, recorded a slice per event-loop turn (TimedEvents). */
export function timedProgramming(
  m: KernelMetrics,
  target: (typeof PROGRAM_TARGETS)[number],
): TimedEvents {
  const series = m.programmed.labels({ target });
  return new TimedEvents((seconds) => series.observe(seconds));
}

/** The reconcile-loop hooks that feed the kernel backends' counters. */
export function reconcilerMetricHooks(
  m: KernelMetrics,
): Pick<ReconcilerOptions, 'onApplied' | 'onRepaired' | 'onRecheck'> {
  return {
    onApplied: (r) => {
      m.ops.inc(r.ops);
      m.failures.inc(r.failed);
      m.applyDuration.observe(r.seconds);
    },
    onRepaired: (n) => m.repairs.inc(n),
    onRecheck: (trigger, seconds) => {
      m.rechecks.inc({ trigger });
      m.recheckDuration.observe({ trigger }, seconds);
    },
  };
}

/**
 * The run() of every kernel backend, wired once: a Reconciler over the backend's Netlink and
 * ownership scopes, fed by its pure plan (runPlanned), counted in the kernel backends' metrics.
 */
export function runKernelPlan(
  events: AsyncIterable<LeaseEvent[]>,
  signal: AbortSignal,
  o: {
    readonly netlink: Netlink;
    readonly log: Logger;
    readonly ownership: readonly Ownership[];
    readonly metrics: KernelMetrics;
    readonly families: readonly Family[];
    readonly plan: Planner;
    readonly resyncMs?: number | undefined;
    readonly ensureBase?: ReconcilerOptions['ensureBase'];
  },
): Promise<void> {
  const reconciler = new Reconciler({
    netlink: o.netlink,
    log: o.log,
    ownership: o.ownership,
    ...(o.resyncMs === undefined ? {} : { resyncMs: o.resyncMs }),
    ...(o.ensureBase === undefined ? {} : { ensureBase: o.ensureBase }),
    ...reconcilerMetricHooks(o.metrics),
  });
  const timed = timedProgramming(o.metrics, 'kernel');
  return runPlanned(events, signal, {
    reconciler,
    families: o.families,
    plan: o.plan,
    onProgrammed: (received) => timed.took(received),
  });
}
