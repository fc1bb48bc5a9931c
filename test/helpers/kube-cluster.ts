/**
 * A cluster of weft daemons in Kubernetes mode (`--kube-subnet-mgr`), for namespace tests: the
 * fake API server (test/fakes/kube-apiserver.ts) runs inside the underlay namespace and the
 * daemons reach it over the underlay, as they would a real one.
 *
 *                  underlay weft-<pid>-0: br0 10.250.0.254/24 ─ fake API server :6443
 *            u0 ┌──────────────┬─u1───────────┴─────┬─u2 ──────── ...
 *   ┌─ eth0 10.250.0.1 ─┐ ┌─ eth0 10.250.0.2 ─┐ ┌─ eth0 10.250.0.3 ─┐
 *   │ node-0 daemon     │ │ node-1 daemon     │ │ node-2 daemon     │  NODE_NAME=node-i,
 *   │ podCIDR 10.5.1/24 │ │ podCIDR 10.5.2/24 │ │ podCIDR 10.5.3/24 │  --kube-subnet-mgr,
 *   │ cni0 10.5.1.1     │ │ cni0 10.5.2.1     │ │ cni0 10.5.3.1     │  own net-conf.json
 *   └──┬────────────────┘ └──┬────────────────┘ └──┬────────────────┘
 *    pod 0 10.5.1.2        pod 1 10.5.2.2        pod 2 10.5.3.2
 *
 * Each daemon reads its own `--net-config-path` (as in Kubernetes, where every node mounts its
 * own net-conf), so one cluster can mix backends: pass one Backend block per node.
 */
