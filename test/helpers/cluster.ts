/**
 * A weft cluster in network namespaces for the integration tests of the kernel backends.
 *
 *                underlay  weft-<pid>-0:  bridge br0   (no address: pure L2)
 *            u0 ┌──────────────┬─u1──────────┴──────┬─u2 ──────────┐
 *   ┌───── eth0 10.250.0.1 ┐┌─ eth0 10.250.0.2 ─┐┌─ eth0 10.250.0.3 ─┐  + fd00:250::N/64
 *   │ node 0  weft daemon  ││ node 1            ││ node 2            │  `ip netns exec`,
 *   │ flannel.1 / routes   ││                   ││                   │  embedded store dir
 *   │ cni0 10.5.X.1/24     ││ cni0              ││ cni0              │  shared by all
 *   └──┬───────────────────┘└──┬────────────────┘└──┬────────────────┘
 *    p0│eth0 10.5.X.2        p0│                   p0│     one or two pod namespaces per node,
 *    pod 0.0 (p1: pod 0.1)   pod 1.0              pod 2.0   default route via cni0's address
 *
 * cni0 and the pods are configured by hand from each node's subnet.env (the CNI plugin has its
 * own tests). Daemons run from the TypeScript sources (test/helpers/weft-src.ts), so no build
 * is needed. `destroy()` stops every daemon and deletes every namespace and temp dir, on any path.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { createWriteStream, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { formatIP, parseCIDR } from '../../src/common/ip.js';
import { NetnsScope, ip, nsExec } from './netns.js';

export const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const WEFT_SRC = join(ROOT, 'test', 'helpers', 'weft-src.ts');

export interface ClusterOptions {
  readonly nodes?: number;
  readonly podsPerNode?: number;
  /** The net-conf Backend block, e.g. `{ Type: 'vxlan' }`. */
  readonly backend: Record<string, unknown>;
  /** IPv4 + IPv6 (pods get addresses of both families). */
  readonly dualStack?: boolean;
  readonly ipMasq?: boolean;
  /** Extra daemon flags. */
  readonly flags?: readonly string[];
  /** Extra daemon environment (e.g. WEFT_NATIVE_ADDON=/nonexistent: run without the addon). */
  readonly env?: Readonly<Record<string, string>>;
}

export interface Pod {
  readonly name: string;
  readonly ns: string;
  readonly node: number;
  readonly ip: string;
  readonly ip6: string | null;
}

export interface LogLine {
  readonly level: number | string;
  readonly msg: string;
  readonly [k: string]: unknown;
}

export interface ClusterNode {
  readonly index: number;
  readonly ns: string;
  readonly ip: string;
  readonly ip6: string;
  readonly dir: string;
  readonly subnetFile: string;
  daemon: ChildProcess | null;
  logs: LogLine[];
  env: Record<string, string>;
  readonly pods: Pod[];
}

export const NETWORK = '10.5.0.0/16';
export const NETWORK_V6 = 'fd00:5::/48';

export function readEnvFile(path: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const line of readFileSync(path, 'utf8').split('\n')) {
    const i = line.indexOf('=');
    if (i > 0) out[line.slice(0, i)] = line.slice(i + 1);
  }
  return out;
}

/** `10.5.38.1/24` → the subnet's n-th address as text. */
function nth(subnetWithHost: string, n: number): string {
  const net = parseCIDR(subnetWithHost)!;
  const bitsLeft = BigInt((net.family === 4 ? 32 : 128) - net.prefix);
  const base = (net.addr >> bitsLeft) << bitsLeft;
  return formatIP(net.family, base + BigInt(n));
}

export async function waitFor<T>(
  fn: () => T | Promise<T>,
  timeoutMs: number,
  what: string,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) {
      throw new Error(
        `timed out after ${timeoutMs} ms waiting for ${what}${last ? `: ${String(last)}` : ''}`,
      );
    }
    await new Promise((r) => setTimeout(r, 50));
  }
}

function tail(logs: readonly LogLine[]): string {
  return logs
    .slice(-3)
    .map((l) => l.msg + (l.err ? `: ${String(l.err)}` : ''))
    .join(' | ');
}

