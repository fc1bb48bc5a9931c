/**
 * `weft cleanup` (src/dataplane/cleanup.ts) after a bpf engine was killed with -9, in a node
 * namespace whose processes see a private bpffs (src/testbed/bpffs.ts):
 *
 *   ns A:  flannel.1 (persistent TUN; weft_tx on its egress)
 *          va 192.168.77.1/24 (weft_rx on its ingress: tcx link pinned, or a clsact filter)
 *   bpffs: <dir>/weft/flannel_1-<A's netns inode>/{tx,rx}
 *
 * What the killed engine left (pins and the links they hold, a clsact filter, the TUN) is gone
 * after `weft cleanup`, and its programs are freed; so is every TUN weft's userspace backends
 * make (flannel0, flannel.ipip, flannel-wg, flannel-wg-v6), and nothing else, and a wireguard
 * UAPI socket nobody serves any more.
 */
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { loadNative } from '../../src/common/native.js';
import { PIN_DIR_ENV, pinDirName } from '../../src/dataplane/bpf-pins.js';
import { UAPI_DIR_ENV } from '../../src/dataplane/wireguard-uapi.js';
import { PrivateBpffs } from '../../src/testbed/bpffs.js';
import { PACKAGE_ROOT, waitFor } from '../../src/testbed/cluster.js';
import { NetnsScope, isRoot, nsExec } from '../../src/testbed/netns.js';
import { type Node, type Side, startNode, twoNodes } from '../helpers/dataplane-pair.js';
import { WEFT_BIN } from '../helpers/daemon.js';
import { clsactIn, progGone, tcxIn } from '../helpers/bpf.js';

const skip = isRoot() ? false : 'needs root (network namespaces, bpf, a private bpffs)';

describe('weft cleanup after a killed bpf engine', { skip }, () => {
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
  const pinRoot = () => join(fs.dir, 'weft');
  const dir = () =>
    fs.view(join(pinRoot(), pinDirName('flannel.1', statSync(`/run/netns/${A.ns}`).ino)));

  async function startAndKill(extra: Record<string, unknown>, env: Record<string, string> = {}) {
    const vars = { [PIN_DIR_ENV]: pinRoot(), ...env };
    Object.assign(process.env, vars);
    let a: Node;
    try {
      a = startNode(scope, A, 'vxlan', 'bpf', { underlay: 'va', ...extra }, fs.via(PACKAGE_ROOT));
    } finally {
      for (const k of Object.keys(vars)) delete process.env[k];
    }
    assert.equal((await a.ready).engine, 'bpf');
    const exited = new Promise((r) => a.proc.once('exit', r));
    a.proc.kill('SIGKILL');
    await exited;
  }

  function cleanup(env: Record<string, string> = {}): {
    pins: { pins: number }[];
    filters: string[];
    devices: string[];
    sockets: string[];
    skipped: string[];
  } {
    const r = spawnSync(
      fs.via(PACKAGE_ROOT)[0]!,
      [
        ...fs.via(PACKAGE_ROOT).slice(1),
        'ip',
        'netns',
        'exec',
        A.ns,
        process.execPath,
        WEFT_BIN,
        'cleanup',
        '--json',
      ],
      { encoding: 'utf8', env: { ...process.env, [PIN_DIR_ENV]: pinRoot(), ...env } },
    );
    const report = JSON.parse(r.stdout) as ReturnType<typeof cleanup>;
    // exit 0, or 1 when something was not removed (then named in `skipped`)
    assert.equal(r.status, report.skipped.length > 0 ? 1 : 0, r.stderr);
    return report;
  }

  test('pinned tcx links and the persistent TUN: all removed, the programs freed', async () => {
    await startAndKill({ persist: true });
    const rx = loadNative().bpfPinInfo(join(dir(), 'rx'))!;
    assert.equal(rx.progName, 'weft_rx');
    assert.deepEqual(tcxIn(A.ns, 'va', 'ingress'), [rx.progId], 'rx outlived the process');
    const r = cleanup();
    assert.deepEqual(
      r.pins.map((p) => p.pins),
      [2],
      JSON.stringify(r),
    );
    assert.deepEqual(r.devices, ['flannel.1']);
    assert.deepEqual(r.skipped, []);
    assert.equal(existsSync(dir()), false, 'the pin directory went');
    assert.deepEqual(tcxIn(A.ns, 'va', 'ingress'), [], 'nothing on the underlay');
    assert.doesNotMatch(nsExec(A.ns, 'ip', ['link', 'show']), /flannel\.1/, 'the TUN went');
    await waitFor(() => progGone(A.ns, rx.progId), 10_000, 'the program freed');
  });

  test('a clsact filter left by kill -9: removed', async () => {
    await startAndKill({}, { WEFT_BPF_ATTACH: 'clsact' });
    const [id] = clsactIn(A.ns, 'va');
    assert.ok(id, 'the filter outlived the process');
    const r = cleanup();
    assert.deepEqual(r.filters, ['va ingress'], JSON.stringify(r));
    assert.deepEqual(clsactIn(A.ns, 'va'), []);
    await waitFor(() => progGone(A.ns, id), 10_000, 'the program freed');
    assert.deepEqual(
      cleanup(),
      { pins: [], filters: [], devices: [], sockets: [], skipped: [] },
      'idempotent',
    );
  });

  test('every TUN weft makes goes (udp, ipip, wireguard); devices of other kinds stay', () => {
    const tuns = ['flannel0', 'flannel.ipip', 'flannel-wg', 'flannel-wg-v6'];
    for (const t of tuns) nsExec(A.ns, 'ip', ['tuntap', 'add', 'dev', t, 'mode', 'tun']);
    nsExec(A.ns, 'ip', ['tuntap', 'add', 'dev', 'flannel-other', 'mode', 'tun']);
    nsExec(A.ns, 'ip', ['link', 'add', 'flannel.2', 'type', 'veth', 'peer', 'name', 'wg-peer']);
    const r = cleanup();
    assert.deepEqual([...r.devices].sort(), [...tuns].sort(), JSON.stringify(r));
    const left = nsExec(A.ns, 'ip', ['-o', 'link', 'show']);
    for (const t of tuns) assert.doesNotMatch(left, new RegExp(`: ${t.replace('.', '\\.')}[:@]`));
    assert.match(left, /: flannel-other:/, 'a TUN of another name stays');
    assert.match(left, /: flannel\.2@/, 'a flannel.<VNI> that is not a TUN stays');
  });

  test('a wireguard UAPI socket nobody serves goes; one a process serves stays', async () => {
    const uapi = mkdtempSync(join(tmpdir(), 'weft-uapi-'));
    const live = createServer();
    try {
      // flannel-wg.sock: bound, never served (what a kill -9 leaves); flannel-wg-v6.sock: served
      execFileSync('python3', [
        '-c',
        'import socket,sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])',
        join(uapi, 'flannel-wg.sock'),
      ]);
      await new Promise<void>((r) => live.listen(join(uapi, 'flannel-wg-v6.sock'), r));
      const r = cleanup({ [UAPI_DIR_ENV]: uapi });
      assert.deepEqual(r.sockets, [join(uapi, 'flannel-wg.sock')], JSON.stringify(r));
      assert.deepEqual(r.skipped, [
        `socket ${join(uapi, 'flannel-wg-v6.sock')}: a process serves it`,
      ]);
      assert.ok(!existsSync(join(uapi, 'flannel-wg.sock')));
      assert.ok(existsSync(join(uapi, 'flannel-wg-v6.sock')));
    } finally {
      await new Promise((r) => live.close(r));
      rmSync(uapi, { recursive: true, force: true });
    }
  });
});
