/**
 * flannel's vxlan `MTU`, `Learning` and `GBP` options on real `weft daemon`s (embedded store), in
 * namespaces built by src/testbed/cluster.ts:
 *
 *            underlay br0 (L2, MTU 1500)          10.250.0.0/24
 *     ┌──────────┴──────────┐
 *   node 0               node 1                  flannel.1: the kernel vxlan device, or the
 *   flannel.1, cni0      flannel.1, cni0         userspace dataplane's TUN (native, bpf engine)
 *   pod 0.0              pod 1.0                 pods' eth0 MTU = FLANNEL_MTU
 *
 * "MTU": 1400 on every vxlan engine: flannel.1 has MTU 1350, subnet.env says FLANNEL_MTU=1350
 * (flannel's MTU − 50), the pods get it, and a 1350-byte don't-fragment ping crosses. Learning
 * and GBP: the kernel device shows `learning` and `gbp` in `ip -d link`, and pods ping across.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Cluster, waitFor } from '../../src/testbed/cluster.js';
import { ip, isRoot, nsExecAsync } from '../../src/testbed/netns.js';
import { runWeft } from '../helpers/daemon.js';

const skip = isRoot() ? false : 'needs root (network namespaces)';

/** A ping of `size` bytes on the wire (IPv4 20 + ICMP 8 + payload), don't-fragment. */
async function pingDF(ns: string, dst: string, size: number): Promise<string> {
  return nsExecAsync(
    ns,
    'ping',
    ['-c', '2', '-i', '0.2', '-w', '20', '-M', 'do', '-s', String(size - 28), dst],
    30_000,
  );
}

const ENGINES = [
  { name: 'kernel', backend: { Type: 'vxlan' }, flags: [] as string[], engine: null },
  {
    name: 'userspace (native engine)',
    backend: { Type: 'vxlan', Dataplane: 'userspace' },
    flags: ['--dataplane-engine', 'native'],
    engine: 'native',
  },
  {
    name: 'userspace (bpf engine)',
    backend: { Type: 'vxlan', Dataplane: 'userspace' },
    flags: ['--dataplane-engine', 'bpf'],
    engine: 'bpf',
  },
];

for (const engine of ENGINES) {
  describe(`vxlan "MTU": 1400, ${engine.name}`, { skip }, () => {
    let c: Cluster;
    before(async () => {
      c = await Cluster.create({
        nodes: 2,
        backend: { ...engine.backend, MTU: 1400 },
        flags: engine.flags,
      });
    });
    after(async () => {
      await c?.destroy();
    });

    test('flannel.1 has MTU 1350 and subnet.env FLANNEL_MTU=1350 (MTU − 50)', () => {
      for (const [i, n] of c.nodes.entries()) {
        // the engine asked for is the one that runs (no fallback measured under its name)
        const started = n.logs.find((l) => l.msg === 'userspace dataplane started');
        assert.equal(started?.engine ?? null, engine.engine, n.name);
        assert.match(c.ipIn(i, 'link', 'show', 'flannel.1'), /\bmtu 1350\b/, n.name);
        assert.equal(n.env.FLANNEL_MTU, '1350', n.name);
      }
    });

    test('the pods get MTU 1350 and a 1350-byte don\u2019t-fragment ping crosses', async () => {
      const [a, b] = [c.pods[0]!, c.pods[1]!];
      assert.match(ip(a.ns, 'link', 'show', 'eth0'), /\bmtu 1350\b/);
      await waitFor(
        async () => {
          await nsExecAsync(a.ns, 'ping', ['-c', '1', '-W', '2', b.ip]);
          return true;
        },
        20_000,
        'first ping',
      );
      const out = await pingDF(a.ns, b.ip, 1350);
      assert.match(out, /2 received/);
    });
  });
}

describe('vxlan "Learning": true, "GBP": true on the kernel device', { skip }, () => {
  let c: Cluster;
  before(async () => {
    c = await Cluster.create({
      nodes: 2,
      backend: { Type: 'vxlan', Learning: true, GBP: true },
    });
  });
  after(async () => {
    await c?.destroy();
  });

  test('ip -d link shows learning and gbp on flannel.1', () => {
    for (const i of [0, 1]) {
      // (the text form prints only `nolearning`: the JSON form says learning either way)
      const [link] = JSON.parse(c.ipIn(i, '-d', '-j', 'link', 'show', 'flannel.1')) as Array<{
        linkinfo: { info_kind: string; info_data: Record<string, unknown> };
      }>;
      const data = link!.linkinfo.info_data;
      assert.equal(link!.linkinfo.info_kind, 'vxlan');
      assert.equal(data.id, 1);
      assert.equal(data.learning, true, JSON.stringify(data));
      assert.equal(data.gbp, true, JSON.stringify(data));
      assert.match(c.ipIn(i, '-d', 'link', 'show', 'flannel.1'), / gbp /);
    }
  });

  test('pods ping across (both devices speak VXLAN-GBP)', async () => {
    const [a, b] = [c.pods[0]!, c.pods[1]!];
    await waitFor(
      async () => {
        await nsExecAsync(a.ns, 'ping', ['-c', '1', '-W', '2', b.ip]);
        return true;
      },
      20_000,
      'first ping',
    );
    assert.match(
      await nsExecAsync(b.ns, 'ping', ['-c', '2', '-i', '0.2', '-w', '20', a.ip], 30_000),
      /2 received/,
    );
  });
});

for (const option of ['Learning', 'GBP']) {
  test(`weft config set refuses "${option}": true with "Dataplane": "userspace" (exit 2, naming it)`, async () => {
    const dir = mkdtempSync(join(tmpdir(), 'weft-vxlan-opt-'));
    try {
      const file = join(dir, 'net-conf.json');
      writeFileSync(
        file,
        JSON.stringify({
          Network: '10.5.0.0/16',
          Backend: { Type: 'vxlan', Dataplane: 'userspace', [option]: true },
        }),
      );
      const r = await runWeft(['config', 'set', file, '--store-dir', join(dir, 'store')]);
      assert.equal(r.code, 2, r.stderr);
      assert.match(r.stderr, new RegExp(`Backend\\.${option}: the userspace vxlan dataplane`));
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
}
