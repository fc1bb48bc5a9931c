/**
 * vxlan with the kernel dataplane, as flannel (DESIGN §5):
 *
 *   device   flannel.<VNI> (IPv6: flannel-v6.<VNI>), vxlan id VNI dstport Port [no]learning
 *            [gbp] local <send addr> dev <ext iface> (the public IP where it is a local address,
 *            as flannel HEAD; else the interface's: send-address.ts); MTU = Backend `MTU` − 50
 *            for both families, as flannel (FLANNEL_MTU too); without `MTU`, iface MTU − 50
 *            (IPv6 − 70),
 *            address = own subnet's network address /32 (/128), MAC random locally-administered
 *            and kept across restarts (read back from the device, else from the MAC file)
 *   per peer (BackendType vxlan), in this order:
 *            neigh <peer subnet addr> lladdr <peer VtepMAC> PERMANENT
 *            fdb   <peer VtepMAC> dst <peer PublicIP> self permanent
 *            route <peer subnet> via <peer subnet addr> dev flannel.<VNI> onlink
 *            removal deletes all three (reverse order); DirectRouting: a peer on our L2 segment
 *            gets `<peer subnet> via <peer PublicIP> dev <ext iface>` instead
 *   lease    BackendType "vxlan", BackendData {"VNI":1,"VtepMAC":"…"} (BackendV6Data for IPv6)
 *
 * Backend option `Dataplane`: "kernel" (this file), "userspace" (delegated to the factory the
 * registry passes in `deps.userspace`, its `vxlan-userspace` entry), "auto" (kernel, or userspace when the kernel has no vxlan).
 * `Learning` and `GBP` are kernel-device flags (as flannel sets them); the userspace dataplane
 * (native and bpf engines) can do neither and refuses them (assertUserspaceCan).
 */
import { WeftError, configError, errorMessage, isWeftError } from '../../common/errors.js';
import { type Family, type IPNet, containsIP, parseIP } from '../../common/ip.js';
import { jsonField } from '../../common/json-field.js';
import { LogOnce, logger } from '../../common/log.js';
import { egressTapName, removeBpfPins } from '../../dataplane/index.js';
import type { Lease, LeaseEvent } from '../lease/types.js';
import { openNetlink } from '../netlink/open-netlink.js';
import { type LinkInfo, type Netlink, type Op, applyAll } from '../netlink/netlink.js';
import type {
  Backend,
  BackendContext,
  BackendFactory,
  BackendSpec,
  PreparedBackend,
} from './backend.js';
import { kernelOrUserspace } from './kernel-fallback.js';
import type { KernelBackendDeps } from './host-gw.js';
import {
  clusterNetwork,
  enabledFamilies,
  ensureTunnelAddress,
  kernelMetrics,
  leasePublicIP,
  runKernelPlan,
  leaseSubnet,
  onLinkNets,
  subnetAddress,
} from './kernel-common.js';
import type { Ownership } from './reconcile.js';
import { chooseVtepMAC, peerVtepMAC, usableVtepMAC } from './vtep-mac.js';
import { sendAddress } from './send-address.js';

export const VXLAN = 'vxlan';
/** The name the userspace VXLAN dataplane registers under (registerBackend). */
export const VXLAN_USERSPACE = 'vxlan-userspace';
export const DEFAULT_VNI = 1;
export const DEFAULT_VXLAN_PORT = 8472;
/** Outer IPv4 (20) + UDP (8) + VXLAN (8) + inner Ethernet (14). */
export const VXLAN_OVERHEAD_V4 = 50;
export const VXLAN_OVERHEAD_V6 = 70;
/**
 * The smallest Backend `MTU`: its device MTU (MTU − 50) must hold IPv4's minimum datagram (68).
 * With IPv6 enabled the device must hold IPv6's minimum link MTU (1280): MTU ≥ 1330.
 */
export const MIN_VXLAN_MTU = 68 + VXLAN_OVERHEAD_V4;
export const MIN_VXLAN_MTU_V6 = 1280 + VXLAN_OVERHEAD_V4;

