/**
 * Traffic through a tunnel asserted by its mechanism, not by a rate: a bit rate or a UDP loss
 * figure depends on how busy the machine is, so neither is ever a verdict. iperf3 moves a fixed
 * amount of TCP data (however long it takes) or a paced, modest UDP stream; what is asserted is
 * that data arrived, and that the dataplane's own byte counters grew by at least what arrived
 * (it went through weft, not around it).
 */
import assert from 'node:assert/strict';
import type { Cluster, Pod } from '../../src/testbed/cluster.js';
import { iperf } from '../../src/testbed/probes.js';
import { sample } from './scrape.js';

/** iperf3 client arguments: 4 MiB of TCP, whatever time it takes. */
export const TCP_FIXED = ['-n', '4M'] as const;
/**
 * iperf3 client arguments: 1.25 MB of UDP paced at 10 Mbit/s (1 s; no sender outruns a loaded
 * machine).
 */
export const UDP_PACED = ['-u', '-b', '10M', '-n', '1250K'] as const;

interface IperfJson {
  start: { test_start: { blksize: number; protocol: string } };
  end: {
    sum_sent?: { bytes: number };
    sum_received?: { bytes: number; packets?: number; lost_packets?: number };
  };
}

/**
 * The payload bytes an iperf3 run's server received, asserted > 0 (and, for UDP, the datagrams
 * counted whole: received = sent − lost, times the datagram size).
 */
export function delivered(json: unknown): number {
  const j = json as IperfJson;
  const sent = j.end.sum_sent?.bytes ?? 0;
  const r = j.end.sum_received;
  assert.ok(sent > 0 && r, `iperf3 sent ${sent} bytes, nothing received`);
  if (j.start.test_start.protocol === 'UDP') {
    const datagrams = r.packets! - r.lost_packets!;
    assert.ok(datagrams > 0, `no UDP datagram arrived (${r.packets} sent)`);
    return datagrams * j.start.test_start.blksize;
  }
  assert.ok(r.bytes > 0 && r.bytes <= sent, `TCP: ${r.bytes} of ${sent} bytes received`);
  return r.bytes;
}

/** How much counter `name` grew from one /metrics text to a later one. */
export function grew(before: string, after: string, name: string): number {
  return sample(after, name) - sample(before, name);
}

/** Asserts `name` grew by at least `bytes` (inner bytes include the headers of what arrived). */
export function assertCounted(before: string, after: string, name: string, bytes: number): void {
  const g = grew(before, after, name);
  assert.ok(g >= bytes, `${name} grew by ${g} < the ${bytes} payload bytes that arrived`);
}

/**
 * iperf3 TCP from pod `a` to pod `b`, then UDP from `b` to `a`: each asserted by what arrived
 * and by the receiving node's weft_dataplane_rx_bytes_total (`metrics` scrapes a node's ns).
 */
export async function assertPodToPod(
  c: Cluster,
  a: Pod,
  b: Pod,
  metrics: (ns: string) => Promise<string>,
): Promise<void> {
  for (const [from, to, args] of [
    [a, b, TCP_FIXED],
    [b, a, UDP_PACED],
  ] as const) {
    const ns = c.nodes[to.node]!.ns;
    const before = await metrics(ns);
    const run = await iperf(c.scope, to.ns, to.ip, from.ns, args);
    assertCounted(before, await metrics(ns), 'weft_dataplane_rx_bytes_total', delivered(run.json));
  }
}

/**
 * iperf3 with `args` both ways between weft pod `pod` (at `podIp`) and `peerIp` in namespace
 * `peerNs` (a pod weft does not serve, e.g. on a kernel vxlan node): each asserted by what
 * arrived and by `pod`'s node's counters (tx bytes going out, rx bytes coming in).
 */
export async function assertBothWays(
  c: Cluster,
  pod: Pod,
  podIp: string,
  peer: { readonly ns: string; readonly ip: string },
  args: readonly string[],
  metrics: (ns: string) => Promise<string>,
): Promise<void> {
  const ns = c.nodes[pod.node]!.ns;
  const m0 = await metrics(ns);
  const out = await iperf(c.scope, peer.ns, peer.ip, pod.ns, args);
  const m1 = await metrics(ns);
  assertCounted(m0, m1, 'weft_dataplane_tx_bytes_total', delivered(out.json));
  const back = await iperf(c.scope, pod.ns, podIp, peer.ns, args);
  assertCounted(m1, await metrics(ns), 'weft_dataplane_rx_bytes_total', delivered(back.json));
}
