/**
 * The rows of the fault campaign (issue #17): each one fault done to node 0 of a Bed (bed.ts)
 * and what it measures. A row returns its figure and whether the goal held; it never asserts
 * (a figure belongs to the run, not to a timed test). Rows that make no sense on a backend say
 * why instead of running.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { execFileSync } from 'node:child_process';
import { once } from 'node:events';
import { CLUSTER_NETWORK, HEALTH_PORT, UNDERLAY_V4 } from '../../src/testbed/cluster.js';
import { nsExecAsync } from '../../src/testbed/netns.js';
import { HOLD_CONNECTIONS, iperf, ping, pingGaps, waitForMesh } from '../../src/testbed/probes.js';
import {
  assertEveryDatagramCounted,
  droppedByReason,
  kernelUdpRecvErrors,
  receiveDrops,
  snmpCounter,
} from '../../src/testbed/drops.js';
import { type Bed, ETCD_PREFIX, type FaultBackend, sleep, timeUntil } from './bed.js';
import { type Outcome, metricSum, secs } from './report.js';

const FLOOD = fileURLToPath(new URL('../../test/helpers/udp-flood.ts', import.meta.url));

export interface RowOptions {
  /** The short mode: shorter floods, holds and waits. */
  readonly short: boolean;
  /** How long etcd stays down (s). */
  readonly etcdDownS: number;
}

export interface RowDef {
  readonly id: string;
  readonly title: string;
  readonly goal: string;
  /** Why the fault has no meaning on this backend, or null. */
  notApplicable(b: FaultBackend): string | null;
  run(bed: Bed, o: RowOptions): Promise<Outcome>;
}

const always = () => null;
const userspaceOnly = (why: string) => (b: FaultBackend) => (b.userspace ? null : why);

/** The goal of every piece of state: back within this. */
const REPAIR_GOAL_MS = 10_000;
/** How long a row waits for a repair before it calls it not restored. */
const REPAIR_WAIT_MS = 30_000;

/** Whether one ping from pod to address answers within `timeoutMs`. */
async function pingsWithin(bed: Bed, timeoutMs: number): Promise<boolean> {
  const ms = await timeUntil(async () => {
    await nsExecAsync(bed.prober.ns, 'ping', ['-n', '-c', '1', '-W', '1', bed.target.ip], 5000);
    return true;
  }, timeoutMs);
  return ms !== null;
}

/** Counts of a metric on node 0, summed over labels. */
async function metric(
  bed: Bed,
  name: string,
  labels: Record<string, string> = {},
): Promise<number> {
  return metricSum(await bed.metrics(0), name, labels);
}

// ---- kill -9 + immediate restart -------------------------------------------------------------

const kill9: RowDef = {
  id: 'kill9',
  title: 'kill -9 + restart',
  goal: 'blackout < 1 s',
  notApplicable: always,
  async run(bed, o) {
    const ping = bed.ping(bed.prober, bed.target.ip, 0.01);
    await sleep(1000);
    const killed = await bed.signal(0, 'SIGKILL');
    const t0 = Date.now() - killed.ms;
    await bed.cluster.startDaemon(0);
    const readyMs = Date.now() - t0;
    await sleep(o.short ? 1000 : 2000);
    const g = pingGaps(await ping.stop(), { endMs: Date.now() });
    // A gap without a lost ping is the pinger not sending on a loaded machine: shown, not judged.
    const stall = g.maxGapMs > g.blackoutMs + 100 ? `; largest reply gap ${secs(g.maxGapMs)}` : '';
    return {
      figure:
        `blackout ${secs(g.blackoutMs)} (${g.sent - g.replies} of ${g.sent} pings at 10 ms lost` +
        `${g.unreachable ? `, ${g.unreachable} unreachable` : ''}${stall}; ready ${secs(readyMs)} after the kill)`,
      met: g.blackoutMs < 1000,
      values: {
        blackoutMs: Math.round(g.blackoutMs),
        maxGapMs: Math.round(g.maxGapMs),
        sent: g.sent,
        replies: g.replies,
        unreachable: g.unreachable,
        readyMs,
      },
    };
  },
};

// ---- state deleted by hand -------------------------------------------------------------------

interface Piece {
  /** What is deleted, for the figure. */
  readonly what: string;
  /** Whether the whole piece (and what the kernel removes with it) is in place. */
  present(): Promise<boolean>;
  remove(): Promise<void>;
}

