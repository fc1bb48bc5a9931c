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
    out = await nsExecAsync(
      ns,
      'ping',
      ['-n', '-c', String(count), '-i', String(intervalS), '-W', '1', dst],
      60_000,
    );
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
