/**
 * A mixed cluster on one store (issue 4): four weft daemons in Kubernetes mode, each reading its
 * own net-conf.json, so each node runs a different backend, as a Kubernetes cluster can when its
 * nodes mount different net-confs.
 *
 *                  underlay weft-<pid>-0: br0 10.250.0.254/24 ─ fake API server :6443
 *            u0 ┌───────────────┬─u1─────────────┴─┬─u2 ─────────────┬─u3 ─────────────┐
 *   ┌─ eth0 10.250.0.1 ─┐ ┌─ eth0 10.250.0.2 ─┐ ┌─ eth0 10.250.0.3 ─┐ ┌─ eth0 10.250.0.4 ─┐
 *   │ A: vxlan, kernel  │ │ B: vxlan,         │ │ C: host-gw        │ │ D: udp            │
 *   │  flannel.1 (link) │ │  userspace (TUN   │ │  routes via       │ │  TUN flannel0,    │
 *   │  :8472            │ │  flannel.1) :8472 │ │  peers' eth0      │ │  :8285            │
 *   └──┬────────────────┘ └──┬────────────────┘ └──┬────────────────┘ └──┬────────────────┘
 *    pod 10.5.1.2          pod 10.5.2.2          pod 10.5.3.2          pod 10.5.4.2
 *
 * flannel's semantics, which weft keeps: vxlan (either dataplane) and host-gw program only peers
 * whose lease has their own BackendType; udp publishes no BackendType and routes the whole cluster
 * network into its TUN, sending to every lease's PublicIP on its port whatever the lease's type.
 * So the only working cross-node path here is A ⇄ B (kernel vxlan ⇄ userspace vxlan, the same
 * wire format). D's datagrams do reach A, B and C, but none of them listens on 8285, and no other
 * node has a route back to D's subnet: a udp node cannot reach a vxlan or host-gw node's pods.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { join } from 'node:path';
import { Cluster, type ClusterNode, PACKAGE_ROOT } from '../../src/testbed/cluster.js';
import { type NetnsScope, ip, isRoot, nsExec, nsExecAsync } from '../../src/testbed/netns.js';
import { iperf } from '../../src/testbed/probes.js';
import { tcpdumpListening } from '../helpers/capture.js';

/** The fake API server, run in the underlay namespace (its control: JSON lines). */
const KUBE_APISERVER = join(PACKAGE_ROOT, 'test', 'helpers', 'kube-apiserver-child.ts');
const skip = isRoot() ? false : 'needs root (network namespaces)';

const BACKENDS = [
  { Type: 'vxlan', Dataplane: 'kernel' },
  { Type: 'vxlan', Dataplane: 'userspace' },
  { Type: 'host-gw' },
  { Type: 'udp' },
];

/** Whether `from`'s pod gets a reply from `to`'s within 10 s (-w: pinging on until then). */
async function pings(from: ClusterNode, to: ClusterNode): Promise<boolean> {
  try {
    await nsExecAsync(from.pods[0]!.ns, 'ping', ['-n', '-c', '1', '-w', '10', to.pods[0]!.ip]);
    return true;
  } catch {
    return false;
  }
}

/** iperf3 TCP for 1 s from `client`'s pod to `server`'s pod (reverse: server sends). */
async function iperfBps(
  scope: NetnsScope,
  client: ClusterNode,
  server: ClusterNode,
  reverse: boolean,
): Promise<number> {
  const { ns, ip: serverIp } = server.pods[0]!;
  const args = ['-t', '1', ...(reverse ? ['-R'] : [])];
  return (await iperf(scope, ns, serverIp, client.pods[0]!.ns, args)).bitsPerSecond;
}

/** Routes inside the cluster network (10.5.0.0/16) on a node, one `ip route` line each. */
function clusterRoutes(n: ClusterNode): string[] {
  return ip(n.ns, 'route', 'show')
    .split('\n')
    .filter((l) => l.startsWith('10.5.'))
    .map((l) => l.trim());
}

