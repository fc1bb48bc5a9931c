/**
 * The CNI plugin with the real Debian plugins (/usr/lib/cni: bridge, host-local, loopback), run
 * as a child process inside a "node" namespace the way a container runtime runs it on a node.
 *
 *   ┌──────────── node: weft-<pid>-0 (subnet.env: 10.5.38.1/24 of 10.5.0.0/16) ───────────┐
 *   │  cni0 bridge 10.5.38.1/24 (made by bridge)                                           │
 *   │    ├─ veth ── eth0 10.5.38.x ── pod A: weft-<pid>-1  (plugin run from source via tsx) │
 *   │    ├─ veth ── eth0 10.5.38.y ── pod B: weft-<pid>-2  (the bundle dist/weft-cni.cjs   │
 *   │    │                                       copied alone as `weft`, "type": "flannel") │
 *   │    └─ veth ── eth0 10.5.38.z ── pod C: weft-<pid>-3  (FLANNEL_IPMASQ=false: bridge    │
 *   │                                                       masquerades, iptables in node) │
 *   └──────────────────────────────────────────────────────────────────────────────────────┘
 *
 * The installed form is the bundle built from source (scripts/build-cni.mjs) and copied alone
 * into a temp CNI bin dir; the npm launcher (bin/weft-cni) runs as a symlink to a temp package.
 * The plugin, and so bridge and host-local, only ever run inside the node namespace (the bridge
 * plugin creates cni0 in the namespace it runs in); host-local keeps its leases in a temp dir.
 * Pods on two nodes through a running weft daemon are the demo's job (issue 6 §2).
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import {
  chmodSync,
  copyFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { isBuiltin } from 'node:module';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { NetnsScope, ip, isRoot, nsExec } from '../../src/testbed/netns.js';

const skip = isRoot() ? false : 'needs root (network namespaces)';
const REPO = resolve(import.meta.dirname, '../..');
const CNI_BIN = '/usr/lib/cni';
const NETWORK = 'weft-cni-test';

interface Run {
  status: number | null;
  stdout: string;
  stderr: string;
  json: Record<string, unknown>;
}

describe('weft-cni with bridge + host-local in namespaces', { skip }, () => {
  const scope = new NetnsScope();
  let tmp = '';
  let node = '';
  let podA = '';
  let podB = '';
  let podC = '';
  let dataDir = '';
  let ipamDir = '';
  let subnetFile = '';
  let weftLink = '';
  let bundleCopy = '';
  let launcherCopy = '';
  let resultA: Record<string, unknown> = {};
  let resultB: Record<string, unknown> = {};

  /** The plugin config a kubelet would hand us for this network. */
  function config(extra: Record<string, unknown> = {}): Record<string, unknown> {
    return {
      cniVersion: '1.0.0',
      name: NETWORK,
      type: 'weft',
      subnetFile,
      dataDir,
      delegate: { hairpinMode: true },
      ipam: { dataDir: ipamDir },
      ...extra,
    };
  }

  /** Runs the plugin inside the node namespace. `bin` null = the source entry through tsx. */
  function cni(
    command: string,
    pod: string,
    id: string,
    conf: unknown,
    bin: string | null = null,
    extraEnv: Record<string, string> = {},
  ): Run {
    const cmd = bin
      ? [bin]
      : [process.execPath, '--import', 'tsx', join(REPO, 'test/helpers/cni-plugin.ts')];
    const r = spawnSync('ip', ['netns', 'exec', node, ...cmd], {
      cwd: REPO,
      input: typeof conf === 'string' ? conf : JSON.stringify(conf),
      encoding: 'utf8',
      env: {
        PATH: process.env.PATH,
        WEFT_LOG_LEVEL: 'warn',
        CNI_COMMAND: command,
        CNI_CONTAINERID: id,
        CNI_NETNS: `/var/run/netns/${pod}`,
        CNI_IFNAME: 'eth0',
        CNI_PATH: CNI_BIN,
        ...extraEnv,
      },
      timeout: 60_000,
    });
    let json: Record<string, unknown> = {};
    try {
      json = r.stdout.trim() ? (JSON.parse(r.stdout) as Record<string, unknown>) : {};
    } catch {
      assert.fail(`stdout is not JSON: ${r.stdout} (stderr: ${r.stderr})`);
    }
    return { status: r.status, stdout: r.stdout, stderr: r.stderr, json };
  }

  function podAddress(result: Record<string, unknown>): string {
    const ips = result.ips as Array<{ address: string; gateway?: string }>;
    assert.equal(ips.length, 1);
    return ips[0]!.address.split('/')[0]!;
  }

  before(() => {
    tmp = mkdtempSync(join(tmpdir(), 'weft-cni-netns-'));
    dataDir = join(tmp, 'flannel');
    ipamDir = join(tmp, 'ipam');
    subnetFile = join(tmp, 'subnet.env');
    writeFileSync(
      subnetFile,
      'FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET=10.5.38.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n',
    );
    // The installed form: the self-contained bundle (scripts/build-cni.mjs, built here from
    // source) copied alone into a CNI bin dir as `weft`, with no package or node_modules beside
    // it. And a package laid out as npm installs it (launcher + bundle only), its launcher
    // symlinked into the bin dir as `weft-launcher`.
    const pkg = join(tmp, 'pkg');
    mkdirSync(join(pkg, 'bin'), { recursive: true });
    const built = spawnSync(
      process.execPath,
      [join(REPO, 'scripts/build-cni.mjs'), '--outfile', join(pkg, 'dist/weft-cni.cjs')],
      { cwd: REPO, encoding: 'utf8' },
    );
    assert.ok(existsSync(join(pkg, 'dist/weft-cni.cjs')), `build-cni: ${built.stderr}`);
    copyFileSync(join(REPO, 'bin/weft-cni'), join(pkg, 'bin/weft-cni'));
    const cniBin = join(tmp, 'cni-bin');
    mkdirSync(cniBin);
    bundleCopy = join(cniBin, 'weft');
    copyFileSync(join(pkg, 'dist/weft-cni.cjs'), bundleCopy);
    chmodSync(bundleCopy, 0o755);
    weftLink = join(cniBin, 'weft-launcher');
    symlinkSync(join(pkg, 'bin/weft-cni'), weftLink);
    launcherCopy = join(tmp, 'launcher-copy');
    copyFileSync(join(REPO, 'bin/weft-cni'), launcherCopy);

    node = scope.add();
    podA = scope.add();
    podB = scope.add();
    podC = scope.add();
  });

  after(async () => {
    await scope.cleanup();
    if (tmp) rmSync(tmp, { recursive: true, force: true });
  });

  test('ADD gives pod A an address in the node subnet with a route to the cluster network', () => {
    const r = cni('ADD', podA, 'pod-a', config());
    assert.equal(r.status, 0, r.stdout + r.stderr);
    resultA = r.json;
    assert.equal(resultA.cniVersion, '1.0.0');
    const addr = podAddress(resultA);
    assert.match(addr, /^10\.5\.38\.\d+$/);
    assert.match(
      ip(podA, '-4', 'addr', 'show', 'dev', 'eth0'),
      new RegExp(`inet ${addr.replace(/\./g, '\\.')}/24`),
    );
    assert.match(ip(podA, '-4', 'route', 'show'), /^10\.5\.0\.0\/16 via 10\.5\.38\.1 dev eth0/m);
    assert.match(ip(node, '-4', 'addr', 'show', 'dev', 'cni0'), /inet 10\.5\.38\.1\/24/);
    assert.match(ip(node, 'link', 'show', 'dev', 'cni0'), /mtu 1450/);
  });

  test('ADD caches the rendered delegate at <dataDir>/<containerID>, 0600 in a 0700 dir', () => {
    const path = join(dataDir, 'pod-a');
    assert.equal(statSync(dataDir).mode & 0o777, 0o700);
    assert.equal(statSync(path).mode & 0o777, 0o600);
    assert.deepEqual(JSON.parse(readFileSync(path, 'utf8')), {
      cniVersion: '1.0.0',
      hairpinMode: true,
      ipMasq: false,
      ipam: {
        dataDir: ipamDir,
        ranges: [[{ subnet: '10.5.38.0/24' }]],
        routes: [{ dst: '10.5.0.0/16' }],
        type: 'host-local',
      },
      isGateway: true,
      mtu: 1450,
      name: NETWORK,
      type: 'bridge',
    });
  });

  test('the bundle copied alone into a bin dir adds pod B (a config written for flannel)', () => {
    const bundle = readFileSync(bundleCopy, 'utf8');
    assert.deepEqual(
      [...bundle.matchAll(/require\("([^"]+)"\)/g)].map((m) => m[1]).filter((m) => !isBuiltin(m!)),
      [],
      'the bundle requires nothing but Node built-ins',
    );
    const r = cni('ADD', podB, 'pod-b', config({ type: 'flannel' }), bundleCopy);
    assert.equal(r.status, 0, r.stdout + r.stderr);
    resultB = r.json;
    assert.match(podAddress(resultB), /^10\.5\.38\.\d+$/);
    assert.notEqual(podAddress(resultB), podAddress(resultA));
  });

  test('a symlinked launcher finds its package; a bare launcher copy says what is missing (code 103)', () => {
    const v = cni('VERSION', podB, 'x', '{}', weftLink);
    assert.equal(v.status, 0, v.stdout + v.stderr);
    assert.deepEqual(v.json.supportedVersions, ['0.3.0', '0.3.1', '0.4.0', '1.0.0']);
    for (const d of [
      '/usr/local/lib/node_modules/weft',
      '/usr/lib/node_modules/weft',
      '/opt/weft',
    ]) {
      assert.equal(existsSync(d), false, `precondition: no weft installed at ${d}`);
    }
    const bare = cni('VERSION', podB, 'x', '{}', launcherCopy);
    assert.equal(bare.status, 1);
    assert.equal(bare.json.code, 103);
    assert.match(String(bare.json.msg), /cannot find the weft package/);
  });

  test('the two pods ping each other', () => {
    nsExec(podA, 'ping', ['-c', '2', '-i', '0.2', '-W', '2', podAddress(resultB)]);
    nsExec(podB, 'ping', ['-c', '2', '-i', '0.2', '-W', '2', podAddress(resultA)]);
  });

  test('FLANNEL_IPMASQ=false makes bridge masquerade the pod (iptables in the node namespace); DEL undoes it', () => {
    const masqEnv = join(tmp, 'subnet-masq.env');
    writeFileSync(
      masqEnv,
      readFileSync(subnetFile, 'utf8').replace('FLANNEL_IPMASQ=true', 'FLANNEL_IPMASQ=false'),
    );
    const add = cni('ADD', podC, 'pod-c', config({ subnetFile: masqEnv }), weftLink);
    assert.equal(add.status, 0, add.stdout + add.stderr);
    const addr = podAddress(add.json).replace(/\./g, '\\.');
    assert.match(
      nsExec(node, 'iptables', ['-t', 'nat', '-S', 'POSTROUTING']),
      new RegExp(`-s ${addr}(/32)? .*pod-c.* -j CNI-`),
    );
    const del = cni('DEL', podC, 'pod-c', config({ subnetFile: masqEnv }), weftLink);
    assert.equal(del.status, 0, del.stdout + del.stderr);
    assert.doesNotMatch(nsExec(node, 'iptables', ['-t', 'nat', '-S', 'POSTROUTING']), /pod-c/);
  });

  test('CHECK passes the recorded result to bridge, which confirms the pod', () => {
    // Debian's plugins (1.1.1) compare a route without `gw` against the kernel's route, which
    // has the bridge gateway, and fail (containernetworking/plugins#886, fixed in 1.3.0). The
    // cluster-network route has no gw in flannel's delegate, so the recorded result names the
    // gateway the route really uses; interface, address and routes are still all checked.
    const routes = (resultA.routes as Array<Record<string, unknown>>).map((r) => ({
      gw: '10.5.38.1',
      ...r,
    }));
    const r = cni('CHECK', podA, 'pod-a', config({ prevResult: { ...resultA, routes } }));
    assert.equal(r.status, 0, r.stdout + r.stderr);
    assert.equal(r.stdout, '');
  });

  test("a delegate's own CNI error comes back with its code and the delegate named", () => {
    // bridge CHECK of pod B against pod A's result: the address does not match.
    const r = cni('CHECK', podB, 'pod-b', config({ prevResult: resultA }));
    assert.equal(r.status, 1);
    assert.equal(typeof r.json.code, 'number');
    assert.match(String(r.json.msg), /^delegate bridge CHECK: /);
  });

  test('malformed configs get CNI errors on stdout with the spec codes', () => {
    const cases: Array<[unknown, number]> = [
      ['{"name":', 6],
      [config({ delegate: { name: 'mine' } }), 7],
      [config({ delegate: { ipam: {} } }), 7],
      [config({ cniVersion: '0.2.0' }), 1],
      [config({ subnetFile: join(tmp, 'absent.env') }), 11],
    ];
    for (const [conf, code] of cases) {
      const r = cni('ADD', podA, 'pod-bad', conf, weftLink);
      assert.equal(r.status, 1, JSON.stringify(conf));
      assert.equal(r.json.code, code, r.stdout);
      assert.equal(typeof r.json.msg, 'string');
    }
    assert.equal(existsSync(join(dataDir, 'pod-bad')), false);
  });

  test('DEL removes the pod interface, releases the address in host-local and drops the cache', () => {
    const addr = podAddress(resultA);
    const leases = join(ipamDir, NETWORK);
    assert.ok(readdirSync(leases).includes(addr));
    const r = cni('DEL', podA, 'pod-a', config());
    assert.equal(r.status, 0, r.stdout + r.stderr);
    assert.equal(r.stdout, '');
    assert.equal(readdirSync(leases).includes(addr), false);
    assert.equal(existsSync(join(dataDir, 'pod-a')), false);
    assert.doesNotMatch(ip(podA, 'link', 'show'), /eth0/);
    assert.ok(readdirSync(leases).includes(podAddress(resultB)), "pod B's lease is untouched");
  });

  test('a second DEL succeeds with no output', () => {
    const r = cni('DEL', podA, 'pod-a', config());
    assert.equal(r.status, 0, r.stdout + r.stderr);
    assert.equal(r.stdout, '');
  });

  test('DEL replays the cached delegate even after subnet.env is gone', () => {
    rmSync(subnetFile);
    const r = cni('DEL', podB, 'pod-b', config(), weftLink);
    assert.equal(r.status, 0, r.stdout + r.stderr);
    assert.equal(readdirSync(join(ipamDir, NETWORK)).includes(podAddress(resultB)), false);
    assert.equal(existsSync(join(dataDir, 'pod-b')), false);
  });
});
