/**
 * udp (flannel's userspace backend, DESIGN §5): TUN `flannel0`, MTU = interface MTU − 28, UDP
 * port `Port` (default 8285) bound on the interface address; the payload is the raw inner IP
 * packet. It routes to every lease regardless of BackendType (as flannel does) and publishes no
 * BackendType/BackendData. Anti-spoofing on receive: the datagram's source must hold a lease
 * and the inner source must be inside that lease's subnet.
 */
import { configError } from '../../common/errors.js';
import { parseCIDR, parseIP } from '../../common/ip.js';
import { jsonField } from '../../common/json-field.js';
import { egressTapName } from '../../dataplane/index.js';
import type { Backend, BackendContext, BackendSpec } from './backend.js';
import { leaseSubnet } from './kernel-common.js';
import { createUserspaceBackend } from './userspace.js';

export const UDP = 'udp';
export const UDP_TUN = 'flannel0';
export const DEFAULT_UDP_PORT = 8285;
/** Outer IPv4 (20) + UDP (8). */
export const UDP_OVERHEAD = 28;

export function parseUdpConfig(raw: Readonly<Record<string, unknown>>): { port: number } {
  const port = jsonField(raw, 'Port');
  if (port === undefined || port === 0) return { port: DEFAULT_UDP_PORT };
  if (typeof port !== 'number' || !Number.isInteger(port) || port < 1 || port > 65535) {
    throw configError('Backend.Port', 'must be an integer in 1..65535');
  }
  return { port };
}

export function createUdpBackend(ctx: BackendContext): Backend {
  const { port } = parseUdpConfig(ctx.netConfig.backend.raw);
  return createUserspaceBackend(ctx, {
    type: UDP,
    format: 'udp',
    tunName: UDP_TUN,
    port,
    overhead: UDP_OVERHEAD,
    vni: 0,
    vtepMac: null,
    attrs: { backendType: '' },
    peerFor(lease, family, publicIP) {
      const subnet = leaseSubnet(lease, family)!;
      const pub = parseIP(publicIP);
      if (!pub || !parseCIDR(`${publicIP}/${pub.family === 4 ? 32 : 128}`))
        return { skip: `bad public IP ${publicIP}` };
      return { subnet, publicIP: pub, port, vtepMac: null };
    },
  });
}

/** udp's one registration (registry.ts). */
export const UDP_SPEC: BackendSpec = {
  type: UDP,
  create: (ctx) => createUdpBackend(ctx),
  parseConfig: parseUdpConfig,
  options: ['Port'],
  egressTap: () => egressTapName(UDP_TUN),
};
