/**
 * The dataplane comparison (DESIGN §8): one run, one testbed shape, every path, interleaved
 * rounds (round 1 of every path, then round 2, ...), every figure also as a ratio to kernel vxlan
 * in the same round. Run as root: `npm run bench` (or `weft bench`). Never part of `npm test`.
 *
 *     underlay ns: br0                       one cluster per path, all up for the whole run:
 *       ├── node 0: eth0 10.250.0.1 ── weft daemon ── cni0 ── pod 0 (iperf3/ping client)
 *       └── node 1: eth0 10.250.0.2 ── weft daemon ── cni0 ── pod 1 (iperf3 server)
 *
 * Paths: underlay (node to node, no tunnel), host-gw, vxlan (kernel), udp (weft native engine),
 * vxlan-userspace (weft native engine), vxlan-bpf and udp-bpf (weft bpf engine: TC-BPF encap and
 * decap in the kernel), ipip-userspace (weft native engine, raw sockets) and ipip-bpf (the bpf
 * engine's IPIP framing), wireguard (weft native engine's WireGuard framing), wireguard-go
 * (no weft: Debian's wireguard-go on each node, set up as flanneld sets up flannel-wg), udp-js
 * (weft js engine), and over an IPv6 underlay (an IPv6-only cluster: IPv6 pods, VXLAN in IPv6)
 * vxlan6 (kernel, flannel-v6.1) and vxlan6-bpf (the bpf engine), whose ratio is to vxlan6 of the
 * same round. Each weft path runs the real
 * `weft daemon` on the embedded store. Figures: iperf3 TCP 1 and 4 streams, UDP 64-byte
 * received pps and loss, ping RTT avg, p50 and p99 (pingRound: every path pinged in turns after
 * the round's throughput runs), and CPU seconds per GB moved by one TCP stream:
 * the whole machine's (every row, kernel paths included: user, system, irq and softirq time of
 * every CPU from /proc/stat, so the kernel's softirq work and iperf3's own count alike), and the
 * daemons' own (userspace rows). The machine figure counts whatever else runs on the machine
 * during the transfer: read it from a quiet machine.
 * Output: a table (medians, ranges, ratios), bench/results/<time>.json; a full run (every path,
 * not --quick) also replaces latest.json, latest.svg and latest.md, which the README shows.
 */
import { existsSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { bool, int, list, parseFlags, usage } from '../src/control/config/flags.js';
import { Progress } from '../src/control/demo/progress.js';
import { buildBenchCluster } from '../src/testbed/bench-cluster.js';
import { type Cluster, HEALTH_PORT } from '../src/testbed/cluster.js';
import { type PingResult, iperf, ping, poolPings, waitForMesh } from '../src/testbed/probes.js';
import { onEarlyEnd } from '../src/testbed/early-end.js';
import { isRoot, nsExecAsync } from '../src/testbed/netns.js';
import {
  WG_UAPI_DIR,
  removeUapiDirIfMade,
  startWireguardGoNodes,
} from '../src/testbed/wireguard-go-nodes.js';
import { isFullRun, markdownTable, saveResults } from './report.js';

interface PathDef {
  readonly name: string;
  readonly label: string;
  /** null: no daemons, node-to-node over the underlay. */
  readonly backend: Record<string, unknown> | null;
  readonly daemonArgs?: readonly string[];
  /** Whether a userspace process moves the packets (the daemons' CPU per GB is measured). */
  readonly userspace: boolean;
  /** An IPv6-only cluster: IPv6 underlay, IPv6 pods (their addresses are measured). */
  readonly ipv6Only?: boolean;
  /** The path its ratios are to (default: kernel vxlan over IPv4). */
  readonly baseline?: string;
  /**
   * Not weft: every node set up as flanneld sets up its wireguard link, with Debian's
   * wireguard-go (src/testbed/wireguard-go-nodes.ts); backend is then null.
   */
  readonly wireguardGo?: boolean;
}

export const PATHS: readonly PathDef[] = [
  { name: 'underlay', label: 'underlay (no tunnel)', backend: null, userspace: false },
  { name: 'host-gw', label: 'kernel host-gw', backend: { Type: 'host-gw' }, userspace: false },
  { name: 'vxlan', label: 'kernel vxlan', backend: { Type: 'vxlan' }, userspace: false },
  { name: 'udp', label: 'weft udp (native)', backend: { Type: 'udp' }, userspace: true },
  {
    name: 'vxlan-userspace',
    label: 'weft vxlan-userspace (native)',
    backend: { Type: 'vxlan', Dataplane: 'userspace' },
    userspace: true,
  },
  {
    name: 'vxlan-bpf',
    label: 'weft vxlan (bpf)',
    backend: { Type: 'vxlan', Dataplane: 'userspace' },
    daemonArgs: ['--dataplane-engine=bpf'],
    // The packets are moved in the kernel (softirq), not by the daemon: no daemon CPU to count.
    userspace: false,
  },
  {
    name: 'udp-bpf',
    label: 'weft udp (bpf)',
    backend: { Type: 'udp' },
    daemonArgs: ['--dataplane-engine=bpf'],
    userspace: false,
  },
  {
    name: 'ipip-userspace',
    label: 'weft ipip-userspace (native)',
    backend: { Type: 'ipip', Dataplane: 'userspace' },
    daemonArgs: ['--dataplane-engine=native'],
    userspace: true,
  },
  {
    name: 'ipip-bpf',
    label: 'weft ipip (bpf)',
    backend: { Type: 'ipip', Dataplane: 'userspace' },
    daemonArgs: ['--dataplane-engine=bpf'],
    userspace: false,
  },
  {
    name: 'vxlan6',
    label: 'kernel vxlan over IPv6',
    backend: { Type: 'vxlan' },
    ipv6Only: true,
    userspace: false,
  },
  {
    name: 'vxlan6-bpf',
    label: 'weft vxlan over IPv6 (bpf; ratio to kernel vxlan over IPv6)',
    backend: { Type: 'vxlan', Dataplane: 'userspace' },
    daemonArgs: ['--dataplane-engine=bpf'],
    ipv6Only: true,
    baseline: 'vxlan6',
    userspace: false,
  },
  {
    name: 'wireguard',
    label: 'weft wireguard (native)',
    backend: { Type: 'wireguard' },
    daemonArgs: ['--dataplane-engine=native'],
    userspace: true,
  },
  {
    name: 'wireguard-go',
    label: 'wireguard-go (Debian, as flanneld)',
    backend: null,
    userspace: true,
    wireguardGo: true,
  },
  {
    name: 'udp-js',
    label: 'weft udp (js engine)',
    backend: { Type: 'udp' },
    daemonArgs: ['--dataplane-engine=js'],
    userspace: true,
  },
];
const BASELINE = 'vxlan';

export const FIGURES = [
  { key: 'tcp1Gbps', label: 'TCP 1 stream', unit: 'Gbit/s', higherIsBetter: true },
  { key: 'tcp4Gbps', label: 'TCP 4 streams', unit: 'Gbit/s', higherIsBetter: true },
  { key: 'udp64Kpps', label: 'UDP 64 B rx', unit: 'kpps', higherIsBetter: true },
  { key: 'udp64LossPct', label: 'UDP 64 B loss', unit: '%', higherIsBetter: false },
  { key: 'pingAvgUs', label: 'ping avg', unit: 'µs', higherIsBetter: false },
  { key: 'pingP50Us', label: 'ping p50', unit: 'µs', higherIsBetter: false },
  { key: 'pingP99Us', label: 'ping p99', unit: 'µs', higherIsBetter: false },
  { key: 'cpuSecPerGB', label: 'CPU per GB', unit: 's/GB', higherIsBetter: false },
  { key: 'daemonCpuSecPerGB', label: 'daemon CPU per GB', unit: 's/GB', higherIsBetter: false },
] as const;
type FigureKey = (typeof FIGURES)[number]['key'];
type Sample = Partial<Record<FigureKey, number>> & { error?: string };

const BENCH_FLAGS = {
  rounds: int(3, 'interleaved rounds', { min: 1, max: 20 }),
  duration: int(5, 'seconds per iperf3 run', { min: 1, max: 60 }),
  paths: list(`paths, comma-separated (default: ${PATHS.map((p) => p.name).join(',')})`, {
    valueName: 'LIST',
  }),
  quick: bool(false, 'a short smoke run: 1 round of 2 s runs'),
  help: bool(false, 'print this message'),
} as const;

const RESULTS = fileURLToPath(new URL('./results/', import.meta.url));

/** utime + stime of a process in seconds (from /proc/<pid>/stat), 0 when gone. */
function cpuSeconds(pid: number | undefined): number {
  if (!pid) return 0;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(fields[11]) + Number(fields[12])) / 100; // clock ticks (USER_HZ = 100)
  } catch {
    return 0;
  }
}

