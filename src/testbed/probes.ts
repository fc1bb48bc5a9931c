/**
 * Probes across a testbed cluster (src/testbed/cluster.ts): ping between pods with loss and
 * RTT figures, the pod pairs that do not answer, waiting for a mesh to converge, iperf3 between
 * two namespaces. Shared by `weft demo`, the benches and the namespace tests.
 */
import type { Pod } from './cluster.js';
import { type NetnsScope, nsExecAsync } from './netns.js';

/** Every pod pair on different nodes, once. */
function crossPairs(pods: readonly Pod[]): Array<[Pod, Pod]> {
  const pairs: Array<[Pod, Pod]> = [];
  for (const a of pods) for (const b of pods) if (a !== b && a.node !== b.node) pairs.push([a, b]);
  return pairs;
}

export interface PingResult {
  readonly sent: number;
  readonly received: number;
  /** Every reply's round trip, in the order the replies came. */
  readonly rttsMs: readonly number[];
  readonly avgMs: number | null;
  /** The median: on a shared machine a few stalled replies move the average, not this. */
  readonly p50Ms: number | null;
  readonly p99Ms: number | null;
}

/** The q-quantile (0 < q ≤ 1) of ascending `sorted` by nearest rank; null when empty. */
function quantile(sorted: readonly number[], q: number): number | null {
  if (sorted.length === 0) return null;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(sorted.length * q) - 1))]!;
}

/** The figures of `sent` pings whose replies took `rttsMs`. */
function pingFigures(sent: number, rttsMs: readonly number[]): PingResult {
  const sorted = [...rttsMs].sort((a, b) => a - b);
  return {
    sent,
    received: rttsMs.length,
    rttsMs,
    avgMs: rttsMs.length ? rttsMs.reduce((a, b) => a + b, 0) / rttsMs.length : null,
    p50Ms: quantile(sorted, 0.5),
    p99Ms: quantile(sorted, 0.99),
  };
}

/** Several ping runs to one destination as one: their pings and replies together. */
export function poolPings(runs: readonly PingResult[]): PingResult {
  return pingFigures(
    runs.reduce((n, r) => n + r.sent, 0),
    runs.flatMap((r) => r.rttsMs),
  );
}

/** What `ping -n` printed, as figures (`count`: what was asked, if ping said nothing). */
export function parsePing(out: string, count: number): PingResult {
  const rtts = [...out.matchAll(/time=([\d.]+) ms/g)].map((m) => Number(m[1]));
  const sent = Number(/(\d+) packets transmitted/.exec(out)?.[1] ?? count);
  return pingFigures(sent, rtts);
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
    out = await nsExecAsync(
      ns,
      'ping',
      ['-n', '-c', String(count), '-i', String(intervalS), '-W', '1', dst],
      60_000,
    );
  } catch (err) {
    out = (err as { stdout?: string }).stdout ?? '';
  }
  return parsePing(out, count);
}

/** The pod pairs on different nodes that get no answer to one ping (`a → b (ip)`), sorted. */
export async function pingFailures(pods: readonly Pod[]): Promise<string[]> {
  const pairs = crossPairs(pods);
  const results = await Promise.all(pairs.map(([a, b]) => ping(a.ns, b.ip || b.ip6!, 1)));
  return pairs
    .filter((_, i) => results[i]!.received === 0)
    .map(([a, b]) => `${a.name} → ${b.name} (${b.ip || b.ip6})`)
    .sort();
}

/**
 * Waits until every pod reaches every pod on another node (routes converge as leases propagate),
 * pinging once per pair per round; resolves to the number of pairs still unreachable at the end.
 */
