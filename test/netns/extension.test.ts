/**
 * The `extension` backend on real `weft daemon`s (embedded store), running real commands inside
 * the node namespaces built by src/testbed/cluster.ts: the commands make a host-gw network.
 *
 *            underlay br0 (L2)                     10.250.0.0/24
 *     ┌──────────┴──────────┐
 *   node 0                node 1                   Backend "extension":
 *   eth0 10.250.0.x       eth0 10.250.0.y            PreStartupCommand   pre.sh  → BackendData
 *   cni0 10.5.X.1/24      cni0 10.5.Y.1/24           PostStartupCommand  record.sh (env)
 *   pod 0.0               pod 1.0                    SubnetAddCommand    record.sh + ip route replace
 *                                                    SubnetRemoveCommand record.sh + ip route del
 *
 * record.sh appends its argv, the variables weft sets and its stdin to `<dir>/<node eth0
 * address>-<what>.log` (the node it runs on), then execs what follows `--`. Checked: the lease's
 * BackendData is pre.sh's output; the post-startup environment; each node's add command saw the
 * other's subnet, public IP and BackendData (stdin) and its route carries pod traffic; no shell
 * reads the command (`;`, `|` reach the program as arguments); a lease removed runs the remove
 * command on the other node, whose route goes.
 */
import assert from 'node:assert/strict';
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { EmbeddedRegistry } from '../../src/control/registry/embedded.js';
import { CLUSTER_NETWORK, Cluster, waitFor } from '../../src/testbed/cluster.js';
import { isRoot, nsExecAsync } from '../../src/testbed/netns.js';

const skip = isRoot() ? false : 'needs root (network namespaces)';

const RECORD = `#!/bin/sh
# record.sh WHAT [ARGS...] [-- COMMAND...]: what weft gave this command, then COMMAND
me=$(ip -4 -o addr show dev eth0 | awk '{print $4}' | cut -d/ -f1)
what=$1; shift
args=""
while [ $# -gt 0 ] && [ "$1" != "--" ]; do args="$args[$1]"; shift; done
[ "$1" = "--" ] && shift
{
  echo "args=$args"
  echo "NETWORK=$NETWORK"
  echo "SUBNET=$SUBNET"
  echo "IPV6SUBNET=$IPV6SUBNET"
  echo "PUBLIC_IP=$PUBLIC_IP"
  echo "PUBLIC_IPV6=$PUBLIC_IPV6"
  echo "stdin=$(cat)"
  echo "--"
} >> "$(dirname "$0")/$me-$what.log"
[ $# -gt 0 ] && exec "$@"
exit 0
`;

const PRE = `#!/bin/sh
echo "data-of $(ip -4 -o addr show dev eth0 | awk '{print $4}')"
`;

/** The complete records (one per run, ended by `--`) in a node's log for `what`. */
function records(dir: string, nodeIp: string, what: string): Array<Record<string, string>> {
  const file = join(dir, `${nodeIp}-${what}.log`);
  if (!existsSync(file)) return [];
  const parts = readFileSync(file, 'utf8').split('--\n');
  parts.pop(); // what follows the last `--`: a record still being written, or nothing
  return parts.map((r) => {
    const o: Record<string, string> = {};
    for (const line of r.split('\n')) {
      const i = line.indexOf('=');
      if (i > 0) o[line.slice(0, i)] = line.slice(i + 1);
    }
    return o;
  });
}