/**
 * Busy CPU seconds of the whole machine so far, every CPU summed (/proc/stat's `cpu` line: user,
 * nice, system, irq, softirq and steal; idle and iowait left out; guest time is inside user).
 */
export function machineCpuSeconds(stat = readFileSync('/proc/stat', 'utf8')): number {
  const f = stat.slice(0, stat.indexOf('\n')).trim().split(/\s+/).slice(1).map(Number);
  const [user, nice, system, , , irq, softirq, steal] = f;
  return (
    ((user ?? 0) + (nice ?? 0) + (system ?? 0) + (irq ?? 0) + (softirq ?? 0) + (steal ?? 0)) / 100
  );
}

interface Bed {
  path: PathDef;
  cluster: Cluster;
  src: { ns: string; ip: string };
  dst: { ns: string; ip: string };
}

/**
 * The nodes whose daemon runs an engine other than bpf, by its own /metrics
 * (`weft_dataplane_engine{engine="bpf"} 1`), read inside each node's namespace: what other
 * processes on the machine load does not count.
 */
async function nodesNotOnBpf(cluster: Cluster): Promise<string[]> {
  const off: string[] = [];
  for (const n of cluster.nodes) {
    const text = await nsExecAsync(n.ns, process.execPath, [
      '-e',
      `fetch('http://127.0.0.1:${HEALTH_PORT}/metrics').then((r) => r.text()).then((t) => process.stdout.write(t))`,
    ]);
    if (!text.split('\n').includes('weft_dataplane_engine{engine="bpf"} 1')) off.push(n.ns);
  }
  return off;
}

async function buildBed(path: PathDef): Promise<Bed> {
  const cluster = await buildBenchCluster({
    prefix: `weft-bench-${process.pid}`,
    backend: path.backend,
    flags: path.daemonArgs ?? [],
    ...(path.ipv6Only ? { dualStack: true, netConf: { EnableIPv4: false } } : {}),
  });
  try {
    if (path.wireguardGo) {
      // wireguard-go is each node's `daemon`: its CPU is counted, destroy() stops it
      const pods = await startWireguardGoNodes(cluster, 1500);
      const silent = await waitForMesh(pods, 15_000);
      if (silent > 0) throw new Error(`${silent} pod pair(s) unreachable after 15 s`);
      return { path, cluster, src: pods[0]!, dst: pods[1]! };
    }
    if (path.backend === null) {
      const [a, b] = cluster.nodes;
      return { path, cluster, src: { ns: a!.ns, ip: a!.ip }, dst: { ns: b!.ns, ip: b!.ip } };
    }
    const bpfRow = path.daemonArgs?.includes('--dataplane-engine=bpf') ?? false;
    await cluster.startDaemons();
    const notBpf = bpfRow ? await nodesNotOnBpf(cluster) : [];
    if (notBpf.length > 0) {
      // A bpf row that fell back to native would measure native: refuse to print it as bpf.
      throw new Error(
        `${path.label}: the bpf engine did not start on ${notBpf.join(', ')} (daemon logs)`,
      );
    }
    const pods = await cluster.addPods(1);
    const silent = await waitForMesh(pods, 15_000);
    if (silent > 0) throw new Error(`${silent} pod pair(s) unreachable after 15 s`);
    const at = (p: (typeof pods)[number]) => ({ ns: p.ns, ip: p.ip || p.ip6! });
    return { path, cluster, src: at(pods[0]!), dst: at(pods[1]!) };
  } catch (err) {
    await cluster.destroy();
    throw err;
  }
}

