/**
 * The one namespace-cluster builder: `weft demo`, the benches and the namespace tests all build
 * their weft clusters here (DESIGN §9); the probes across them (ping, iperf3) are in probes.ts.
 * Options choose the store (embedded, etcd, kube), the launcher (the built dist/ or the
 * TypeScript sources through tsx) and the pod wiring (through weft-cni, or cni0 + veth by hand
 * from subnet.env).
 *
 *                 underlay namespace: bridge br0 10.250.0.254/24, fd00:250::fe/64
 *                 (etcd :2379 with store 'etcd'; the kube API server :6443 with store 'kube')
 *            u0 ┌──────────────┬─u1───────────┴─────┬─u2 ───────── ...
 *   ┌─ eth0 10.250.0.1 ──┐ ┌─ eth0 10.250.0.2 ──┐ ┌─ eth0 10.250.0.3 ──┐  + fd00:250::N/64
 *   │ node 0 weft daemon │ │ node 1             │ │ node 2             │  `ip netns exec`,
 *   │ cni0 10.5.X.1/24   │ │ cni0               │ │ cni0               │  /readyz on 127.0.0.1
 *   └──┬─────────────────┘ └──┬─────────────────┘ └──┬─────────────────┘
 *    pod 0.0 (pod 0.1 …)    pod 1.0                pod 2.0     each pod: its own namespace, eth0,
 *                                                              default route via cni0
 *
 * Readiness is read from each daemon's `/readyz` (inside its namespace), never from its logs.
 * `destroy()` stops every process, deletes every namespace and the cluster's dir, on any path;
 * `detach()` instead hands a detached cluster (`detached: true`) over to whoever records it.
 */
