/**
 * The bpf engine's bridge bypass learns the pods' bridge from control's rtnetlink watch (no
 * sysfs poll): a bridge not named cni0 (`pods0`, the CNI delegate's `bridge` and the daemons'
 * --pod-bridge), made by weft-cni with the first pod after the daemons started.
 *
 *            underlay br0 10.250.0.254/24
 *     ┌──────────┴──────────┐
 *   node 0 eth0          node 1 eth0             ingress: weft_rx
 *   flannel.1 TUN (egress: weft_tx)  vxlan userspace, --dataplane-engine=bpf
 *   pods0 (weft-cni, after start)    pods0 (egress: weft_bridge) ─ vethX ─ pod 1.0
 *   pod 0.0
 *
 * Asserted on node 1: weft_bridge is on pods0, its port map (weft_ports) holds pod 1.0's MAC
 * with the ifindex of pod 1.0's port, and TCP super-packets from pod 0.0 took that port past
 * the bridge (the bypass counter grew).
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Cluster, HEALTH_PORT, waitFor } from '../../src/testbed/cluster.js';
import { isRoot, nsExec } from '../../src/testbed/netns.js';
import { iperf, waitForMesh } from '../../src/testbed/probes.js';
import { tcxIn } from '../helpers/bpf.js';
import { TCP_FIXED, delivered } from '../helpers/carried.js';
import { sample, scrape } from '../helpers/scrape.js';

const skip = isRoot() ? false : 'needs root (network namespaces, bpf)';
const BRIDGE = 'pods0';
const BYPASS = 'weft_dataplane_bpf_bridge_bypass_packets_total';

const json = <T>(ns: string, cmd: string, args: string[]): T =>
  JSON.parse(nsExec(ns, cmd, args)) as T;

/** weft_ports of the program `prog` as MAC → port ifindex. */
function portMap(ns: string, prog: number): Map<string, number> {
  const { map_ids: ids = [] } = json<{ map_ids?: number[] }>(ns, 'bpftool', [
    '-j',
    'prog',
    'show',
    'id',
    String(prog),
  ]);
  for (const id of ids) {
    const m = json<{ name: string }>(ns, 'bpftool', ['-j', 'map', 'show', 'id', String(id)]);
    if (m.name !== 'weft_ports') continue;
    const entries = json<Array<{ key: string[]; value: string[] }>>(ns, 'bpftool', [
      '-j',
      'map',
      'dump',
      'id',
      String(id),
    ]);
    const bytes = (hex: string[]) => Buffer.from(hex.map((h) => parseInt(h, 16)));
    return new Map(
      entries.map((e) => [
        [...bytes(e.key).subarray(0, 6)].map((b) => b.toString(16).padStart(2, '0')).join(':'),
        bytes(e.value).readUInt32LE(0),
      ]),
    );
  }
  throw new Error(`program ${prog} has no weft_ports map`);
}

describe(
  `bpf engine: the pods' bridge ${BRIDGE} (not cni0) followed through netlink`,
  { skip },
  () => {
    let c: Cluster;
    before(async () => {
      c = await Cluster.build({
        nodes: 2,
        backend: { Type: 'vxlan', Dataplane: 'userspace' },
        podWiring: 'cni',
        podBridge: BRIDGE,
        flags: ['--dataplane-engine=bpf'],
      });
      await c.startDaemons();
    });
    after(async () => {
      await c?.destroy();
    });

    test('a pod added after start is in the port map and its TCP super-packets bypass the bridge', async () => {
      const node = c.nodes[1]!;
      assert.equal(
        sample(await scrape(node.ns, HEALTH_PORT), 'weft_dataplane_engine', '{engine="bpf"}'),
        1,
      );
      // no bridge yet: weft-cni makes it with the first pod
      assert.doesNotMatch(nsExec(node.ns, 'ip', ['-o', 'link', 'show']), /: pods0[:@]/);
      const pods = await c.addPods(1);
      assert.equal(await waitForMesh(pods, 15_000), 0, 'pod pairs unreachable');
      const pod = node.pods[0]!;
      assert.doesNotMatch(nsExec(node.ns, 'ip', ['-o', 'link', 'show']), /: cni0[:@]/);

      const [prog] = (await waitFor(
        () => {
          const p = tcxIn(node.ns, BRIDGE, 'egress');
          return p.length === 1 ? p : null;
        },
        10_000,
        `weft_bridge on ${BRIDGE}`,
      ))!;
      assert.equal(
        json<{ name: string }>(node.ns, 'bpftool', ['-j', 'prog', 'show', 'id', String(prog)]).name,
        'weft_bridge',
      );
      const [{ address: mac }] = json<Array<{ address: string }>>(pod.ns, 'ip', [
        '-j',
        'link',
        'show',
        'eth0',
      ]) as [{ address: string }];
      const [{ ifindex: port }] = json<Array<{ ifindex: number }>>(node.ns, 'ip', [
        '-j',
        'link',
        'show',
        'master',
        BRIDGE,
      ]) as [{ ifindex: number }];
      // learnt by the bridge from the pod's first frames, reported by netlink
      await waitFor(
        () => portMap(node.ns, prog!).get(mac) === port,
        10_000,
        'the pod in weft_ports',
      );

      const before = sample(await scrape(node.ns, HEALTH_PORT), BYPASS);
      delivered((await iperf(c.scope, pod.ns, pod.ip, c.nodes[0]!.pods[0]!.ns, TCP_FIXED)).json);
      assert.ok(sample(await scrape(node.ns, HEALTH_PORT), BYPASS) > before, 'bridge bypass grew');
    });
  },
);