describe(
  'mixed cluster: kernel vxlan, userspace vxlan, host-gw and udp nodes on one store',
  {
    skip,
  },
  () => {
    let c: Cluster;
    let A: ClusterNode, B: ClusterNode, C: ClusterNode, D: ClusterNode;

    before(async () => {
      c = await Cluster.create({
        store: 'kube',
        kubeApiServer: KUBE_APISERVER,
        backend: BACKENDS,
      });
      [A, B, C, D] = c.nodes as [ClusterNode, ClusterNode, ClusterNode, ClusterNode];
    });

    after(async () => {
      await c?.destroy();
    });

    test('each node runs the backend of its own net-conf', () => {
      assert.deepEqual(
        c.nodes.map((n) => n.env.FLANNEL_SUBNET),
        ['10.5.1.1/24', '10.5.2.1/24', '10.5.3.1/24', '10.5.4.1/24'],
      );
      assert.match(ip(A.ns, '-d', 'link', 'show', 'flannel.1'), /vxlan id 1 /);
      assert.match(ip(B.ns, '-d', 'link', 'show', 'flannel.1'), /\btun\b/);
      assert.match(ip(D.ns, '-d', 'link', 'show', 'flannel0'), /\btun\b/);
      assert.throws(() => ip(C.ns, 'link', 'show', 'flannel.1'));
    });

    test('kernel vxlan (A) and userspace vxlan (B) pods ping each other both ways', async () => {
      assert.equal(await pings(A, B), true, 'A → B');
      assert.equal(await pings(B, A), true, 'B → A');
    });

    test('iperf3 TCP works both ways between kernel vxlan (A) and userspace vxlan (B)', async () => {
      // A is the client: forward = kernel sends to userspace, reverse = userspace sends to kernel.
      const kernelToUser = await iperfBps(c.scope, A, B, false);
      const userToKernel = await iperfBps(c.scope, A, B, true);
      assert.ok(kernelToUser > 0, `A → B ${kernelToUser} bit/s`);
      assert.ok(userToKernel > 0, `B → A ${userToKernel} bit/s`);
      // Not a timed assertion: the figures are for the report only.
      process.stderr.write(
        `# mixed: A→B ${(kernelToUser / 1e9).toFixed(2)} Gbit/s, B→A ${(userToKernel / 1e9).toFixed(2)} Gbit/s\n`,
      );
    });

    test('kernel vxlan (A) programs only the vxlan peer B: one route, one neighbour, one FDB entry', () => {
      assert.deepEqual(clusterRoutes(A).sort(), [
        '10.5.1.0/24 dev cni0 proto kernel scope link src 10.5.1.1',
        '10.5.2.0/24 via 10.5.2.0 dev flannel.1 onlink',
      ]);
      const neigh = ip(A.ns, 'neigh', 'show', 'dev', 'flannel.1').trim().split('\n');
      assert.equal(neigh.length, 1, neigh.join('\n'));
      assert.match(neigh[0]!, /^10\.5\.2\.0 lladdr \S+ PERMANENT/);
      const fdb = nsExec(A.ns, 'bridge', ['fdb', 'show', 'dev', 'flannel.1'])
        .trim()
        .split('\n')
        .filter((l) => / dst /.test(l));
      assert.equal(fdb.length, 1, fdb.join('\n'));
      assert.match(fdb[0]!, / dst 10\.250\.0\.2 self permanent/);
    });

    test('userspace vxlan (B) routes the network into its TUN and skips the host-gw and udp leases', () => {
      assert.deepEqual(clusterRoutes(B).sort(), [
        '10.5.0.0/16 dev flannel.1 scope link',
        '10.5.2.0/24 dev cni0 proto kernel scope link src 10.5.2.1',
      ]);
      const skipped = B.logs
        .filter((l) => l.msg === 'peer lease skipped')
        .map((l) => `${String(l.lease)}: ${String(l.reason)}`)
        .sort();
      assert.deepEqual(skipped, [
        '10.5.3.0-24: BackendType "host-gw" is not vxlan',
        '10.5.4.0-24: BackendType "" is not vxlan',
      ]);
    });

    test('host-gw (C) programs no route: no other lease is host-gw', () => {
      assert.deepEqual(clusterRoutes(C), [
        '10.5.3.0/24 dev cni0 proto kernel scope link src 10.5.3.1',
      ]);
    });

    test('udp (D) routes the whole network into flannel0', () => {
      assert.deepEqual(clusterRoutes(D).sort(), [
        '10.5.0.0/16 dev flannel0 scope link',
        '10.5.4.0/24 dev cni0 proto kernel scope link src 10.5.4.1',
      ]);
    });

    // That none of them answers: the next test (no pod path from D to any of A, B, C).
    test('udp (D) sends to every lease on :8285 whatever its type', async () => {
      // Capture what leaves D's underlay interface while D's pod pings the three other pods
      // (one request each: what leaves is asserted here, not what comes back).
      const cap = c.scope.spawn(D.ns, 'tcpdump', [
        '-n',
        '-l',
        '-i',
        'eth0',
        '-c',
        '3',
        'udp and dst port 8285',
      ]);
      let out = '';
      cap.stdout!.on('data', (d: Buffer) => (out += d.toString()));
      const done = new Promise((r) => cap.once('exit', r));
      await tcpdumpListening(cap);
      await Promise.all(
        [A, B, C].map((n) =>
          nsExecAsync(D.pods[0]!.ns, 'ping', ['-n', '-c', '1', '-W', '1', n.pods[0]!.ip]).catch(
            () => undefined,
          ),
        ),
      );
      const stop = setTimeout(() => cap.kill('SIGTERM'), 5000);
      await done;
      clearTimeout(stop);
      const dsts = [...out.matchAll(/> (10\.250\.0\.\d+)\.8285:/g)].map((m) => m[1]).sort();
      assert.deepEqual(dsts, ['10.250.0.1', '10.250.0.2', '10.250.0.3'], out);
    });

    test('no pod path exists between backends that do not share a wire format', async () => {
      const pairs: string[] = [];
      const names = ['A', 'B', 'C', 'D'];
      await Promise.all(
        c.nodes.flatMap((from, i) =>
          c.nodes.map(async (to, j) => {
            if (i === j) return;
            if (await pings(from, to)) pairs.push(`${names[i]}→${names[j]}`);
          }),
        ),
      );
      assert.deepEqual(pairs.sort(), ['A→B', 'B→A']);
    });
  },
);