/** The address weft gives its device: the subnet's network address /32. */
const ownAddr = (bed: Bed) => `${bed.subnet(0).split('/')[0]}/32`;
const has = async (p: Promise<string>, re: RegExp) => re.test(await p);
const isUp = (bed: Bed, dev: string) => has(bed.ip(0, 'link', 'show', 'dev', dev), /[<,]UP[,>]/);
/** The route(s) weft needs for node 1 (kernel backends) or the cluster (userspace). */
function routePresent(bed: Bed): Promise<boolean> {
  const b = bed.backend;
  if (b.userspace)
    return has(bed.ip(0, 'route', 'show', CLUSTER_NETWORK), new RegExp(`dev ${b.dev}\\b`));
  const via = b.dev ? `dev ${b.dev.replace('.', '\\.')} onlink` : `via ${UNDERLAY_V4}\\.2 dev eth0`;
  return has(bed.ip(0, 'route', 'show', bed.subnet(1)), new RegExp(via));
}
const addrPresent = (bed: Bed) =>
  has(bed.ip(0, 'addr', 'show', 'dev', bed.backend.dev!), new RegExp(`inet ${ownAddr(bed)} `));

function stateRow(
  id: string,
  title: string,
  notApplicable: (b: FaultBackend) => string | null,
  piece: (bed: Bed) => Piece,
): RowDef {
  return {
    id,
    title,
    goal: 'restored ≤ 10 s, /readyz 200 after, pods ping',
    notApplicable,
    async run(bed) {
      const made = piece(bed);
      // a check that fails (the device it reads is gone) finds the piece missing
      const p = { ...made, present: () => made.present().catch(() => false) };
      if (!(await p.present())) throw new Error(`${p.what} not in place before the fault`);
      const samples: Array<{ at: number; status: number }> = [];
      let sampling = true;
      const sampler = (async () => {
        while (sampling) {
          samples.push({ at: Date.now(), status: await bed.readyz(0) });
          await sleep(250);
        }
      })();
      const t0 = Date.now();
      // remove() throws when the deletion fails. Whether it is gone is not read back: the
      // daemon's netlink watch can put it back before a spawned `ip` reads it (on a loaded
      // machine it did, every time), so the first poll that finds it is the restore time's bound.
      await p.remove();
      const restoredMs = await timeUntil(() => p.present(), REPAIR_WAIT_MS);
      sampling = false;
      await sampler;
      const first503 = samples.find((s) => s.at >= t0 && s.status !== 200);
      const pingOk = restoredMs !== null && (await pingsWithin(bed, 10_000));
      const readyAfter = await bed.readyz(0);
      const notReady = first503
        ? `/readyz ${first503.status || 'no answer'} from ${secs(first503.at - t0)}`
        : '/readyz stayed 200';
      const figure =
        restoredMs === null
          ? `${p.what}: not restored in ${secs(REPAIR_WAIT_MS)}; ${notReady}`
          : `${p.what}: restored in ${secs(restoredMs)}; /readyz ${readyAfter} after` +
            `${first503 ? ` (${notReady})` : ''}; ${pingOk ? 'pods ping' : 'pods do NOT ping'}`;
      return {
        figure,
        met: restoredMs !== null && restoredMs <= REPAIR_GOAL_MS && readyAfter === 200 && pingOk,
        values: {
          restoredMs,
          readyAfter,
          notReadyFromMs: first503 ? first503.at - t0 : null,
          pingAfter: pingOk,
        },
      };
    },
  };
}

const kernelVxlanOnly = (why: (b: FaultBackend) => string) => (b: FaultBackend) =>
  b.dev === 'flannel.1' && !b.userspace ? null : why(b);

const deleteRoute = stateRow('delete-route', 'route deleted', always, (bed) => {
  const b = bed.backend;
  return b.userspace
    ? {
        what: `route ${CLUSTER_NETWORK} dev ${b.dev}`,
        present: () => routePresent(bed),
        remove: async () => void (await bed.ip(0, 'route', 'del', CLUSTER_NETWORK, 'dev', b.dev!)),
      }
    : {
        what: `route to node 1 (${bed.subnet(1)})`,
        present: () => routePresent(bed),
        remove: async () => void (await bed.ip(0, 'route', 'del', bed.subnet(1))),
      };
});

const deleteAddress = stateRow(
  'delete-address',
  'address deleted',
  (b) => (b.dev ? null : 'host-gw gives no device an address'),
  (bed) => ({
    what: `${ownAddr(bed)} on ${bed.backend.dev}`,
    // the kernel removes the routes through the device's address with it
    present: async () => (await addrPresent(bed)) && (await routePresent(bed)),
    remove: async () =>
      void (await bed.ip(0, 'addr', 'del', ownAddr(bed), 'dev', bed.backend.dev!)),
  }),
);

