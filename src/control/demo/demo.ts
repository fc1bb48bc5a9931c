/**
 * `weft demo`: the one-command local cluster (DESIGN §9). For each backend it builds a fresh
 * cluster of network namespaces, starts one `weft daemon` per node on a shared store, creates
 * pods through weft-cni (bridge + host-local), pings every pod pair, runs a short iperf3, and
 * prints a table. Everything it made is removed on success, failure or Ctrl-C.
 *
 * The table names the engine that moved the packets, as the daemons' logs say (kernel for the
 * kernel backends). The bpf rows (`vxlan-bpf`, `udp-bpf`: `--dataplane-engine=bpf`) need the
 * bpf engine's programs to load here: where they cannot, the daemons fall back to native and the
 * row says why instead of measuring native under a bpf label (not a failure of the demo).
 *
 * With --keep the last cluster is built detached (daemons and etcd in their own session, their
 * output in log files under the state dir), recorded in `<state-dir>/weft-demo-<pid>.json`
 * (processes with their start times, namespaces, dir), and the command returns. `weft demo down`
 * stops exactly what those state files list, nothing else.
 */
import { mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { WeftError, usageError } from '../../common/errors.js';
import { bool, int, list, oneOf, parseFlags, str, usage } from '../config/flags.js';
import type { Io } from '../cli/store-commands.js';
import { Cluster, type DetachedCluster, type Pod } from '../../testbed/cluster.js';
import { iperf, ping, waitForMesh } from '../../testbed/probes.js';
import { onEarlyEnd } from '../../testbed/early-end.js';
import { deleteNamespace, isRoot } from '../../testbed/netns.js';
import { Progress } from './progress.js';

export interface DemoBackend {
  /** The net-conf Backend block. */
  readonly backend: Record<string, unknown>;
  /** Extra daemon flags. */
  readonly flags?: readonly string[];
}

export const DEMO_BACKENDS: Record<string, DemoBackend> = {
  'host-gw': { backend: { Type: 'host-gw' } },
  vxlan: { backend: { Type: 'vxlan' } },
  'vxlan-userspace': { backend: { Type: 'vxlan', Dataplane: 'userspace' } },
  'vxlan-bpf': {
    backend: { Type: 'vxlan', Dataplane: 'userspace' },
    flags: ['--dataplane-engine=bpf'],
  },
  udp: { backend: { Type: 'udp' } },
  'udp-bpf': { backend: { Type: 'udp' }, flags: ['--dataplane-engine=bpf'] },
  // flannel's wireguard in the native engine; each node's key in its own dir (testbed)
  wireguard: { backend: { Type: 'wireguard', PersistentKeepaliveInterval: 25 } },
};

/** The log line of a userspace backend's engine start (backend/userspace.ts) and its field. */
const ENGINE_STARTED = 'userspace dataplane started';
/** What the dataplane logs when the bpf engine cannot run (dataplane/index.ts). */
const BPF_FELL_BACK = 'bpf engine unavailable; the native engine runs instead';

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
  keep: bool(
    false,
    'leave the last cluster up, detached, and return (remove it with `weft demo down`)',
  ),
  'state-dir': str(
    '/run/weft-demo',
    'where kept clusters are recorded (and keep their logs); `weft demo down` reads it',
    'DIR',
  ),
  help: bool(false, 'print this message'),
} as const;

/** A kept cluster as `<state-dir>/<id>.json` records it for `weft demo down`. */
export interface KeptState {
  readonly id: string;
  readonly dir: string;
  readonly namespaces: readonly string[];
  /** `start`: the process's start time (/proc/<pid>/stat field 22), so a reused pid is spared. */
  readonly processes: ReadonlyArray<{ pid: number; start: string | null; what: string }>;
  readonly nodes: ReadonlyArray<{ name: string; ns: string; ip: string; log: string }>;
  readonly pods: ReadonlyArray<{ name: string; ns: string; ip: string; node: number }>;
}

