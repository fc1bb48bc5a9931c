/**
 * The deployment files agree with the code: every flag they pass is a real daemon flag and
 * parses, probe paths and ports match the health server's flags, the ConfigMap's configs parse
 * with the daemon's and the CNI plugin's own parsers, and the RBAC grants what the kube subnet
 * manager calls.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join, posix } from 'node:path';
import { fileURLToPath } from 'node:url';
import yaml from 'js-yaml';
import { DAEMON_FLAGS, parseFlags } from '../../../src/control/config/flags.js';
import { parseNetConfig } from '../../../src/control/config/net-config.js';
import { parseVxlanConfig } from '../../../src/control/backend/vxlan.js';
import { parseCniConfig } from '../../../src/control/cni/cni-config.js';

type Obj = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

const root = new URL('../../../', import.meta.url);
const read = (p: string) => readFileSync(new URL(p, root), 'utf8');

const docs = (yaml.loadAll(read('deploy/kubernetes/weft.yml')) as Obj[]).filter(Boolean);
const byKind = (kind: string) => {
  const found = docs.filter((d) => d.kind === kind);
  assert.equal(found.length, 1, `exactly one ${kind}`);
  return found[0]!;
};

/** `--name=value` / `--name` tokens → flag names, checked against DAEMON_FLAGS. */
function flagNames(args: readonly string[]): string[] {
  return args.filter((a) => a.startsWith('-')).map((a) => a.replace(/^--?/, '').split('=')[0]!);
}