export type Dataplane = 'kernel' | 'userspace' | 'auto';

export interface VxlanConfig {
  readonly vni: number;
  readonly port: number;
  readonly directRouting: boolean;
  readonly dataplane: Dataplane;
  /** Backend `MTU` (the underlay's, before the 50 bytes of encapsulation); null: the interface's. */
  readonly mtu: number | null;
  /** Backend `Learning`: the kernel device learns remote MACs from what it receives. */
  readonly learning: boolean;
  /** Backend `GBP`: VXLAN group-based policy extension on the kernel device. */
  readonly gbp: boolean;
}

/** Parses the vxlan Backend block (names matched case-insensitively, as Go's JSON does). */
export function parseVxlanConfig(raw: Readonly<Record<string, unknown>>): VxlanConfig {
  const int = (name: string, def: number, min: number, max: number): number => {
    const v = jsonField(raw, name);
    if (v === undefined || v === null) return def;
    if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > max) {
      throw configError(`Backend.${name}`, `must be an integer in ${min}..${max}`);
    }
    return v;
  };
  const vni = int('VNI', DEFAULT_VNI, 0, 0xffffff);
  const port = int('Port', 0, 0, 65535) || DEFAULT_VXLAN_PORT;
  // 0 is Go's zero value (flannel would make a device of MTU −50): the interface MTU, as unset.
  const mtu = int('MTU', 0, 0, 65535);
  if (mtu !== 0 && mtu < MIN_VXLAN_MTU) {
    throw configError(
      'Backend.MTU',
      `must be 0 (the interface MTU) or at least ${MIN_VXLAN_MTU} (the device gets MTU − ${VXLAN_OVERHEAD_V4})`,
    );
  }
  const flag = (name: string): boolean => {
    const v = jsonField(raw, name) ?? false;
    if (typeof v !== 'boolean') throw configError(`Backend.${name}`, 'must be true or false');
    return v;
  };
  const dr = flag('DirectRouting');
  const learning = flag('Learning');
  const gbp = flag('GBP');
  const dp = jsonField(raw, 'Dataplane') ?? 'kernel';
  if (dp !== 'kernel' && dp !== 'userspace' && dp !== 'auto') {
    throw configError('Backend.Dataplane', 'must be "kernel", "userspace" or "auto"');
  }
  const cfg: VxlanConfig = {
    vni,
    port,
    directRouting: dr,
    dataplane: dp,
    mtu: mtu === 0 ? null : mtu,
    learning,
    gbp,
  };
  if (dp === 'userspace') assertUserspaceCan(cfg);
  return cfg;
}

/**
 * The options only a kernel vxlan device has: the userspace dataplane (native and bpf engines)
 * refuses them rather than run without them. `Learning`: it learns no MAC from what it receives
 * (its peers are the leases); `GBP`: it neither writes nor checks the group-policy header.
 */
export function assertUserspaceCan(cfg: VxlanConfig): void {
  const why = cfg.gbp
    ? 'Backend.GBP: the userspace vxlan dataplane (native and bpf engines) cannot write or check VXLAN group-based-policy headers'
    : cfg.learning
      ? 'Backend.Learning: the userspace vxlan dataplane (native and bpf engines) does not learn remote MACs; its peers come from the leases'
      : null;
  if (why) {
    throw new WeftError(
      'WEFT_ERR_BACKEND_UNSUPPORTED',
      `${why}; use "Dataplane": "kernel" (the vxlan kernel module) or drop the option`,
      { details: { field: cfg.gbp ? 'Backend.GBP' : 'Backend.Learning' } },
    );
  }
}

/**
 * The vxlan device's (or TUN's) MTU for one family: Backend `MTU` − 50 for both families when
 * set (flannel's rule), else the interface MTU − 50 (IPv6 underlay − 70). With IPv6 enabled a
 * Backend `MTU` below 1330 is refused (the device could not carry IPv6).
 */
