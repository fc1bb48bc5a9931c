/**
 * ipip with the kernel dataplane, as flannel's ipip backend (IPv4 only):
 *
 *   device   flannel.ipip, kind ipip, local = the interface address, no remote (and, as
 *            flannel's netlink library writes them, ttl inherit, tos 0, nopmtudisc);
 *            MTU = interface MTU − 20; address = own subnet's network address /32
 *            An existing flannel.ipip that is not an ipip device is refused (it is not ours to
 *            delete); one whose local differs or that has a remote is deleted and recreated.
 *   per peer (BackendType ipip):
 *            route <peer subnet> via <peer PublicIP> dev flannel.ipip onlink
 *            DirectRouting: a peer on our L2 segment gets the same route on the external
 *            interface instead (`dev <ext iface> onlink`, flannel keeps the onlink flag)
 *   lease    BackendType "ipip", no BackendData
 *
 * Not a separate tunl0: the kernel creates tunl0 (local any, remote any) with the module and
 * hands it packets no better device matches; a device with our local address matches first.
 *
 * Backend option `Dataplane` (weft's, as vxlan's): "kernel" (this file, the default),
 * "userspace" (the `ipip-userspace` factory the registry passes in `deps.userspace`: a TUN
 * flannel.ipip and the native engine on raw IPPROTO_IPIP sockets, same wire format), "auto"
 * (kernel, or userspace when the kernel has no ipip module).
 */
import { WeftError, configError, isWeftError } from '../../common/errors.js';
import { type IPNet, containsIP, parseIP } from '../../common/ip.js';
import { jsonField } from '../../common/json-field.js';
import { type Logger, logger } from '../../common/log.js';
import type { Lease, LeaseEvent } from '../lease/types.js';
import { type LinkInfo, type Netlink, type Op, applyAll } from '../netlink/netlink.js';
import { openNetlink } from '../netlink/open-netlink.js';
import type { Backend, BackendContext, BackendFactory, BackendSpec } from './backend.js';
import { kernelOrUserspace } from './kernel-fallback.js';
import type { KernelBackendDeps } from './host-gw.js';
import {
  clusterNetwork,
  ensureTunnelAddress,
  kernelMetrics,
  leasePublicIP,
  leaseSubnet,
  onLinkNets,
  runKernelPlan,
  subnetCIDR,
} from './kernel-common.js';

export const IPIP = 'ipip';
/** The name the userspace IPIP dataplane registers under. */
export const IPIP_USERSPACE = 'ipip-userspace';
export const IPIP_DEV = 'flannel.ipip';
/** The outer IPv4 header. */
export const IPIP_OVERHEAD = 20;

/** The Backend options ipip (either dataplane) reads besides `Type`. */
export const IPIP_OPTIONS = ['DirectRouting', 'Dataplane'] as const;

export interface IpipConfig {
  readonly directRouting: boolean;
  readonly dataplane: 'kernel' | 'userspace' | 'auto';
}

/** Parses the ipip Backend block (names matched case-insensitively, as Go's JSON does). */
export function parseIpipConfig(raw: Readonly<Record<string, unknown>>): IpipConfig {
  const dr = jsonField(raw, 'DirectRouting') ?? false;
  if (typeof dr !== 'boolean') throw configError('Backend.DirectRouting', 'must be true or false');
  const dp = jsonField(raw, 'Dataplane') ?? 'kernel';
  if (dp !== 'kernel' && dp !== 'userspace' && dp !== 'auto') {
    throw configError('Backend.Dataplane', 'must be "kernel", "userspace" or "auto"');
  }
  return { directRouting: dr, dataplane: dp };
}

/**
 * What both dataplanes need before anything is created: an IPv4-only network (as flannel) and
 * an IPv4 address on the external interface. Returns the interface's IPv4 address.
 */
export function checkIpipNode(ctx: BackendContext): string {
  const network = clusterNetwork(ctx.netConfig, 4);
  if (!ctx.netConfig.enableIPv4 || !network || ctx.netConfig.enableIPv6) {
    throw new WeftError(
      'WEFT_ERR_BACKEND_UNSUPPORTED',
      'Backend.Type: "ipip" is IPv4 only, as flannel (set EnableIPv4 and not EnableIPv6)',
    );
  }
  const ext = ctx.extIface;
  if (!ext.ifaceAddr) {
    throw new WeftError('WEFT_ERR_IFACE', `ipip: ${ext.name} has no IPv4 address`);
  }
  if (ext.mtu - IPIP_OVERHEAD <= 0) {
    throw new WeftError(
      'WEFT_ERR_BACKEND',
      `ipip: MTU ${ext.mtu} of ${ext.name} is too small for ipip`,
    );
  }
  return ext.ifaceAddr;
}

export interface IpipPlanContext {
  readonly dev: string;
  readonly extDev: string;
  readonly directRouting: boolean;
  /** The external interface's on-link IPv4 networks (DirectRouting). */
  readonly extNets: readonly IPNet[];
}

/** Pure: the route one peer lease event needs (IPv4 only). */
export function planIpip(event: LeaseEvent, ctx: IpipPlanContext): Op[] {
  const lease = event.lease;
  if (lease.attrs.backendType !== IPIP) return [];
  const subnet = leaseSubnet(lease, 4);
  const gw = leasePublicIP(lease, 4);
  if (!subnet || !gw) return [];
  const pub = ctx.directRouting ? parseIP(gw) : null;
  const direct = pub !== null && ctx.extNets.some((n) => containsIP(n, pub));
  const route = { dst: subnetCIDR(subnet), gw, dev: direct ? ctx.extDev : ctx.dev, onlink: true };
  return [event.type === 'added' ? { op: 'replaceRoute', ...route } : { op: 'delRoute', ...route }];
}

