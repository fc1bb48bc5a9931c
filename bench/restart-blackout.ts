/**
 * `npm run bench:restart` (root): the blackout a pod sees when a userspace node's daemon is
 * killed with SIGKILL and started again at once (issue 17 §1: goal < 1 s). Measured, never
 * asserted; `npm run faults` carries the same row in its table.
 *
 *            underlay br0 10.250.0.254/24 (embedded store in the cluster dir)
 *       u0 ┌───────────────┴─────────────┐ u1
 *   node 0 weft daemon (eth0 .1)     node 1 weft daemon (eth0 .2)   ← kill -9, restart at once
 *     cni0 ─ pod 0.0  ── ping -D -i 0.01 ──►  cni0 ─ pod 1.0
 *
 * For each backend (udp; vxlan "Dataplane":"userspace") and round: pod 0.0 pings pod 1.0 every
 * 10 ms with kernel timestamps (-D); node 1's daemon gets SIGKILL and, the moment it has exited,
 * the same command again (the built dist/ launcher, as production runs it); the ping goes on
 * until the new daemon is ready plus 2 s. Figures per round: the blackout (the largest gap
 * between two replies with pings lost inside it, either way: probes.ts pingGaps, as `npm run
 * faults` reads it), the largest reply gap, "unreachable" answers, and the restarted daemon's exec → the
 * moment its engine forwards with a peer table (its log line against the spawn) and exec → ready.
 * Flags: --rounds N (default 3), --backend udp|vxlan-userspace (default both), --store etcd|embedded
 * (default etcd, as the fault campaign ran), --dataplane-engine native|bpf (default native).
 *
 * bpf: two clusters per backend, measured in interleaved rounds: `bpf pinned` (the daemons see a
 * bpffs of their own, testbed/bpffs.ts, so the tcx links are pinned and outlive the kill:
 * src/dataplane/bpf-pins.ts) and `bpf unpinned` (no bpffs, as inside `ip netns exec` or on a
 * host without /sys/fs/bpf: the links go with the process).
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Cluster, PACKAGE_ROOT } from '../src/testbed/cluster.js';
import { onEarlyEnd } from '../src/testbed/early-end.js';
import { isRoot } from '../src/testbed/netns.js';
import { pingGaps } from '../src/testbed/probes.js';

const EARLY = 'forwarding with the last run’s peers until the store answers';

const BACKENDS: Record<string, Record<string, unknown>> = {
  udp: { Type: 'udp' },
  'vxlan-userspace': { Type: 'vxlan', Dataplane: 'userspace' },
};

/** `--name value` or `--name=value`. */
function flag(name: string): string | undefined {
  const eq = process.argv.find((a) => a.startsWith(`--${name}=`));
  if (eq) return eq.slice(name.length + 3);
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : undefined;
}

/** The clusters measured side by side for one engine (see the file comment). */
function variantsOf(engine: string): Array<{ label: string; bpffs: boolean }> {
  if (engine === 'bpf')
    return [
      { label: 'bpf pinned', bpffs: true },
      { label: 'bpf unpinned', bpffs: false },
    ];
  return [{ label: engine, bpffs: false }];
}

interface Round {
  backend: string;
  /** The engine asked for (bpf: pinned or not). */
  engine: string;
  round: number;
  /** The largest gap between replies with pings lost inside it, either way (probes.ts). */
  blackoutMs: number;
  /** The largest gap between replies, lost pings or not (a loaded pinger stalls too). */
  maxGapMs: number;
  replies: number;
  /** Pings lost between the first and the last reply, both ways (sequence numbers missing). */
  lost: number;
  unreachable: number;
  /**
   * Restarted daemon: spawn → its engine forwards with a peer table (the fast start's log line,
   * else its first `peer table replaced`), ms.
   */
  execToForwardMs: number | null;
  /** Restarted daemon: spawn → /readyz 200 (ms). */
  execToReadyMs: number;
}

/** Echo requests with no reply between the first and the last one answered (`ping` output). */
function lostInside(out: string): number {
  const seqs = new Set([...out.matchAll(/bytes from .*icmp_seq=(\d+)/g)].map((m) => Number(m[1])));
  if (seqs.size === 0) return 0;
  const all = [...seqs];
  return Math.max(...all) - Math.min(...all) + 1 - seqs.size;
}