const deleteNeighbour = stateRow(
  'delete-neighbour',
  'neighbour deleted',
  kernelVxlanOnly((b) =>
    b.userspace
      ? 'a TUN has no neighbours (peers live in the engine)'
      : 'host-gw programs no neighbours',
  ),
  (bed) => {
    const peer = bed.subnet(1).split('/')[0]!;
    return {
      what: `neighbour ${peer} on flannel.1`,
      present: () =>
        has(bed.ip(0, 'neigh', 'show', 'dev', 'flannel.1'), new RegExp(`^${peer} lladdr`, 'm')),
      remove: async () => void (await bed.ip(0, 'neigh', 'del', peer, 'dev', 'flannel.1')),
    };
  },
);

const deleteFdb = stateRow(
  'delete-fdb',
  'FDB entry deleted',
  kernelVxlanOnly((b) =>
    b.userspace ? 'a TUN has no FDB (peers live in the engine)' : 'host-gw programs no FDB',
  ),
  (bed) => {
    const dst = `dst ${UNDERLAY_V4}.2 `;
    const line = async () =>
      (await bed.run(0, 'bridge', 'fdb', 'show', 'dev', 'flannel.1'))
        .split('\n')
        .find((l) => l.includes(dst));
    return {
      what: `FDB entry to ${UNDERLAY_V4}.2 on flannel.1`,
      present: async () => (await line()) !== undefined,
      remove: async () => {
        const mac = (await line())!.split(' ')[0]!;
        await bed.run(
          0,
          'bridge',
          'fdb',
          'del',
          mac,
          'dev',
          'flannel.1',
          'dst',
          `${UNDERLAY_V4}.2`,
        );
      },
    };
  },
);

const deleteDevice = stateRow(
  'delete-device',
  'device deleted',
  (b) => (b.dev ? null : 'host-gw owns no device'),
  (bed) => {
    const dev = bed.backend.dev!;
    return {
      what: `${dev}${bed.backend.userspace ? ' (the TUN)' : ''}`,
      present: async () =>
        (await isUp(bed, dev)) && (await addrPresent(bed)) && (await routePresent(bed)),
      remove: async () => void (await bed.ip(0, 'link', 'del', dev)),
    };
  },
);

const linkDown = stateRow(
  'link-down',
  'device set down',
  (b) => (b.dev ? null : 'host-gw owns no device (eth0 is not weft’s)'),
  (bed) => {
    const dev = bed.backend.dev!;
    return {
      what: `${dev} down`,
      // the kernel drops the routes through a device that goes down
      present: async () => (await isUp(bed, dev)) && (await routePresent(bed)),
      remove: async () => void (await bed.ip(0, 'link', 'set', dev, 'down')),
    };
  },
);

const flushIptables = stateRow('flush-iptables', 'masquerade rules flushed', always, (bed) => {
  const rules = async () =>
    (await bed.run(0, 'iptables', '-t', 'nat', '-S', 'FLANNEL-POSTRTG'))
      .split('\n')
      .filter((l) => l.startsWith('-A')).length;
  let want = 0;
  return {
    what: 'nat chain FLANNEL-POSTRTG',
    present: async () => {
      const n = await rules();
      want ||= n;
      return n > 0 && n >= want;
    },
    remove: async () => void (await bed.run(0, 'iptables', '-t', 'nat', '-F', 'FLANNEL-POSTRTG')),
  };
});

// ---- the store -------------------------------------------------------------------------------

/** A lease no real node holds, valid for the bed's backend (subnets 10.5.250+ are never picked). */
const fakeLease = (bed: Bed, n: number) => ({
  key: `10.5.${n}.0-24`,
  value: bed.leaseValue(`${UNDERLAY_V4}.${n}`, { mac: `0a:00:00:00:00:${n.toString(16)}` }),
});

const etcdDown: RowDef = {
  id: 'etcd-down',
  title: 'etcd stopped',
  goal: '0 pings lost; watch resumes ≤ 10 s after etcd returns',
  notApplicable: always,
  async run(bed, o) {
    const peers0 = await metric(bed, 'weft_lease_peers');
    const ping = bed.ping(bed.prober, bed.target.ip, 0.1);
    await sleep(500);
    await bed.cluster.stopEtcd();
    await sleep(o.etcdDownS * 1000);
    await bed.cluster.startEtcd();
    const back = Date.now();
    const fake = fakeLease(bed, 250);
    bed.putLease(fake.key, fake.value);
    const seenMs = await timeUntil(
      async () => (await metric(bed, 'weft_lease_peers')) === peers0 + 1,
      30_000,
    );
    const resumeMs = seenMs === null ? null : Date.now() - back;
    bed.delLease(fake.key);
    await timeUntil(async () => (await metric(bed, 'weft_lease_peers')) === peers0, 30_000);
    const g = pingGaps(await ping.stop());
    const alive = bed.cluster.nodes.every((n) => bed.alive(n.index));
    const lost = g.sent - g.replies;
    return {
      figure:
        `${o.etcdDownS} s down: ${lost} of ${g.sent} pings lost; ` +
        (resumeMs === null
          ? 'a lease written after etcd returned was NOT seen in 30 s'
          : `a lease written after etcd returned seen ${secs(resumeMs)} later`) +
        (alive ? '' : '; a daemon exited'),
      met: lost === 0 && resumeMs !== null && resumeMs <= 10_000 && alive,
      values: { downS: o.etcdDownS, sent: g.sent, lost, resumeMs, alive },
    };
  },
};