describe('deploy/kubernetes/weft.yml', () => {
  const ds = byKind('DaemonSet');
  const pod = ds.spec.template.spec;
  const main = pod.containers.find((c: Obj) => c.name === 'weft');
  const args: string[] = main.args;

  test('holds the namespace, service account, RBAC, config map and daemon set', () => {
    assert.deepEqual(
      docs.map((d) => d.kind),
      [
        'Namespace',
        'ServiceAccount',
        'ClusterRole',
        'ClusterRoleBinding',
        'ConfigMap',
        'DaemonSet',
      ],
    );
  });

  test('every flag of the daemon container is a daemon flag', () => {
    assert.equal(args[0], 'daemon');
    for (const name of flagNames(args)) {
      assert.ok(Object.hasOwn(DAEMON_FLAGS, name), `--${name} is not a daemon flag`);
    }
  });

  test('the arguments parse and select the kube subnet manager', () => {
    const parsed = parseFlags(DAEMON_FLAGS, args.slice(1), {});
    assert.equal(parsed.values.kubeSubnetMgr, true);
    assert.deepEqual(parsed.positionals, []);
  });

  test('the probes hit /healthz and /readyz on --healthz-port', () => {
    const port = parseFlags(DAEMON_FLAGS, args.slice(1), {}).values.healthzPort;
    assert.notEqual(port, 0, 'the health server must be enabled');
    assert.equal(main.livenessProbe.httpGet.path, '/healthz');
    assert.equal(main.livenessProbe.httpGet.port, port);
    assert.equal(main.readinessProbe.httpGet.path, '/readyz');
    assert.equal(main.readinessProbe.httpGet.port, port);
  });

  test('--net-config-path points into the mounted config map at its net-conf.json key', () => {
    const path = parseFlags(DAEMON_FLAGS, args.slice(1), {}).values.netConfigPath;
    const cfgVolume = pod.volumes.find((v: Obj) => v.configMap?.name === 'weft-cfg');
    const mount = main.volumeMounts.find((m: Obj) => m.name === cfgVolume.name);
    assert.equal(path, `${mount.mountPath}/net-conf.json`);
    assert.ok('net-conf.json' in byKind('ConfigMap').data);
  });

  test('subnet.env is written to the host path the CNI plugin reads', () => {
    const file = parseFlags(DAEMON_FLAGS, args.slice(1), {}).values.subnetFile;
    const mount = main.volumeMounts.find((m: Obj) => file.startsWith(`${m.mountPath}/`));
    assert.ok(mount, `no volume holds ${file}`);
    const vol = pod.volumes.find((v: Obj) => v.name === mount.name);
    assert.equal(vol.hostPath.path, mount.mountPath);
  });

  test('the node name comes from the downward API', () => {
    const env = Object.fromEntries(
      main.env.map((e: Obj) => [e.name, e.valueFrom.fieldRef.fieldPath]),
    );
    assert.equal(env.NODE_NAME, 'spec.nodeName');
    assert.equal(env.POD_NAME, 'metadata.name');
    assert.equal(env.POD_NAMESPACE, 'metadata.namespace');
  });

  test('host network, every default capability dropped, NET_ADMIN, NET_RAW and BPF added, and /dev/net/tun for userspace backends', () => {
    assert.equal(pod.hostNetwork, true);
    assert.deepEqual(main.securityContext.capabilities.drop, ['ALL']);
    assert.deepEqual([...main.securityContext.capabilities.add].sort(), [
      'BPF',
      'NET_ADMIN',
      'NET_RAW',
    ]);
    const tun = pod.volumes.find((v: Obj) => v.hostPath?.path === '/dev/net/tun');
    assert.equal(tun.hostPath.type, 'CharDevice');
    assert.ok(
      main.volumeMounts.some((m: Obj) => m.name === tun.name && m.mountPath === '/dev/net/tun'),
    );
  });

  test('the init container installs the bundled plugin and the CNI config, and nothing else', () => {
    const init = pod.initContainers.find((c: Obj) => c.name === 'install-cni');
    const script: string = init.args.join('\n');
    const hostPaths = new Set(pod.volumes.map((v: Obj) => v.hostPath?.path));
    for (const p of ['/opt/cni/bin', '/etc/cni/net.d', '/opt/weft']) assert.ok(hostPaths.has(p), p);
    for (const m of init.volumeMounts) assert.match(m.mountPath, /^\/host\/|^\/etc\/weft$/);
    // Run the script for real against a temp "host": the image's files are this checkout's.
    const tmp = mkdtempSync(join(tmpdir(), 'weft-install-cni-'));
    try {
      const host = join(tmp, 'host');
      mkdirSync(join(host, 'opt/cni/bin'), { recursive: true });
      mkdirSync(join(host, 'opt/weft/node_modules/old'), { recursive: true });
      writeFileSync(join(host, 'opt/cni/bin/flannel'), 'flannel, not ours\n');
      mkdirSync(join(tmp, 'etc'));
      writeFileSync(join(tmp, 'etc/cni-conf.json'), byKind('ConfigMap').data['cni-conf.json']);
      const bundle = join(tmp, 'weft-cni.cjs');
      const built = spawnSync(
        process.execPath,
        [fileURLToPath(new URL('scripts/build-cni.mjs', root)), '--outfile', bundle],
        { encoding: 'utf8' },
      );
      assert.equal(built.status, 0, built.stderr);
      const local = script
        .replaceAll('/host/', `${host}/`)
        .replaceAll('/usr/local/bin/node', process.execPath)
        .replaceAll('/opt/weft/dist/weft-cni.cjs', bundle)
        .replaceAll('/etc/weft/', `${tmp}/etc/`);
      const r = spawnSync('/bin/sh', ['-c', local], { encoding: 'utf8' });
      assert.equal(r.status, 0, r.stderr);
      const plugin = readFileSync(join(host, 'opt/cni/bin/weft'), 'utf8');
      assert.equal(plugin.split('\n')[0], '#!/opt/weft/node', 'runs with the copied node');
      assert.equal(statSync(join(host, 'opt/cni/bin/weft')).mode & 0o777, 0o755);
      assert.equal(
        readFileSync(join(host, 'opt/cni/bin/flannel'), 'utf8'),
        'flannel, not ours\n',
        "another plugin's binary is never touched",
      );
      assert.deepEqual(readdirSync(join(host, 'opt/cni/bin')).sort(), ['flannel', 'weft']);
      assert.deepEqual(readdirSync(join(host, 'opt/weft')), ['node'], 'no package on the host');
      assert.deepEqual(readdirSync(join(host, 'etc/cni/net.d')), ['10-weft.conflist']);
      const v = spawnSync(process.execPath, [join(host, 'opt/cni/bin/weft')], {
        input: '{"cniVersion":"1.0.0"}',
        encoding: 'utf8',
        env: { CNI_COMMAND: 'VERSION', PATH: process.env.PATH },
      });
      assert.equal(v.status, 0, v.stdout + v.stderr);
      assert.match(v.stdout, /"supportedVersions"/);
    } finally {
      rmSync(tmp, { recursive: true, force: true });
    }
  });

  test('memory request and limit cover the idle figures bench:footprint measured', () => {
    const fp = JSON.parse(read('bench/results/footprint-latest.json')) as {
      rows: Array<{ what: string; rssMB: number }>;
    };
    const rss = (re: RegExp) =>
      fp.rows.find((r) => re.test(r.what))?.rssMB ?? assert.fail(`no ${re} row in the results`);
    const kube = rss(/^daemon idle: Kubernetes API/);
    const engine =
      rss(/^daemon idle: embedded .*userspace/) - rss(/^daemon idle: embedded .*vxlan \(kernel\)/);
    const mi = (q: string) => Number(/^(\d+)Mi$/.exec(q)?.[1] ?? assert.fail(`${q}: not in Mi`));
    const { requests, limits } = main.resources;
    assert.ok(
      mi(requests.memory) >= kube + engine,
      `request ${requests.memory} < ${kube + engine} MB`,
    );
    assert.ok(mi(limits.memory) >= 2 * mi(requests.memory), 'the limit leaves room');
  });

  test('memory request and limit cover 5,000 real-sized Nodes as bench:scale measured', () => {
    // bench:scale --stores kube --node-size real: Nodes as a kubelet fills them in (~17 KB)
    const sc = JSON.parse(read('bench/results/scale-real-nodes.json')) as {
      nodeSize: string;
      peers: number;
      rows: Array<Record<string, number | string | null | undefined>>;
    };
    assert.equal(sc.nodeSize, 'real');
    assert.ok(sc.peers >= 5000);
    const rows = sc.rows.filter((r) => r.store === 'kube' && !r.error);
    assert.ok(rows.length > 0, 'kube rows');
    const most = (keys: string[]) =>
      Math.max(...rows.flatMap((r) => keys.map((k) => Number(r[k] ?? 0))));
    const peak = most(['peakRssMiB', 'startPeakRssMiB', 'relistPeakRssMiB']);
    const settled = most(['settledRssMiB']);
    const mi = (q: string) => Number(/^(\d+)Mi$/.exec(q)?.[1] ?? assert.fail(`${q}: not in Mi`));
    const { requests, limits } = main.resources;
    assert.ok(
      mi(requests.memory) >= settled,
      `request ${requests.memory} < ${settled} MiB settled`,
    );
    assert.ok(mi(requests.memory) >= peak, `request ${requests.memory} < ${peak} MiB peak`);
    assert.ok(mi(limits.memory) >= 2 * peak, `limit ${limits.memory} < twice ${peak} MiB`);
  });

  test('/metrics is served on a declared container port (the health server port)', () => {
    const port = parseFlags(DAEMON_FLAGS, args.slice(1), {}).values.healthzPort;
    const ports: Obj[] = main.ports ?? [];
    const metrics = ports.find((p) => p.name === 'metrics');
    assert.ok(metrics, 'a container port named metrics');
    assert.equal(metrics.containerPort, port);
    assert.equal(metrics.protocol, 'TCP');
    assert.equal(
      pod.hostNetwork && metrics.hostPort,
      port,
      'host network: hostPort = containerPort',
    );
  });

  test('net-conf.json parses with the daemon parser: vxlan, "Dataplane": "auto"', () => {
    const cfg = parseNetConfig(byKind('ConfigMap').data['net-conf.json']);
    assert.equal(cfg.backend.type, 'vxlan');
    assert.equal(parseVxlanConfig(cfg.backend.raw).dataplane, 'auto');
  });

  test("cni-conf.json's weft plugin parses with the CNI plugin's parser", () => {
    const list = JSON.parse(byKind('ConfigMap').data['cni-conf.json']);
    const plugin = { name: list.name, cniVersion: list.cniVersion, ...list.plugins[0] };
    assert.equal(plugin.type, 'weft');
    const cfg = parseCniConfig(JSON.stringify(plugin));
    assert.equal(cfg.name, 'cbr0');
  });

  test('the ClusterRole grants what the kube subnet manager calls, bound to its account', () => {
    const rules: Obj[] = byKind('ClusterRole').rules;
    const verbs = (resource: string) =>
      new Set(rules.filter((r) => r.resources.includes(resource)).flatMap((r) => r.verbs));
    for (const v of ['get', 'list', 'watch']) assert.ok(verbs('nodes').has(v), `nodes ${v}`);
    assert.ok(verbs('nodes/status').has('patch'));
    assert.ok(verbs('pods').has('get'));
    const binding = byKind('ClusterRoleBinding');
    const sa = byKind('ServiceAccount');
    assert.equal(binding.roleRef.name, byKind('ClusterRole').metadata.name);
    assert.deepEqual(binding.subjects, [
      { kind: 'ServiceAccount', name: sa.metadata.name, namespace: sa.metadata.namespace },
    ]);
    assert.equal(pod.serviceAccountName, sa.metadata.name);
  });

  test('both containers run the image the Dockerfile builds, at its entrypoint', () => {
    const images = new Set([...pod.containers, ...pod.initContainers].map((c: Obj) => c.image));
    assert.equal(images.size, 1);
    const entry = /^ENTRYPOINT \["([^"]+)"\]/m.exec(read('Dockerfile'))?.[1];
    assert.deepEqual(main.command, [entry]);
  });
});

