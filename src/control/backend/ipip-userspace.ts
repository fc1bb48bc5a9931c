/**
 * ipip with the userspace dataplane: the same lease (BackendType "ipip", no BackendData) and the
 * same wire format as the kernel device flannel creates (RFC 2003: outer IPv4, protocol 4; the
 * header fields are native/src/ipip.h's), so a kernel-ipip peer cannot tell it apart. For nodes
 * without the kernel's ipip module:
 *
 *   TUN      flannel.ipip (the kernel device does not exist here), MTU = interface MTU − 20,
 *            address = own subnet's network address /32, a route for the cluster network
 *   engine   native (raw IPPROTO_IPIP sockets, IP_HDRINCL: Node has none, so no js engine), or
 *            bpf: the programs frame IPIP in the kernel (GSO super-packets whole), the native
 *            engine's raw sockets the slow path; "Dataplane": "auto" without the module picks it
 *   peers    the leases of type ipip, to their PublicIP; received packets only from those, with
 *            the inner source inside the sender's subnet (counted drops otherwise)
 *
 * IPv4 only, as flannel. DirectRouting is a kernel-route feature: here every peer goes through
 * the TUN (logged once at start when it is set).
 */
import { parseIP } from '../../common/ip.js';
import type { Backend, BackendContext, BackendSpec, Handover } from './backend.js';
import {
  IPIP,
  IPIP_DEV,
  IPIP_OPTIONS,
  IPIP_OVERHEAD,
  IPIP_USERSPACE,
  checkIpipNode,
  parseIpipConfig,
} from './ipip.js';
import { leaseSubnet } from './kernel-common.js';
import { type UserspaceSpec, createUserspaceBackend } from './userspace.js';

export function createIpipUserspaceBackend(ctx: BackendContext, handover?: Handover): Backend {
  const cfg = parseIpipConfig(ctx.netConfig.backend.raw);
  const spec: UserspaceSpec = {
    type: IPIP,
    format: 'ipip',
    tunName: IPIP_DEV,
    port: 0,
    overhead: IPIP_OVERHEAD,
    vni: 0,
    vtepMac: null,
    attrs: { backendType: IPIP },
    peerFor(lease, family, publicIP) {
      if (lease.attrs.backendType !== IPIP)
        return { skip: `BackendType "${lease.attrs.backendType}" is not ipip` };
      const pub = parseIP(publicIP);
      if (family !== 4 || !pub || pub.family !== 4) return { skip: `no IPv4 public IP` };
      return { subnet: leaseSubnet(lease, 4)!, publicIP: pub, port: 0, vtepMac: null };
    },
    prepared() {
      if (cfg.directRouting) {
        ctx.log.warn(
          { dev: IPIP_DEV },
          'DirectRouting is not applied by the userspace ipip dataplane: every peer goes through the TUN',
        );
      }
    },
  };
  return createUserspaceBackend(
    ctx,
    {
      type: IPIP,
      // the node is checked as prepare begins (IPv4 only, an IPv4 address); the engine is the
      // dataplane's choice (js, which cannot send IPIP, is refused there)
      resolve: async () => {
        checkIpipNode(ctx);
        return spec;
      },
    },
    {},
    handover,
  );
}

/** ipip-userspace's one registration (registry.ts). */
export const IPIP_USERSPACE_SPEC: BackendSpec = {
  type: IPIP_USERSPACE,
  create: (ctx, handover) => createIpipUserspaceBackend(ctx, handover),
  parseConfig: parseIpipConfig,
  options: IPIP_OPTIONS,
};
