/**
 * A kernel vxlan node made by hand beside a testbed cluster, as flannel sets one up (no weft on
 * it): flannel.1 (IPv4 underlay) and, dual-stack, flannel-v6.1 (IPv6 underlay), each with its
 * own VtepMAC; cni0 and one pod; flannel's per-peer entries (neighbour, FDB, onlink route, per
 * family on that family's device) for every lease in the cluster's embedded store; and its own
 * lease written there, so the weft nodes program it as a peer.
 *
 *   underlay br0 ── u9 ── eth0 10.250.0.9 (+ fd00:250::9)
 *                         flannel.1    vxlan id 1 dstport 8472 local 10.250.0.9   nolearning
 *                         flannel-v6.1 vxlan id 1 dstport 8472 local fd00:250::9  nolearning
 *                         cni0 10.5.200.1/24 (+ fd00:5:0:ff00::1/64) ── pod 10.5.200.2 (+ ::2)
 */
import { encodeLeaseAttrs } from '../../src/control/lease/lease-json.js';
import { EmbeddedRegistry } from '../../src/control/registry/embedded.js';
import type { Cluster } from '../../src/testbed/cluster.js';
import { ip, nsExec } from '../../src/testbed/netns.js';

export const KERNEL_NODE = {
  ip: '10.250.0.9',
  ip6: 'fd00:250::9',
  mac: '02:aa:00:00:00:09',
  mac6: '02:aa:00:00:00:69',
  pod: '10.5.200.2',
  pod6: 'fd00:5:0:ff00::2',
} as const;

/** A lease as the store holds it (flannel's JSON). */
export interface StoredLease {
  readonly PublicIP: string;
  readonly PublicIPv6: string | null;
  readonly BackendType?: string;
  readonly BackendData?: { VNI: number; VtepMAC: string };
  readonly BackendV6Data?: { VNI: number; VtepMAC: string };
}

export interface KernelVxlanNode {
  readonly ns: string;
  readonly pod: string;
  /** The weft leases it was programmed with. */
  readonly peers: ReadonlyArray<{ readonly key: string; readonly lease: StoredLease }>;
}

/** Builds the node in `c`'s scope (removed with the cluster). IPv6 too when `dualStack`. */
export async function addKernelVxlanNode(c: Cluster, dualStack: boolean): Promise<KernelVxlanNode> {
  const K = KERNEL_NODE;
  const mtu = dualStack ? '1430' : '1450';
  const ns = c.scope.add();
  c.scope.vethBetween(c.underlay, 'u9', ns, 'eth0');
  ip(c.underlay, 'link', 'set', 'u9', 'master', 'br0', 'up');
  ip(ns, 'addr', 'add', `${K.ip}/24`, 'dev', 'eth0');
  if (dualStack) ip(ns, 'addr', 'add', `${K.ip6}/64`, 'dev', 'eth0', 'nodad');
  ip(ns, 'link', 'set', 'eth0', 'up');
  nsExec(ns, 'sysctl', ['-qw', 'net.ipv4.ip_forward=1', 'net.ipv6.conf.all.forwarding=1']);
  const devices = [['flannel.1', K.mac, K.ip, '1450', '10.5.200.0/32']] as string[][];
  if (dualStack) devices.push(['flannel-v6.1', K.mac6, K.ip6, '1430', 'fd00:5:0:ff00::/128']);
  for (const [dev, mac, local, devMtu, addr] of devices as [
    string,
    string,
    string,
    string,
    string,
  ][]) {
    ip(
      ns,
      'link',
      'add',
      dev,
      'address',
      mac,
      'type',
      'vxlan',
      'id',
      '1',
      'dstport',
      '8472',
      'local',
      local,
      'dev',
      'eth0',
      'nolearning',
    );
    ip(ns, 'link', 'set', dev, 'mtu', devMtu, 'up');
    ip(ns, 'addr', 'add', addr, 'dev', dev, ...(addr.includes(':') ? ['nodad'] : []));
  }
  ip(ns, 'link', 'add', 'cni0', 'type', 'bridge');
  ip(ns, 'addr', 'add', '10.5.200.1/24', 'dev', 'cni0');
  if (dualStack) ip(ns, 'addr', 'add', 'fd00:5:0:ff00::1/64', 'dev', 'cni0', 'nodad');
  ip(ns, 'link', 'set', 'cni0', 'mtu', mtu, 'up');
  const pod = c.scope.add();
  c.scope.vethBetween(ns, 'p0', pod, 'eth0');
  ip(ns, 'link', 'set', 'p0', 'master', 'cni0', 'mtu', mtu, 'up');
  ip(pod, 'addr', 'add', `${K.pod}/24`, 'dev', 'eth0');
  if (dualStack) ip(pod, 'addr', 'add', `${K.pod6}/64`, 'dev', 'eth0', 'nodad');
  ip(pod, 'link', 'set', 'eth0', 'mtu', mtu, 'up');
  ip(pod, 'route', 'add', 'default', 'via', '10.5.200.1');
  if (dualStack) ip(pod, '-6', 'route', 'add', 'default', 'via', 'fd00:5:0:ff00::1');
  const peers: Array<{ key: string; lease: StoredLease }> = [];
  const store = new EmbeddedRegistry(c.storeDir);
  try {
    for (const s of (await store.listSubnets()).leases) {
      const lease = JSON.parse(s.value) as StoredLease;
      peers.push({ key: s.key, lease });
      const [k4, k6] = s.key.split('&') as [string, string | undefined];
      const families = [[k4, 'flannel.1', lease.BackendData, lease.PublicIP]] as const;
      const all = dualStack
        ? [...families, [k6, 'flannel-v6.1', lease.BackendV6Data, lease.PublicIPv6] as const]
        : families;
      for (const [part, dev, data, pub] of all) {
        if (!part || !data || !pub) throw new Error(`lease ${s.key} lacks data for ${dev}`);
        const [net, len] = part.split('-') as [string, string];
        const f = net.includes(':') ? '-6' : '-4';
        ip(ns, f, 'neigh', 'replace', net, 'lladdr', data.VtepMAC, 'dev', dev, 'nud', 'permanent');
        nsExec(ns, 'bridge', [
          'fdb',
          'append',
          data.VtepMAC,
          'dev',
          dev,
          'dst',
          pub,
          'self',
          'permanent',
        ]);
        ip(ns, f, 'route', 'replace', `${net}/${len}`, 'via', net, 'dev', dev, 'onlink');
      }
    }
    await store.createSubnet(
      dualStack ? '10.5.200.0-24&fd00:5:0:ff00::-64' : '10.5.200.0-24',
      encodeLeaseAttrs({
        publicIP: K.ip,
        publicIPv6: dualStack ? K.ip6 : null,
        backendType: 'vxlan',
        backendData: { VNI: 1, VtepMAC: K.mac },
        ...(dualStack ? { backendV6Data: { VNI: 1, VtepMAC: K.mac6 } } : {}),
      }),
      3_600_000,
    );
  } finally {
    await store.close();
  }
  return { ns, pod, peers };
}