async function round(c: Cluster, backend: string, engine: string, n: number): Promise<Round> {
  const src = c.nodes[0]!.pods[0]!;
  const dst = c.nodes[1]!.pods[0]!;
  // both ways: replies to the killed node's pod cross its TUN twice, and only a pod on the
  // killed node sees "net unreachable" while the cluster route is missing
  const pings = [
    [src, dst],
    [dst, src],
  ].map(([a, b]) => {
    const p: ChildProcess = spawn('ip', [
      'netns',
      'exec',
      a!.ns,
      'ping',
      '-D',
      '-i',
      '0.01',
      b!.ip,
    ]);
    const o = { p, out: '' };
    p.stdout!.on('data', (d: Buffer) => (o.out += d.toString()));
    return o;
  });
  await new Promise((r) => setTimeout(r, 1500));
  const node = c.nodes[1]!;
  await c.killDaemon(1);
  const t0 = Date.now();
  await c.startDaemon(1);
  const execToReadyMs = Date.now() - t0;
  await new Promise((r) => setTimeout(r, 2000));
  for (const { p } of pings) {
    p.kill('SIGINT');
    await new Promise((r) => p.once('exit', r));
  }
  // the first table the engine forwards with: the last run's (fast start), else the store's
  const line = node.logs.find((l) => l.msg === EARLY || l.msg === 'peer table replaced');
  const execToForwardMs = line ? Date.parse(String(line.time)) - t0 : null;
  const g = pings.map(({ out }) => pingGaps(out));
  return {
    backend,
    engine,
    round: n,
    blackoutMs: Math.round(Math.max(...g.map((x) => x.blackoutMs))),
    maxGapMs: Math.round(Math.max(...g.map((x) => x.maxGapMs))),
    replies: Math.min(...g.map((x) => x.replies)),
    lost: pings.reduce((a, { out }) => a + lostInside(out), 0),
    unreachable: g.reduce((a, x) => a + x.unreachable, 0),
    execToForwardMs,
    execToReadyMs,
  };
}

async function main(): Promise<void> {
  if (!isRoot()) {
    process.stderr.write('bench:restart needs root (network namespaces)\n');
    process.exit(2);
  }
  const rounds = Number(flag('rounds') ?? 3);
  const only = flag('backend');
  const store = (flag('store') ?? 'etcd') as 'etcd' | 'embedded';
  const engine = flag('dataplane-engine') ?? 'native';
  if (!['native', 'bpf'].includes(engine)) {
    process.stderr.write(`--dataplane-engine: native or bpf, not ${engine}\n`);
    process.exit(2);
  }
  const rows: Round[] = [];
  // the clusters of the backend under way, for an early end too
  let clusters: Array<{ label: string; c: Cluster }> = [];
  const destroyAll = async () => {
    for (const { c } of clusters) await c.destroy();
    clusters = [];
  };
  const early = onEarlyEnd('bench:restart', destroyAll);
  for (const [name, backend] of Object.entries(BACKENDS)) {
    if (only && only !== name) continue;
    try {
      for (const v of variantsOf(engine)) {
        const c = await Cluster.create({
          nodes: 2,
          backend,
          store,
          launcher: 'dist',
          bpffs: v.bpffs,
          flags: ['--log-level=debug', '--dataplane-engine', engine],
        });
        clusters.push({ label: v.label, c });
      }
      for (let i = 0; i < rounds; i++) {
        for (const { label, c } of clusters) {
          const r = await round(c, name, label, i + 1);
          rows.push(r);
          process.stdout.write(
            `${name} ${label} round ${r.round}: blackout ${r.blackoutMs} ms, ${r.lost} lost, ` +
              `${r.unreachable} unreachable, ` +
              `exec→forwarding ${r.execToForwardMs ?? '?'} ms, exec→ready ${r.execToReadyMs} ms\n`,
          );
        }
      }
    } finally {
      await destroyAll();
    }
  }
  early.off();
  const dir = join(PACKAGE_ROOT, 'bench', 'results');
  mkdirSync(dir, { recursive: true });
  const file = engine === 'native' ? 'restart-latest.json' : `restart-${engine}-latest.json`;
  writeFileSync(join(dir, file), `${JSON.stringify(rows, null, 2)}\n`);
}

if (import.meta.url === `file://${process.argv[1]}`) await main();
