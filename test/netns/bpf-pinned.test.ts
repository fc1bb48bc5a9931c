/**
 * The bpf engine's pinned tcx links (src/dataplane/bpf-pins.ts) behind real `weft daemon`s with
 * --dataplane-engine=bpf (udp, vxlan and ipip userspace), on 2-node clusters (src/testbed/cluster.ts, embedded store) whose
 * daemons see a bpffs of their own (src/testbed/bpffs.ts: a private mount namespace; the host's
 * mount table and /sys/fs/bpf never see it, and it goes with the cluster):
 *
 *            underlay br0 10.250.0.254/24
 *       u0 ┌──────────┴──────────┐ u1
 *   node 0 weft daemon        node 1 weft daemon  ← kill -9 / SIGTERM / restart
 *   TUN egress: weft_tx       pins <bpffs>/weft/<tun>-<netns inode>/{tx,rx,bridge}
 *   eth0 ingress: weft_rx
 *   cni0 ─ pod 0.0            cni0 ─ pod 1.0
 *
 * After kill -9 no weft process is left in node 1's namespace, yet pods ping both ways: the
 * pinned links keep the programs (and, through them, the peer maps) on the devices. The restarted
 * daemon takes the same links over (same pin paths and link ids, its own programs on them, its
 * counters counting). A pin that no longer fits (its device deleted, a map where a link belongs)
 * is replaced. A SIGTERM keeps the pins as it keeps the TUN; --release-lease-on-exit removes
 * them with the TUN: nothing pinned, no weft program on the devices. The engine on its own
 * (dataplane-node.ts): a TUN that is not persistent gets no pins and its stop leaves nothing; a
 * persistent one's pins outlive kill -9 and a clsact start (never pinned) removes them. Nothing
 * here is timed: the blackout figures come from bench/restart-blackout.ts.
 */