describe('deploy/systemd/weft.service', () => {
  const unit = read('deploy/systemd/weft.service');
  const directive = (name: string) =>
    new RegExp(`^${name}=(.*)$`, 'm').exec(unit)?.[1] ?? assert.fail(`no ${name}=`);

  test('is Type=notify with the main pid allowed to notify', () => {
    assert.equal(directive('Type'), 'notify');
    assert.equal(directive('NotifyAccess'), 'main');
  });

  test('ExecStart runs the daemon with real flags only', () => {
    const [bin, cmd, ...rest] = directive('ExecStart').split(/\s+/);
    assert.equal(bin, '/opt/weft/bin/weft');
    assert.equal(cmd, 'daemon');
    const args = rest.filter((a) => !a.startsWith('$'));
    for (const name of flagNames(args)) {
      assert.ok(Object.hasOwn(DAEMON_FLAGS, name), `--${name} is not a daemon flag`);
    }
    const parsed = parseFlags(DAEMON_FLAGS, args, {});
    assert.equal(parsed.values.kubeSubnetMgr, false);
    assert.notEqual(parsed.values.healthzPort, 0);
  });

  test('leaves the daemon more time to stop than its own deadline', () => {
    assert.ok(Number(directive('TimeoutStopSec')) > 1.9);
  });
});