export async function waitForMesh(pods: readonly Pod[], timeoutMs = 15_000): Promise<number> {
  const deadline = Date.now() + timeoutMs;
  let pending = crossPairs(pods);
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
  scope: NetnsScope,
  server: string,
  serverIp: string,
  client: string,
  args: readonly string[] = ['-t', '2'],
): Promise<IperfResult> {
  const port = String(5201 + Math.floor(Math.random() * 500));
  const srv = scope.spawn(server, 'iperf3', ['-s', '-1', '-B', serverIp, '-p', port], {
    stdio: 'ignore',
  });
  try {
    let lastErr: unknown;
    for (let attempt = 0; attempt < 30; attempt++) {
      try {
        const out = await nsExecAsync(
          client,
          'iperf3',
          ['-c', serverIp, '-p', port, '-J', ...args],
          60_000,
        );
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

export interface PingGaps {
  /**
   * The blackout, ms: the largest gap between two consecutive replies with a ping lost between
   * them (with a window given, also from its start to the first reply and from the last reply to
   * its end, when pings were lost there; no reply at all: the whole window). A gap with no ping
   * lost inside it is the pinger itself not sending (a loaded machine), not the path.
   */
  readonly blackoutMs: number;
  /** The largest gap between two consecutive replies, ms, lost pings between them or not. */
  readonly maxGapMs: number;
  /** Echo replies (a duplicate counts once more). */
  readonly replies: number;
  /** "Destination ... Unreachable" answers. */
  readonly unreachable: number;
  /** Echo requests sent: the summary's "N packets transmitted", else the highest icmp_seq. */
  readonly sent: number;
}

/**
 * Reads the output of `ping -D` (each line prefixed with `[<epoch seconds>.<µs>]`): when the
 * replies came and which were lost. `window` (ms since the epoch, the clock ping's timestamps
 * use) bounds the measurement at either end.
 */
export function pingGaps(
  out: string,
  window: { readonly startMs?: number; readonly endMs?: number } = {},
): PingGaps {
  const replies: Array<{ t: number; seq: number }> = [];
  let unreachable = 0;
  let maxSeq = 0;
  for (const line of out.split('\n')) {
    const m = /^\[(\d+(?:\.\d+)?)\] (.*)$/.exec(line);
    if (!m) continue;
    const seq = Number(/icmp_seq=(\d+)/.exec(m[2]!)?.[1] ?? NaN);
    if (seq > maxSeq) maxSeq = seq;
    if (/unreachable/i.test(m[2]!)) unreachable++;
    else if (/ bytes from /.test(m[2]!)) replies.push({ t: Number(m[1]) * 1000, seq });
  }
  const sentLine = /(\d+) packets transmitted/.exec(out);
  const sent = sentLine ? Number(sentLine[1]) : maxSeq;
  // The window's edges as replies: seq 0 before the first ping, sent + 1 after the last.
  const marks = [
    ...(window.startMs === undefined ? [] : [{ t: window.startMs, seq: 0 }]),
    ...replies,
    ...(window.endMs === undefined ? [] : [{ t: window.endMs, seq: sent + 1 }]),
  ];
  let blackoutMs = 0;
  let maxGapMs = 0;
  for (let i = 1; i < marks.length; i++) {
    const gap = marks[i]!.t - marks[i - 1]!.t;
    maxGapMs = Math.max(maxGapMs, gap);
    if (marks[i]!.seq - marks[i - 1]!.seq > 1) blackoutMs = Math.max(blackoutMs, gap);
  }
  return { blackoutMs, maxGapMs, replies: replies.length, unreachable, sent };
}

/**
 * A `node -e` script (argv: PORT N): opens N connections to 127.0.0.1:PORT, prints "held K" once
 * each has connected (K of them) or failed, and keeps them open until its stdin closes.
 */
export const HOLD_CONNECTIONS = `
const net = require('node:net');
const [port, n] = process.argv.slice(1).map(Number);
let connected = 0, settled = 0;
const settle = () => { if (++settled === n) process.stdout.write('held ' + connected + '\\n'); };
for (let i = 0; i < n; i++) {
  const s = net.connect(port, '127.0.0.1');
  let once = false;
  const done = (ok) => { if (once) return; once = true; if (ok) connected++; settle(); };
  s.on('connect', () => done(true));
  s.on('error', () => done(false));
}
process.stdin.on('end', () => process.exit(0));
process.stdin.resume();
`;
