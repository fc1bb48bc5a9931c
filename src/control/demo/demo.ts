/**
 * `weft demo`: the one-command local cluster (DESIGN §9). For each backend it builds a fresh
 * cluster of network namespaces, starts one `weft daemon` per node on a shared store, creates
 * pods through weft-cni (bridge + host-local), pings every pod pair, runs a short iperf3, and
 * prints a table. Everything it made is removed on success, failure or Ctrl-C; with --keep the
 * last cluster stays up until `weft demo down`.
 */
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { WeftError, usageError } from '../../common/errors.js';
import { bool, int, list, oneOf, parseFlags, usage } from '../config/flags.js';
import type { Io } from '../cli/store-commands.js';
import {
  Cluster,
  iperf,
  ping,
  waitForMesh,
  CLUSTER_NETWORK,
  type Pod,
} from '../testbed/cluster.js';
import { deleteNamespace, isRoot } from '../testbed/netns.js';
import { Progress } from './progress.js';

export const DEMO_BACKENDS: Record<string, Record<string, unknown>> = {
  'host-gw': { Type: 'host-gw' },
  vxlan: { Type: 'vxlan' },
  'vxlan-userspace': { Type: 'vxlan', Dataplane: 'userspace' },
  udp: { Type: 'udp' },
};

export const DEMO_FLAGS = {
  nodes: int(3, 'number of node namespaces', { min: 2, max: 16 }),
  pods: int(1, 'pods per node', { min: 1, max: 4 }),
  backend: list(
    `backends to run, comma-separated (default: ${Object.keys(DEMO_BACKENDS).join(',')})`,
    {
      valueName: 'LIST',
    },
  ),
  store: oneOf(['embedded', 'etcd'] as const, 'embedded', 'lease store shared by the nodes'),
  'iperf-seconds': int(2, 'iperf3 duration per backend', { min: 1, max: 60 }),
  keep: bool(false, 'leave the last cluster up (remove it with `weft demo down`)'),
  help: bool(false, 'print this message'),
} as const;

/** Where kept clusters are recorded for `weft demo down`. */
const STATE_DIR = '/run/weft-demo';

export interface DemoRow {
  backend: string;
  pairs: number;
  reachable: number;
  gbps: number | null;
  rttAvgMs: number | null;
  error?: string;
}