describe('Dockerfile', () => {
  const text = read('Dockerfile');

  test('builds on Debian node:20 with libmnl and npm ci', () => {
    assert.match(text, /^FROM node:20-bookworm AS build$/m);
    assert.match(text, /libmnl-dev/);
    assert.match(text, /npm ci/);
    assert.match(text, /^FROM node:20-bookworm-slim$/m);
    assert.match(text, /libmnl0/);
  });

  const stages = text.split(/^(?=FROM )/m).filter((t) => t.startsWith('FROM '));
  const build = stages.find((t) => /^FROM \S+ AS build$/m.test(t)) ?? '';
  const runtime = stages.at(-1) ?? '';
  const workdir = (stage: string) => /^WORKDIR (\S+)$/m.exec(stage)?.[1] ?? '/';
  const pkg = JSON.parse(read('package.json')) as Obj;

  /**
   * The files the installed package loads at run time, read from the code: the package.json
   * (its "type"), the bins and what each loads from dist/, every path a module resolves under
   * packageRoot() (the addon, the TUN helper, ...), and each production dependency.
   */
  function runtimeFiles(): string[] {
    const files = ['package.json'];
    for (const bin of Object.values(pkg.bin as Record<string, string>)) {
      files.push(bin);
      const src = read(bin);
      for (const m of src.matchAll(/'\.\.\/(dist\/[^']+)'/g)) files.push(m[1]!);
      for (const m of src.matchAll(/ENTRY = '([^']+)'/g)) files.push(m[1]!);
    }
    const walk = (dir: string): string[] =>
      readdirSync(new URL(dir, root), { withFileTypes: true }).flatMap((e) =>
        e.isDirectory() ? walk(`${dir}${e.name}/`) : e.name.endsWith('.ts') ? [dir + e.name] : [],
      );
    for (const file of walk('src/')) {
      for (const m of read(file).matchAll(/join\(\s*packageRoot\(\),([^)]*)\)/g)) {
        const parts = [...m[1]!.matchAll(/'([^']+)'/g)].map((p) => p[1]!);
        files.push(parts.join('/'));
      }
    }
    for (const dep of Object.keys(pkg.dependencies as Record<string, string>))
      files.push(`node_modules/${dep}`);
    return [...new Set(files)];
  }

  test('the runtime stage copies every file the runtime loads, from where the build made it', () => {
    const files = runtimeFiles();
    assert.ok(files.includes('native/build/weft-tun'), 'the TUN helper is found in the code');
    assert.ok(files.includes('native/build/Release/weft.node'));
    assert.ok(files.includes('dist/weft-cni.cjs'));
    const dir = workdir(runtime);
    const copies = [...runtime.matchAll(/^COPY --from=build (\S+) (\S+)$/gm)].map((m) => ({
      src: m[1]!,
      dest: posix.join(dir, m[2]!),
    }));
    for (const c of copies) assert.equal(c.src, c.dest, 'the same layout as the build stage');
    for (const f of files) {
      const abs = posix.join(dir, f);
      assert.ok(
        copies.some((c) => abs === c.dest || abs.startsWith(`${c.dest}/`)),
        `${f} is not copied into the runtime image`,
      );
    }
    assert.equal(workdir(build), dir);
  });

  test('the build stage builds every generated runtime file and fails when one is missing', () => {
    const run = /^RUN npm ci(?:.*\\\n)*.*$/m.exec(build)?.[0] ?? assert.fail('no RUN npm ci');
    for (const f of runtimeFiles().filter((f) => /^(dist|native\/build)\//.test(f))) {
      assert.ok(run.includes(`test -f ${f}`), `the build does not check ${f}`);
    }
  });

  test('the build stage gets every source file the package ships', () => {
    const copied = [...build.matchAll(/^COPY (?!--from)(.+) \S+$/gm)].flatMap((m) =>
      m[1]!.split(/\s+/),
    );
    for (const f of (pkg.files as string[]).filter((f) => f !== 'dist')) {
      assert.ok(
        copied.some((c) => f === c || f.startsWith(`${c}/`)),
        `${f} (package.json "files") is not copied into the build stage`,
      );
    }
  });

  test('copies every path the image needs from the repository', () => {
    for (const m of text.matchAll(/^COPY (?!--from)(.+) \S+$/gm)) {
      for (const src of m[1]!.split(/\s+/)) {
        assert.ok(existsSync(new URL(src, root)), `${src} missing`);
      }
    }
  });
});