const leaseRevoked: RowDef = {
  id: 'lease-revoked',
  title: 'own lease revoked',
  goal: 'exits by itself ≤ 10 s, naming why',
  notApplicable: always,
  async run(bed): Promise<Outcome> {
    const node = bed.victim;
    const p = node.daemon!;
    const gone = once(p, 'exit');
    const key = bed.leaseKey(0);
    const t0 = Date.now();
    bed.delLease(key);
    const exited = await Promise.race([gone.then(() => true), sleep(30_000).then(() => false)]);
    const ms = Date.now() - t0;
    if (!exited) {
      return {
        figure: `still running 30 s after its lease ${key} was deleted`,
        met: false,
        values: { exitMs: null },
      };
    }
    node.daemon = null;
    // What it said: the plain sentence on stderr (else the JSON log's error).
    const log = readFileSync(node.logFile, 'utf8').split('\n');
    const why =
      log.filter((l) => !l.startsWith('{') && /revoked/.test(l)).pop() ??
      log.filter((l) => /revoked/.test(l)).pop() ??
      null;
    const code = p.exitCode;
    return {
      figure: `exit ${code ?? p.signalCode} ${secs(ms)} after ${key} was deleted: ${
        why ? `"${why.trim().slice(0, 110)}"` : 'no reason given'
      }`,
      met: ms <= 10_000 && why !== null && p.signalCode === null,
      values: { exitMs: ms, code, why },
    };
  },
};

const badLeases: RowDef = {
  id: 'bad-leases',
  title: 'bad leases injected',
  goal: 'every one skipped and counted; pods ping',
  notApplicable: always,
  async run(bed) {
    const own = bed.subnet(0).split('/')[0]!;
    const peer = bed.subnet(1).split('/')[0]!;
    const good = (n: number) =>
      bed.leaseValue(`${UNDERLAY_V4}.${n}`, { mac: `0a:00:00:00:01:${n}` });
    const bad: Array<[string, string]> = [
      ['10.5.241.0-24', 'not json'], // malformed
      ['not-a-subnet', good(91)], // malformed key
      ['10.5.242.0-24', '{"PublicIP":"300.1.1.1","PublicIPv6":null}'], // malformed
      ['10.5.243.0-24', '{"PublicIPv6":null}'], // malformed: no address
      ['10.9.0.0-24', good(92)], // outside_network
      [`${own.replace(/\.0$/, '.128')}-25`, good(93)], // overlaps_own
      [`${peer}-25`, good(94)], // overlaps_peer (node 1's lease is older)
    ];
    if (bed.backend.leaseType === 'vxlan') {
      bad.push(['10.5.244.0-24', bed.leaseValue(`${UNDERLAY_V4}.95`, { vni: 2 })]); // backend_data
      bad.push([
        '10.5.245.0-24',
        bed.leaseValue(`${UNDERLAY_V4}.96`, { mac: '01:00:5e:00:00:01' }),
      ]);
    }
    /** What node 0 counted: malformed, and each conflict reason. */
    const tallies = async () => {
      const m = await bed.metrics(0);
      const out: Record<string, number> = {
        malformed: metricSum(m, 'weft_lease_malformed_total'),
      };
      for (const x of m.matchAll(/^weft_lease_conflicts_total\{reason="(\w+)"\} (\S+)$/gm))
        out[x[1]!] = Number(x[2]);
      return out;
    };
    const sum = (t: Record<string, number>) => Object.values(t).reduce((a, b) => a + b, 0);
    const before = await tallies();
    try {
      for (const [key, value] of bad) bed.putLease(key, value);
      await timeUntil(async () => sum(await tallies()) - sum(before) >= bad.length, 10_000);
      await sleep(1000); // anything counted twice shows now
      const after = await tallies();
      const n = sum(after) - sum(before);
      const by = Object.entries(after)
        .map(([k, v]) => [k, v - (before[k] ?? 0)] as const)
        .filter(([, v]) => v > 0)
        .map(([k, v]) => `${k} ${v}`)
        .join(', ');
      const silent = await waitForMesh(bed.cluster.pods, 10_000);
      const alive = bed.cluster.nodes.every((x) => bed.alive(x.index));
      return {
        figure:
          `${n} of ${bad.length} counted by node 0 (${by})` +
          `${silent ? `; ${silent} pod pair(s) cut off` : '; pods ping'}${alive ? '' : '; a daemon exited'}`,
        met: n === bad.length && silent === 0 && alive,
        values: { injected: bad.length, counted: n, silentPairs: silent, alive },
      };
    } finally {
      for (const [key] of bad) bed.delLease(key);
    }
  },
};