/** A round's throughput figures of one path (its pings are taken with every path's: pingRound). */
async function measure(bed: Bed, seconds: number): Promise<Sample> {
  const s: Sample = {};
  const { scope } = bed.cluster;
  const pids = bed.cluster.nodes.map((n) => n.daemon?.pid);
  const daemons = () => pids.reduce<number>((a, p) => a + cpuSeconds(p), 0);
  const [cpu0, machine0] = [daemons(), machineCpuSeconds()];
  const t1 = await iperf(scope, bed.dst.ns, bed.dst.ip, bed.src.ns, ['-t', String(seconds)]);
  const [cpu1, machine1] = [daemons(), machineCpuSeconds()];
  s.tcp1Gbps = t1.bitsPerSecond / 1e9;
  if (t1.bitsPerSecond > 0) {
    // Over the whole iperf3 run (its start and end too), per the bytes the stream carried.
    const gb = (t1.bitsPerSecond * seconds) / 8 / 1e9;
    s.cpuSecPerGB = (machine1 - machine0) / gb;
    if (bed.path.userspace) s.daemonCpuSecPerGB = (cpu1 - cpu0) / gb;
  }
  s.tcp4Gbps =
    (await iperf(scope, bed.dst.ns, bed.dst.ip, bed.src.ns, ['-t', String(seconds), '-P', '4']))
      .bitsPerSecond / 1e9;
  const u = await iperf(scope, bed.dst.ns, bed.dst.ip, bed.src.ns, [
    '-t',
    String(seconds),
    '-u',
    '-b',
    '0',
    '-l',
    '64',
  ]);
  const sum = (
    u.json.end as
      { sum?: { packets?: number; lost_packets?: number; seconds?: number } } | undefined
  )?.sum;
  if (sum?.packets) {
    const received = sum.packets - (sum.lost_packets ?? 0);
    s.udp64Kpps = received / (sum.seconds || seconds) / 1000;
    s.udp64LossPct = (100 * (sum.lost_packets ?? 0)) / sum.packets;
  }
  return s;
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

interface Summary {
  path: string;
  label: string;
  figures: Partial<
    Record<FigureKey, { median: number; min: number; max: number; ratio: number | null }>
  >;
  errors: string[];
}

/** How a round pings: `chunks` turns, `perChunk` pings each (10 ms apart), per path. */
interface PingPlan {
  readonly chunks: number;
  readonly perChunk: number;
}

/**
 * A round's pings, every path's through the same stretch of time: after the round's throughput
 * figures (and a second for the last UDP flood's queues to drain), each path in turn gets a chunk
 * of pings, the turns starting one path later each time, until every path has had `chunks`.
 * On this shared machine the RTT of an idle path drifts by tens of µs from one second to the
 * next (halted vCPUs waking, other tenants): measured one path after the other, that drift
 * lands in one path's figure; taken in turns, every path samples it alike, and what is left
 * between two paths' figures is the paths and the sampling error of 200 pings. Each turn's
 * first ping follows a quiet spell on its path, as a sparse flow's first packet does: it
 * counts (bench/README.md, "The first packet after an idle spell").
 */
async function pingRound(beds: readonly Bed[], plan: PingPlan): Promise<Map<string, PingResult>> {
  await new Promise((r) => setTimeout(r, 1000));
  const runs = new Map<string, PingResult[]>(beds.map((b) => [b.path.name, []]));
  for (let c = 0; c < plan.chunks; c++) {
    for (let k = 0; k < beds.length; k++) {
      const bed = beds[(c + k) % beds.length]!;
      runs.get(bed.path.name)!.push(await ping(bed.src.ns, bed.dst.ip, plan.perChunk, 0.01));
    }
  }
  return new Map([...runs].map(([name, r]) => [name, poolPings(r)]));
}

/** The ping figures of one path's round into its sample (an error when nothing came back). */
function withPings(s: Sample, p: PingResult | undefined): Sample {
  if (s.error !== undefined || p === undefined) return s;
  if (p.received === 0) return { error: 'ping: no reply' };
  return {
    ...s,
    pingAvgUs: p.avgMs! * 1000,
    pingP50Us: p.p50Ms! * 1000,
    pingP99Us: p.p99Ms! * 1000,
  };
}

function summarize(paths: readonly PathDef[], rounds: Array<Record<string, Sample>>): Summary[] {
  return paths.map((p) => {
    const figures: Summary['figures'] = {};
    for (const f of FIGURES) {
      const vals = rounds
        .map((r) => r[p.name]?.[f.key])
        .filter((v): v is number => v !== undefined);
      if (vals.length === 0) continue;
      // Ratio: per round against kernel vxlan of the same round, then the median of those.
      const ratios = rounds
        .map((r) => {
          const v = r[p.name]?.[f.key];
          const base = r[p.baseline ?? BASELINE]?.[f.key];
          return v !== undefined && base ? v / base : undefined;
        })
        .filter((v): v is number => v !== undefined);
      figures[f.key] = {
        median: median(vals),
        min: Math.min(...vals),
        max: Math.max(...vals),
        ratio: ratios.length ? median(ratios) : null,
      };
    }
    const errors = rounds.map((r) => r[p.name]?.error).filter((e): e is string => Boolean(e));
    return { path: p.name, label: p.label, figures, errors };
  });
}

function fmt(v: number): string {
  return v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2);
}