/** Appends a daemon's stderr to `file` and its JSON log lines to `logs`. */
export function captureLogs(p: ChildProcess, logs: LogLine[], file: string): void {
  const out = createWriteStream(file, { flags: 'a' });
  let partial = '';
  p.stderr!.on('data', (d: Buffer) => {
    out.write(d);
    partial += d.toString();
    const lines = partial.split('\n');
    partial = lines.pop()!;
    for (const l of lines) {
      try {
        logs.push(JSON.parse(l) as LogLine);
      } catch {
        /* not JSON */
      }
    }
  });
  p.on('close', () => out.end());
}

export class Cluster {
  readonly scope = new NetnsScope();
  readonly nodes: ClusterNode[] = [];
  readonly dir: string;
  readonly storeDir: string;
  readonly options: ClusterOptions;
  underlay = '';

  private constructor(o: ClusterOptions) {
    this.options = o;
    this.dir = mkdtempSync(join(tmpdir(), 'weft-cluster-'));
    this.storeDir = join(this.dir, 'store');
  }

  /** Builds the cluster and waits until every daemon is ready and every pod is wired. */
  static async create(o: ClusterOptions): Promise<Cluster> {
    const c = new Cluster(o);
    try {
      await c.#build();
      return c;
    } catch (err) {
      await c.destroy();
      throw err;
    }
  }

