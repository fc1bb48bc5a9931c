/**
 * The bench's bpf rows on the bench's own testbed (src/testbed/bench-cluster.ts, exactly what
 * bench/run.ts builds): `--dataplane-engine=bpf`, `--ip-masq`, pods made by weft-cni behind
 * cni0, a default route in the nodes, the built daemons started together.
 *
 *            underlay br0 10.250.0.254 (the nodes' default route)
 *     ┌──────────┴──────────┐
 *   node 0 eth0          node 1 eth0             ingress: weft_rx
 *   flannel.1 / flannel0 TUN (egress: weft_tx), cni0 (weft-cni: bridge + host-local)
 *   pod 0.0              pod 1.0
 *
 * Found by the bench: both bpf rows' pods could not reach each other. The cause was a stale
 * programs object (native/build/weft.bpf.o built before weft.bpf.c learnt to push a MAC header
 * for bpf_redirect_neigh): it loaded, passed the probe (test runs carry an Ethernet header) and
 * dropped every packet the TUN sent, and `npm run build` never rebuilt it. Now the object carries
 * its source's hash and the engine refuses one built from another weft.bpf.c, so the bench row
 * says the bpf engine did not start instead of measuring a broken one.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { appendFileSync, copyFileSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { bpfSourcePath } from '../../src/dataplane/bpf-binding.js';
import { buildBenchCluster } from '../../src/testbed/bench-cluster.js';
import { type Cluster, HEALTH_PORT } from '../../src/testbed/cluster.js';
import { isRoot } from '../../src/testbed/netns.js';
import { TCP_FIXED, delivered } from '../helpers/carried.js';
import { sample, scrape } from '../helpers/scrape.js';
import { iperf, ping, waitForMesh } from '../../src/testbed/probes.js';

const skip = isRoot() ? false : 'needs root (network namespaces, bpf)';

const metrics = (ns: string) => scrape(ns, HEALTH_PORT);
const value = sample;
const BYPASS = 'weft_dataplane_bpf_bridge_bypass_packets_total';

const BACKENDS = [{ Type: 'vxlan', Dataplane: 'userspace' }, { Type: 'udp' }] as const;

for (const backend of BACKENDS) {
  describe(`bench testbed, ${backend.Type} with --dataplane-engine=bpf`, { skip }, () => {
    let c: Cluster | undefined;
    after(async () => {
      await c?.destroy();
    });

    test('pods on the two nodes reach each other, through the programs', async () => {
      c = await buildBenchCluster({ backend, flags: ['--dataplane-engine=bpf'] });
      await c.startDaemons();
      const pods = await c.addPods(1);
      assert.equal(await waitForMesh(pods, 15_000), 0, 'pod pairs unreachable');
      const pings = await ping(pods[0]!.ns, pods[1]!.ip, 20, 0.01);
      assert.equal(pings.received, 20);
      for (const n of c.nodes) {
        const m = await metrics(n.ns);
        assert.equal(value(m, 'weft_dataplane_engine', '{engine="bpf"}'), 1);
        // 20 echo requests (node 0) or replies (node 1) left: had the programs not sent them,
        // the userspace engine would have read each one from the TUN.
        assert.ok(value(m, 'weft_dataplane_tx_packets_total') >= 20, m);
        assert.ok(value(m, 'weft_dataplane_tun_reads_total') < 20, m);
      }
    });

    test('TCP super-packets reach the receiving pod past the bridge, whole', async () => {
      assert.ok(c, 'the testbed of the test before');
      const [a, b] = [c.pods[0]!, c.pods[1]!];
      const before = value(await metrics(c.nodes[1]!.ns), BYPASS);
      const tcp = await iperf(c.scope, b.ns, b.ip, a.ns, TCP_FIXED);
      delivered(tcp.json);
      // weft_bridge on node 1's cni0 handed the decapsulated GSO packets to pod 1's port (the
      // bridge would have segmented them); the ACKs node 0 receives are not GSO.
      assert.ok(value(await metrics(c.nodes[1]!.ns), BYPASS) > before);
    });
  });
}

describe('bench testbed: a programs object built from another weft.bpf.c', { skip }, () => {
  let c: Cluster | undefined;
  let dir = '';
  before(() => {
    // The shipped source with one more line: a build of it is not a build of weft.bpf.c.
    dir = mkdtempSync(join(tmpdir(), 'weft-stale-bpf-'));
    const src = join(dir, 'weft.bpf.c');
    copyFileSync(bpfSourcePath(), src);
    appendFileSync(src, '// an older or newer revision\n');
    const arch = spawnSync('cc', ['-dumpmachine'], { encoding: 'utf8' }).stdout.trim();
    const r = spawnSync('clang', [
      ...['-O2', '-g', '-target', 'bpf', `-I/usr/include/${arch || 'x86_64-linux-gnu'}`],
      // weft_abi.h and the headers it includes stay beside the shipped source.
      `-I${dirname(bpfSourcePath())}`,
      ...['-DWEFT_SOURCE_SHA256="0000"', '-c', src, '-o', join(dir, 'weft.bpf.o')],
    ]);
    assert.equal(r.status, 0, String(r.stderr));
  });
  after(async () => {
    await c?.destroy();
    rmSync(dir, { recursive: true, force: true });
  });

  test('is refused at start, naming the rebuild; the native engine carries the pods', async () => {
    c = await buildBenchCluster({
      backend: { Type: 'udp' },
      flags: ['--dataplane-engine=bpf'],
      env: { WEFT_BPF_OBJECT: join(dir, 'weft.bpf.o') },
    });
    await c.startDaemons();
    const pods = await c.addPods(1);
    const silent = await waitForMesh(pods, 15_000);
    const warnings = c.nodes.flatMap((n, i) =>
      n.logs
        .filter((l) =>
          typeof l.level === 'number' ? l.level >= 40 : !/^(info|debug|trace)$/.test(l.level),
        )
        .map((l) => ({ node: i, ...l })),
    );
    assert.equal(
      silent,
      0,
      `pod pairs unreachable; the nodes' warnings: ${JSON.stringify(warnings)}`,
    );
    for (const n of c.nodes) {
      const m = await metrics(n.ns);
      assert.equal(value(m, 'weft_dataplane_engine', '{engine="bpf"}'), 0);
      assert.equal(value(m, 'weft_dataplane_engine', '{engine="native"}'), 1);
      const why = n.logs.find((l) => l.msg.startsWith('bpf engine unavailable'));
      assert.ok(why, 'the fallback is logged');
      assert.match(String(why.err), /stale object .*build-native\.mjs --bpf/);
    }
  });
});
