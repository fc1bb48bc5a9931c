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
 * (default etcd, as the fault campaign ran).
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Cluster, PACKAGE_ROOT } from '../src/testbed/cluster.js';
import { isRoot } from '../src/testbed/netns.js';
import { pingGaps } from '../src/testbed/probes.js';

const EARLY = 'forwarding with the last run’s peers until the store answers';

const BACKENDS: Record<string, Record<string, unknown>> = {
  udp: { Type: 'udp' },
  'vxlan-userspace': { Type: 'vxlan', Dataplane: 'userspace' },
};

function flag(name: string): string | undefined {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : undefined;
}

interface Round {
  backend: string;
  round: number;
  /** The largest gap between replies with pings lost inside it, either way (probes.ts). */
  blackoutMs: number;
  /** The largest gap between replies, lost pings or not (a loaded pinger stalls too). */
  maxGapMs: number;
  replies: number;
  unreachable: number;
  /**
   * Restarted daemon: spawn → its engine forwards with a peer table (the fast start's log line,
   * else its first `peer table replaced`), ms.
   */
  execToForwardMs: number | null;
  /** Restarted daemon: spawn → /readyz 200 (ms). */
  execToReadyMs: number;
}

async function round(c: Cluster, backend: string, n: number): Promise<Round> {
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
  const old = node.daemon!;
  const gone = new Promise((r) => old.once('exit', r));
  old.kill('SIGKILL');
  await gone;
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
    round: n,
    blackoutMs: Math.round(Math.max(...g.map((x) => x.blackoutMs))),
    maxGapMs: Math.round(Math.max(...g.map((x) => x.maxGapMs))),
    replies: Math.min(...g.map((x) => x.replies)),
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
  const rows: Round[] = [];
  for (const [name, backend] of Object.entries(BACKENDS)) {
    if (only && only !== name) continue;
    const c = await Cluster.create({
      nodes: 2,
      backend,
      store,
      launcher: 'dist',
      flags: ['--log-level=debug'],
    });
    try {
      for (let i = 0; i < rounds; i++) {
        const r = await round(c, name, i + 1);
        rows.push(r);
        process.stdout.write(
          `${name} round ${r.round}: blackout ${r.blackoutMs} ms, ${r.unreachable} unreachable, ` +
            `exec→forwarding ${r.execToForwardMs ?? '?'} ms, exec→ready ${r.execToReadyMs} ms\n`,
        );
      }
    } finally {
      await c.destroy();
    }
  }
  const dir = join(PACKAGE_ROOT, 'bench', 'results');
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, 'restart-latest.json'), `${JSON.stringify(rows, null, 2)}\n`);
}

if (import.meta.url === `file://${process.argv[1]}`) await main();
