/** Leases and contexts for the kernel backend unit tests, one table per address family. */
import { type Family, parseCIDR } from '../../../../src/common/ip.js';
import { logger } from '../../../../src/common/log.js';
import {
  type BackendContext,
  DEFAULT_BACKEND_OPTIONS,
  type ExternalInterface,
} from '../../../../src/control/backend/backend.js';
import { parseNetConfig } from '../../../../src/control/config/net-config.js';
import { makeSubnetKey } from '../../../../src/control/lease/subnet-key.js';
import type { Lease, LeaseAttrs } from '../../../../src/control/lease/types.js';
import { Registry } from '../../../../src/common/metrics.js';

/** Per family: the cluster network, a peer's subnet and its gateway address, public addresses. */
export const FAM = {
  4: {
    network: '10.5.0.0/16',
    subnet: '10.5.34.0/24',
    subnetAddr: '10.5.34.0',
    publicIP: '192.168.1.12',
    offLinkIP: '172.16.9.9',
    extNet: '192.168.1.0/24',
    own: '10.5.1.0/24',
    ownAddr: '10.5.1.0/32',
    dev: 'flannel.1',
  },
  6: {
    network: 'fc00::/48',
    subnet: 'fc00:0:0:5d::/64',
    subnetAddr: 'fc00:0:0:5d::',
    publicIP: '2001:db8:1::12',
    offLinkIP: '2001:db8:9::9',
    extNet: '2001:db8:1::/64',
    own: 'fc00:0:0:1::/64',
    ownAddr: 'fc00:0:0:1::/128',
    dev: 'flannel-v6.1',
  },
} as const;

export const FAMILIES: Family[] = [4, 6];

export const PEER_MAC = 'aa:bb:cc:dd:ee:01';
export const PEER_MAC_V6 = 'aa:bb:cc:dd:ee:02';

/** A dual-stack peer lease; `over` replaces attributes. */
export function peerLease(
  over: Partial<LeaseAttrs> = {},
  subnets: { v4: string; v6: string } = { v4: FAM[4].subnet, v6: FAM[6].subnet },
): Lease {
  const v4 = parseCIDR(subnets.v4)!;
  const v6 = parseCIDR(subnets.v6)!;
  return {
    key: makeSubnetKey(v4, v6),
    subnet: v4,
    ipv6Subnet: v6,
    attrs: {
      publicIP: FAM[4].publicIP,
      publicIPv6: FAM[6].publicIP,
      backendType: 'vxlan',
      backendData: { VNI: 1, VtepMAC: PEER_MAC },
      backendV6Data: { VNI: 1, VtepMAC: PEER_MAC_V6 },
      ...over,
    },
    expiration: new Date(Date.now() + 86_400_000),
  };
}

export function ownLease(): Lease {
  return peerLease({}, { v4: FAM[4].own, v6: FAM[6].own });
}

export const EXT: ExternalInterface = {
  name: 'eth0',
  index: 2,
  mtu: 1500,
  ifaceAddr: '192.168.1.11',
  ifaceAddrV6: '2001:db8:1::11',
  publicIP: '192.168.1.11',
  publicIPv6: '2001:db8:1::11',
};

export function backendContext(
  backend: Record<string, unknown>,
  over: Partial<BackendContext> = {},
): BackendContext {
  const netConfig = parseNetConfig(
    JSON.stringify({
      Network: FAM[4].network,
      EnableIPv6: true,
      IPv6Network: FAM[6].network,
      Backend: backend,
    }),
  );
  const log = logger('test');
  log.level = 'silent';
  return {
    netConfig,
    extIface: EXT,
    log,
    metrics: new Registry(),
    options: DEFAULT_BACKEND_OPTIONS,
    signal: new AbortController().signal,
    ...over,
  };
}
