/**
 * host-gw: one route per peer, `<peer subnet> via <peer PublicIP> dev <ext iface>`. Every node
 * must share the L2 segment, and none may sit behind NAT (checked at prepare). MTU = interface
 * MTU. Only peers whose BackendType is host-gw are programmed.
 */
import type { Family } from '../../common/ip.js';
import { logger } from '../../common/log.js';
import type { Lease, LeaseEvent } from '../lease/types.js';
import { openNetlink } from '../netlink/open-netlink.js';
import type { Netlink, Op } from '../netlink/netlink.js';
import type { Backend, BackendContext, BackendSpec } from './backend.js';
import {
  assertNoNAT,
  clusterNetwork,
  enabledFamilies,
  kernelMetrics,
  leasePublicIP,
  runKernelPlan,
  leaseSubnet,
  subnetCIDR,
} from './kernel-common.js';
import type { Ownership } from './reconcile.js';

export const HOST_GW = 'host-gw';

export interface HostGwPlanContext {
  /** The external interface's name. */
  readonly extDev: string;
}

/** Pure: the route a peer lease needs (added) or no longer needs (removed). */
export function planHostGw(event: LeaseEvent, family: Family, ctx: HostGwPlanContext): Op[] {
  const lease = event.lease;
  if (lease.attrs.backendType !== HOST_GW) return [];
  const subnet = leaseSubnet(lease, family);
  const gw = leasePublicIP(lease, family);
  if (!subnet || !gw) return [];
  const route = { dst: subnetCIDR(subnet), gw, dev: ctx.extDev };
  return [event.type === 'added' ? { op: 'replaceRoute', ...route } : { op: 'delRoute', ...route }];
}

export interface KernelBackendDeps {
  /** Opens the Netlink the backend uses (default: openNetlink(), in the current namespace). */
  readonly openNetlink?: () => Netlink;
  readonly resyncMs?: number;
}

export function createHostGwBackend(ctx: BackendContext, deps: KernelBackendDeps = {}): Backend {
  const log = ctx.log ?? logger('host-gw');
  const families = enabledFamilies(ctx.netConfig);
  const metrics = kernelMetrics(ctx.metrics);
  let nl: Netlink | undefined;
  return {
    type: HOST_GW,
    async prepare() {
      assertNoNAT(HOST_GW, ctx.extIface, families);
      nl = (deps.openNetlink ?? openNetlink)();
      return { attrs: { backendType: HOST_GW }, mtu: ctx.extIface.mtu };
    },
    async start(_lease: Lease) {},
    snapshotParts: true, // (runKernelPlan)
    async run(events, signal) {
      if (!nl) throw new Error('host-gw: run before prepare');
      const ownership: Ownership[] = families.map((family) => ({
        family,
        routes: [
          {
            dev: ctx.extIface.name,
            within: clusterNetwork(ctx.netConfig, family)!,
            viaGateway: true,
          },
        ],
      }));
      await runKernelPlan(events, signal, {
        netlink: nl,
        log,
        ownership,
        metrics,
        resyncMs: deps.resyncMs,
        families,
        plan: (ev, family) => planHostGw(ev, family, { extDev: ctx.extIface.name }),
      });
    },
    async close() {
      nl?.close();
      nl = undefined;
    },
  };
}

/** host-gw's one registration (registry.ts): no options. */
export const HOST_GW_SPEC: BackendSpec = {
  type: HOST_GW,
  create: (ctx) => createHostGwBackend(ctx),
  options: [],
};
