/**
 * A weft cluster on one machine, built from network namespaces (DESIGN §9). Used by
 * `weft demo`, `weft bench` and the integration tests.
 *
 *                 underlay namespace: bridge br0 (10.250.0.254/24, fd00:250::fe/64)
 *           ┌──────────────┬──────┴───────┬──────────────┐
 *      veth │ 10.250.0.1   │ 10.250.0.2   │ 10.250.0.3   │   (etcd on 10.250.0.254 with --store etcd)
 *   ┌───────┴──────┐┌──────┴───────┐┌─────┴────────┐
 *   │ node 0  eth0 ││ node 1  eth0 ││ node 2  eth0 │  one `weft daemon` each (ip netns exec)
 *   │ cni0 (CNI)   ││ cni0         ││ cni0         │  bridge + host-local via weft-cni
 *   └──┬───────────┘└──┬───────────┘└──┬───────────┘
 *     pod 0.0 ...     pod 1.0 ...     pod 2.0 ...       each pod: its own namespace, eth0
 *
 * The embedded store is a directory under the cluster's temp dir, shared by every daemon.
 * `destroy()` stops every process and deletes every namespace it made, on any path.
 */
import type { ChildProcess } from 'node:child_process';
import { createWriteStream, mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Netns, ipIn, nsRun } from './netns.js';

/** The weft package root (this file is src/control/testbed/ or dist/control/testbed/). */
export const PACKAGE_ROOT = fileURLToPath(new URL('../../..', import.meta.url));
export const WEFT_BIN = join(PACKAGE_ROOT, 'bin', 'weft');
export const WEFT_CNI_BIN = join(PACKAGE_ROOT, 'bin', 'weft-cni');
export const CNI_PLUGIN_DIR = '/usr/lib/cni';

export const UNDERLAY_V4 = '10.250.0';
export const UNDERLAY_V6 = 'fd00:250::';
export const CLUSTER_NETWORK = '10.5.0.0/16';
export const CLUSTER_NETWORK_V6 = 'fd00:5::/48';

export interface Pod {
  readonly name: string;
  readonly ns: string;
  readonly node: ClusterNode;
  readonly ip: string;
  readonly ip6: string | null;
}

export interface ClusterNode {
  readonly index: number;
  readonly ns: string;
  readonly ip: string;
  readonly ip6: string;
  readonly dir: string;
  readonly subnetFile: string;
  daemon: ChildProcess | null;
  readonly pods: Pod[];
}

export interface ClusterOptions {
  readonly nodes: number;
  /** Temp dir owned by the cluster (store, subnet files, CNI state, daemon logs). */
  readonly dir: string;
  readonly netns?: Netns;
  /** Name prefix of the namespaces the cluster makes itself (default `weft-<pid>`). */
  readonly prefix?: string;
  readonly store?: 'embedded' | 'etcd';
  /** Underlay MTU (veth default 1500). */
  readonly mtu?: number;
}

export interface DaemonStart {
  /** The net-conf JSON written to the store before the daemons start. */
  readonly netConf: Record<string, unknown>;
  readonly extraArgs?: readonly string[];
  readonly timeoutMs?: number;
}

export class Cluster {
  readonly netns: Netns;
  readonly dir: string;
  readonly underlay: string;
  readonly nodes: ClusterNode[] = [];
  readonly store: 'embedded' | 'etcd';
  #etcd: ChildProcess | null = null;
  readonly #ownNetns: boolean;

  private constructor(o: ClusterOptions, underlay: string, netns: Netns) {
    this.netns = netns;
    this.#ownNetns = o.netns === undefined;
    this.dir = o.dir;
    this.underlay = underlay;
    this.store = o.store ?? 'embedded';
  }

  static async create(o: ClusterOptions): Promise<Cluster> {
    const netns = o.netns ?? new Netns(o.prefix);
    const underlay = await netns.add();
    const c = new Cluster(o, underlay, netns);
    try {
      await c.#build(o);
    } catch (err) {
      await c.destroy();
      throw err;
    }
    return c;
  }

