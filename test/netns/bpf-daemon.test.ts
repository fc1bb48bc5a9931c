/**
 * The bpf engine behind real `weft daemon`s (embedded store), in namespaces built by
 * src/testbed/cluster.ts, for the userspace backends started with --dataplane-engine=bpf, and
 * for ipip with "Dataplane": "auto" on a kernel without the ipip module (auto: bpf):
 *
 *            underlay br0 (L2)                 10.250.0.0/24
 *     ┌──────────┴──────────┐
 *   node 0               node 1               eth0 ingress: weft_rx
 *   flannel0 / flannel.1 / flannel.ipip TUN (egress: weft_tx), cni0 10.5.X.1/24
 *   pod 0.0              pod 1.0
 *
 * Pods ping both ways and iperf3 TCP crosses; /metrics says the bpf engine runs and that the
 * programs, not the userspace engine, moved the packets.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Cluster, waitFor } from '../../src/testbed/cluster.js';
import { isRoot, nsExecAsync } from '../../src/testbed/netns.js';
import { iperf } from '../../src/testbed/probes.js';
import { TCP_FIXED, assertCounted, delivered } from '../helpers/carried.js';
import { sample, scrape } from '../helpers/scrape.js';
import { ipipMissing } from '../helpers/ipip.js';

const skip = isRoot() ? false : 'needs root (network namespaces, bpf)';
const HEALTH_PORT = '9094';

const metrics = (ns: string) => scrape(ns, HEALTH_PORT);
const value = sample;

const bpfFlag = ['--dataplane-engine', 'bpf'];
const withModule =
  isRoot() && ipipMissing() === null
    ? 'this kernel has the ipip module: "auto" runs the kernel device, not an engine'
    : false;
const cases = [
  { name: 'udp backend with --dataplane-engine=bpf', backend: { Type: 'udp' }, flags: bpfFlag },
  {
    name: 'vxlan backend (userspace) with --dataplane-engine=bpf',
    backend: { Type: 'vxlan', Dataplane: 'userspace' },
    flags: bpfFlag,
  },
  {
    name: 'ipip backend (userspace) with --dataplane-engine=bpf',
    backend: { Type: 'ipip', Dataplane: 'userspace' },
    flags: bpfFlag,
  },
  {
    name: 'ipip backend, Dataplane "auto", no ipip module: the bpf engine',
    backend: { Type: 'ipip', Dataplane: 'auto' },
    flags: [],
    skip: withModule,
  },
];

for (const { name, backend, flags, skip: why = false } of cases) {
  describe(name, { skip: skip || why }, () => {
    let c: Cluster;
    before(async () => {
      c = await Cluster.create({
        nodes: 2,
        backend,
        flags: [...flags, '--healthz-port', HEALTH_PORT, '--healthz-ip', '127.0.0.1'],
      });
    });
    after(async () => {
      await c?.destroy();
    });

    test('pods ping both ways and iperf3 TCP crosses, through the programs', async () => {
      const [a, b] = [c.pods[0]!, c.pods[1]!];
      await waitFor(
        async () => {
          await nsExecAsync(a.ns, 'ping', ['-c', '1', '-W', '2', b.ip]);
          return true;
        },
        15_000,
        'first ping',
      );
      await nsExecAsync(b.ns, 'ping', ['-c', '3', '-i', '0.2', '-W', '2', a.ip]);
      const m0 = await metrics(c.nodes[0]!.ns);
      const run = await iperf(c.scope, b.ns, b.ip, a.ns, TCP_FIXED);
      const m = await metrics(c.nodes[0]!.ns);
      assertCounted(m0, m, 'weft_dataplane_tx_bytes_total', delivered(run.json));
      assert.equal(value(m, 'weft_dataplane_engine', '{engine="bpf"}'), 1);
      assert.equal(value(m, 'weft_dataplane_engine', '{engine="native"}'), 0);
      // The userspace engine saw almost nothing: what it read from the TUN is what the programs
      // passed (no peer yet at the first packets, neighbour discovery).
      assert.ok(value(m, 'weft_dataplane_tun_reads_total') < 100, m);
    });
  });
}