export async function demoCommand(argv: readonly string[], io: Io): Promise<number> {
  const parsed = parseFlags(DEMO_FLAGS, argv, io.env);
  const o = parsed.values;
  if (o.help) {
    io.stdout.write(
      usage(
        DEMO_FLAGS,
        'weft demo [flags] | weft demo down',
        'A local weft cluster in network namespaces.',
      ),
    );
    return 0;
  }
  if (!isRoot()) {
    throw new WeftError(
      'WEFT_ERR_USAGE',
      'weft demo must run as root (it creates network namespaces); try: sudo npm run demo',
    );
  }
  if (parsed.positionals[0] === 'down') return demoDown(io);
  if (parsed.positionals.length > 0)
    throw usageError('', `unexpected argument ${JSON.stringify(parsed.positionals[0])}`);
  const backends = o.backend.length
    ? o.backend
        .flatMap((b) => b.split(','))
        .map((b) => b.trim())
        .filter(Boolean)
    : Object.keys(DEMO_BACKENDS);
  for (const b of backends) {
    if (!DEMO_BACKENDS[b])
      throw usageError(
        'backend',
        `unknown backend ${JSON.stringify(b)} (known: ${Object.keys(DEMO_BACKENDS).join(', ')})`,
      );
  }

  const progress = new Progress();
  const rows: DemoRow[] = [];
  let current: Cluster | null = null;
  let interrupted = false;
  const onSignal = () => {
    if (interrupted) return;
    interrupted = true;
    progress.note('interrupted: removing the cluster');
    void (current?.destroy() ?? Promise.resolve()).finally(() => process.exit(130));
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  const prefix = `weft-demo-${process.pid}`;
  try {
    for (const [i, backend] of backends.entries()) {
      const last = i === backends.length - 1;
      const dir = mkdtempSync(join(tmpdir(), `${prefix}-`));
      const cluster: Cluster = await progress.step(
        `[${backend}] building ${o.nodes} nodes on an underlay bridge (${o.store} store)`,
        () => Cluster.create({ nodes: o.nodes, dir, store: o.store, prefix }),
      );
      current = cluster;
      const keepThis = o.keep && last;
      try {
        rows.push(await runBackend(cluster, backend, o.pods, o.iperfSeconds, progress));
      } catch (err) {
        rows.push({
          backend,
          pairs: 0,
          reachable: 0,
          gbps: null,
          rttAvgMs: null,
          error: (err as Error).message.split('\n')[0],
        });
      } finally {
        if (keepThis) {
          recordKept(cluster);
          printKept(io, cluster);
        } else {
          await progress.step(`[${backend}] removing the cluster`, async () => {
            await cluster.stopDaemons();
            await cluster.removePods();
            await cluster.destroy();
            rmSync(dir, { recursive: true, force: true });
          });
        }
        current = null;
      }
    }
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    if (current) await (current as Cluster).destroy();
  }
  io.stdout.write(renderTable(rows));
  return rows.every((r) => !r.error && r.reachable === r.pairs && r.pairs > 0) ? 0 : 1;
}

async function runBackend(
  cluster: Cluster,
  backend: string,
  pods: number,
  iperfSeconds: number,
  progress: Progress,
): Promise<DemoRow> {
  const netConf = { Network: CLUSTER_NETWORK, Backend: DEMO_BACKENDS[backend]! };
  await progress.step(`[${backend}] starting ${cluster.nodes.length} weft daemons`, () =>
    cluster.startDaemons({ netConf }),
  );
  const made = await progress.step(
    `[${backend}] creating pods through weft-cni (bridge + host-local)`,
    () => cluster.addPods(pods),
    (p) => p.map((x) => `${x.name} ${x.ip}`).join(', '),
  );
  await progress.step(
    `[${backend}] waiting for routes to converge`,
    () => waitForMesh(made, 15_000),
    (left) => (left === 0 ? 'every pair answers' : `${left} pair(s) still silent after 15 s`),
  );
  const pairs: Array<[Pod, Pod]> = [];
  for (const a of made) for (const b of made) if (a !== b && a.node !== b.node) pairs.push([a, b]);
  const results = await progress.step(
    `[${backend}] pinging ${pairs.length} pod pairs across nodes`,
    () => Promise.all(pairs.map(([a, b]) => ping(a.ns, b.ip, 3))),
    (r) => `${r.filter((x) => x.received > 0).length}/${r.length} reachable`,
  );
  const rtts = results.map((r) => r.avgMs).filter((x): x is number => x !== null);
  let gbps: number | null = null;
  const [src, dst] = pairs[0] ?? [];
  if (src && dst && results[0]!.received > 0) {
    const r = await progress.step(
      `[${backend}] iperf3 ${src.name} → ${dst.name} for ${iperfSeconds}s`,
      () => iperf(cluster.netns, dst.ns, dst.ip, src.ns, ['-t', String(iperfSeconds)]),
      (x) => `${(x.bitsPerSecond / 1e9).toFixed(2)} Gbit/s`,
    );
    gbps = r.bitsPerSecond / 1e9;
  }
  return {
    backend,
    pairs: pairs.length,
    reachable: results.filter((r) => r.received > 0).length,
    gbps,
    rttAvgMs: rtts.length ? rtts.reduce((a, b) => a + b, 0) / rtts.length : null,
  };
}

export function renderTable(rows: readonly DemoRow[]): string {
  const head = ['backend', 'reachable', 'throughput', 'rtt avg'];
  const body = rows.map((r) => [
    r.backend,
    r.error ? 'failed' : `${r.reachable}/${r.pairs}`,
    r.gbps === null ? '-' : `${r.gbps.toFixed(2)} Gbit/s`,
    r.rttAvgMs === null ? '-' : `${r.rttAvgMs.toFixed(3)} ms`,
  ]);
  const all = [head, ...body];
  const w = head.map((_, i) => Math.max(...all.map((r) => r[i]!.length)));
  const line = (r: string[]) =>
    r
      .map((c, i) => c.padEnd(w[i]!))
      .join('   ')
      .trimEnd();
  let out = `\n${line(head)}\n${w.map((x) => '─'.repeat(x)).join('   ')}\n${body.map(line).join('\n')}\n`;
  for (const r of rows) if (r.error) out += `\n${r.backend}: ${r.error}\n`;
  return out;
}

function recordKept(cluster: Cluster): void {
  mkdirSync(STATE_DIR, { recursive: true });
  writeFileSync(
    join(STATE_DIR, `${process.pid}.json`),
    JSON.stringify({ namespaces: cluster.netns.names, dir: cluster.dir }),
  );
}

function printKept(io: Io, cluster: Cluster): void {
  io.stdout.write(`\nThe cluster is still up. Enter it with:\n`);
  for (const n of cluster.nodes) {
    io.stdout.write(
      `  ip netns exec ${n.ns} bash     # node ${n.index} (${n.ip})${n.pods.map((p) => `; pod ${p.ns} ${p.ip}`).join('')}\n`,
    );
  }
  io.stdout.write(`Remove it with: weft demo down\n`);
}

/** Removes every kept demo cluster (and any demo namespace a crash left behind). */
async function demoDown(io: Io): Promise<number> {
  let removed = 0;
  let files: string[] = [];
  try {
    files = readdirSync(STATE_DIR).filter((f) => f.endsWith('.json'));
  } catch {
    /* nothing kept */
  }
  for (const f of files) {
    const state = JSON.parse(readFileSync(join(STATE_DIR, f), 'utf8')) as {
      namespaces: string[];
      dir: string;
    };
    for (const ns of state.namespaces) await deleteNamespace(ns);
    rmSync(state.dir, { recursive: true, force: true });
    rmSync(join(STATE_DIR, f), { force: true });
    removed++;
  }
  let stray: string[] = [];
  try {
    stray = readdirSync('/run/netns').filter((n) => n.startsWith('weft-demo-'));
  } catch {
    /* no namespaces */
  }
  for (const ns of stray) await deleteNamespace(ns);
  io.stdout.write(
    `removed ${removed} kept cluster(s)${stray.length ? ` and ${stray.length} stray namespace(s)` : ''}\n`,
  );
  return 0;
}