  async #build(o: ClusterOptions): Promise<void> {
    const u = this.underlay;
    await ipIn(u, 'link', 'add', 'br0', 'type', 'bridge');
    await ipIn(u, 'addr', 'add', `${UNDERLAY_V4}.254/24`, 'dev', 'br0');
    await ipIn(u, 'addr', 'add', `${UNDERLAY_V6}fe/64`, 'dev', 'br0', 'nodad');
    await ipIn(u, 'link', 'set', 'br0', 'up');
    for (let i = 0; i < o.nodes; i++) {
      const ns = await this.netns.add();
      const dir = join(this.dir, `node${i}`);
      mkdirSync(dir, { recursive: true });
      await this.netns.veth(ns, 'eth0', u, `n${i}`);
      await ipIn(u, 'link', 'set', `n${i}`, 'master', 'br0', 'up');
      if (o.mtu) {
        await ipIn(ns, 'link', 'set', 'eth0', 'mtu', String(o.mtu));
        await ipIn(u, 'link', 'set', `n${i}`, 'mtu', String(o.mtu));
      }
      const ip = `${UNDERLAY_V4}.${i + 1}`;
      const ip6 = `${UNDERLAY_V6}${(i + 1).toString(16)}`;
      await ipIn(ns, 'addr', 'add', `${ip}/24`, 'dev', 'eth0');
      await ipIn(ns, 'addr', 'add', `${ip6}/64`, 'dev', 'eth0', 'nodad');
      await ipIn(ns, 'link', 'set', 'eth0', 'up');
      await ipIn(ns, 'route', 'add', 'default', 'via', `${UNDERLAY_V4}.254`);
      await nsRun(ns, 'sysctl', ['-qw', 'net.ipv4.ip_forward=1', 'net.ipv6.conf.all.forwarding=1']);
      this.nodes.push({
        index: i,
        ns,
        ip,
        ip6,
        dir,
        subnetFile: join(dir, 'subnet.env'),
        daemon: null,
        pods: [],
      });
    }
    if (this.store === 'etcd') await this.#startEtcd();
  }

  async #startEtcd(): Promise<void> {
    const data = join(this.dir, 'etcd');
    const url = `http://${UNDERLAY_V4}.254:2379`;
    this.#etcd = this.netns.spawn(
      this.underlay,
      'etcd',
      [
        '--name',
        'weft-demo',
        '--data-dir',
        data,
        '--listen-client-urls',
        url,
        '--advertise-client-urls',
        url,
        '--listen-peer-urls',
        `http://${UNDERLAY_V4}.254:2380`,
        '--initial-advertise-peer-urls',
        `http://${UNDERLAY_V4}.254:2380`,
        '--initial-cluster',
        `weft-demo=http://${UNDERLAY_V4}.254:2380`,
        '--log-level',
        'error',
      ],
      { stdio: ['ignore', 'ignore', 'pipe'] },
    );
    for (let i = 0; i < 100; i++) {
      try {
        await nsRun(this.underlay, 'etcdctl', ['--endpoints', url, 'endpoint', 'health'], {
          timeoutMs: 2000,
        });
        return;
      } catch {
        await new Promise((r) => setTimeout(r, 150));
      }
    }
    throw new Error('etcd did not become healthy in the underlay namespace');
  }

  /** Store flags every weft command of this cluster needs. */
  storeArgs(): string[] {
    return this.store === 'etcd'
      ? [`--etcd-endpoints=http://${UNDERLAY_V4}.254:2379`]
      : [`--store-dir=${join(this.dir, 'store')}`];
  }

  /** Writes the net-conf with `weft config set` (from the underlay namespace). */
  async setConfig(netConf: Record<string, unknown>): Promise<void> {
    const file = join(this.dir, 'net-conf.json');
    writeFileSync(file, JSON.stringify(netConf));
    await nsRun(this.underlay, process.execPath, [
      WEFT_BIN,
      'config',
      'set',
      file,
      ...this.storeArgs(),
    ]);
  }

  /** Starts one daemon per node and waits until each logs `ready`. */
  async startDaemons(s: DaemonStart): Promise<void> {
    await this.setConfig(s.netConf);
    await Promise.all(this.nodes.map((n) => this.startDaemon(n, s.extraArgs ?? [], s.timeoutMs)));
  }

  async startDaemon(
    n: ClusterNode,
    extraArgs: readonly string[] = [],
    timeoutMs = 20_000,
  ): Promise<void> {
    const log = createWriteStream(join(n.dir, 'daemon.log'), { flags: 'a' });
    const p = this.netns.spawn(n.ns, process.execPath, [
      WEFT_BIN,
      'daemon',
      '--iface=eth0',
      '--ip-masq',
      `--subnet-file=${n.subnetFile}`,
      ...this.storeArgs(),
      ...extraArgs,
    ]);
    n.daemon = p;
    await new Promise<void>((resolve, reject) => {
      let buf = '';
      const timer = setTimeout(
        () => fail(new Error(`node ${n.index}: daemon not ready after ${timeoutMs} ms`)),
        timeoutMs,
      );
      const fail = (err: Error) => {
        clearTimeout(timer);
        const why = lastErrorMessage(buf);
        const tail = buf.split('\n').slice(-8).join('\n');
        reject(Object.assign(err, { message: `${err.message}${why ? `: ${why}` : ''}\n${tail}` }));
      };
      p.stderr!.on('data', (d: Buffer) => {
        log.write(d);
        buf += d.toString();
        if (/"msg":"ready"/.test(buf)) {
          clearTimeout(timer);
          resolve();
        }
      });
      p.on('exit', (code, sig) =>
        fail(new Error(`node ${n.index}: daemon exited (${code ?? sig})`)),
      );
    });
  }

  async stopDaemons(): Promise<void> {
    await Promise.all(
      this.nodes.map(async (n) => {
        const p = n.daemon;
        n.daemon = null;
        if (!p || p.exitCode !== null || p.signalCode !== null) return;
        const exited = new Promise((r) => p.once('exit', r));
        p.kill('SIGTERM');
        const t = setTimeout(() => p.kill('SIGKILL'), 5000);
        await exited;
        clearTimeout(t);
      }),
    );
  }

  /** Runs the CNI plugin inside the node namespace, as a container runtime would. */
  async cni(
    n: ClusterNode,
    command: 'ADD' | 'DEL',
    podNs: string,
  ): Promise<Record<string, unknown>> {
    const conf = {
      cniVersion: '1.0.0',
      name: 'weft-demo',
      type: 'weft',
      subnetFile: n.subnetFile,
      dataDir: join(n.dir, 'cni'),
      // As kube-flannel's cni-conf.json: pods get a default route via cni0.
      delegate: { hairpinMode: true, isDefaultGateway: true },
      ipam: { dataDir: join(n.dir, 'ipam') },
    };
    const out = await nsRun(n.ns, process.execPath, [WEFT_CNI_BIN], {
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

  /** Creates `count` pods on every node through weft-cni → bridge + host-local. */
  async addPods(count: number): Promise<Pod[]> {
    const made: Pod[] = [];
    for (const n of this.nodes) {
      for (let j = 0; j < count; j++) {
        const ns = await this.netns.add();
        const result = await this.cni(n, 'ADD', ns);
        const ips = (result.ips as Array<{ address: string }> | undefined) ?? [];
        const v4 = ips.find((i) => !i.address.includes(':'));
        const v6 = ips.find((i) => i.address.includes(':'));
        if (!v4 && !v6)
          throw new Error(`CNI ADD for ${ns} returned no address: ${JSON.stringify(result)}`);
        const pod: Pod = {
          name: `pod${n.index}.${n.pods.length}`,
          ns,
          node: n,
          ip: v4 ? v4.address.split('/')[0]! : '',
          ip6: v6 ? v6.address.split('/')[0]! : null,
        };
        n.pods.push(pod);
        made.push(pod);
      }
    }
    return made;
  }

  async removePods(): Promise<void> {
    for (const n of this.nodes) {
      for (const p of n.pods.splice(0)) await this.cni(n, 'DEL', p.ns).catch(() => {});
    }
  }

  get pods(): Pod[] {
    return this.nodes.flatMap((n) => n.pods);
  }

  async destroy(): Promise<void> {
    for (const n of this.nodes) {
      if (n.daemon && n.daemon.exitCode === null) n.daemon.kill('SIGKILL');
    }
    this.#etcd?.kill('SIGKILL');
    if (this.#ownNetns) await this.netns.cleanup();
  }
}

/** The `msg` of the last error-level JSON log line in `text`, if any. */
function lastErrorMessage(text: string): string | null {
  for (const line of text.trim().split('\n').reverse()) {
    try {
      const l = JSON.parse(line) as { level?: string; msg?: string };
      if (l.level === 'error' || l.level === 'fatal') return l.msg ?? null;
    } catch {
      /* not JSON */
    }
  }
  return null;
}

export interface PingResult {
  readonly sent: number;
  readonly received: number;
  readonly avgMs: number | null;
  readonly p99Ms: number | null;
}

/** `ping -c count` from a namespace; never throws for lost packets. */
export async function ping(
  ns: string,
  dst: string,
  count = 3,
  intervalS = 0.2,
): Promise<PingResult> {
  let out: string;
  try {
    out = await nsRun(ns, 'ping', [
      '-n',
      '-c',
      String(count),
      '-i',
      String(intervalS),
      '-W',
      '1',
      dst,
    ]);
  } catch (err) {
    out = (err as { stdout?: string }).stdout ?? '';
  }
  const rtts = [...out.matchAll(/time=([\d.]+) ms/g)].map((m) => Number(m[1]));
  const sent = Number(/(\d+) packets transmitted/.exec(out)?.[1] ?? count);
  const sorted = [...rtts].sort((a, b) => a - b);
  return {
    sent,
    received: rtts.length,
    avgMs: rtts.length ? rtts.reduce((a, b) => a + b, 0) / rtts.length : null,
    p99Ms: sorted.length
      ? sorted[Math.min(sorted.length - 1, Math.ceil(sorted.length * 0.99) - 1)]!
      : null,
  };
}

/**
 * Waits until every pod reaches every pod on another node (routes converge as leases propagate),
 * pinging once per pair per round; resolves to the number of pairs still unreachable at the end.
 */
export async function waitForMesh(pods: readonly Pod[], timeoutMs = 15_000): Promise<number> {
  const pairs: Array<[Pod, Pod]> = [];
  for (const a of pods) for (const b of pods) if (a !== b && a.node !== b.node) pairs.push([a, b]);
  const deadline = Date.now() + timeoutMs;
  let pending = pairs;
  while (pending.length > 0 && Date.now() < deadline) {
    const results = await Promise.all(pending.map(([a, b]) => ping(a.ns, b.ip || b.ip6!, 1)));
    pending = pending.filter((_, i) => results[i]!.received === 0);
  }
  return pending.length;
}

export interface IperfResult {
  readonly bitsPerSecond: number;
  readonly json: Record<string, unknown>;
}

/** iperf3 from `client` to a one-shot server in `server` (bound to `serverIp`). */
export async function iperf(
  netns: Netns,
  server: string,
  serverIp: string,
  client: string,
  args: readonly string[] = ['-t', '2'],
): Promise<IperfResult> {
  const port = String(5201 + Math.floor(Math.random() * 500));
  const srv = netns.spawn(server, 'iperf3', ['-s', '-1', '-B', serverIp, '-p', port], {
    stdio: 'ignore',
  });
  try {
    let lastErr: unknown;
    for (let attempt = 0; attempt < 30; attempt++) {
      try {
        const out = await nsRun(client, 'iperf3', ['-c', serverIp, '-p', port, '-J', ...args], {
          timeoutMs: 60_000,
        });
        const json = JSON.parse(out) as {
          error?: string;
          end?: { sum_received?: { bits_per_second?: number }; sum?: { bits_per_second?: number } };
        };
        // iperf3 -J reports some failures (the server not listening yet) inside its JSON.
        if (json.error) throw Object.assign(new Error(`iperf3: ${json.error}`), { stdout: out });
        const bps = json.end?.sum_received?.bits_per_second ?? json.end?.sum?.bits_per_second ?? 0;
        return { bitsPerSecond: bps, json: json as Record<string, unknown> };
      } catch (err) {
        lastErr = err;
        const text = `${String(err)} ${(err as { stdout?: string }).stdout ?? ''}`;
        if (!/Connection refused|unable to connect|unable to send control message/i.test(text))
          throw err;
        await new Promise((r) => setTimeout(r, 100));
      }
    }
    throw lastErr;
  } finally {
    if (srv.exitCode === null) srv.kill('SIGKILL');
  }
}
