/**
 * vxlan with the userspace dataplane (DESIGN §5): the same lease (BackendType "vxlan",
 * BackendData {"VNI":…,"VtepMAC":"…"}) and the same wire format as the kernel device, so a
 * kernel-vxlan peer cannot tell it apart. A TUN named flannel.<VNI> (the kernel device does not
 * exist on this node), MTU = interface MTU − 50, UDP port `Port` (default 8472). Peers are the
 * leases of type vxlan with a usable VtepMAC; on receive only our VNI and our VtepMAC pass, and
 * the inner source must be inside the sending peer's subnet. The VtepMAC is random, locally
 * administered and kept across restarts as the kernel backend's (backend/vtep-mac.ts).
 * Each family rides its own underlay, as flannel's flannel.<VNI> and flannel-v6.<VNI> do: IPv4
 * pods in IPv4 to the peer's PublicIP with its BackendData VtepMAC, IPv6 pods in IPv6 to its
 * PublicIPv6 with its BackendV6Data VtepMAC; one engine binds both addresses on a dual-stack
 * node (MTU then interface MTU − 70, the IPv6 outer header's), only the IPv6 one on an
 * IPv6-only node. Our lease publishes the same VtepMAC in BackendData and BackendV6Data (one
 * TUN receives both). Backend `MTU`, when set, makes the TUN's MTU (and FLANNEL_MTU) MTU − 50
 * as the kernel device's; `Learning` and `GBP` are refused (vxlan.ts assertUserspaceCan).
 */
import { parseIP } from '../../common/ip.js';
import { parseMac } from '../../dataplane/index.js';
import type { Backend, BackendContext, BackendSpec, Handover } from './backend.js';
import { enabledFamilies, leaseSubnet } from './kernel-common.js';
import { createUserspaceBackend } from './userspace.js';
import { peerVtepMAC } from './vtep-mac.js';
import {
  VXLAN,
  VXLAN_SPEC,
  VXLAN_USERSPACE,
  VXLAN_OVERHEAD_V4,
  VXLAN_OVERHEAD_V6,
  assertUserspaceCan,
  parseVxlanConfig,
  vtepMACFor,
  vxlanDeviceMTU,
  vxlanDeviceName,
} from './vxlan.js';

export function createVxlanUserspaceBackend(ctx: BackendContext, handover?: Handover): Backend {
  const cfg = parseVxlanConfig(ctx.netConfig.backend.raw);
  const dev = vxlanDeviceName(4, cfg.vni);
  const families = enabledFamilies(ctx.netConfig);
  // the kernel-only options are refused before anything starts (also when "Dataplane": "auto"
  // hands over here for lack of kernel vxlan)
  assertUserspaceCan(cfg);
  // Backend MTU − 50 for every family (each call checks its family's minimum)
  const mtu =
    cfg.mtu === null
      ? undefined
      : Math.min(...families.map((f) => vxlanDeviceMTU(cfg, ctx.extIface.mtu, f)));
  return createUserspaceBackend(
    ctx,
    {
      type: VXLAN,
      // the VtepMAC is chosen as prepare begins (vtep-mac.ts), then the engine starts with it
      async resolve() {
        const mac = await vtepMACFor(ctx, dev, 4, null);
        return {
          type: VXLAN,
          format: 'vxlan',
          tunName: dev,
          port: cfg.port,
          overhead: VXLAN_OVERHEAD_V4,
          overheadV6: VXLAN_OVERHEAD_V6,
          ...(mtu === undefined ? {} : { mtu }),
          underlayPerFamily: true,
          vni: cfg.vni,
          vtepMac: parseMac(mac),
          attrs: {
            backendType: VXLAN,
            ...(families.includes(4) ? { backendData: { VNI: cfg.vni, VtepMAC: mac } } : {}),
            ...(families.includes(6) ? { backendV6Data: { VNI: cfg.vni, VtepMAC: mac } } : {}),
          },
          peerFor(lease, family, publicIP) {
            if (lease.attrs.backendType !== VXLAN)
              return { skip: `BackendType "${lease.attrs.backendType}" is not vxlan` };
            const data =
              family === 6 && lease.attrs.backendV6Data !== undefined
                ? lease.attrs.backendV6Data
                : lease.attrs.backendData;
            const m = peerVtepMAC(data);
            if ('reason' in m) return { skip: m.reason };
            const pub = parseIP(publicIP);
            if (!pub) return { skip: `bad public IP ${publicIP}` };
            return {
              subnet: leaseSubnet(lease, family)!,
              publicIP: pub,
              port: cfg.port,
              vtepMac: parseMac(m.mac),
            };
          },
        };
      },
    },
    {},
    handover,
  );
}

/**
 * vxlan-userspace's one registration (registry.ts): the vxlan block and options. No egress TAP
 * entry, as before this table: configs name `vxlan` with "Dataplane", which has one.
 */
export const VXLAN_USERSPACE_SPEC: BackendSpec = {
  type: VXLAN_USERSPACE,
  create: (ctx, handover) => createVxlanUserspaceBackend(ctx, handover),
  parseConfig: parseVxlanConfig,
  options: VXLAN_SPEC.options,
};
