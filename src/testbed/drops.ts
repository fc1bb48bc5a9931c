/**
 * Drop accounting for flood tests: weft's own drop counters from a /metrics text, and the
 * kernel's UDP receive errors of a namespace (datagrams the kernel dropped before weft could
 * read them: a full socket buffer). Every datagram sent at a dataplane port is either forwarded,
 * counted by weft under a reason, or counted here by the kernel.
 */
import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { nsExecAsync } from './netns.js';

const FLOOD = fileURLToPath(new URL('../../test/helpers/udp-flood.ts', import.meta.url));

/** Reasons only the TUN → UDP direction gives (a packet the node sends, not one it receives). */
const SEND_SIDE = new Set(['no_route', 'send_error']);

/**
 * The sum of `weft_dataplane_dropped_packets_total` over the reasons a received datagram can
 * get (the send-side ones are left out: the kernel's own packets into a fresh TUN, such as IPv6
 * router solicitations, are dropped as no_route meanwhile).
 */
export function receiveDrops(metrics: string): number {
  let sum = 0;
  for (const [reason, n] of Object.entries(droppedByReason(metrics))) {
    if (!SEND_SIDE.has(reason)) sum += n;
  }
  return sum;
}

/** Per-reason drop counts (`{reason="..."}` label → value). */
export function droppedByReason(metrics: string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const m of metrics.matchAll(
    /^weft_dataplane_dropped_packets_total\{[^}]*reason="([^"]+)"[^}]*\} (\S+)$/gm,
  )) {
    out[m[1]!] = (out[m[1]!] ?? 0) + Number(m[2]);
  }
  return out;
}

/** One counter of namespace `ns`'s /proc/net/snmp, e.g. `('Ip', 'InReceives')`. */
export async function snmpCounter(ns: string, group: string, name: string): Promise<number> {
  const snmp = await nsExecAsync(ns, 'cat', ['/proc/net/snmp']);
  const [head, values] = snmp.split('\n').filter((l) => l.startsWith(`${group}: `));
  const names = head!.split(' ');
  const vals = values!.split(' ');
  return Number(vals[names.indexOf(name)]);
}

/** The kernel's UDP `InErrors` in namespace `ns` (/proc/net/snmp; includes RcvbufErrors). */
export function kernelUdpRecvErrors(ns: string): Promise<number> {
  return snmpCounter(ns, 'Udp', 'InErrors');
}

/**
 * Sends `count` bad datagrams (udp-flood.ts mode "mixed": a quarter of them zero-length) from
 * namespace `from` to `target:port`, then waits (≤ 15 s: counters are read per scrape) until weft's
 * receive-side drop counters, read through `scrape`, and the kernel's receive errors in `targetNs` account for
 * every datagram sent, and asserts it: 400 sent (100 empty) = weft's drops + the kernel's, the
 * kernel's fewer than half, and returns the three figures. On timeout it throws with the
 * per-reason drops.
 */
export async function assertEveryDatagramCounted(o: {
  from: string;
  targetNs: string;
  target: string;
  port: number;
  scrape: () => Promise<string>;
  count?: number;
}): Promise<{ sent: number; counted: number; kernel: number }> {
  const before = receiveDrops(await o.scrape());
  const kernelBefore = await kernelUdpRecvErrors(o.targetNs);
  const args = { mode: 'mixed', target: o.target, port: o.port, count: o.count ?? 400 };
  const out = await nsExecAsync(
    o.from,
    process.execPath,
    ['--import', 'tsx', FLOOD, JSON.stringify(args)],
    60_000,
  );
  const { sent, empty } = JSON.parse(out) as { sent: number; empty: number };
  const kernel = (await kernelUdpRecvErrors(o.targetNs)) - kernelBefore;
  const deadline = Date.now() + 15_000;
  for (;;) {
    const now = await o.scrape();
    const counted = receiveDrops(now) - before;
    if (counted + kernel >= sent) {
      assert.deepEqual([sent, empty], [o.count ?? 400, (o.count ?? 400) / 4]);
      assert.equal(counted + kernel, sent);
      assert.ok(kernel < sent / 2, `the kernel dropped ${kernel} of ${sent}`);
      return { sent, counted, kernel };
    }
    if (Date.now() > deadline) {
      throw new Error(
        `${counted} drops counted + ${kernel} by the kernel < ${sent} sent after 15 s; ` +
          `drops ${JSON.stringify(droppedByReason(now))}`,
      );
    }
    await new Promise((r) => setTimeout(r, 100));
  }
}