import assert from 'node:assert/strict';
import { existsSync, readFileSync, readdirSync, statSync, unlinkSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { loadNative } from '../../src/common/native.js';
import { PIN_DIR_ENV, pinDirName } from '../../src/dataplane/bpf-pins.js';
import type { BpfPinInfo } from '../../src/common/native-addon.js';
import { PrivateBpffs } from '../../src/testbed/bpffs.js';
import { Cluster, PACKAGE_ROOT, type Pod, waitFor } from '../../src/testbed/cluster.js';
import { NetnsScope, isRoot, nsExec, pidsIn } from '../../src/testbed/netns.js';
import { type Node, type Side, startNode, twoNodes } from '../helpers/dataplane-pair.js';
import { ping } from '../../src/testbed/probes.js';
import { sample, scrape } from '../helpers/scrape.js';
import { progGone, tcxIn } from '../helpers/bpf.js';

const skip = isRoot() ? false : 'needs root (network namespaces, bpf, a private bpffs)';
const HEALTH_PORT = '9095';
const TOOK_OVER = 'bpf programs took over the pinned links';

const pings = async (from: Pod, to: Pod) => (await ping(from.ns, to.ip, 1)).received === 1;

/** Node i's pin directory as this process reaches it (through the bpffs holder). */
function pinDir(c: Cluster, i: number, dev: string): string {
  const ino = statSync(`/run/netns/${c.nodes[i]!.ns}`).ino;
  return c.bpffs!.view(join(c.bpffs!.dir, 'weft', pinDirName(dev, ino)));
}

function pin(c: Cluster, i: number, dev: string, name: string): BpfPinInfo | null {
  return loadNative().bpfPinInfo(join(pinDir(c, i, dev), name));
}

function ifindex(c: Cluster, i: number, dev: string): number {
  return Number(JSON.parse(c.ipIn(i, '-j', 'link', 'show', 'dev', dev))[0].ifindex);
}

/** The weft daemons alive in node i's namespace (the pods have their own). */
function weftProcesses(c: Cluster, i: number): number[] {
  return pidsIn(c.nodes[i]!.ns).filter((pid) => {
    try {
      return readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes('weft');
    } catch {
      return false;
    }
  });
}

const tcx = (c: Cluster, i: number, dev: string, hook: 'ingress' | 'egress') =>
  tcxIn(c.nodes[i]!.ns, dev, hook);

const kill9 = (c: Cluster, i: number) => c.killDaemon(i);

const FLAGS = ['--dataplane-engine=bpf', `--healthz-port=${HEALTH_PORT}`, '--healthz-ip=127.0.0.1'];

const BACKENDS: ReadonlyArray<[string, Record<string, unknown>, string]> = [
  ['udp', { Type: 'udp' }, 'flannel0'],
  ['vxlan userspace', { Type: 'vxlan', Dataplane: 'userspace' }, 'flannel.1'],
  ['ipip userspace', { Type: 'ipip', Dataplane: 'userspace' }, 'flannel.ipip'],
];

for (const [name, backend, dev] of BACKENDS) {
  describe(`${name} with --dataplane-engine=bpf: pinned links outlive kill -9`, { skip }, () => {
    let c: Cluster;
    before(async () => {
      c = await Cluster.create({ nodes: 2, backend, bpffs: true, flags: FLAGS });
      await waitFor(() => pings(c.pods[0]!, c.pods[1]!), 20_000, 'first ping');
    });
    after(async () => {
      await c?.destroy();
    });

    test('the pins are in the cluster’s own bpffs, never the host’s', async () => {
      assert.equal(PrivateBpffs.hostSees(c.bpffs!.dir), false, 'host mount table');
      assert.deepEqual(readdirSync(c.bpffs!.dir), [], 'the host sees an empty directory');
      assert.equal(existsSync('/sys/fs/bpf/weft'), false, 'nothing under the host’s /sys/fs/bpf');
      for (const i of [0, 1]) {
        // weft_bridge follows cni0 (made with the first pod) within a second
        await waitFor(() => pin(c, i, dev, 'bridge') !== null, 10_000, 'bridge link pinned');
        assert.deepEqual(readdirSync(pinDir(c, i, dev)).sort(), ['bridge', 'rx', 'tx']);
        const tx = pin(c, i, dev, 'tx')!;
        assert.equal(tx.kind, 'link');
        assert.equal(tx.progName, 'weft_tx');
        assert.equal(tx.ifindex, ifindex(c, i, dev), 'tx on the TUN');
        assert.deepEqual(tcx(c, i, dev, 'egress'), [tx.progId], 'the one program on the TUN');
        assert.equal(pin(c, i, dev, 'rx')!.ifindex, ifindex(c, i, 'eth0'), 'rx on the underlay');
        assert.equal(pin(c, i, dev, 'bridge')!.ifindex, ifindex(c, i, 'cni0'), 'bridge on cni0');
      }
    });

    test('kill -9: pods ping with no weft process; the restart takes the same links over', async () => {
      const before = { tx: pin(c, 1, dev, 'tx')!, rx: pin(c, 1, dev, 'rx')! };
      await kill9(c, 1);
      assert.deepEqual(weftProcesses(c, 1), [], 'no weft process in node 1’s namespace');
      assert.ok(await pings(c.pods[0]!, c.pods[1]!), 'pod 0.0 → pod 1.0 with no daemon');
      assert.ok(await pings(c.pods[1]!, c.pods[0]!), 'pod 1.0 → pod 0.0 with no daemon');
      assert.deepEqual(weftProcesses(c, 1), [], 'still none');
      assert.deepEqual(pin(c, 1, dev, 'tx'), before.tx, 'the link and its program untouched');

      await c.startDaemon(1);
      const took = c.nodes[1]!.logs.find((l) => l.msg === TOOK_OVER);
      assert.ok(took, 'the new daemon took the pinned links over');
      assert.equal(took.links, 2);
      for (const [slot, was] of Object.entries(before)) {
        const now = pin(c, 1, dev, slot)!;
        assert.equal(now.id, was.id, `${slot}: the same link`);
        assert.equal(now.ifindex, was.ifindex, `${slot}: on the same device`);
        assert.notEqual(now.progId, was.progId, `${slot}: the new daemon’s program`);
        assert.equal(now.progName, was.progName);
      }
      // The new programs count into the new daemon's counters: what crosses now is its own.
      const m0 = await scrape(c.nodes[1]!.ns, HEALTH_PORT);
      const r = await ping(c.pods[1]!.ns, c.pods[0]!.ip, 5, 0.05);
      assert.equal(r.received, 5);
      const m1 = await scrape(c.nodes[1]!.ns, HEALTH_PORT);
      const tx = (m: string) => sample(m, 'weft_dataplane_tx_packets_total');
      assert.ok(tx(m1) - tx(m0) >= 5, `tx_packets ${tx(m0)} → ${tx(m1)}`);
      assert.equal(sample(m1, 'weft_dataplane_engine', '{engine="bpf"}'), 1);
      assert.deepEqual(tcx(c, 1, dev, 'egress'), [pin(c, 1, dev, 'tx')!.progId], 'TUN: ours alone');
      const rx = pin(c, 1, dev, 'rx')!.progId;
      assert.deepEqual(tcx(c, 1, 'eth0', 'ingress'), [rx], 'underlay: ours alone');
    });
  });
}

describe('udp with --dataplane-engine=bpf: replaced, kept and removed pins', { skip }, () => {
  let c: Cluster;
  before(async () => {
    c = await Cluster.create({ nodes: 2, backend: { Type: 'udp' }, bpffs: true, flags: FLAGS });
    await waitFor(() => pings(c.pods[0]!, c.pods[1]!), 20_000, 'first ping');
  });
  after(async () => {
    await c?.destroy();
  });

  test('incompatible pins (device deleted, a map where a link was) are replaced', async () => {
    const rxBefore = pin(c, 1, 'flannel0', 'rx')!;
    await kill9(c, 1);
    c.ipIn(1, 'link', 'del', 'flannel0');
    assert.equal(pin(c, 1, 'flannel0', 'tx')!.ifindex, 0, 'the tx link lost its device');
    const rxPath = join(pinDir(c, 1, 'flannel0'), 'rx');
    unlinkSync(rxPath);
    nsExec(c.nodes[1]!.ns, 'bpftool', [
      'map',
      'create',
      rxPath,
      'type',
      'array',
      'key',
      '4',
      'value',
      '4',
      'entries',
      '1',
      'name',
      'foreign',
    ]);
    assert.equal(pin(c, 1, 'flannel0', 'rx')!.kind, 'map');
    await c.startDaemon(1);
    const line = c.nodes[1]!.logs.find((l) => l.msg === 'pinned bpf links replaced');
    assert.ok(line, 'replacement logged');
    assert.deepEqual(line.replaced, ['tx: its device is gone', 'rx: a map, not a link']);
    const tx = pin(c, 1, 'flannel0', 'tx')!;
    const rx = pin(c, 1, 'flannel0', 'rx')!;
    assert.equal(tx.kind, 'link');
    assert.equal(tx.ifindex, ifindex(c, 1, 'flannel0'), 'tx on the new TUN');
    assert.equal(rx.kind, 'link');
    assert.notEqual(rx.id, rxBefore.id, 'a new rx link');
    await waitFor(() => pings(c.pods[1]!, c.pods[0]!), 20_000, 'pod 1.0 → pod 0.0');
    assert.ok(await pings(c.pods[0]!, c.pods[1]!));
  });

  test('SIGTERM keeps the pins with the TUN; --release-lease-on-exit removes both', async () => {
    await c.stopDaemon(1);
    assert.deepEqual(readdirSync(pinDir(c, 1, 'flannel0')).sort(), ['bridge', 'rx', 'tx']);
    assert.ok(await pings(c.pods[0]!, c.pods[1]!), 'forwarding on after a SIGTERM');
    await c.startDaemon(1, ['--release-lease-on-exit']);
    const progs = ['tx', 'rx', 'bridge'].map((n) => pin(c, 1, 'flannel0', n)!.progId);
    await c.stopDaemon(1);
    assert.equal(existsSync(pinDir(c, 1, 'flannel0')), false, 'the pin directory went');
    assert.deepEqual(tcx(c, 1, 'eth0', 'ingress'), [], 'no program on the underlay');
    assert.deepEqual(tcx(c, 1, 'cni0', 'egress'), [], 'no program on the bridge');
    assert.doesNotMatch(c.ipIn(1, 'link', 'show'), /flannel0/, 'the TUN went');
    // The kernel frees a detached program once its last reference is dropped (deferred work).
    await waitFor(
      () => progs.every((id) => progGone(c.nodes[1]!.ns, id)),
      10_000,
      'the programs freed',
    );
  });
});

describe('the engine in process (test/helpers/dataplane-node.ts), with a bpffs', { skip }, () => {
  const scope = new NetnsScope();
  let A: Side;
  let fs: PrivateBpffs;
  before(async () => {
    [A] = twoNodes(scope);
    fs = await PrivateBpffs.inTempDir();
  });
  after(async () => {
    await scope.cleanup();
    await fs?.close();
  });
  const dir = () =>
    fs.view(join(fs.dir, 'weft', pinDirName('flannel.1', statSync(`/run/netns/${A.ns}`).ino)));
  const info = (n: string) => loadNative().bpfPinInfo(join(dir(), n));

  async function start(extra: Record<string, unknown>, env: Record<string, string> = {}) {
    const vars = { [PIN_DIR_ENV]: join(fs.dir, 'weft'), ...env };
    Object.assign(process.env, vars);
    let a: Node;
    try {
      a = startNode(scope, A, 'vxlan', 'bpf', { underlay: 'va', ...extra }, fs.via(PACKAGE_ROOT));
    } finally {
      for (const k of Object.keys(vars)) delete process.env[k];
    }
    assert.equal((await a.ready).engine, 'bpf');
    return a;
  }
  async function stop(a: Node, how: 'close' | 'kill') {
    const exited = new Promise((r) => a.proc.once('exit', r));
    if (how === 'close') await a.send({ cmd: 'close' });
    else a.proc.kill('SIGKILL');
    await exited;
  }

  test('a TUN that is not persistent: nothing pinned; stop leaves no link or program', async () => {
    const a = await start({});
    assert.equal(existsSync(dir()), false, 'no pin directory');
    const [rx] = tcxIn(A.ns, 'va', 'ingress');
    assert.ok(rx, 'weft_rx attached');
    await stop(a, 'close');
    assert.deepEqual(tcxIn(A.ns, 'va', 'ingress'), [], 'nothing on the underlay');
    assert.doesNotMatch(nsExec(A.ns, 'ip', ['link', 'show']), /flannel\.1/, 'the TUN went');
    await waitFor(() => progGone(A.ns, rx), 10_000, 'the program freed');
  });

  test('persistent: kill -9 leaves the links pinned; a clsact start removes them, its stop all', async () => {
    const a = await start({ persist: true });
    const [tx, rx] = [info('tx')!, info('rx')!];
    assert.deepEqual([tx.progName, rx.progName], ['weft_tx', 'weft_rx']);
    await stop(a, 'kill');
    assert.deepEqual(tcxIn(A.ns, 'va', 'ingress'), [rx.progId], 'rx outlived the process');
    // the harness addresses its TUN afresh: the persistent one goes first
    nsExec(A.ns, 'ip', ['link', 'del', 'flannel.1']);
    const b = await start({ persist: true }, { WEFT_BPF_ATTACH: 'clsact' });
    assert.equal(existsSync(dir()), false, 'the pins went');
    assert.deepEqual(tcxIn(A.ns, 'va', 'ingress'), [], 'no tcx program left on the underlay');
    assert.match(nsExec(A.ns, 'tc', ['filter', 'show', 'dev', 'va', 'ingress']), /weft_rx/);
    await stop(b, 'close');
    assert.equal(nsExec(A.ns, 'tc', ['filter', 'show', 'dev', 'va', 'ingress']).trim(), '');
    await waitFor(
      () => [tx.progId, rx.progId].every((id) => progGone(A.ns, id)),
      10_000,
      'the pinned programs freed',
    );
  });
});