// ---- the dataplane's socket ------------------------------------------------------------------

/** Runs test/helpers/udp-flood.ts in a namespace; its {"sent"} figure. */
async function flood(ns: string, args: Record<string, unknown>): Promise<number> {
  const out = await nsExecAsync(
    ns,
    process.execPath,
    ['--import', 'tsx', FLOOD, JSON.stringify(args)],
    600_000,
  );
  return (JSON.parse(out) as { sent: number }).sent;
}

const fmtCount = (n: number) => (n >= 10_000 ? `${(n / 1000).toFixed(0)}k` : String(n));

const garbage: RowDef = {
  id: 'garbage',
  title: 'garbage flood',
  goal: 'daemon alive, pods ping after; every paced datagram counted',
  notApplicable: userspaceOnly('no weft socket: the kernel takes these datagrams'),
  async run(bed, o) {
    const seconds = o.short ? 2 : 10;
    const port = bed.backend.port!;
    const victim = bed.victim;
    const m0 = await bed.metrics(0);
    const k0 = await kernelUdpRecvErrors(victim.ns);
    // From nodes 1 and 2 at once, sources that hold a lease: the datagrams get decoded, not
    // just refused.
    const senders = bed.cluster.nodes.slice(1);
    const sent = (
      await Promise.all(
        senders.map((n) =>
          flood(n.ns, { mode: 'random', target: victim.ip, port, bindIp: n.ip, seconds }),
        ),
      )
    ).reduce((a, b) => a + b, 0);
    await sleep(1000);
    const m1 = await bed.metrics(0);
    const counted = receiveDrops(m1) - receiveDrops(m0);
    const kernel = (await kernelUdpRecvErrors(victim.ns)) - k0;
    const fwd =
      metricSum(m1, 'weft_dataplane_rx_packets_total') -
      metricSum(m0, 'weft_dataplane_rx_packets_total');
    const alive = bed.alive(0);
    let paced = 'not run (daemon down)';
    let pacedOk = false;
    if (alive) {
      try {
        const r = await assertEveryDatagramCounted({
          from: bed.cluster.nodes[1]!.ns,
          targetNs: victim.ns,
          target: victim.ip,
          port,
          scrape: () => bed.metrics(0),
        });
        paced = `${r.counted + r.kernel}/${r.sent} paced counted`;
        pacedOk = true;
      } catch (err) {
        paced = `paced: ${(err as Error).message.split('\n')[0]!.slice(0, 100)}`;
      }
    }
    const pingOk = alive && (await pingsWithin(bed, 10_000));
    const reasons = Object.entries(droppedByReason(m1))
      .map(([r, n]) => [r, n - (droppedByReason(m0)[r] ?? 0)] as const)
      .filter(([, n]) => n > 0)
      .sort((a, b) => b[1] - a[1])
      .slice(0, 3)
      .map(([r, n]) => `${r} ${fmtCount(n)}`)
      .join(', ');
    return {
      figure:
        `${fmtCount(sent)} random datagrams in ${seconds} s: ${alive ? 'alive' : 'DAEMON DIED'}, ` +
        `${fmtCount(counted)} counted (${reasons}), ${fmtCount(kernel)} by the kernel, ${fwd} forwarded; ` +
        `${paced}; ${pingOk ? 'pods ping' : 'pods do NOT ping'}`,
      met: alive && pacedOk && pingOk,
      values: { sent, counted, kernel, forwarded: fwd, alive, pacedOk, pingAfter: pingOk },
    };
  },
};