export function vxlanDeviceMTU(
  cfg: Pick<VxlanConfig, 'mtu'>,
  ifaceMTU: number,
  family: Family,
): number {
  if (cfg.mtu !== null) {
    if (family === 6 && cfg.mtu < MIN_VXLAN_MTU_V6) {
      throw configError(
        'Backend.MTU',
        `must be at least ${MIN_VXLAN_MTU_V6} with EnableIPv6 (the device's MTU − ${VXLAN_OVERHEAD_V4} must hold IPv6's 1280)`,
      );
    }
    return cfg.mtu - VXLAN_OVERHEAD_V4;
  }
  return ifaceMTU - (family === 4 ? VXLAN_OVERHEAD_V4 : VXLAN_OVERHEAD_V6);
}

export function vxlanDeviceName(family: Family, vni: number): string {
  return family === 4 ? `flannel.${vni}` : `flannel-v6.${vni}`;
}

export interface VxlanPlanContext {
  /** flannel.<VNI> (or flannel-v6.<VNI>) for this family. */
  readonly dev: string;
  readonly extDev: string;
  readonly directRouting: boolean;
  /** The on-link networks of the external interface (for DirectRouting), this family. */
  readonly extNets: readonly IPNet[];
  /** Told why a lease was skipped (the caller logs once and counts). */
  readonly onSkip?: (lease: Lease, reason: string) => void;
}

/** Pure: the ops one peer lease event needs for one family. */
export function planVxlan(event: LeaseEvent, family: Family, ctx: VxlanPlanContext): Op[] {
  const lease = event.lease;
  if (lease.attrs.backendType !== VXLAN) return [];
  const subnet = leaseSubnet(lease, family);
  const publicIP = leasePublicIP(lease, family);
  if (!subnet || !publicIP) return [];
  const gw = subnetAddress(subnet);
  const dst = `${gw}/${subnet.prefix}`;
  // parseIP is the costly part of a plan: only DirectRouting needs it.
  const pub = ctx.directRouting ? parseIP(publicIP) : null;
  const direct = pub !== null && ctx.extNets.some((n) => containsIP(n, pub));
  const add = event.type === 'added';
  if (direct) {
    const route = { dst, gw: publicIP, dev: ctx.extDev };
    return [add ? { op: 'replaceRoute', ...route } : { op: 'delRoute', ...route }];
  }
  const data = family === 4 ? lease.attrs.backendData : lease.attrs.backendV6Data;
  const vtep = peerVtepMAC(data);
  if ('reason' in vtep) {
    if (add) ctx.onSkip?.(lease, vtep.reason);
    return [];
  }
  const neigh = { dst: gw, mac: vtep.mac, dev: ctx.dev };
  const fdb = { mac: vtep.mac, dst: publicIP, dev: ctx.dev };
  const route = { dst, gw, dev: ctx.dev, onlink: true };
  if (add) {
    return [
      { op: 'replaceNeigh', ...neigh },
      { op: 'appendFdb', ...fdb },
      { op: 'replaceRoute', ...route },
    ];
  }
  return [
    { op: 'delRoute', ...route },
    { op: 'delFdb', ...fdb },
    { op: 'delNeigh', dst: gw, dev: ctx.dev },
  ];
}

interface DeviceWanted {
  readonly name: string;
  readonly vni: number;
  readonly port: number;
  readonly local: string | null;
  /** The external interface (name for the op, index for the comparison). */
  readonly link: string;
  readonly linkIndex: number;
  readonly mtu: number;
  readonly learning: boolean;
  readonly gbp: boolean;
}

/** Whether an existing link is the vxlan device we would create (then it is reused as is). */
export function isCompatibleDevice(l: LinkInfo, w: DeviceWanted): boolean {
  return (
    l.kind === 'vxlan' &&
    l.vxlan !== null &&
    l.vxlan.vni === w.vni &&
    l.vxlan.port === w.port &&
    (l.vxlan.local ?? null) === w.local &&
    l.vxlan.link === w.linkIndex &&
    l.vxlan.learning === w.learning &&
    (l.vxlan.gbp ?? false) === w.gbp
  );
}

