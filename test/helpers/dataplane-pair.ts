/**
 * Two dataplane-node.ts processes, one per node namespace, fed each other's peer records: the
 * pair the dataplane namespace tests (dataplane-engine, bpf-engine) drive.
 */
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { after } from 'node:test';
import type { DataplaneEngine } from '../../src/dataplane/index.js';
import { PACKAGE_ROOT as ROOT } from '../../src/testbed/cluster.js';
import { type NetnsScope, ip, nsExec } from '../../src/testbed/netns.js';

/**
 * One dataplane-node.ts process: its first line (ready) and one reply per command. A process
 * that ends with its ready line or a reply still owed fails them (naming how it ended), so a
 * test whose node died fails instead of waiting forever.
 */
export class Node {
  readonly #replies: Array<{
    resolve: (v: Record<string, unknown>) => void;
    reject: (e: Error) => void;
  }> = [];
  readonly ready: Promise<Record<string, unknown>>;
  /** Resolves once the process has ended and its output is read. */
  readonly closed: Promise<void>;
  #ended: Error | null = null;
  constructor(readonly proc: ChildProcess) {
    this.closed = new Promise((r) => proc.once('close', () => r()));
    const rl = createInterface({ input: proc.stdout! });
    let first: { resolve: (v: Record<string, unknown>) => void; reject: (e: Error) => void };
    this.ready = new Promise((resolve, reject) => (first = { resolve, reject }));
    // Whoever awaits `ready` sees the failure; nobody awaiting it is no unhandled rejection.
    this.ready.catch(() => undefined);
    let gotFirst = false;
    rl.on('line', (line) => {
      let v: Record<string, unknown>;
      try {
        v = JSON.parse(line) as Record<string, unknown>;
      } catch {
        return;
      }
      if (!gotFirst) {
        gotFirst = true;
        first.resolve(v);
      } else this.#replies.shift()?.resolve(v);
    });
    // 'close': after its output is read to the end, so every line it wrote counts first.
    proc.once('close', (code, signal) => {
      this.#ended = new Error(`dataplane-node ended (${signal ?? `exit ${code}`})`);
      if (!gotFirst) first.reject(this.#ended);
      for (const r of this.#replies.splice(0)) r.reject(this.#ended);
    });
  }
  send(cmd: Record<string, unknown>): Promise<Record<string, unknown>> {
    if (this.#ended) return Promise.reject(this.#ended);
    return new Promise((resolve, reject) => {
      this.#replies.push({ resolve, reject });
      this.proc.stdin!.write(JSON.stringify(cmd) + '\n');
    });
  }
}

export interface Side {
  readonly ns: string;
  readonly under: string;
  readonly v4: string;
  readonly v6: string;
  readonly subnet: string;
  readonly subnet6: string;
  readonly mac: string;
}

export type Stats = {
  total: { counters: Record<string, number> };
  offloads: Record<string, boolean>;
};

export const PORT = { udp: 8285, vxlan: 8472, ipip: 0, wireguard: 51820 } as const;

/** The framings a pair runs (IPIP: IPv4 pods only, no port). */
export type PairFormat = keyof typeof PORT;

/**
 * Each framing's TUN and its MTU (a 1500-byte underlay less the encapsulation: flannel's udp − 28,
 * vxlan − 50, ipip − 20, wireguard − 80).
 */
export const TUN = {
  udp: { name: 'flannel0', mtu: 1472 },
  vxlan: { name: 'flannel.1', mtu: 1450 },
  ipip: { name: 'flannel.ipip', mtu: 1480 },
  wireguard: { name: 'flannel-wg', mtu: 1420 },
} as const;

export function peersOf(s: Side, format: PairFormat) {
  const base = {
    publicIP: s.under,
    port: PORT[format],
    ...(format === 'vxlan' ? { vtepMac: s.mac } : {}),
  };
  if (format === 'ipip') return [{ subnet: s.subnet, ...base }];
  return [
    { subnet: s.subnet, ...base },
    { subnet: s.subnet6, ...base },
  ];
}

/** One dataplane-node.ts process in `s`'s namespace (2 queues for native unless `extra` says). */
export function startNode(
  scope: NetnsScope,
  s: Side,
  format: PairFormat,
  engine: DataplaneEngine,
  extra: Record<string, unknown> = {},
  via: readonly string[] = [],
): Node {
  const cfg = {
    format,
    engine,
    tunName: TUN[format].name,
    workers: engine === 'js' ? 1 : 2,
    bindIp: s.under,
    port: PORT[format],
    tunMtu: TUN[format].mtu,
    vni: 1,
    vtepMac: s.mac,
    tunAddr: `${s.v4}/32`,
    clusterRoute: '10.7.0.0/16',
    tunAddr6: `${s.v6}/128`,
    clusterRoute6: 'fd07::/48',
    ...extra,
  };
  return new Node(
    scope.spawn(
      s.ns,
      process.execPath,
      ['--import', 'tsx', join(ROOT, 'test/helpers/dataplane-node.ts'), JSON.stringify(cfg)],
      { cwd: ROOT },
      via,
    ),
  );
}

export async function startPair(
  scope: NetnsScope,
  sides: [Side, Side],
  format: PairFormat,
  engine: DataplaneEngine,
  extra: Record<string, unknown> = {},
): Promise<[Node, Node]> {
  const nodes = sides.map((s) => startNode(scope, s, format, engine, extra)) as [Node, Node];
  for (const n of nodes) assert.equal((await n.ready).ready, true);
  await nodes[0].send({ cmd: 'peers', peers: peersOf(sides[1], format) });
  await nodes[1].send({ cmd: 'peers', peers: peersOf(sides[0], format) });
  return nodes;
}

export async function stopPair(nodes: [Node, Node]): Promise<void> {
  await Promise.all(
    nodes.map(async (n) => {
      // A node that already died has nothing to close: its test fails on its own error.
      await n.send({ cmd: 'close' }).catch(() => undefined);
      await n.closed;
    }),
  );
}

/**
 * One pair for the tests of the describe that calls this (the same framing, engines and options),
 * as `start` makes it: started by the first test that runs `fn` on it, stopped after the
 * describe's last test, also when one fails. A test that fails stops it, so the next test starts
 * a fresh pair and no failure carries over; a test that changes the pair (a peer table, a route)
 * puts it back before it ends. Its counters run on from test to test: a test asserts by what
 * they grew during it.
 */
export function sharedPair(
  start: () => Promise<[Node, Node]>,
): (fn: (nodes: [Node, Node]) => Promise<void>) => Promise<void> {
  let nodes: [Node, Node] | null = null;
  after(async () => {
    if (nodes) await stopPair(nodes);
    nodes = null;
  });
  return async (fn) => {
    nodes ??= await start();
    const n = nodes;
    try {
      await fn(n);
    } catch (err) {
      nodes = null;
      await stopPair(n);
      throw err;
    }
  };
}

/**
 * Two node namespaces joined by a veth (va 192.168.77.1 ⇄ vb 192.168.77.2), with the TUN
 * addresses and subnets the dataplane tests give them.
 */
export function twoNodes(scope: NetnsScope): [Side, Side] {
  const a = scope.add();
  const b = scope.add();
  scope.vethBetween(a, 'va', b, 'vb');
  ip(a, 'addr', 'add', '192.168.77.1/24', 'dev', 'va');
  ip(b, 'addr', 'add', '192.168.77.2/24', 'dev', 'vb');
  ip(a, 'link', 'set', 'va', 'up');
  ip(b, 'link', 'set', 'vb', 'up');
  const side = (ns: string, i: number): Side => ({
    ns,
    under: `192.168.77.${i}`,
    v4: `10.7.${i}.0`,
    v6: `fd07:0:0:${i}::`,
    subnet: `10.7.${i}.0/24`,
    subnet6: `fd07:0:0:${i}::/64`,
    mac: `02:00:00:00:07:0${i}`,
  });
  return [side(a, 1), side(b, 2)];
}

/**
 * A kernel vxlan device "vx" in `s`'s namespace on `dev`, programmed as flannel does for `peer`
 * (VNI 1, port 8472, `s`'s VtepMAC; route, neighbour and fdb entry for the peer's subnets and
 * VtepMAC), over the IPv4 underlay or, with `under6`, an IPv6 one (as flannel-v6.1). Deleted by
 * `ip link del vx` (or with the namespace).
 */
export function addKernelVxlan(
  s: Side,
  dev: string,
  peer: Side,
  /** An IPv6 underlay instead: our address and the peer's (MTU 1430, flannel-v6.1's). */
  under6?: { readonly local: string; readonly peer: string },
): void {
  ip(
    s.ns,
    'link',
    'add',
    'vx',
    'type',
    'vxlan',
    'id',
    '1',
    'dstport',
    String(PORT.vxlan),
    'local',
    under6?.local ?? s.under,
    'dev',
    dev,
    'nolearning',
  );
  ip(s.ns, 'link', 'set', 'vx', 'address', s.mac, 'mtu', under6 ? '1430' : '1450', 'up');
  ip(s.ns, 'addr', 'add', `${s.v4}/32`, 'dev', 'vx');
  ip(s.ns, 'addr', 'add', `${s.v6}/128`, 'dev', 'vx', 'nodad');
  ip(s.ns, 'route', 'add', peer.subnet, 'via', peer.v4, 'dev', 'vx', 'onlink');
  ip(s.ns, 'route', 'add', peer.subnet6, 'via', peer.v6, 'dev', 'vx', 'onlink');
  ip(s.ns, 'neigh', 'replace', peer.v4, 'lladdr', peer.mac, 'dev', 'vx', 'nud', 'permanent');
  ip(s.ns, 'neigh', 'replace', peer.v6, 'lladdr', peer.mac, 'dev', 'vx', 'nud', 'permanent');
  nsExec(s.ns, 'bridge', [
    'fdb',
    'append',
    peer.mac,
    'dev',
    'vx',
    'dst',
    under6?.peer ?? peer.under,
    'self',
    'permanent',
  ]);
}