const spoofed: RowDef = {
  id: 'spoofed',
  title: 'spoofed sources',
  goal: '0 delivered, all counted',
  notApplicable: (b) =>
    b.leaseType === 'wireguard'
      ? 'a spoofed inner source needs a peer’s session keys: cryptokey routing (wg_allowed_ips) is tested in test/netns/dataplane-wireguard.test.ts'
      : userspaceOnly('the kernel paths have no source check (DESIGN §5)')(b),
  async run(bed, o) {
    const count = o.short ? 2000 : 60_000;
    const port = bed.backend.port!;
    const [n0, n1, n2] = bed.cluster.nodes;
    let vxlanDstMac: string | undefined;
    if (bed.backend.leaseType === 'vxlan') {
      const v = bed.etcdctl(
        'get',
        `${ETCD_PREFIX}/subnets/${bed.leaseKey(0)}`,
        '--print-value-only',
      );
      vxlanDstMac = (JSON.parse(v) as { BackendData: { VtepMAC: string } }).BackendData.VtepMAC;
    }
    const m0 = await bed.metrics(0);
    const k0 = await kernelUdpRecvErrors(n0!.ns);
    const in0 = await snmpCounter(bed.target.ns, 'Ip', 'InReceives');
    // node 1 (holds a lease) claims node 2's pod as the source
    const spoof = await flood(n1!.ns, {
      mode: 'spoof',
      target: n0!.ip,
      port,
      bindIp: n1!.ip,
      count,
      innerSrc: n2!.pods[0]!.ip,
      innerDst: bed.target.ip,
      vxlanDstMac,
    });
    // the underlay's bridge address holds no lease at all
    const stranger = await flood(bed.cluster.underlay, {
      mode: 'spoof',
      target: n0!.ip,
      port,
      bindIp: `${UNDERLAY_V4}.254`,
      count,
      innerSrc: n1!.pods[0]!.ip,
      innerDst: bed.target.ip,
      vxlanDstMac,
    });
    const sent = spoof + stranger;
    let counted = 0;
    await timeUntil(async () => {
      const m = await bed.metrics(0);
      counted =
        metricSum(m, 'weft_dataplane_dropped_packets_total', { reason: 'spoofed_source' }) -
        metricSum(m0, 'weft_dataplane_dropped_packets_total', { reason: 'spoofed_source' }) +
        metricSum(m, 'weft_dataplane_dropped_packets_total', { reason: 'unknown_source' }) -
        metricSum(m0, 'weft_dataplane_dropped_packets_total', { reason: 'unknown_source' });
      return counted + (await kernelUdpRecvErrors(n0!.ns)) - k0 >= sent;
    }, 15_000);
    const kernel = (await kernelUdpRecvErrors(n0!.ns)) - k0;
    const delivered = (await snmpCounter(bed.target.ns, 'Ip', 'InReceives')) - in0;
    return {
      figure:
        `${fmtCount(sent)} sent (${fmtCount(spoof)} from a peer, ${fmtCount(stranger)} from no lease): ` +
        `${delivered} delivered to the pod, ${fmtCount(counted)} counted by weft + ${kernel} by the kernel`,
      met: delivered === 0 && counted + kernel === sent,
      values: { sent, delivered, counted, kernel },
    };
  },
};

// ---- the process -----------------------------------------------------------------------------

/** Node 0's kernel state weft programs, one normalised line per entry. */
async function kernelState(bed: Bed): Promise<string[]> {
  const lines = [
    ...(await bed.ip(0, '-4', 'route', 'show')).split('\n'),
    ...(await bed.ip(0, 'neigh', 'show', 'nud', 'permanent')).split('\n'),
  ];
  if (bed.backend.dev === 'flannel.1' && !bed.backend.userspace)
    lines.push(...(await bed.run(0, 'bridge', 'fdb', 'show', 'dev', 'flannel.1')).split('\n'));
  return lines
    .map((l) => l.trim().replace(/\s+/g, ' '))
    .filter(Boolean)
    .sort();
}

const sigterm: RowDef = {
  id: 'sigterm',
  title: 'SIGTERM + restart',
  goal: 'exit 0 ≤ 2 s; no stale or missing routes after restart',
  notApplicable: always,
  async run(bed) {
    const fake = fakeLease(bed, 251);
    const peers0 = await metric(bed, 'weft_lease_peers');
    bed.putLease(fake.key, fake.value);
    const mentions = (l: string) =>
      l.includes('10.5.251.') || l.includes(`${UNDERLAY_V4}.251 `) || l.includes(':fb ');
    try {
      await timeUntil(async () => (await metric(bed, 'weft_lease_peers')) === peers0 + 1, 10_000);
      if (!bed.backend.userspace)
        await timeUntil(async () => (await kernelState(bed)).some(mentions), 10_000);
      const before = await kernelState(bed);
      const stop = await bed.signal(0, 'SIGTERM');
      // gone while the daemon is down: its route must not survive the restart
      bed.delLease(fake.key);
      await bed.cluster.startDaemon(0);
      await waitForMesh(bed.cluster.pods, 15_000);
      await timeUntil(async () => (await metric(bed, 'weft_lease_peers')) === peers0, 10_000);
      await sleep(1000);
      const after = await kernelState(bed);
      const stale = after.filter(mentions);
      const missing = before.filter((l) => !mentions(l) && !after.includes(l));
      const code = stop.code ?? stop.signal;
      return {
        figure:
          `exit ${code} in ${secs(stop.ms)}; after restart ${stale.length} stale, ${missing.length} missing` +
          `${stale.length ? ` (${stale[0]})` : missing.length ? ` (${missing[0]})` : ''}`,
        met: stop.code === 0 && stop.ms <= 2000 && stale.length === 0 && missing.length === 0,
        values: {
          exitCode: stop.code,
          exitMs: stop.ms,
          stale: stale.length,
          missing: missing.length,
        },
      };
    } finally {
      bed.delLease(fake.key);
    }
  },
};