import { type ChildProcess } from 'node:child_process';
import {
  closeSync,
  createWriteStream,
  mkdirSync,
  mkdtempSync,
  openSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { formatIP, parseCIDR } from '../common/ip.js';
import { NetnsScope, ip, nsExec, nsExecAsync, nsSpawn } from './netns.js';
import { PrivateBpffs } from './bpffs.js';

/** The weft package root (this file is src/testbed/ or dist/testbed/). */
export const PACKAGE_ROOT = fileURLToPath(new URL('../..', import.meta.url));
export const WEFT_BIN = join(PACKAGE_ROOT, 'bin', 'weft');
export const WEFT_CNI_BIN = join(PACKAGE_ROOT, 'bin', 'weft-cni');
/** Entry points from the sources (a checkout only; launcher 'source'). */
const WEFT_SRC = join(PACKAGE_ROOT, 'test', 'helpers', 'weft-src.ts');
const WEFT_CNI_SRC = join(PACKAGE_ROOT, 'test', 'helpers', 'cni-plugin.ts');
/**
 * As this module runs (through tsx → source, from dist/ → dist), unless WEFT_TEST_LAUNCHER says
 * `dist` or `source`: the suite's runner (scripts/run-tests.mjs) builds dist/ from the sources
 * first and sets `dist`, so each daemon starts as it ships (bin/weft) without compiling the
 * TypeScript again at every start.
 */
const DEFAULT_LAUNCHER = launcherFrom(process.env.WEFT_TEST_LAUNCHER);

/**
 * The node argv that runs `weft` or `weft-cni` with `launcher` (default: as WEFT_TEST_LAUNCHER
 * says, see above): bin/ (dist/), or the sources through tsx.
 */
export function launchArgv(
  what: 'weft' | 'weft-cni',
  launcher: 'dist' | 'source' = DEFAULT_LAUNCHER,
): string[] {
  if (launcher === 'source') return ['--import', 'tsx', what === 'weft' ? WEFT_SRC : WEFT_CNI_SRC];
  return [what === 'weft' ? WEFT_BIN : WEFT_CNI_BIN];
}

function launcherFrom(env: string | undefined): 'dist' | 'source' {
  if (env === 'dist' || env === 'source') return env;
  if (env !== undefined && env !== '') {
    throw new Error(`WEFT_TEST_LAUNCHER must be dist or source, not ${JSON.stringify(env)}`);
  }
  return import.meta.url.endsWith('.ts') ? 'source' : 'dist';
}
export const CNI_PLUGIN_DIR = '/usr/lib/cni';

export const UNDERLAY_V4 = '10.250.0';
export const UNDERLAY_V6 = 'fd00:250::';
export const CLUSTER_NETWORK = '10.5.0.0/16';
export const CLUSTER_NETWORK_V6 = 'fd00:5::/48';
export const KUBE_API = `http://${UNDERLAY_V4}.254:6443`;
/** The underlay's etcd (store 'etcd'). */
export const ETCD_URL = `http://${UNDERLAY_V4}.254:2379`;
/** Where each daemon serves /healthz /readyz /metrics inside its namespace (unless flags say). */
export const HEALTH_PORT = 10281;

export type Backend = Readonly<Record<string, unknown>>;
/** A Kubernetes object as the API server's control channel returns it (untyped JSON). */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type KubeObject = Record<string, any>;
export type StoreKind = 'embedded' | 'etcd' | 'kube';

export interface ClusterOptions {
  /** Node count (default: one per Backend block when several are given, else 3). */
  readonly nodes?: number;
  /** The net-conf Backend block; one per node is allowed in kube mode (own net-conf each). */
  readonly backend?: Backend | readonly Backend[];
  /** IPv4 + IPv6 (pods get addresses of both families). */
  readonly dualStack?: boolean;
  /** More net-conf fields (e.g. `EnableNFTables: true`). */
  readonly netConf?: Readonly<Record<string, unknown>>;
  readonly ipMasq?: boolean;
  /** `--iptables-resync` seconds (default 1, so tests see repairs quickly; null: the daemon's). */
  readonly iptablesResync?: number | null;
  /** Extra daemon flags. */
  readonly flags?: readonly string[];
  /** Extra daemon environment (e.g. WEFT_NATIVE_ADDON=/nonexistent: run without the addon). */
  readonly env?: Readonly<Record<string, string>>;
  /** embedded (a dir shared by every daemon, default), etcd or kube in the underlay. */
  readonly store?: StoreKind;
  /** kube: the API server script (JSON-line control, see test/helpers/kube-apiserver-child.ts). */
  readonly kubeApiServer?: string;
  /**
   * dist: bin/weft and bin/weft-cni; source: the TypeScript sources through tsx. Default: as
   * this module runs (from dist/ → dist, through tsx → source).
   */
  readonly launcher?: 'dist' | 'source';
  /** Pods per node made by `create()` (default 1). */
  readonly podsPerNode?: number;
  /** cni: through weft-cni (bridge + host-local); manual (default): cni0 + veth by hand. */
  readonly podWiring?: 'cni' | 'manual';
  /**
   * The pods' bridge's name (default cni0, the CNI bridge plugin's): the CNI delegate's
   * `bridge`, the manual wiring's, and the daemons' --pod-bridge.
   */
  readonly podBridge?: string;
  /** Start the daemons all at once (default: one after the other). */
  readonly parallelStart?: boolean;
  /**
   * Daemons (and etcd) in their own session with their output in log files only, so they outlive
   * this process and its terminal's Ctrl-C; `detach()` hands them over (`weft demo --keep`).
   */
  readonly detached?: boolean;
  /** The cluster's dir (store, subnet files, logs); default a new temp dir. Removed by destroy. */
  readonly dir?: string;
  /** Name prefix of the namespaces (default `weft-<pid>`). */
  readonly prefix?: string;
  /** Underlay MTU (veth default 1500). */
  readonly mtu?: number;
  /** Nodes route by default via the underlay bridge's address. */
  readonly defaultRoute?: boolean;
  /**
   * Daemons see a bpffs of their own (testbed/bpffs.ts, never the host's) and pin the bpf
   * engine's links there (WEFT_BPF_PIN_DIR): the pins outlive a killed daemon, as on a host.
   */
  readonly bpffs?: boolean;
  /** Every node's subnet file in ONE directory, `<dir>/subnets/n<i+1>.env` (default: one dir each). */
  readonly sharedSubnetDir?: boolean;
  /** How long a daemon may take to answer /readyz (default 60 s: tsx start-up on a loaded box). */
  readonly readyTimeoutMs?: number;
}

export interface Pod {
  readonly name: string;
  readonly ns: string;
  /** Index of its node. */
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
  /** `node-<index>` (the Kubernetes node name in kube mode). */
  readonly name: string;
  readonly ns: string;
  readonly ip: string;
  readonly ip6: string;
  readonly dir: string;
  readonly subnetFile: string;
  /** The daemon's stderr (JSON log lines), appended across restarts. */
  readonly logFile: string;
  daemon: ChildProcess | null;
  /** The daemon's log lines since its last start (empty for detached daemons). */
  logs: LogLine[];
  /** subnet.env as the daemon wrote it when it became ready. */
  env: Record<string, string>;
  readonly pods: Pod[];
}

/** What a detached cluster leaves running, for whoever stops it later. */
export interface DetachedCluster {
  readonly dir: string;
  readonly namespaces: readonly string[];
  readonly processes: ReadonlyArray<{ readonly pid: number; readonly what: string }>;
}

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

/** Polls `fn` (every 50 ms) until it returns a truthy value; throws after `timeoutMs`. */
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

/** Appends a process's stderr to `file` and its JSON log lines to `logs`. */
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

/** The value of `--name` in a flag list (`--name=v` or `--name v`; the last one wins). */
function flagValue(flags: readonly string[], name: string): string | undefined {
  let v: string | undefined;
  flags.forEach((f, i) => {
    if (f === `--${name}`) v = flags[i + 1];
    else if (f.startsWith(`--${name}=`)) v = f.slice(name.length + 3);
  });
  return v;
}

/** The last lines of a daemon log, with the last error-level message first. */
function logTail(file: string): string {
  let text = '';
  try {
    text = readFileSync(file, 'utf8');
  } catch {
    return '';
  }
  const lines = text.trim().split('\n');
  let why: string | null = null;
  for (const line of [...lines].reverse()) {
    try {
      const l = JSON.parse(line) as { level?: string | number; msg?: string; err?: unknown };
      if (
        l.level === 'error' ||
        l.level === 'fatal' ||
        (typeof l.level === 'number' && l.level >= 50)
      ) {
        why = `${l.msg ?? ''}${l.err ? `: ${String(l.err)}` : ''}`;
        break;
      }
    } catch {
      /* not JSON */
    }
  }
  return `${why ? `: ${why}` : ''}\n${lines.slice(-8).join('\n')}`;
}

/** Ends a process: SIGTERM, SIGKILL after 5 s; resolves once it has exited. */
async function terminate(p: ChildProcess): Promise<void> {
  if (p.exitCode !== null || p.signalCode !== null) return;
  const exited = new Promise((r) => p.once('exit', r));
  p.kill('SIGTERM');
  const t = setTimeout(() => p.kill('SIGKILL'), 5000);
  await exited;
  clearTimeout(t);
}

/** Polls `http://<host>:<port>/readyz` (argv) until it answers 200, then exits 0. */
const READYZ_PROBE = `
const [host, port] = process.argv.slice(1);
const url = 'http://' + (host.includes(':') ? '[' + host + ']' : host) + ':' + port + '/readyz';
(async () => {
  for (;;) {
    try {
      const r = await fetch(url, { signal: AbortSignal.timeout(1000) });
      if (r.status === 200) process.exit(0);
    } catch {}
    await new Promise((r) => setTimeout(r, 25));
  }
})();`;

/**
 * Waits until the daemon in namespace `ns` answers 200 on `/readyz` (its health server, which
 * the root namespace cannot reach: one probe process inside `ns` polls it). Rejects if `daemon`
 * exits first or after `timeoutMs`. Readiness is read from the daemon, never from its logs.
 */
export async function waitReadyz(o: {
  readonly ns: string;
  readonly port: number | string;
  readonly host?: string;
  readonly daemon: ChildProcess;
  readonly timeoutMs?: number;
}): Promise<void> {
  const timeoutMs = o.timeoutMs ?? 60_000;
  const probe = nsSpawn(
    o.ns,
    process.execPath,
    ['-e', READYZ_PROBE, o.host ?? '127.0.0.1', String(o.port)],
    { stdio: 'ignore' },
  );
  let timer: NodeJS.Timeout | undefined;
  let onExit: (code: number | null, sig: string | null) => void = () => undefined;
  try {
    await new Promise<void>((resolve, reject) => {
      timer = setTimeout(
        () => reject(new Error(`daemon not ready after ${timeoutMs} ms`)),
        timeoutMs,
      );
      onExit = (code, sig) => reject(new Error(`daemon exited ${code ?? sig} before ready`));
      if (o.daemon.exitCode !== null || o.daemon.signalCode !== null)
        onExit(o.daemon.exitCode, o.daemon.signalCode);
      o.daemon.once('exit', onExit);
      probe.once('exit', (code) =>
        code === 0 ? resolve() : reject(new Error(`readiness probe exited ${code}`)),
      );
    });
  } finally {
    clearTimeout(timer);
    o.daemon.off('exit', onExit);
    if (probe.exitCode === null && probe.signalCode === null) probe.kill('SIGKILL');
  }
}

export class Cluster {
  readonly scope: NetnsScope;
  readonly nodes: ClusterNode[] = [];
  readonly dir: string;
  readonly storeDir: string;
  readonly store: StoreKind;
  readonly options: ClusterOptions;
  underlay = '';
  /** The daemons' bpffs (options.bpffs); its pins are under `<dir>/weft`. */
  bpffs: PrivateBpffs | null = null;
  #storeProc: ChildProcess | null = null;
  #pending = new Map<number, (r: { result?: unknown; error?: string }) => void>();
  #rpcId = 0;

  private constructor(o: ClusterOptions) {
    this.options = o;
    this.store = o.store ?? 'embedded';
    this.scope = new NetnsScope(o.prefix);
    if (o.dir) mkdirSync(o.dir, { recursive: true });
    this.dir = o.dir ?? mkdtempSync(join(tmpdir(), `${o.prefix ?? 'weft-cluster'}-`));
    this.storeDir = join(this.dir, 'store');
  }

  /** Namespaces, underlay, store and net-conf; no daemon yet. Cleans up after itself on failure. */
  static async build(o: ClusterOptions = {}): Promise<Cluster> {
    const c = new Cluster(o);
    try {
      await c.#build();
      return c;
    } catch (err) {
      await c.destroy();
      throw err;
    }
  }

  /** Builds the cluster, starts every daemon (ready on /readyz) and wires the pods. */
  static async create(o: ClusterOptions): Promise<Cluster> {
    const c = await Cluster.build(o);
    try {
      await c.startDaemons();
      await c.addPods(o.podsPerNode ?? 1);
      return c;
    } catch (err) {
      await c.destroy();
      throw err;
    }
  }

  #backendOf(i: number): Backend {
    const b = this.options.backend;
    if (!b) throw new Error('the cluster has no Backend to run daemons with');
    return Array.isArray(b) ? (b as readonly Backend[])[i]! : (b as Backend);
  }

  #netConf(i: number): Record<string, unknown> {
    const conf: Record<string, unknown> = { Network: CLUSTER_NETWORK, Backend: this.#backendOf(i) };
    if (this.options.dualStack)
      Object.assign(conf, { EnableIPv6: true, IPv6Network: CLUSTER_NETWORK_V6 });
    return { ...conf, ...this.options.netConf };
  }

  async #build(): Promise<void> {
    const o = this.options;
    const count =
      o.nodes ?? (Array.isArray(o.backend) ? (o.backend as readonly Backend[]).length : 3);
    if (Array.isArray(o.backend) && this.store !== 'kube')
      throw new Error('one Backend per node needs the kube store (each node its own net-conf)');
    if (o.bpffs) this.bpffs = await PrivateBpffs.create(join(this.dir, 'bpffs'));
    const u = (this.underlay = this.scope.add());
    ip(u, 'link', 'add', 'br0', 'type', 'bridge');
    ip(u, 'addr', 'add', `${UNDERLAY_V4}.254/24`, 'dev', 'br0');
    ip(u, 'addr', 'add', `${UNDERLAY_V6}fe/64`, 'dev', 'br0', 'nodad');
    ip(u, 'link', 'set', 'br0', 'up');
    for (let i = 0; i < count; i++) {
      const ns = this.scope.add();
      this.scope.vethBetween(u, `u${i}`, ns, 'eth0');
      ip(u, 'link', 'set', `u${i}`, 'master', 'br0', 'up');
      if (o.mtu) {
        ip(ns, 'link', 'set', 'eth0', 'mtu', String(o.mtu));
        ip(u, 'link', 'set', `u${i}`, 'mtu', String(o.mtu));
      }
      const nodeIp = `${UNDERLAY_V4}.${i + 1}`;
      const nodeIp6 = `${UNDERLAY_V6}${(i + 1).toString(16)}`;
      ip(ns, 'addr', 'add', `${nodeIp}/24`, 'dev', 'eth0');
      ip(ns, 'addr', 'add', `${nodeIp6}/64`, 'dev', 'eth0', 'nodad');
      ip(ns, 'link', 'set', 'eth0', 'up');
      if (o.defaultRoute) ip(ns, 'route', 'add', 'default', 'via', `${UNDERLAY_V4}.254`);
      nsExec(ns, 'sysctl', ['-qw', 'net.ipv4.ip_forward=1', 'net.ipv6.conf.all.forwarding=1']);
      const dir = join(this.dir, `node${i}`);
      mkdirSync(dir, { recursive: true });
      this.nodes.push({
        index: i,
        name: `node-${i}`,
        ns,
        ip: nodeIp,
        ip6: nodeIp6,
        dir,
        subnetFile: o.sharedSubnetDir
          ? join(this.dir, 'subnets', `n${i + 1}.env`)
          : join(dir, 'subnet.env'),
        logFile: join(dir, 'daemon.log'),
        daemon: null,
        logs: [],
        env: {},
        pods: [],
      });
    }
    if (this.store === 'etcd') await this.#startEtcd();
    if (this.store === 'kube') await this.#startKubeApi();
    if (!o.backend) return;
    if (this.store === 'kube') {
      for (const n of this.nodes) {
        writeFileSync(join(n.dir, 'net-conf.json'), JSON.stringify(this.#netConf(n.index)));
        // The controller manager's job: a podCIDR per node.
        await this.rpc('addNode', { name: n.name, podCIDR: `10.5.${n.index + 1}.0/24` });
      }
    } else {
      const file = join(this.dir, 'net-conf.json');
      writeFileSync(file, JSON.stringify(this.#netConf(0)));
      nsExec(
        u,
        process.execPath,
        [...this.#launch('weft'), 'config', 'set', file, ...this.storeArgs()],
        {
          cwd: PACKAGE_ROOT,
        },
      );
    }
  }

  /** The node argv that runs `weft` or `weft-cni` with this cluster's launcher. */
  #launch(what: 'weft' | 'weft-cni'): string[] {
    return launchArgv(what, this.options.launcher);
  }

  /** Output of a detached process: a log file (opened here, closed once the child holds it). */
  #spawnLogged(
    ns: string,
    file: string,
    cmd: string,
    args: string[],
    env?: NodeJS.ProcessEnv,
    via: readonly string[] = [],
  ) {
    if (!this.options.detached) {
      return this.scope.spawn(
        ns,
        cmd,
        args,
        { cwd: PACKAGE_ROOT, env, stdio: ['ignore', 'ignore', 'pipe'] },
        via,
      );
    }
    const fd = openSync(file, 'a');
    try {
      return this.scope.spawn(
        ns,
        cmd,
        args,
        { cwd: PACKAGE_ROOT, env, detached: true, stdio: ['ignore', fd, fd] },
        via,
      );
    } finally {
      closeSync(fd);
    }
  }

  /** Stops the underlay's etcd (store 'etcd'): SIGTERM, SIGKILL after 5 s. `startEtcd` again. */
  async stopEtcd(): Promise<void> {
    const p = this.#storeProc;
    if (this.store !== 'etcd' || !p) throw new Error('stopEtcd: the cluster runs no etcd');
    this.#storeProc = null;
    await terminate(p);
  }

  /** Starts the underlay's etcd again after `stopEtcd` (same data dir: every key kept). */
  async startEtcd(): Promise<void> {
    if (this.store !== 'etcd' || this.#storeProc) throw new Error('startEtcd: etcd is running');
    await this.#startEtcd();
  }

  async #startEtcd(): Promise<void> {
    const peer = `http://${UNDERLAY_V4}.254:2380`;
    const p = this.#spawnLogged(this.underlay, join(this.dir, 'etcd.log'), 'etcd', [
      '--name',
      'weft-testbed',
      '--data-dir',
      join(this.dir, 'etcd'),
      '--listen-client-urls',
      ETCD_URL,
      '--advertise-client-urls',
      ETCD_URL,
      '--listen-peer-urls',
      peer,
      '--initial-advertise-peer-urls',
      peer,
      '--initial-cluster',
      `weft-testbed=${peer}`,
      '--log-level',
      'error',
    ]);
    this.#storeProc = p;
    p.stderr?.resume();
    await waitFor(
      async () => {
        if (p.exitCode !== null) throw new Error(`etcd exited ${p.exitCode}`);
        await nsExecAsync(
          this.underlay,
          'etcdctl',
          ['--endpoints', ETCD_URL, 'endpoint', 'health'],
          2000,
        );
        return true;
      },
      15_000,
      'etcd healthy in the underlay namespace',
    );
  }

  async #startKubeApi(): Promise<void> {
    const script = this.options.kubeApiServer;
    if (!script) throw new Error("store 'kube' needs kubeApiServer (the API server script)");
    const p = this.scope.spawn(
      this.underlay,
      process.execPath,
      ['--import', 'tsx', script, `${UNDERLAY_V4}.254`, '6443'],
      { cwd: PACKAGE_ROOT, stdio: ['pipe', 'pipe', 'inherit'] },
    );
    this.#storeProc = p;
    const rl = createInterface({ input: p.stdout! });
    await new Promise<void>((resolve, reject) => {
      const t = setTimeout(() => reject(new Error('the kube API server did not start')), 20_000);
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
      p.once('exit', (code) => {
        clearTimeout(t);
        reject(new Error(`the kube API server exited ${code}`));
      });
    });
  }

  /** Calls an op of the kube API server's control channel (kube store only). */
  rpc(op: string, ...args: unknown[]): Promise<KubeObject> {
    const id = ++this.#rpcId;
    return new Promise((resolve, reject) => {
      this.#pending.set(id, (r) =>
        r.error ? reject(new Error(r.error)) : resolve(r.result as KubeObject),
      );
      this.#storeProc!.stdin!.write(JSON.stringify({ id, op, args }) + '\n');
    });
  }

  /** Store flags every weft command of this cluster needs (node i's, in kube mode). */
  storeArgs(i = 0): string[] {
    switch (this.store) {
      case 'etcd':
        return [`--etcd-endpoints=${ETCD_URL}`];
      case 'kube':
        return [
          '--kube-subnet-mgr',
          `--kube-api-url=${KUBE_API}`,
          `--net-config-path=${join(this.nodes[i]!.dir, 'net-conf.json')}`,
        ];
      default:
        return [`--store-dir=${this.storeDir}`];
    }
  }

  /** Starts every daemon (one after the other unless parallelStart) and waits until ready. */
  async startDaemons(): Promise<void> {
    if (this.options.parallelStart) {
      await Promise.all(this.nodes.map((n) => this.startDaemon(n.index)));
      return;
    }
    // One at a time: concurrent dual-stack acquisitions can pick the same IPv4 subnet under
    // different keys (reported as a lease-manager bug); sequential starts avoid the race.
    for (const n of this.nodes) await this.startDaemon(n.index);
  }

  /**
   * Starts node i's daemon and waits for its /readyz (lease held, subnet.env written). `env` adds
   * to the daemon's environment for this start only; `waitReady: false` returns once it is spawned.
   */
  async startDaemon(
    i: number,
    extra: readonly string[] = [],
    start: {
      readonly env?: Readonly<Record<string, string>>;
      readonly waitReady?: boolean;
      /**
       * A command that execs the rest inside the node's namespace (after `ip netns exec`), e.g.
       * `setpriv --bounding-set=…` to run the daemon with a capability set of its own.
       */
      readonly wrap?: readonly string[];
    } = {},
  ): Promise<void> {
    const node = this.nodes[i]!;
    const o = this.options;
    const flags = [...(o.flags ?? []), ...extra];
    const port = flagValue(flags, 'healthz-port') ?? String(HEALTH_PORT);
    const given = flagValue(flags, 'healthz-ip');
    const host = !given || given === '0.0.0.0' || given === '::' ? '127.0.0.1' : given;
    const args = [
      ...this.#launch('weft'),
      'daemon',
      ...this.storeArgs(i),
      '--iface=eth0',
      `--subnet-file=${node.subnetFile}`,
      ...(o.iptablesResync === null ? [] : [`--iptables-resync=${o.iptablesResync ?? 1}`]),
      '--healthz-ip=127.0.0.1',
      `--healthz-port=${HEALTH_PORT}`,
      ...(o.ipMasq ? ['--ip-masq'] : []),
      ...(o.podBridge ? [`--pod-bridge=${o.podBridge}`] : []),
      ...flags,
    ];
    const env = {
      ...process.env,
      WEFT_LOG_LEVEL: 'info',
      NODE_NAME: node.name,
      // the wireguard backend's key, per node and never the host's /run/flannel/wgkey
      WIREGUARD_KEY_FILE: join(node.dir, 'wgkey'),
      // the UAPI sockets (`wg show`) are files, not per namespace: each node its own directory
      WEFT_WIREGUARD_UAPI_DIR: join(node.dir, 'wireguard'),
      ...(this.bpffs ? { WEFT_BPF_PIN_DIR: join(this.bpffs.dir, 'weft') } : {}),
      ...o.env,
      ...start.env,
    };
    const [cmd, ...argv] = [...(start.wrap ?? []), process.execPath, ...args];
    const p = this.#spawnLogged(
      node.ns,
      node.logFile,
      cmd!,
      argv,
      env,
      this.bpffs?.via(PACKAGE_ROOT),
    );
    node.daemon = p;
    node.logs = [];
    if (!o.detached) captureLogs(p, node.logs, node.logFile);
    if (start.waitReady === false) return;
    await this.#waitReady(node, p, host, port);
    node.env = readEnvFile(node.subnetFile);
  }

  async #waitReady(node: ClusterNode, p: ChildProcess, host: string, port: string): Promise<void> {
    try {
      await waitReadyz({
        ns: node.ns,
        host,
        port,
        daemon: p,
        timeoutMs: this.options.readyTimeoutMs ?? 60_000,
      });
    } catch (err) {
      throw new Error(
        `node ${node.index}: ${(err as Error).message} (log ${node.logFile})${logTail(node.logFile)}`,
      );
    }
  }

  /** Stops node i's daemon (SIGTERM, then SIGKILL after 5 s). */
  async stopDaemon(i: number): Promise<void> {
    const node = this.nodes[i]!;
    const p = node.daemon;
    node.daemon = null;
    if (p) await terminate(p);
  }

  /** SIGKILL to node i's daemon; resolves once it has exited. */
  async killDaemon(i: number): Promise<void> {
    const node = this.nodes[i]!;
    const p = node.daemon;
    node.daemon = null;
    if (!p || p.exitCode !== null || p.signalCode !== null) return;
    const gone = new Promise((r) => p.once('exit', r));
    p.kill('SIGKILL');
    await gone;
  }

  async stopDaemons(): Promise<void> {
    await Promise.all(this.nodes.map((n) => this.stopDaemon(n.index)));
  }

  /** Makes `count` more pods on every node, wired as `podWiring` says. */
  async addPods(count: number): Promise<Pod[]> {
    const made: Pod[] = [];
    for (const n of this.nodes) {
      for (let j = 0; j < count; j++) {
        const pod = this.options.podWiring === 'cni' ? await this.#cniPod(n) : this.#manualPod(n);
        n.pods.push(pod);
        made.push(pod);
      }
    }
    return made;
  }

  /** Runs the CNI plugin inside the node namespace, as a container runtime would. */
  cni(n: ClusterNode, command: 'ADD' | 'DEL', podNs: string): Record<string, unknown> {
    const conf = {
      cniVersion: '1.0.0',
      name: 'weft-testbed',
      type: 'weft',
      subnetFile: n.subnetFile,
      dataDir: join(n.dir, 'cni'),
      // As kube-flannel's cni-conf.json: pods get a default route via cni0.
      delegate: {
        hairpinMode: true,
        isDefaultGateway: true,
        ...(this.options.podBridge ? { bridge: this.options.podBridge } : {}),
      },
      ipam: { dataDir: join(n.dir, 'ipam') },
    };
    const out = nsExec(n.ns, process.execPath, this.#launch('weft-cni'), {
      cwd: PACKAGE_ROOT,
      input: JSON.stringify(conf),
      env: {
        PATH: process.env.PATH,
        CNI_COMMAND: command,
        CNI_CONTAINERID: podNs,
        CNI_NETNS: `/run/netns/${podNs}`,
        CNI_IFNAME: 'eth0',
        CNI_PATH: CNI_PLUGIN_DIR,
      },
    });
    return out.trim() ? (JSON.parse(out) as Record<string, unknown>) : {};
  }

  async #cniPod(n: ClusterNode): Promise<Pod> {
    const ns = this.scope.add();
    const result = this.cni(n, 'ADD', ns);
    const ips = (result.ips as Array<{ address: string }> | undefined) ?? [];
    const v4 = ips.find((i) => !i.address.includes(':'));
    const v6 = ips.find((i) => i.address.includes(':'));
    if (!v4 && !v6)
      throw new Error(`CNI ADD for ${ns} returned no address: ${JSON.stringify(result)}`);
    return {
      name: `pod${n.index}.${n.pods.length}`,
      ns,
      node: n.index,
      ip: v4 ? v4.address.split('/')[0]! : '',
      ip6: v6 ? v6.address.split('/')[0]! : null,
    };
  }

  /** cni0 (or podBridge) with the subnet's first address (made with the first pod), pods behind. */
  #manualPod(node: ClusterNode): Pod {
    const br = this.options.podBridge ?? 'cni0';
    const sub = node.env.FLANNEL_SUBNET!;
    const sub6 = node.env.FLANNEL_IPV6_SUBNET;
    const mtu = node.env.FLANNEL_MTU!;
    const j = node.pods.length;
    if (j === 0) {
      ip(node.ns, 'link', 'add', br, 'type', 'bridge');
      ip(node.ns, 'addr', 'add', sub, 'dev', br);
      if (sub6) ip(node.ns, 'addr', 'add', sub6, 'dev', br, 'nodad');
      ip(node.ns, 'link', 'set', br, 'mtu', mtu, 'up');
    }
    const gw = sub.split('/')[0]!;
    const gw6 = sub6?.split('/')[0];
    const pns = this.scope.add();
    this.scope.vethBetween(node.ns, `p${j}`, pns, 'eth0');
    ip(node.ns, 'link', 'set', `p${j}`, 'master', br, 'mtu', mtu, 'up');
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
    return { name: `pod${node.index}.${j}`, ns: pns, node: node.index, ip: podIp, ip6: podIp6 };
  }

  /** Releases the pods' addresses through CNI DEL (cni wiring); the namespaces go at destroy. */
  removePods(): void {
    for (const n of this.nodes) {
      for (const p of n.pods.splice(0)) {
        if (this.options.podWiring !== 'cni') continue;
        try {
          this.cni(n, 'DEL', p.ns);
        } catch {
          /* the namespace goes anyway */
        }
      }
    }
  }

  get pods(): Pod[] {
    return this.nodes.flatMap((n) => n.pods);
  }

  /** Whole `ip` output of node i, for assertions. */
  ipIn(i: number, ...args: string[]): string {
    return ip(this.nodes[i]!.ns, ...args);
  }

  /**
   * Hands a detached cluster over: this process lets go of its daemons (they keep running in
   * their own session) and returns what must be stopped later. The cluster object is spent.
   */
  detach(): DetachedCluster {
    if (!this.options.detached) throw new Error('detach() needs a cluster built with detached');
    const processes: Array<{ pid: number; what: string }> = [];
    for (const n of this.nodes) {
      const p = n.daemon;
      if (p?.pid !== undefined && p.exitCode === null)
        processes.push({ pid: p.pid, what: `daemon ${n.name}` });
      p?.unref();
      n.daemon = null;
    }
    const s = this.#storeProc;
    if (s?.pid !== undefined && s.exitCode === null)
      processes.push({ pid: s.pid, what: this.store });
    s?.unref();
    this.#storeProc = null;
    return { dir: this.dir, namespaces: [...this.scope.namespaces], processes };
  }

  async destroy(): Promise<void> {
    await Promise.all(this.nodes.map((n) => this.stopDaemon(n.index).catch(() => undefined)));
    this.#storeProc?.stdin?.end();
    await this.scope.cleanup();
    await this.bpffs?.close();
    if (!process.env.WEFT_KEEP_TEST_DIR) rmSync(this.dir, { recursive: true, force: true });
  }
}