  async #build(): Promise<void> {
    const o = this.options;
    const n = o.nodes ?? 3;
    this.underlay = this.scope.add();
    ip(this.underlay, 'link', 'add', 'br0', 'type', 'bridge');
    ip(this.underlay, 'link', 'set', 'br0', 'up');
    for (let i = 0; i < n; i++) {
      const ns = this.scope.add();
      this.scope.vethBetween(this.underlay, `u${i}`, ns, 'eth0');
      ip(this.underlay, 'link', 'set', `u${i}`, 'master', 'br0', 'up');
      const nodeIp = `10.250.0.${i + 1}`;
      const nodeIp6 = `fd00:250::${i + 1}`;
      ip(ns, 'addr', 'add', `${nodeIp}/24`, 'dev', 'eth0');
      ip(ns, 'addr', 'add', `${nodeIp6}/64`, 'dev', 'eth0', 'nodad');
      ip(ns, 'link', 'set', 'eth0', 'up');
      nsExec(ns, 'sysctl', ['-qw', 'net.ipv4.ip_forward=1', 'net.ipv6.conf.all.forwarding=1']);
      const dir = join(this.dir, `node${i}`);
      this.nodes.push({
        index: i,
        ns,
        ip: nodeIp,
        ip6: nodeIp6,
        dir,
        subnetFile: join(dir, 'subnet.env'),
        daemon: null,
        logs: [],
        env: {},
        pods: [],
      });
    }
    const conf: Record<string, unknown> = { Network: NETWORK, Backend: o.backend };
    if (o.dualStack) Object.assign(conf, { EnableIPv6: true, IPv6Network: NETWORK_V6 });
    const confFile = join(this.dir, 'net-conf.json');
    writeFileSync(confFile, JSON.stringify(conf));
    await this.#weft(['config', 'set', confFile, '--store-dir', this.storeDir]);
    // One at a time: concurrent dual-stack acquisitions can pick the same IPv4 subnet under
    // different keys (reported as a lease-manager bug); sequential starts avoid the race.
    for (const node of this.nodes) await this.startDaemon(node.index);
    for (const node of this.nodes) this.#wirePods(node);
  }

  /** Runs a short weft command in the root namespace (store files only, no network). */
  #weft(args: readonly string[]): Promise<void> {
    return new Promise((resolve, reject) => {
      const p = spawn(process.execPath, ['--import', 'tsx', WEFT_SRC, ...args], {
        cwd: ROOT,
        stdio: ['ignore', 'ignore', 'pipe'],
      });
      let err = '';
      p.stderr.on('data', (d: Buffer) => (err += d.toString()));
      p.on('close', (code) =>
        code === 0 ? resolve() : reject(new Error(`weft ${args.join(' ')}: ${err}`)),
      );
    });
  }

  /** Starts node i's daemon and waits for it to be ready (lease held, subnet.env written). */
  async startDaemon(i: number, extra: readonly string[] = []): Promise<void> {
    const node = this.nodes[i]!;
    const args = [
      '--import',
      'tsx',
      WEFT_SRC,
      'daemon',
      '--store-dir',
      this.storeDir,
      '--iface',
      'eth0',
      '--subnet-file',
      node.subnetFile,
      '--iptables-resync',
      '1',
      ...(this.options.ipMasq ? ['--ip-masq'] : []),
      ...(this.options.flags ?? []),
      ...extra,
    ];
    const p = this.scope.spawn(node.ns, process.execPath, args, {
      cwd: ROOT,
      env: { ...process.env, WEFT_LOG_LEVEL: 'info', ...this.options.env },
    });
    node.daemon = p;
    node.logs = [];
    captureLogs(p, node.logs, join(this.dir, `node${i}.log`));
    const log = join(this.dir, `node${i}.log`);
    await new Promise<void>((resolve, reject) => {
      const deadline = setTimeout(
        () => done(new Error(`daemon ${i} not ready after 20 s; see ${log}`)),
        20_000,
      );
      const poll = setInterval(() => {
        if (node.logs.some((l) => l.msg === 'ready')) done();
      }, 25);
      const onExit = (code: number | null) =>
        done(new Error(`daemon ${i} exited ${code}: ${tail(node.logs)}`));
      p.once('exit', onExit);
      function done(err?: Error) {
        clearTimeout(deadline);
        clearInterval(poll);
        p.off('exit', onExit);
        if (err) reject(err);
        else resolve();
      }
    });
    node.env = readEnvFile(node.subnetFile);
  }

  /** Stops node i's daemon (SIGTERM, then SIGKILL after 5 s). */
  async stopDaemon(i: number): Promise<void> {
    const p = this.nodes[i]!.daemon;
    if (!p || p.exitCode !== null || p.signalCode !== null) return;
    const exited = new Promise((r) => p.once('exit', r));
    p.kill('SIGTERM');
    const t = setTimeout(() => p.kill('SIGKILL'), 5000);
    await exited;
    clearTimeout(t);
    this.nodes[i]!.daemon = null;
  }

  /** cni0 with the subnet's first address; pods behind it with the next ones. */
  #wirePods(node: ClusterNode): void {
    if (node.pods.length > 0) return;
    const env = node.env;
    const sub = env.FLANNEL_SUBNET!;
    const sub6 = env.FLANNEL_IPV6_SUBNET;
    const mtu = env.FLANNEL_MTU!;
    ip(node.ns, 'link', 'add', 'cni0', 'type', 'bridge');
    ip(node.ns, 'addr', 'add', sub, 'dev', 'cni0');
    if (sub6) ip(node.ns, 'addr', 'add', sub6, 'dev', 'cni0', 'nodad');
    ip(node.ns, 'link', 'set', 'cni0', 'mtu', mtu, 'up');
    const gw = sub.split('/')[0]!;
    const gw6 = sub6?.split('/')[0];
    for (let j = 0; j < (this.options.podsPerNode ?? 1); j++) {
      const pns = this.scope.add();
      this.scope.vethBetween(node.ns, `p${j}`, pns, 'eth0');
      ip(node.ns, 'link', 'set', `p${j}`, 'master', 'cni0', 'mtu', mtu, 'up');
      const podIp = nth(sub, 2 + j);
      ip(pns, 'addr', 'add', `${podIp}/${sub.split('/')[1]}`, 'dev', 'eth0');
      let podIp6: string | null = null;
      if (sub6) {
        podIp6 = nth(sub6, 2 + j);
        ip(pns, 'addr', 'add', `${podIp6}/${sub6.split('/')[1]}`, 'dev', 'eth0', 'nodad');
      }
      ip(pns, 'link', 'set', 'eth0', 'mtu', mtu, 'up');
      ip(pns, 'route', 'add', 'default', 'via', gw);
      if (gw6) ip(pns, '-6', 'route', 'add', 'default', 'via', gw6);
      node.pods.push({
        name: `pod${node.index}.${j}`,
        ns: pns,
        node: node.index,
        ip: podIp,
        ip6: podIp6,
      });
    }
  }

  get pods(): Pod[] {
    return this.nodes.flatMap((n) => n.pods);
  }

  /** Whole `ip` output of a node, for assertions. */
  ipIn(i: number, ...args: string[]): string {
    return ip(this.nodes[i]!.ns, ...args);
  }

  async destroy(): Promise<void> {
    await Promise.all(this.nodes.map((n) => this.stopDaemon(n.index).catch(() => undefined)));
    await this.scope.cleanup();
    if (!process.env.WEFT_KEEP_TEST_DIR) rmSync(this.dir, { recursive: true, force: true });
  }
}