/**
 * Creates the device or reuses a compatible one; returns its MAC. The MAC is chosen by
 * `chooseMac` (vtep-mac.ts: the existing device's first, unless another node holds it) and set on
 * a reused device when it differs.
 */
export async function ensureVxlanDevice(
  nl: Netlink,
  w: DeviceWanted,
  chooseMac: (deviceMac: string | null) => Promise<string>,
  log: BackendContext['log'],
): Promise<string> {
  const existing = await nl.getLink(w.name);
  const mac = await chooseMac(usableVtepMAC(existing?.mac) ? existing!.mac : null);
  if (existing && isCompatibleDevice(existing, w)) {
    const change: Op = { op: 'setLink', dev: w.name };
    if (existing.mtu !== w.mtu) Object.assign(change, { mtu: w.mtu });
    if (existing.mac !== mac) Object.assign(change, { mac });
    if (Object.keys(change).length > 2) await applyAll(nl, [change]);
    log.info({ dev: w.name, mac }, 'reusing vxlan device');
    return mac;
  }
  if (existing) {
    log.warn(
      { dev: w.name, kind: existing.kind, vxlan: existing.vxlan },
      'recreating incompatible device',
    );
    // The userspace dataplane's TUN of this name (Dataplane auto without the vxlan module last
    // time): the bpf programs pinned on it go with it.
    if (existing.kind === 'tun') removeBpfPins(w.name, log);
    await applyAll(nl, [{ op: 'delLink', dev: w.name }]);
  }
  await applyAll(nl, [
    {
      op: 'addVxlan',
      name: w.name,
      vni: w.vni,
      port: w.port,
      ...(w.local ? { local: w.local } : {}),
      link: w.link,
      learning: w.learning,
      ...(w.gbp ? { gbp: true } : {}),
      mtu: w.mtu,
      mac,
    },
  ]);
  log.info(
    { dev: w.name, mac, vni: w.vni, port: w.port, mtu: w.mtu, learning: w.learning, gbp: w.gbp },
    'created vxlan device',
  );
  return mac;
}

/** Our VtepMAC for `dev` (vtep-mac.ts), given the existing device's MAC. */
export async function vtepMACFor(
  ctx: BackendContext,
  dev: string,
  family: Family,
  device: string | null,
): Promise<string> {
  const { mac, source } = await chooseVtepMAC({
    dev,
    subnetFile: ctx.options.subnetFile,
    device,
    stored: ctx.vtepMACs?.stored(family) ?? null,
    inUse: (await ctx.vtepMACs?.inUse()) ?? new Set(),
    log: ctx.log,
  });
  ctx.log.info({ dev, mac, from: source }, 'VtepMAC chosen');
  return mac;
}

function isNoKernelVxlan(err: unknown): boolean {
  if (!isWeftError(err, 'WEFT_ERR_NETLINK')) return false;
  const errno = err.details.errno;
  return errno === 'EOPNOTSUPP' || errno === 'EAFNOSUPPORT' || errno === 'EPROTONOSUPPORT';
}

export interface VxlanDeps extends KernelBackendDeps {
  /** The userspace implementation (the registry passes its `vxlan-userspace` entry; none when absent). */
  readonly userspace?: BackendFactory | null;
}

/**
 * Test knob: "Dataplane": "auto" finds the kernel's vxlan link type refused (EOPNOTSUPP), as on a
 * kernel without the vxlan module, which a namespace cannot otherwise model (the module is
 * loaded for the whole machine).
 */
export const NO_KERNEL_VXLAN_ENV = 'WEFT_TEST_NO_KERNEL_VXLAN';

/**
 * The vxlan backend factory (registered as `vxlan`). With Dataplane "userspace" it hands over to
 * the `vxlan-userspace` factory; with "auto" it tries the kernel device and hands over when the
 * kernel has no vxlan link type (kernel-fallback.ts).
 */