export interface DemoRow {
  backend: string;
  /** The engine that moved the packets: kernel, native, bpf or js (null: not known). */
  engine: string | null;
  /** Why the row's engine could not run here (the bpf rows): not measured, not a failure. */
  unavailable?: string;
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
  if (parsed.positionals[0] === 'down') return demoDown(io, o.stateDir);
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
  // Ctrl-C, SIGTERM, a closed terminal or output (`weft demo | head`): the cluster goes too.
  const early = onEarlyEnd('weft demo', () => current?.destroy(), 'the cluster');
  const id = `weft-demo-${process.pid}`;
  try {
    for (const [i, backend] of backends.entries()) {
      const keepThis = o.keep && i === backends.length - 1;
      const cluster: Cluster = await progress.step(
        `[${backend}] building ${o.nodes} nodes on an underlay bridge (${o.store} store)`,
        () =>
          Cluster.build({
            nodes: o.nodes,
            store: o.store,
            backend: DEMO_BACKENDS[backend]!.backend,
            flags: DEMO_BACKENDS[backend]!.flags ?? [],
            prefix: id,
            parallelStart: true,
            podWiring: 'cni',
            defaultRoute: true,
            ipMasq: true,
            iptablesResync: null,
            // A kept cluster outlives this command: its own session, logs under the state dir.
            ...(keepThis ? { detached: true, dir: join(o.stateDir, id) } : {}),
          }),
      );
      current = cluster;
      try {
        rows.push(await runBackend(cluster, backend, o.pods, o.iperfSeconds, progress));
      } catch (err) {
        rows.push({
          backend,
          engine: null,
          pairs: 0,
          reachable: 0,
          gbps: null,
          rttAvgMs: null,
          error: (err as Error).message.split('\n')[0],
        });
      } finally {
        if (keepThis) {
          printKept(io, await recordKept(cluster, id, o.stateDir), o.stateDir);
        } else {
          await progress.step(`[${backend}] removing the cluster`, async () => {
            await cluster.stopDaemons();
            cluster.removePods();
            await cluster.destroy();
          });
        }
        current = null;
      }
    }
  } finally {
    early.off();
    if (current) await (current as Cluster).destroy();
  }
  io.stdout.write(renderTable(rows));
  return rows.every((r) => r.unavailable || (!r.error && r.reachable === r.pairs && r.pairs > 0))
    ? 0
    : 1;
}

/**
 * The engine the daemons run, from their logs: the userspace backends log it when their
 * dataplane starts (kernel when none does); `unavailable` is the reason a node gave for running
 * native where bpf was asked.
 */
export function daemonEngines(lines: Iterable<Readonly<Record<string, unknown>>>): {
  engine: string | null;
  unavailable: string | null;
} {
  const engines = new Set<string>();
  let unavailable: string | null = null;
  for (const l of lines) {
    if (l.msg === ENGINE_STARTED && typeof l.engine === 'string') engines.add(l.engine);
    if (l.msg === BPF_FELL_BACK && unavailable === null) unavailable = String(l.err);
  }
  const engine = engines.size === 0 ? 'kernel' : [...engines].sort().join('+');
  return { engine, unavailable };
}

/**
 * A node's daemon log lines: as captured (in memory, complete once the daemon is ready), or
 * for a detached daemon (nothing captured) from its log file.
 */
function nodeLogLines(n: Cluster['nodes'][number]): Array<Readonly<Record<string, unknown>>> {
  if (n.logs.length > 0) return n.logs;
  const out: Array<Record<string, unknown>> = [];
  for (const line of readLog(n.logFile).split('\n')) {
    try {
      if (line.startsWith('{')) out.push(JSON.parse(line) as Record<string, unknown>);
    } catch {
      /* not a log line */
    }
  }
  return out;
}

function readLog(file: string): string {
  try {
    return readFileSync(file, 'utf8');
  } catch {
    return '';
  }
}

async function runBackend(
  cluster: Cluster,
  backend: string,
  pods: number,
  iperfSeconds: number,
  progress: Progress,
): Promise<DemoRow> {
  await progress.step(`[${backend}] starting ${cluster.nodes.length} weft daemons`, () =>
    cluster.startDaemons(),
  );
  const { engine, unavailable } = await progress.step(
    `[${backend}] checking which engine runs`,
    async () => daemonEngines(cluster.nodes.flatMap(nodeLogLines)),
    (e) => (e.unavailable ? `bpf unavailable: ${e.unavailable}` : `${e.engine}`),
  );
  const asksBpf = DEMO_BACKENDS[backend]?.flags?.includes('--dataplane-engine=bpf') ?? false;
  if (asksBpf && (unavailable !== null || engine !== 'bpf')) {
    // Measuring here would measure native under a bpf label.
    return {
      backend,
      engine,
      pairs: 0,
      reachable: 0,
      gbps: null,
      rttAvgMs: null,
      unavailable: `the bpf engine cannot run on this machine (${unavailable ?? `the daemons run ${engine}`}); the daemons fell back to native, so this row is not measured`,
    };
  }
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
      () => iperf(cluster.scope, dst.ns, dst.ip, src.ns, ['-t', String(iperfSeconds)]),
      (x) => `${(x.bitsPerSecond / 1e9).toFixed(2)} Gbit/s`,
    );
    gbps = r.bitsPerSecond / 1e9;
  }
  return {
    backend,
    engine,
    pairs: pairs.length,
    reachable: results.filter((r) => r.received > 0).length,
    gbps,
    rttAvgMs: rtts.length ? rtts.reduce((a, b) => a + b, 0) / rtts.length : null,
  };
}