import { type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { ROOT, captureLogs, readEnvFile, waitFor, type LogLine } from './cluster.js';
import { NetnsScope, ip, nsExec, nsExecAsync } from './netns.js';

export const KUBE_API = 'http://10.250.0.254:6443';
const API = KUBE_API;
const WEFT = join(ROOT, 'test', 'helpers', 'weft-src.ts');
const APISERVER = join(ROOT, 'test', 'helpers', 'kube-apiserver-child.ts');

export type Obj = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

export interface KubeNode {
  readonly name: string;
  readonly ns: string;
  readonly ip: string;
  readonly subnetFile: string;
  daemon: ChildProcess | null;
  logs: LogLine[];
  env: Record<string, string>;
  pod: { ns: string; ip: string } | null;
}

export class KubeCluster {
  readonly scope = new NetnsScope();
  readonly nodes: KubeNode[] = [];
  readonly dir = mkdtempSync(join(tmpdir(), 'weft-kube-'));
  underlay = '';
  #api: ChildProcess | null = null;
  #pending = new Map<number, (r: { result?: unknown; error?: string }) => void>();
  #id = 0;

  readonly backends: readonly Record<string, unknown>[];

  /** One Backend block for every node (3 nodes), or one per node. */
  constructor(backend: Record<string, unknown> | readonly Record<string, unknown>[]) {
    this.backends = Array.isArray(backend) ? backend : [backend, backend, backend];
  }

  async build(): Promise<void> {
    this.underlay = this.scope.add();
    ip(this.underlay, 'link', 'add', 'br0', 'type', 'bridge');
    ip(this.underlay, 'addr', 'add', '10.250.0.254/24', 'dev', 'br0');
    ip(this.underlay, 'link', 'set', 'br0', 'up');
    await this.#startApi();
    for (let i = 0; i < this.backends.length; i++) {
      const conf = join(this.dir, `net-conf-${i}.json`);
      writeFileSync(conf, JSON.stringify({ Network: '10.5.0.0/16', Backend: this.backends[i] }));
      const ns = this.scope.add();
      this.scope.vethBetween(this.underlay, `u${i}`, ns, 'eth0');
      ip(this.underlay, 'link', 'set', `u${i}`, 'master', 'br0', 'up');
      ip(ns, 'addr', 'add', `10.250.0.${i + 1}/24`, 'dev', 'eth0');
      ip(ns, 'link', 'set', 'eth0', 'up');
      nsExec(ns, 'sysctl', ['-qw', 'net.ipv4.ip_forward=1']);
      const name = `node-${i}`;
      // The controller manager's job: a podCIDR per node.
      await this.rpc('addNode', { name, podCIDR: `10.5.${i + 1}.0/24` });
      this.nodes.push({
        name,
        ns,
        ip: `10.250.0.${i + 1}`,
        subnetFile: join(this.dir, `node${i}`, 'subnet.env'),
        daemon: null,
        logs: [],
        env: {},
        pod: null,
      });
    }
    for (let i = 0; i < this.nodes.length; i++) await this.startDaemon(i);
    for (const n of this.nodes) this.#wirePod(n);
  }

  async #startApi(): Promise<void> {
    const p = this.scope.spawn(
      this.underlay,
      process.execPath,
      ['--import', 'tsx', APISERVER, '10.250.0.254', '6443'],
      { cwd: ROOT, stdio: ['pipe', 'pipe', 'inherit'] },
    );
    this.#api = p;
    const rl = createInterface({ input: p.stdout! });
    await new Promise<void>((resolve, reject) => {
      const t = setTimeout(() => reject(new Error('fake API server did not start')), 20_000);
      rl.on('line', (line) => {
        const msg = JSON.parse(line) as {
          id?: number;
          listening?: string;
          result?: unknown;
          error?: string;
        };
        if (msg.listening) {
          clearTimeout(t);
          resolve();
        } else if (typeof msg.id === 'number') {
          this.#pending.get(msg.id)?.(msg);
          this.#pending.delete(msg.id);
        }
      });
      p.once('exit', (code) => reject(new Error(`fake API server exited ${code}`)));
    });
  }

  /** Calls an op of the fake API server (test/helpers/kube-apiserver-child.ts). */
  rpc(op: string, ...args: unknown[]): Promise<Obj> {
    const id = ++this.#id;
    return new Promise((resolve, reject) => {
      this.#pending.set(id, (r) =>
        r.error ? reject(new Error(r.error)) : resolve(r.result as Obj),
      );
      this.#api!.stdin!.write(JSON.stringify({ id, op, args }) + '\n');
    });
  }

  async startDaemon(i: number): Promise<void> {
    const node = this.nodes[i]!;
    const p = this.scope.spawn(
      node.ns,
      process.execPath,
      [
        '--import',
        'tsx',
        WEFT,
        'daemon',
        '--kube-subnet-mgr',
        `--kube-api-url=${API}`,
        `--net-config-path=${join(this.dir, `net-conf-${i}.json`)}`,
        '--iface=eth0',
        `--subnet-file=${node.subnetFile}`,
      ],
      { cwd: ROOT, env: { ...process.env, NODE_NAME: node.name, WEFT_LOG_LEVEL: 'info' } },
    );
    node.daemon = p;
    node.logs = [];
    captureLogs(p, node.logs, join(this.dir, `node${i}.log`));
    const log = join(this.dir, `node${i}.log`);
    let onExit: (code: number | null) => void = () => undefined;
    const exited = new Promise<never>((_, reject) => {
      onExit = (code) => reject(new Error(`daemon ${i} exited ${code} (log ${log})`));
      p.once('exit', onExit);
    });
    try {
      await Promise.race([
        waitFor(
          () => node.logs.some((l) => l.msg === 'ready'),
          30_000,
          `daemon ${i} ready (${log})`,
        ),
        exited,
      ]);
    } finally {
      p.off('exit', onExit);
    }
    node.env = readEnvFile(node.subnetFile);
  }

  async stopDaemon(i: number): Promise<void> {
    const p = this.nodes[i]!.daemon;
    if (!p || p.exitCode !== null || p.signalCode !== null) return;
    const exited = new Promise((r) => p.once('exit', r));
    p.kill('SIGTERM');
    const t = setTimeout(() => p.kill('SIGKILL'), 5000);
    await exited;
    clearTimeout(t);
  }

  #wirePod(node: KubeNode): void {
    const sub = node.env.FLANNEL_SUBNET!;
    const mtu = node.env.FLANNEL_MTU!;
    ip(node.ns, 'link', 'add', 'cni0', 'type', 'bridge');
    ip(node.ns, 'addr', 'add', sub, 'dev', 'cni0');
    ip(node.ns, 'link', 'set', 'cni0', 'mtu', mtu, 'up');
    const pns = this.scope.add();
    this.scope.vethBetween(node.ns, 'p0', pns, 'eth0');
    ip(node.ns, 'link', 'set', 'p0', 'master', 'cni0', 'mtu', mtu, 'up');
    const gw = sub.split('/')[0]!;
    const podIp = gw.replace(/\.1$/, '.2');
    ip(pns, 'addr', 'add', `${podIp}/${sub.split('/')[1]}`, 'dev', 'eth0');
    ip(pns, 'link', 'set', 'eth0', 'mtu', mtu, 'up');
    ip(pns, 'route', 'add', 'default', 'via', gw);
    node.pod = { ns: pns, ip: podIp };
  }

  async destroy(): Promise<void> {
    await Promise.all(this.nodes.map((_, i) => this.stopDaemon(i).catch(() => undefined)));
    this.#api?.stdin?.end();
    await this.scope.cleanup();
    if (!process.env.WEFT_KEEP_TEST_DIR) rmSync(this.dir, { recursive: true, force: true });
  }
}

export async function pingFailures(nodes: readonly KubeNode[]): Promise<string[]> {
  const failures: string[] = [];
  await Promise.all(
    nodes.flatMap((a) =>
      nodes
        .filter((b) => b !== a)
        .map((b) =>
          nsExecAsync(a.pod!.ns, 'ping', ['-c', '1', '-W', '2', b.pod!.ip]).catch(() => {
            failures.push(`${a.name} → ${b.name} (${b.pod!.ip})`);
          }),
        ),
    ),
  );
  return failures.sort();
}