export function createVxlanBackend(ctx: BackendContext, deps: VxlanDeps = {}): Backend {
  const cfg = parseVxlanConfig(ctx.netConfig.backend.raw);
  return kernelOrUserspace(ctx, {
    type: VXLAN,
    userspaceType: VXLAN_USERSPACE,
    dataplane: cfg.dataplane,
    kernel: () => createKernelVxlan(ctx, cfg, deps),
    userspace: deps.userspace ?? null,
  });
}

/** vxlan's one registration (registry.ts). */
export const VXLAN_SPEC: BackendSpec = {
  type: VXLAN,
  create: (ctx, _handover, userspace) => createVxlanBackend(ctx, { userspace }),
  parseConfig: parseVxlanConfig,
  options: ['VNI', 'Port', 'MTU', 'GBP', 'Learning', 'DirectRouting', 'Dataplane'],
  // userspace or auto: the TUN flannel.<VNI>'s TAP (auto may hand over); kernel: none
  egressTap(raw) {
    try {
      const v = parseVxlanConfig(raw);
      return v.dataplane === 'kernel' ? null : egressTapName(vxlanDeviceName(4, v.vni));
    } catch {
      return null; // the backend refuses this config itself
    }
  },
  fallback: VXLAN_USERSPACE,
};

interface FamilyDevice {
  readonly family: Family;
  readonly dev: string;
  readonly mac: string;
  readonly network: IPNet;
  readonly wanted: DeviceWanted;
  /** Our lease's subnet of this family (set by start). */
  subnet: IPNet | null;
}

/**
 * The re-check of one vxlan device (each resync, before the peers): a device that is gone or no
 * longer ours is created again with the same MAC, then its address and link state are restored.
 * Returns how many pieces it restored (the peers' entries follow in the same resync).
 */
async function restoreVxlanDevice(
  nl: Netlink,
  d: FamilyDevice,
  log: BackendContext['log'],
): Promise<number> {
  if (!d.subnet) return 0;
  const link = await nl.getLink(d.dev);
  const addr = `${subnetAddress(d.subnet)}/${d.family === 4 ? 32 : 128}`;
  let restored = 0;
  if (!link || !isCompatibleDevice(link, d.wanted)) {
    log.warn({ dev: d.dev }, 'vxlan device missing; creating it again');
    // the MAC our lease publishes, so the peers' entries for us stay right
    await ensureVxlanDevice(nl, d.wanted, () => Promise.resolve(d.mac), log);
    restored++;
  } else if (link.up && (await nl.listAddrs(d.family, d.dev)).some((a) => a.addr === addr)) {
    return 0;
  }
  await ensureTunnelAddress(nl, d.dev, d.subnet, d.network);
  log.info({ dev: d.dev, addr }, 'vxlan device address and link restored');
  return restored + 1;
}