export function renderTable(summaries: readonly Summary[]): string {
  const head = ['path', ...FIGURES.map((f) => `${f.label} (${f.unit})`)];
  const rows = summaries.map((s) => [
    s.label,
    ...FIGURES.map((f) => {
      const x = s.figures[f.key];
      if (!x) return s.errors.length ? 'failed' : '-';
      const range = x.min === x.max ? '' : ` [${fmt(x.min)}–${fmt(x.max)}]`;
      const ratio = x.ratio === null ? '' : ` ${x.ratio.toFixed(2)}×`;
      return `${fmt(x.median)}${range}${ratio}`;
    }),
  ]);
  return markdownTable(head, rows);
}

/** A grouped horizontal bar chart of the ratios to kernel vxlan (1.0 = kernel vxlan). */
export function renderSvg(summaries: readonly Summary[], title: string): string {
  const figs = FIGURES.filter((f) => ['tcp1Gbps', 'tcp4Gbps', 'udp64Kpps'].includes(f.key));
  const colors = ['#4c78a8', '#f58518', '#54a24b'];
  const rowH = 16;
  const groupH = figs.length * rowH + 14;
  const left = 230;
  const width = 760;
  const scaleMax = Math.max(
    1.2,
    ...summaries.flatMap((s) => figs.map((f) => s.figures[f.key]?.ratio ?? 0)),
  );
  const x = (r: number) => left + (r / scaleMax) * (width - left - 60);
  const height = 60 + summaries.length * groupH + 30;
  const parts: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" font-family="sans-serif" font-size="12">`,
    `<rect width="100%" height="100%" fill="white"/>`,
    `<text x="10" y="20" font-size="14" font-weight="bold">${escapeXml(title)}</text>`,
  ];
  figs.forEach((f, i) =>
    parts.push(
      `<rect x="${left + i * 150}" y="30" width="10" height="10" fill="${colors[i]}"/><text x="${left + i * 150 + 14}" y="39">${f.label}</text>`,
    ),
  );
  summaries.forEach((s, gi) => {
    const y0 = 55 + gi * groupH;
    parts.push(`<text x="10" y="${y0 + groupH / 2}">${escapeXml(s.label)}</text>`);
    figs.forEach((f, i) => {
      const r = s.figures[f.key]?.ratio;
      const y = y0 + i * rowH;
      if (r === undefined || r === null) {
        parts.push(`<text x="${left + 4}" y="${y + 11}" fill="#999">n/a</text>`);
        return;
      }
      parts.push(
        `<rect x="${left}" y="${y}" width="${Math.max(1, x(r) - left)}" height="${rowH - 3}" fill="${colors[i]}"/>`,
      );
      parts.push(`<text x="${x(r) + 4}" y="${y + 11}">${r.toFixed(2)}×</text>`);
    });
  });
  const one = x(1);
  parts.push(
    `<line x1="${one}" y1="48" x2="${one}" y2="${height - 25}" stroke="#333" stroke-dasharray="4 3"/>`,
  );
  parts.push(`<text x="${one - 40}" y="${height - 10}">kernel vxlan = 1.0×</text>`);
  parts.push('</svg>');
  return parts.join('\n') + '\n';
}