/** `10.5.38.1/24` → `10.5.38.0/24`. */
const subnetOf = (flannelSubnet: string) => flannelSubnet.replace(/\.1\//, '.0/');

describe('extension backend: flannel’s four commands, run without a shell', { skip }, () => {
  let c: Cluster;
  let dir: string;
  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'weft-ext-'));
    chmodSync(dir, 0o755);
    for (const [name, text] of [
      ['record.sh', RECORD],
      ['pre.sh', PRE],
    ] as const) {
      writeFileSync(join(dir, name), text);
      chmodSync(join(dir, name), 0o755);
    }
    const rec = join(dir, 'record.sh');
    c = await Cluster.create({
      nodes: 2,
      backend: {
        Type: 'extension',
        PreStartupCommand: join(dir, 'pre.sh'),
        // `;` and `|` are arguments here: a shell would have run `echo` on its own
        PostStartupCommand: `${rec} post ; echo $SUBNET|x`,
        SubnetAddCommand: `${rec} add -- ip route replace $SUBNET via $PUBLIC_IP`,
        SubnetRemoveCommand: `${rec}   remove -- ip route del $SUBNET via $PUBLIC_IP`,
      },
    });
  });
  after(async () => {
    await c?.destroy();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  test('each lease publishes BackendType extension and PreStartupCommand’s output as BackendData', async () => {
    const store = new EmbeddedRegistry(c.storeDir);
    try {
      const { leases } = await store.listSubnets();
      for (const n of c.nodes) {
        const key = subnetOf(n.env.FLANNEL_SUBNET!).replace('/', '-');
        const lease = leases.find((l) => l.key === key);
        assert.ok(lease, `${n.name}: no lease ${key}`);
        const value = JSON.parse(lease.value) as Record<string, unknown>;
        assert.equal(value.BackendType, 'extension');
        assert.equal(value.BackendData, `data-of ${n.ip}/24`);
      }
    } finally {
      await store.close();
    }
  });

  test('PostStartupCommand ran once with NETWORK, SUBNET, PUBLIC_IP (no shell: `;` and `|` are arguments)', () => {
    for (const n of c.nodes) {
      const [r, more] = records(dir, n.ip, 'post');
      assert.ok(r, `${n.name}: PostStartupCommand did not run`);
      assert.equal(more, undefined, `${n.name}: ran twice`);
      assert.equal(r.args, `[;][echo][${subnetOf(n.env.FLANNEL_SUBNET!)}|x]`);
      assert.equal(r.NETWORK, CLUSTER_NETWORK);
      assert.equal(r.SUBNET, subnetOf(n.env.FLANNEL_SUBNET!));
      assert.equal(r.PUBLIC_IP, n.ip);
      assert.equal(r.IPV6SUBNET, '');
      assert.equal(r.stdin, '');
    }
  });

  test('SubnetAddCommand saw the peer’s subnet, public IP and BackendData; its route carries the pods’ ping', async () => {
    for (const [i, n] of c.nodes.entries()) {
      const peer = c.nodes[1 - i]!;
      const peerSubnet = subnetOf(peer.env.FLANNEL_SUBNET!);
      const adds = await waitFor(
        () => {
          const r = records(dir, n.ip, 'add');
          return r.length > 0 ? r : null;
        },
        20_000,
        `${n.name}: SubnetAddCommand`,
      );
      assert.deepEqual(
        adds!.map((r) => [r.SUBNET, r.PUBLIC_IP, r.stdin]),
        [[peerSubnet, peer.ip, `data-of ${peer.ip}/24`]],
      );
      // the record is written before record.sh execs `ip route replace`
      await waitFor(
        () => new RegExp(`via ${peer.ip} dev eth0`).test(c.ipIn(i, 'route', 'show', peerSubnet)),
        20_000,
        `${n.name}: the route to ${peerSubnet}`,
      );
    }
    const [a, b] = [c.pods[0]!, c.pods[1]!];
    await nsExecAsync(a.ns, 'ping', ['-c', '2', '-i', '0.2', '-w', '20', b.ip], 30_000);
    await nsExecAsync(b.ns, 'ping', ['-c', '2', '-i', '0.2', '-w', '20', a.ip], 30_000);
  });

  test('a lease removed: SubnetRemoveCommand runs on the other node and its route goes', async () => {
    const [n0, n1] = [c.nodes[0]!, c.nodes[1]!];
    const gone = subnetOf(n1.env.FLANNEL_SUBNET!);
    await c.stopDaemon(1);
    const store = new EmbeddedRegistry(c.storeDir);
    try {
      await store.deleteSubnet(gone.replace('/', '-'));
    } finally {
      await store.close();
    }
    const removes = await waitFor(
      () => {
        const r = records(dir, n0.ip, 'remove');
        return r.length > 0 ? r : null;
      },
      20_000,
      'SubnetRemoveCommand on node 0',
    );
    assert.deepEqual(
      removes!.map((r) => [r.SUBNET, r.PUBLIC_IP, r.stdin]),
      [[gone, n1.ip, `data-of ${n1.ip}/24`]],
    );
    await waitFor(
      () => c.ipIn(0, 'route', 'show', gone).trim() === '',
      20_000,
      `node 0: the route to ${gone} removed`,
    );
  });
});