function createKernelVxlan(
  ctx: BackendContext,
  cfg: VxlanConfig,
  deps: KernelBackendDeps,
): Backend {
  const log = ctx.log ?? logger('vxlan');
  const families = enabledFamilies(ctx.netConfig);
  const metrics = kernelMetrics(ctx.metrics);
  const ext = ctx.extIface;
  const devices: FamilyDevice[] = [];
  const skipped = new LogOnce();
  let nl: Netlink | undefined;
  // What the last re-check of the devices found: false while one is missing and cannot be restored.
  let devicesOk = true;
  const prepareDevices = async (): Promise<PreparedBackend> => {
    if (cfg.dataplane === 'auto' && process.env[NO_KERNEL_VXLAN_ENV] === '1') {
      throw new WeftError(
        'WEFT_ERR_NETLINK',
        `link add ${vxlanDeviceName(4, cfg.vni)} type vxlan: operation not supported (${NO_KERNEL_VXLAN_ENV})`,
        { details: { errno: 'EOPNOTSUPP' } },
      );
    }
    nl = (deps.openNetlink ?? openNetlink)();
    let backendData: unknown;
    let backendV6Data: unknown;
    let mtu = 0;
    for (const family of families) {
      const dev = vxlanDeviceName(family, cfg.vni);
      // the public IP where it is an address of this host (as flannel HEAD), else the
      // interface's (behind a NAT)
      const local = sendAddress(ext, family);
      const devMtu = vxlanDeviceMTU(cfg, ext.mtu, family);
      const wanted: DeviceWanted = {
        name: dev,
        vni: cfg.vni,
        port: cfg.port,
        local,
        link: ext.name,
        linkIndex: ext.index,
        mtu: devMtu,
        learning: cfg.learning,
        gbp: cfg.gbp,
      };
      const mac = await ensureVxlanDevice(
        nl,
        wanted,
        (device) => vtepMACFor(ctx, dev, family, device),
        log,
      );
      devices.push({
        family,
        dev,
        mac,
        network: clusterNetwork(ctx.netConfig, family)!,
        wanted,
        subnet: null,
      });
      const data = { VNI: cfg.vni, VtepMAC: mac };
      if (family === 4) backendData = data;
      else backendV6Data = data;
      if (mtu === 0) mtu = devMtu;
    }
    return {
      attrs: {
        backendType: VXLAN,
        ...(backendData === undefined ? {} : { backendData }),
        ...(backendV6Data === undefined ? {} : { backendV6Data }),
      },
      mtu,
    };
  };
  return {
    type: VXLAN,
    isReady: () => devicesOk,
    async prepare(): Promise<PreparedBackend> {
      try {
        return await prepareDevices();
      } catch (err) {
        // the mark kernel-fallback.ts hands over on ("auto"); code and message as they were
        if (!isNoKernelVxlan(err)) throw err;
        const e = err as WeftError;
        throw new WeftError(e.code, e.message, {
          cause: err,
          details: { ...e.details, missing: 'vxlan module' },
        });
      }
    },
    async start(lease: Lease) {
      if (!nl) throw new Error('vxlan: start before prepare');
      for (const d of devices) {
        const subnet = leaseSubnet(lease, d.family);
        d.subnet = subnet;
        if (!subnet) continue;
        const addr = await ensureTunnelAddress(nl, d.dev, subnet, d.network);
        log.info({ dev: d.dev, addr }, 'vxlan device up');
      }
    },
    snapshotParts: true, // (runKernelPlan)
    async run(events, signal) {
      if (!nl) throw new Error('vxlan: run before prepare');
      const netlink = nl;
      const extNets = new Map<Family, IPNet[]>();
      for (const d of devices) extNets.set(d.family, await onLinkNets(netlink, ext.name, d.family));
      const ownership: Ownership[] = devices.map((d) => ({
        family: d.family,
        routes: [
          { dev: d.dev, within: d.network },
          ...(cfg.directRouting ? [{ dev: ext.name, within: d.network, viaGateway: true }] : []),
        ],
        neighDev: d.dev,
        fdbDev: d.dev,
      }));
      const byFamily = new Map(devices.map((d) => [d.family, d]));
      await runKernelPlan(events, signal, {
        netlink,
        log,
        ownership,
        metrics,
        resyncMs: deps.resyncMs,
        ensureBase: async () => {
          let restored = 0;
          try {
            for (const d of devices) restored += await restoreVxlanDevice(netlink, d, log);
          } catch (err) {
            if (devicesOk)
              log.error({ err: errorMessage(err) }, 'vxlan device cannot be restored; not ready');
            devicesOk = false;
            throw err;
          }
          if (!devicesOk) log.info('vxlan devices restored; ready');
          devicesOk = true;
          return restored;
        },
        families: devices.map((d) => d.family),
        plan: (ev, family) =>
          planVxlan(ev, family, {
            dev: byFamily.get(family)!.dev,
            extDev: ext.name,
            directRouting: cfg.directRouting,
            extNets: extNets.get(family) ?? [],
            onSkip: (lease, reason) => {
              metrics.skipped.inc();
              if (skipped.first(`${lease.key}:${reason}`))
                log.warn({ lease: lease.key, reason }, 'skipping peer lease');
            },
          }),
      });
    },
    async close() {
      nl?.close();
      nl = undefined;
    },
  };
}
