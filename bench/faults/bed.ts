/**
 * One fault testbed per backend: three nodes on the underlay bridge with a real etcd, the built
 * daemon (bin/weft, as production runs it) on each, one pod per node, masquerading on.
 *
 *             underlay namespace: br0 10.250.0.254/24, etcd :2379
 *        u0 ┌──────────────────────┬─u1──────────────────┴─┬─u2 ─────────────────┐
 *   node 0 (eth0 .1): the VICTIM   node 1 (eth0 .2)         node 2 (eth0 .3)
 *   weft daemon ← every fault      weft daemon              weft daemon
 *   cni0 ─ pod 0.0 (target)        cni0 ─ pod 1.0 (prober:  cni0 ─ pod 2.0
 *                                   pings the target)
 *
 * Each node namespace also runs a small HTTP agent (the daemons serve /readyz and /metrics on
 * 127.0.0.1 inside their namespace, out of this process's reach). `restore()` brings the bed
 * back to health between rows (daemons running, every pod pair pinging); the whole bed goes at
 * `destroy()`, on any path.
 */
import type { ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { encodeLeaseAttrs } from '../../src/control/lease/lease-json.js';
import { Cluster, ETCD_URL, HEALTH_PORT, type Pod } from '../../src/testbed/cluster.js';
import { nsExec, nsExecAsync } from '../../src/testbed/netns.js';
import { waitForMesh } from '../../src/testbed/probes.js';

export interface FaultBackend {
  /** As `--backends` names it (the bench's path names). */
  readonly name: string;
  readonly label: string;
  readonly backend: Readonly<Record<string, unknown>>;
  /** Daemon flags of this path (e.g. --dataplane-engine=bpf). */
  readonly flags: readonly string[];
  /** A userspace engine moves the packets (a TUN and a UDP socket of the daemon's own). */
  readonly userspace: boolean;
  /** The device weft owns: flannel.1 (kernel vxlan, or the TUN), flannel0; host-gw none. */
  readonly dev: string | null;
  /** The UDP port of the backend (userspace: the engine's socket). */
  readonly port: number | null;
  /** BackendType in its leases. */
  readonly leaseType: string;
}

export const ETCD_PREFIX = '/coreos.com/network';
/** The testbeds' namespaces and dirs are named `<BED_PREFIX>-…`. */
export const BED_PREFIX = `weft-faults-${process.pid}`;

/** Reads one line-delimited JSON answer per request from an agent in a node namespace. */
const HTTP_AGENT = `
const port = process.argv[1];
require('node:readline').createInterface({ input: process.stdin }).on('line', async (line) => {
  const { id, path, timeoutMs } = JSON.parse(line);
  let out = { id, status: 0, body: '' };
  try {
    const r = await fetch('http://127.0.0.1:' + port + path, { signal: AbortSignal.timeout(timeoutMs) });
    out = { id, status: r.status, body: await r.text() };
  } catch (err) {
    out.body = String(err);
  }
  process.stdout.write(JSON.stringify(out) + '\\n');
});`;

class HttpAgent {
  readonly #p: ChildProcess;
  readonly #pending = new Map<number, (r: { status: number; body: string }) => void>();
  #id = 0;
  #dead = false;

  constructor(cluster: Cluster, ns: string) {
    this.#p = cluster.scope.spawn(ns, process.execPath, ['-e', HTTP_AGENT, String(HEALTH_PORT)], {
      stdio: ['pipe', 'pipe', 'ignore'],
    });
    createInterface({ input: this.#p.stdout! }).on('line', (line) => {
      const r = JSON.parse(line) as { id: number; status: number; body: string };
      this.#pending.get(r.id)?.(r);
      this.#pending.delete(r.id);
    });
    // An agent that died (its namespace torn down, killed) answers every request with status 0,
    // as a daemon that did not answer: a write to its closed stdin must not end the campaign.
    const gone = () => {
      this.#dead = true;
      for (const resolve of this.#pending.values()) resolve({ status: 0, body: 'agent gone' });
      this.#pending.clear();
    };
    this.#p.stdin!.on('error', gone);
    this.#p.on('exit', gone);
  }

  /** GET a path of the daemon's endpoint; status 0 when it did not answer. */
  get(path: string, timeoutMs = 2000): Promise<{ status: number; body: string }> {
    if (this.#dead) return Promise.resolve({ status: 0, body: 'agent gone' });
    const id = ++this.#id;
    return new Promise((resolve) => {
      this.#pending.set(id, resolve);
      this.#p.stdin!.write(JSON.stringify({ id, path, timeoutMs }) + '\n');
    });
  }
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * Polls `fn` every `stepMs` until it is true; the milliseconds that took, or null after
 * `timeoutMs` (errors count as false).
 */
export async function timeUntil(
  fn: () => boolean | Promise<boolean>,
  timeoutMs: number,
  stepMs = 100,
): Promise<number | null> {
  const t0 = Date.now();
  for (;;) {
    if (
      await Promise.resolve()
        .then(fn)
        .catch(() => false)
    )
      return Date.now() - t0;
    if (Date.now() - t0 > timeoutMs) return null;
    await sleep(stepMs);
  }
}

/** A running `ping -D`; `stop()` ends it (SIGINT: it prints its summary) and returns its output. */
export interface RunningPing {
  readonly startedMs: number;
  stop(): Promise<string>;
}

export class Bed {
  readonly backend: FaultBackend;
  readonly cluster: Cluster;
  readonly #http: HttpAgent[];

  private constructor(backend: FaultBackend, cluster: Cluster) {
    this.backend = backend;
    this.cluster = cluster;
    this.#http = cluster.nodes.map((n) => new HttpAgent(cluster, n.ns));
  }

  static async build(backend: FaultBackend): Promise<Bed> {
    const cluster = await Cluster.create({
      nodes: 3,
      backend: backend.backend,
      store: 'etcd',
      launcher: 'dist',
      prefix: BED_PREFIX,
      ipMasq: true,
      flags: backend.flags,
      // the daemon's own re-check periods (iptables every 5 s), as production runs it
      iptablesResync: null,
    });
    try {
      const bed = new Bed(backend, cluster);
      const silent = await waitForMesh(cluster.pods, 20_000);
      if (silent > 0) throw new Error(`${silent} pod pair(s) unreachable 20 s after start`);
      return bed;
    } catch (err) {
      await cluster.destroy();
      throw err;
    }
  }

  /** Node 0: every fault hits it. */
  get victim() {
    return this.cluster.nodes[0]!;
  }
  get target(): Pod {
    return this.cluster.nodes[0]!.pods[0]!;
  }
  get prober(): Pod {
    return this.cluster.nodes[1]!.pods[0]!;
  }

  async readyz(i = 0): Promise<number> {
    return (await this.#http[i]!.get('/readyz')).status;
  }
  async healthz(i = 0): Promise<number> {
    return (await this.#http[i]!.get('/healthz')).status;
  }
  async metrics(i = 0): Promise<string> {
    const r = await this.#http[i]!.get('/metrics', 5000);
    if (r.status !== 200)
      throw new Error(`node ${i} /metrics: ${r.status} ${r.body.slice(0, 200)}`);
    return r.body;
  }

  /** `ip ...` in node i (async: the HTTP agents and pings go on meanwhile). */
  ip(i: number, ...args: string[]): Promise<string> {
    return nsExecAsync(this.cluster.nodes[i]!.ns, 'ip', args, 10_000);
  }
  run(i: number, cmd: string, ...args: string[]): Promise<string> {
    return nsExecAsync(this.cluster.nodes[i]!.ns, cmd, args, 10_000);
  }

  etcdctl(...args: string[]): string {
    return nsExec(this.cluster.underlay, 'etcdctl', ['--endpoints', ETCD_URL, ...args]);
  }

  /** Node i's lease key (`10.5.7.0-24`), from the subnet.env it wrote. */
  leaseKey(i: number): string {
    return this.subnet(i).replace('/', '-');
  }
  /** Node i's subnet (`10.5.7.0/24`). */
  subnet(i: number): string {
    return this.cluster.nodes[i]!.env.FLANNEL_SUBNET!.replace(/\.1\/(\d+)$/, '.0/$1');
  }

  /** A lease value this bed's backend programs (a vxlan one needs a VtepMAC). */
  leaseValue(publicIP: string, vxlan: { vni?: number; mac?: string } = {}): string {
    const type = this.backend.leaseType;
    return encodeLeaseAttrs({
      publicIP,
      publicIPv6: null,
      backendType: type,
      backendData:
        type === 'vxlan'
          ? { VNI: vxlan.vni ?? 1, VtepMAC: vxlan.mac ?? '0a:00:00:00:00:fa' }
          : type === 'wireguard'
            ? { PublicKey: randomBytes(32).toString('base64'), Port: 51820 }
            : undefined,
    });
  }

  putLease(key: string, value: string): void {
    this.etcdctl('put', `${ETCD_PREFIX}/subnets/${key}`, value);
  }
  delLease(key: string): void {
    this.etcdctl('del', `${ETCD_PREFIX}/subnets/${key}`);
  }

  /** Starts `ping -D` from a pod (every `intervalS`), reading its output as it comes. */
  ping(from: Pod, to: string, intervalS: number): RunningPing {
    const p = this.cluster.scope.spawn(
      from.ns,
      'ping',
      ['-D', '-n', '-i', String(intervalS), '-W', '1', to],
      { stdio: ['ignore', 'pipe', 'ignore'] },
    );
    let out = '';
    p.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    return {
      startedMs: Date.now(),
      async stop() {
        if (p.exitCode === null && p.signalCode === null) {
          const gone = once(p, 'exit');
          p.kill('SIGINT');
          await gone;
        }
        return out;
      },
    };
  }

  /** Sends `sig` to node i's daemon; resolves with how it ended and how long that took. */
  async signal(
    i: number,
    sig: NodeJS.Signals,
  ): Promise<{ code: number | null; signal: string | null; ms: number }> {
    const node = this.cluster.nodes[i]!;
    const p = node.daemon;
    if (!p || p.exitCode !== null || p.signalCode !== null)
      throw new Error(`node ${i}: no daemon running`);
    const gone = once(p, 'exit');
    const t0 = Date.now();
    p.kill(sig);
    await gone;
    node.daemon = null;
    return { code: p.exitCode, signal: p.signalCode, ms: Date.now() - t0 };
  }

  alive(i: number): boolean {
    const p = this.cluster.nodes[i]!.daemon;
    return !!p && p.exitCode === null && p.signalCode === null;
  }

  /** Why the bed is not healthy (a daemon down, a pod pair silent), or null. */
  async sickness(): Promise<string | null> {
    const down = this.cluster.nodes.filter((n) => !this.alive(n.index)).map((n) => n.name);
    if (down.length) return `daemon down on ${down.join(', ')}`;
    const silent = await waitForMesh(this.cluster.pods, 15_000);
    return silent > 0 ? `${silent} pod pair(s) unreachable` : null;
  }

  /**
   * Brings the bed back to health after a row: starts daemons that are down, restarts the
   * victim's when pods do not reach each other. Throws when that does not heal it (the caller
   * builds a new bed), including when a daemon came back with another subnet than its pods'.
   */
  async restore(): Promise<void> {
    const subnets = this.cluster.nodes.map((n) => n.env.FLANNEL_SUBNET);
    for (const n of this.cluster.nodes)
      if (!this.alive(n.index)) await this.cluster.startDaemon(n.index);
    let why = await this.sickness();
    if (why) {
      await this.cluster.stopDaemon(0);
      await this.cluster.startDaemon(0);
      why = await this.sickness();
    }
    const moved = this.cluster.nodes.filter((n, i) => n.env.FLANNEL_SUBNET !== subnets[i]);
    if (moved.length) throw new Error(`${moved.map((n) => n.name).join(', ')} took a new subnet`);
    if (why) throw new Error(`testbed did not heal: ${why}`);
  }

  async destroy(): Promise<void> {
    await this.cluster.destroy();
  }
}