export function renderTable(rows: readonly DemoRow[]): string {
  const head = ['backend', 'engine', 'reachable', 'throughput', 'rtt avg'];
  const body = rows.map((r) => [
    r.backend,
    r.engine ?? '-',
    r.error ? 'failed' : r.unavailable ? 'unavailable' : `${r.reachable}/${r.pairs}`,
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
  for (const r of rows) if (r.unavailable) out += `\n${r.backend}: ${r.unavailable}\n`;
  return out;
}

/** The start time of process `pid` (/proc/<pid>/stat field 22), or null if it is gone. */
export function processStart(pid: number): string | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // Field 2 (comm) may hold spaces and parentheses: count from the last ')'.
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19] ?? null;
  } catch {
    return null;
  }
}

/**
 * Lets go of the cluster (its daemons keep running in their own session) and records it. If the
 * record cannot be written, what was detached is removed at once: nothing unrecorded stays up.
 */
async function recordKept(cluster: Cluster, id: string, stateDir: string): Promise<KeptState> {
  const nodes = cluster.nodes.map((n) => ({ name: n.name, ns: n.ns, ip: n.ip, log: n.logFile }));
  const pods = cluster.pods.map((p) => ({ name: p.name, ns: p.ns, ip: p.ip, node: p.node }));
  const d: DetachedCluster = cluster.detach();
  const state: KeptState = {
    id,
    dir: d.dir,
    namespaces: d.namespaces,
    processes: d.processes.map((p) => ({ ...p, start: processStart(p.pid) })),
    nodes,
    pods,
  };
  try {
    mkdirSync(stateDir, { recursive: true });
    writeFileSync(join(stateDir, `${id}.json`), JSON.stringify(state, null, 2) + '\n');
  } catch (err) {
    await removeKept(state);
    throw err;
  }
  return state;
}

function printKept(io: Io, state: KeptState, stateDir: string): void {
  io.stdout.write(`\nThe cluster is still up (detached; logs in ${state.dir}). Enter it with:\n`);
  for (const n of state.nodes) {
    const pods = state.pods.filter((p) => p.node === state.nodes.indexOf(n));
    io.stdout.write(
      `  ip netns exec ${n.ns} bash     # ${n.name} (${n.ip})${pods.map((p) => `; pod ${p.ns} ${p.ip}`).join('')}\n`,
    );
  }
  const dirFlag = stateDir === DEMO_FLAGS['state-dir'].default ? '' : ` --state-dir ${stateDir}`;
  io.stdout.write(`Remove it with: weft demo down${dirFlag}\n`);
}

/** Stops the recorded processes (only if still the same process), then namespaces and dir. */
async function removeKept(state: KeptState): Promise<number> {
  const ours = state.processes.filter((p) => p.start !== null && processStart(p.pid) === p.start);
  for (const p of ours) signal(p.pid, 'SIGTERM');
  const deadline = Date.now() + 5000;
  while (ours.some((p) => processStart(p.pid) === p.start) && Date.now() < deadline)
    await new Promise((r) => setTimeout(r, 50));
  for (const p of ours) if (processStart(p.pid) === p.start) signal(p.pid, 'SIGKILL');
  for (const ns of state.namespaces) await deleteNamespace(ns);
  rmSync(state.dir, { recursive: true, force: true });
  return ours.length;
}

function signal(pid: number, sig: NodeJS.Signals): void {
  try {
    process.kill(pid, sig);
  } catch {
    /* gone */
  }
}

/** Removes every cluster recorded in `stateDir`, and only what those records list. */
async function demoDown(io: Io, stateDir: string): Promise<number> {
  let files: string[] = [];
  try {
    files = readdirSync(stateDir).filter((f) => f.endsWith('.json'));
  } catch {
    /* nothing kept */
  }
  let removed = 0;
  let bad = 0;
  for (const f of files) {
    let state: KeptState;
    try {
      state = JSON.parse(readFileSync(join(stateDir, f), 'utf8')) as KeptState;
      if (!Array.isArray(state.namespaces) || !Array.isArray(state.processes) || !state.dir)
        throw new Error('not a kept-cluster record');
    } catch (err) {
      process.stderr.write(
        `weft demo down: skipping ${join(stateDir, f)}: ${(err as Error).message}\n`,
      );
      bad++;
      continue;
    }
    const procs = await removeKept(state);
    rmSync(join(stateDir, f), { force: true });
    io.stdout.write(
      `removed ${state.id}: ${procs} process(es), ${state.namespaces.length} namespace(s), ${state.dir}\n`,
    );
    removed++;
  }
  if (removed === 0 && bad === 0) io.stdout.write(`no kept cluster recorded in ${stateDir}\n`);
  return bad ? 1 : 0;
}