const fdExhaustion: RowDef = {
  id: 'fd-exhaustion',
  title: 'out of fds',
  goal: 'alive, 0 pings lost while out of fds, /healthz 200 after',
  notApplicable: always,
  async run(bed, o) {
    const node = bed.victim;
    const pid = node.daemon!.pid!;
    const limits = execFileSync(
      'prlimit',
      ['--pid', String(pid), '--nofile', '-o', 'SOFT,HARD', '--noheadings'],
      {
        encoding: 'utf8',
      },
    )
      .trim()
      .split(/\s+/);
    const fds = () => readdirSync(`/proc/${pid}/fd`).length;
    // 16 fds more than it holds (the soft limit: raising a hard one back needs more than root
    // may have in a container)
    const limit = fds() + 16;
    execFileSync('prlimit', ['--pid', String(pid), `--nofile=${limit}:${limits[1]}`]);
    const holdS = o.short ? 3 : 12;
    const ping = bed.ping(bed.prober, bed.target.ip, 0.05);
    const holder = bed.cluster.scope.spawn(
      node.ns,
      process.execPath,
      ['-e', HOLD_CONNECTIONS, String(HEALTH_PORT), '300'],
      { stdio: ['pipe', 'pipe', 'ignore'] },
    );
    let peak = 0;
    let held = '';
    try {
      held = await new Promise<string>((resolve, reject) => {
        holder.stdout!.once('data', (d: Buffer) => resolve(d.toString().trim()));
        holder.once('exit', (code) => reject(new Error(`connection holder exited ${code}`)));
      });
      const end = Date.now() + holdS * 1000;
      while (Date.now() < end && bed.alive(0)) {
        peak = Math.max(peak, fds());
        await sleep(200);
      }
    } finally {
      holder.stdin!.end();
      await once(holder, 'exit');
    }
    const g = pingGaps(await ping.stop());
    const alive = bed.alive(0);
    const healthMs = alive
      ? await timeUntil(async () => (await bed.healthz(0)) === 200, 10_000)
      : null;
    if (alive)
      execFileSync('prlimit', ['--pid', String(pid), `--nofile=${limits[0]}:${limits[1]}`]);
    const exhausted = peak >= limit;
    const lost = g.sent - g.replies;
    return {
      figure:
        `${held} connections, fds ${peak}/${limit} for ${holdS} s${exhausted ? '' : ' (never ran out: not exercised)'}: ` +
        `${alive ? 'alive' : 'DAEMON DIED'}, ${lost} of ${g.sent} pings lost; ` +
        (healthMs === null
          ? '/healthz not 200 within 10 s after'
          : `/healthz 200 ${secs(healthMs)} after`),
      met: alive && exhausted && lost === 0 && healthMs !== null,
      values: { limit, peakFds: peak, sent: g.sent, lost, alive, healthzAfterMs: healthMs },
    };
  },
};

const crash: RowDef = {
  id: 'crash',
  title: 'crash (throw, reject, exit)',
  goal: 'process ends non-zero ≤ 2 s after',
  notApplicable: always,
  async run(bed) {
    const parts: string[] = [];
    const values: Record<string, number | null> = {};
    let met = true;
    for (const how of ['throw', 'reject', 'exit'] as const) {
      await bed.cluster.stopDaemon(0);
      await bed.cluster.startDaemon(0, [], { env: { WEFT_TEST_CRASH: how }, waitReady: false });
      const node = bed.victim;
      const p = node.daemon!;
      const exited = await Promise.race([
        once(p, 'exit').then(() => Date.now()),
        sleep(60_000).then(() => null),
      ]);
      // the crash comes right after the daemon logs `ready` (WEFT_TEST_CRASH, daemon-command.ts)
      const ready = node.logs.find((l) => l.msg === 'ready');
      const readyAt = ready ? Date.parse(String(ready.time)) : null;
      const code = p.exitCode ?? p.signalCode;
      const ms = exited !== null && readyAt !== null ? exited - readyAt : null;
      node.daemon = exited === null ? p : null;
      if (exited === null) {
        parts.push(`${how}: still running after 60 s`);
        met = false;
        p.kill('SIGKILL');
        await once(p, 'exit');
        node.daemon = null;
      } else if (ms === null) {
        parts.push(`${how}: exit ${code} before it was ready`);
        met = false;
      } else {
        parts.push(`${how} → ${code} in ${secs(ms)}`);
        met &&= typeof code === 'number' && code !== 0 && ms <= 2000;
      }
      values[`${how}Ms`] = ms;
      values[`${how}Code`] = typeof code === 'number' ? code : null;
    }
    await bed.cluster.startDaemon(0);
    return { figure: parts.join(', '), met, values };
  },
};