function escapeXml(s: string): string {
  return s.replace(
    /[<>&"]/g,
    (c) => ({ '<': '&lt;', '>': '&gt;', '&': '&amp;', '"': '&quot;' })[c]!,
  );
}

export async function main(argv: readonly string[]): Promise<number> {
  const parsed = parseFlags(BENCH_FLAGS, argv, process.env);
  const o = parsed.values;
  if (o.help) {
    process.stdout.write(
      usage(BENCH_FLAGS, 'weft bench', 'userspace vs kernel dataplanes, interleaved rounds'),
    );
    return 0;
  }
  if (!isRoot()) {
    process.stderr.write(
      'weft bench: must run as root (it creates network namespaces); try: sudo npm run bench\n',
    );
    return 1;
  }
  const rounds = o.quick ? 1 : o.rounds;
  const seconds = o.quick ? 2 : o.duration;
  // 200 pings per path and round (one chunk of 20 with --quick)
  const pings: PingPlan = o.quick ? { chunks: 1, perChunk: 20 } : { chunks: 5, perChunk: 40 };
  const wanted = o.paths.length
    ? o.paths.flatMap((p) => p.split(',')).map((p) => p.trim())
    : PATHS.map((p) => p.name);
  const unknown = wanted.filter((w) => !PATHS.some((p) => p.name === w));
  if (unknown.length) {
    process.stderr.write(`weft bench: --paths: unknown path(s) ${unknown.join(', ')}\n`);
    return 2;
  }
  const paths = PATHS.filter((p) => wanted.includes(p.name));
  const progress = new Progress();
  const beds = new Map<string, Bed>();
  const failed = new Map<string, string>();
  const uapiDirWasThere = existsSync(WG_UAPI_DIR);
  const cleanup = async () => {
    for (const b of beds.values()) {
      await b.cluster.destroy();
    }
    beds.clear();
    removeUapiDirIfMade(uapiDirWasThere);
  };
  const early = onEarlyEnd('weft bench', cleanup);
  const results: Array<Record<string, Sample>> = [];
  const started = new Date();
  try {
    for (const p of paths) {
      try {
        beds.set(p.name, await progress.step(`testbed: ${p.label}`, () => buildBed(p)));
      } catch (err) {
        failed.set(p.name, (err as Error).message.split('\n')[0]!);
      }
    }
    const total = rounds * beds.size;
    let done = 0;
    for (let r = 0; r < rounds; r++) {
      const round: Record<string, Sample> = {};
      for (const p of paths) {
        const bed = beds.get(p.name);
        if (!bed) {
          round[p.name] = { error: failed.get(p.name) ?? 'testbed failed' };
          continue;
        }
        done++;
        round[p.name] = await progress
          .step(
            `round ${r + 1}/${rounds} [${'#'.repeat(done)}${'.'.repeat(total - done)}] ${p.label}`,
            () => measure(bed, seconds),
            (s) => `${fmt(s.tcp1Gbps ?? 0)} Gbit/s`,
          )
          .catch((err: Error) => ({ error: err.message.split('\n')[0]! }));
      }
      const measured = paths.flatMap((p) => {
        const bed = beds.get(p.name);
        return bed && round[p.name]?.error === undefined ? [bed] : [];
      });
      if (measured.length > 0) {
        const rtts = await progress.step(
          `round ${r + 1}/${rounds}: ping, every path in turns`,
          () => pingRound(measured, pings),
        );
        for (const p of paths) round[p.name] = withPings(round[p.name]!, rtts.get(p.name));
      }
      results.push(round);
    }
  } finally {
    early.off();
    await cleanup();
  }
  const summaries = summarize(paths, results);
  const table = renderTable(summaries);
  const meta = {
    started: started.toISOString(),
    rounds,
    secondsPerRun: seconds,
    kernel: readFileSync('/proc/sys/kernel/osrelease', 'utf8').trim(),
    cpus: (await import('node:os')).cpus().length,
    command: `weft bench ${argv.join(' ')}`.trim(),
  };
  const json = JSON.stringify({ meta, summaries, rounds: results }, null, 2) + '\n';
  const svg = renderSvg(
    summaries,
    `weft dataplanes vs kernel vxlan — ${meta.kernel}, ${rounds} round(s) × ${seconds}s`,
  );
  const saved = saveResults(RESULTS, started, { json, svg, table }, isFullRun(o));
  if (!saved.includes('latest.json'))
    process.stdout.write('(not a full run: bench/results/latest.* left as they were)\n');
  process.stdout.write(
    `\n${table}\nmedians [min–max] and ratio to kernel vxlan (or the path its label names) in the same round; results in bench/results/\n`,
  );
  for (const s of summaries)
    for (const e of new Set(s.errors)) process.stdout.write(`${s.path}: ${e}\n`);
  const carried = summaries.every(
    (s) => s.errors.length === 0 && s.figures.tcp1Gbps && s.figures.tcp1Gbps.median > 0,
  );
  return carried ? 0 : 1;
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  main(process.argv.slice(2)).then((code) => (process.exitCode = code));
}
