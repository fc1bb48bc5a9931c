/**
 * The deployment files agree with the code: every flag they pass is a real daemon flag and
 * parses, probe paths and ports match the health server's flags, the ConfigMap's configs parse
 * with the daemon's and the CNI plugin's own parsers, and the RBAC grants what the kube subnet
 * manager calls.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import yaml from 'js-yaml';
import { DAEMON_FLAGS, parseFlags } from '../../../src/control/config/flags.js';
import { parseNetConfig } from '../../../src/control/config/net-config.js';
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

  test('host network, NET_ADMIN and NET_RAW, and /dev/net/tun for userspace backends', () => {
    assert.equal(pod.hostNetwork, true);
    assert.deepEqual([...main.securityContext.capabilities.add].sort(), ['NET_ADMIN', 'NET_RAW']);
    const tun = pod.volumes.find((v: Obj) => v.hostPath?.path === '/dev/net/tun');
    assert.equal(tun.hostPath.type, 'CharDevice');
    assert.ok(
      main.volumeMounts.some((m: Obj) => m.name === tun.name && m.mountPath === '/dev/net/tun'),
    );
  });

  test('the init container installs weft-cni and the CNI config', () => {
    const init = pod.initContainers.find((c: Obj) => c.name === 'install-cni');
    const script: string = init.args.join('\n');
    assert.match(script, /\/opt\/weft\/bin\/weft-cni/);
    assert.match(script, /\/host\/opt\/cni\/bin\/weft\b/);
    assert.match(script, /cni-conf\.json .*10-weft\.conflist/);
    const hostPaths = new Set(pod.volumes.map((v: Obj) => v.hostPath?.path));
    for (const p of ['/opt/cni/bin', '/etc/cni/net.d', '/opt/weft']) assert.ok(hostPaths.has(p), p);
  });

  test('net-conf.json parses with the daemon parser', () => {
    const cfg = parseNetConfig(byKind('ConfigMap').data['net-conf.json']);
    assert.equal(cfg.backend.type, 'vxlan');
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

  test('copies every path the image needs from the repository', () => {
    for (const m of text.matchAll(/^COPY (?!--from)(.+) \S+$/gm)) {
      for (const src of m[1]!.split(/\s+/)) {
        assert.ok(existsSync(new URL(src, root)), `${src} missing`);
      }
    }
  });
});