// ---- hardened hosts (issue #27) ---------------------------------------------------------------

/** rp_filter of node 0's all, default and eth0 (1 strict, 0 off). */
async function rpFilter(bed: Bed, value: string): Promise<void> {
  await bed.run(
    0,
    'sysctl',
    '-qw',
    `net.ipv4.conf.all.rp_filter=${value}`,
    `net.ipv4.conf.default.rp_filter=${value}`,
    `net.ipv4.conf.eth0.rp_filter=${value}`,
  );
}

/** Node 0's daemon stopped and started again (the engines decide what the host allows at start). */
async function restartVictim(bed: Bed): Promise<void> {
  if (bed.alive(0)) await bed.signal(0, 'SIGTERM');
  await bed.cluster.startDaemon(0);
}

/**
 * Pings both ways between the prober and the target, then 4 MiB of TCP each way: the bytes the
 * receiving iperf3 counted, per direction (0 when the transfer failed).
 */
async function reachBothWays(bed: Bed): Promise<{ pings: number; tcp: number[] }> {
  await waitForMesh(bed.cluster.pods, 20_000);
  const [a, b] = [bed.target, bed.prober];
  const pings = (await ping(b.ns, a.ip, 3)).received + (await ping(a.ns, b.ip, 3)).received;
  const tcp: number[] = [];
  for (const [from, to] of [
    [a, b],
    [b, a],
  ] as const) {
    try {
      const r = await iperf(bed.cluster.scope, to.ns, to.ip, from.ns, ['-n', '4M']);
      const end = r.json.end as { sum_received?: { bytes?: number } } | undefined;
      tcp.push(end?.sum_received?.bytes ?? 0);
    } catch {
      tcp.push(0); // nothing arrived
    }
  }
  return { pings, tcp };
}

const hardened: RowDef = {
  id: 'hardened',
  title: 'strict rp_filter + FORWARD DROP',
  goal: 'pods reach each other both ways: 6/6 pings, 4 MiB TCP through each way',
  notApplicable: always,
  async run(bed) {
    try {
      await rpFilter(bed, '1');
      await bed.run(0, 'iptables', '-P', 'FORWARD', 'DROP');
      await restartVictim(bed);
      const { pings, tcp } = await reachBothWays(bed);
      const mib = tcp.map((n) => (n / 1048576).toFixed(1));
      return {
        figure: `${pings}/6 pings, TCP ${mib[0]} MiB to node 1, ${mib[1]} MiB back`,
        met: pings === 6 && tcp.every((n) => n > 0),
        values: { pings, tcpOut: tcp[0]!, tcpBack: tcp[1]! },
      };
    } finally {
      await rpFilter(bed, '0');
      await bed.run(0, 'iptables', '-P', 'FORWARD', 'ACCEPT');
      await restartVictim(bed);
    }
  },
};

const inputRule: RowDef = {
  id: 'input-rule',
  title: 'INPUT drop on the tunnel port',
  goal: "node 0's rule against node 1 applies: 0/3 pings answered, the rule counts them",
  notApplicable: (b) => (b.port === null ? 'host-gw has no tunnel port' : null),
  async run(bed) {
    const rule = [
      '-s',
      `${UNDERLAY_V4}.2`,
      '-p',
      'udp',
      '--dport',
      String(bed.backend.port),
      '-j',
      'DROP',
    ];
    const matched = async () => {
      const out = await bed.run(0, 'iptables', '-L', 'INPUT', '-v', '-x', '-n');
      return Number(out.split('\n')[2]?.trim().split(/\s+/)[0] ?? 0);
    };
    try {
      await bed.run(0, 'iptables', '-I', 'INPUT', ...rule);
      await restartVictim(bed);
      const before = await matched();
      const answered = (await ping(bed.prober.ns, bed.target.ip, 3)).received;
      const counted = (await matched()) - before;
      return {
        figure: `${answered}/3 answered, the rule matched ${counted}`,
        met: answered === 0 && counted > 0,
        values: { answered, counted },
      };
    } finally {
      await bed.run(0, 'iptables', '-D', 'INPUT', ...rule).catch(() => undefined);
      await restartVictim(bed);
    }
  },
};

/** Every row, in the order a run takes them. */
export const ROWS: readonly RowDef[] = [
  kill9,
  deleteRoute,
  deleteAddress,
  deleteNeighbour,
  deleteFdb,
  deleteDevice,
  linkDown,
  flushIptables,
  etcdDown,
  leaseRevoked,
  badLeases,
  garbage,
  spoofed,
  sigterm,
  fdExhaustion,
  crash,
  hardened,
  inputRule,
];