/** Whether an existing link is the ipip device we would create (local ours, no remote). */
export function isOurIpipDevice(l: LinkInfo, local: string): boolean {
  return l.kind === IPIP && !!l.ipip && l.ipip.local === local && l.ipip.remote === null;
}

function noKernelIpip(err: unknown): boolean {
  if (!isWeftError(err, 'WEFT_ERR_NETLINK')) return false;
  const errno = err.details.errno;
  return errno === 'EOPNOTSUPP' || errno === 'EPROTONOSUPPORT' || errno === 'EINVAL';
}

/** Creates (or checks, or recreates) flannel.ipip and sets its MTU; flannel's configureIPIPDevice. */
export async function ensureIpipDevice(
  nl: Netlink,
  w: { readonly local: string; readonly mtu: number },
  log: Logger,
): Promise<void> {
  const existing = await nl.getLink(IPIP_DEV);
  const add: Op = { op: 'addIpip', name: IPIP_DEV, local: w.local, mtu: w.mtu };
  try {
    if (!existing) {
      await applyAll(nl, [add]);
    } else if (existing.kind !== IPIP) {
      throw new WeftError(
        'WEFT_ERR_BACKEND',
        `ipip: ${IPIP_DEV} exists but is a ${existing.kind || 'plain'} device, not ipip; ` +
          'remove it and start again',
      );
    } else if (!isOurIpipDevice(existing, w.local)) {
      log.warn(
        {
          dev: IPIP_DEV,
          local: existing.ipip?.local ?? null,
          remote: existing.ipip?.remote ?? null,
        },
        'ipip device has other tunnel addresses; recreating it',
      );
      await applyAll(nl, [{ op: 'delLink', dev: IPIP_DEV }, add]);
    }
  } catch (err) {
    if (noKernelIpip(err)) {
      throw new WeftError(
        'WEFT_ERR_BACKEND_UNSUPPORTED',
        `Backend.Type: "ipip" needs the kernel's ipip module, which this kernel does not have ` +
          `(${(err as Error).message}); "Dataplane": "userspace" (or "auto") runs without it`,
        { cause: err, details: { missing: 'ipip module' } },
      );
    }
    throw err;
  }
  await applyAll(nl, [{ op: 'setLink', dev: IPIP_DEV, mtu: w.mtu }]);
}

export interface IpipDeps extends KernelBackendDeps {
  /** The userspace implementation (the registry passes its `ipip-userspace` entry). */
  readonly userspace?: BackendFactory | null;
}

/**
 * The ipip backend factory (registered as `ipip`). With Dataplane "userspace" it hands over to
 * the `ipip-userspace` factory; with "auto" it tries the kernel device first and hands over
 * when the kernel has no ipip module (kernel-fallback.ts).
 */
export function createIpipBackend(ctx: BackendContext, deps: IpipDeps = {}): Backend {
  const cfg = parseIpipConfig(ctx.netConfig.backend.raw);
  return kernelOrUserspace(ctx, {
    type: IPIP,
    userspaceType: IPIP_USERSPACE,
    dataplane: cfg.dataplane,
    kernel: () => createKernelIpip(ctx, cfg, deps),
    userspace: deps.userspace ?? null,
  });
}

/** ipip's one registration (registry.ts). */
export const IPIP_SPEC: BackendSpec = {
  type: IPIP,
  create: (ctx, _handover, userspace) => createIpipBackend(ctx, { userspace }),
  parseConfig: parseIpipConfig,
  options: IPIP_OPTIONS,
  fallback: IPIP_USERSPACE,
};

function createKernelIpip(ctx: BackendContext, cfg: IpipConfig, deps: KernelBackendDeps): Backend {
  const log = ctx.log ?? logger(IPIP);
  const metrics = kernelMetrics(ctx.metrics);
  const ext = ctx.extIface;
  let nl: Netlink | undefined;
  return {
    type: IPIP,
    async prepare() {
      const local = checkIpipNode(ctx);
      const mtu = ext.mtu - IPIP_OVERHEAD;
      nl = (deps.openNetlink ?? openNetlink)();
      try {
        await ensureIpipDevice(nl, { local, mtu }, log);
      } catch (err) {
        nl.close();
        nl = undefined;
        throw err;
      }
      log.info({ dev: IPIP_DEV, local, mtu }, 'ipip device ready');
      return { attrs: { backendType: IPIP }, mtu };
    },
    async start(lease: Lease) {
      if (!nl) throw new Error('ipip: start before prepare');
      const subnet = leaseSubnet(lease, 4);
      if (!subnet) return;
      const addr = await ensureTunnelAddress(
        nl,
        IPIP_DEV,
        subnet,
        clusterNetwork(ctx.netConfig, 4)!,
      );
      log.info({ dev: IPIP_DEV, addr }, 'ipip device up');
    },
    snapshotParts: true, // (runKernelPlan)
    async run(events, signal) {
      if (!nl) throw new Error('ipip: run before prepare');
      const network = clusterNetwork(ctx.netConfig, 4)!;
      const extNets = cfg.directRouting ? await onLinkNets(nl, ext.name, 4) : [];
      await runKernelPlan(events, signal, {
        netlink: nl,
        log,
        metrics,
        families: [4],
        resyncMs: deps.resyncMs,
        ownership: [
          {
            family: 4,
            routes: [
              { dev: IPIP_DEV, within: network },
              ...(cfg.directRouting ? [{ dev: ext.name, within: network, viaGateway: true }] : []),
            ],
          },
        ],
        plan: (ev) =>
          planIpip(ev, {
            dev: IPIP_DEV,
            extDev: ext.name,
            directRouting: cfg.directRouting,
            extNets,
          }),
      });
    },
    async close() {
      nl?.close();
      nl = undefined;
    },
  };
}
