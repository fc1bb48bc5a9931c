/**
 * The bpf engine on hosts set up as real ones are (issue 27), between two node namespaces
 * (test/helpers/dataplane-pair.ts), each case on bpf ⇄ bpf (vxlan; the IPIP framing too where
 * noted):
 *
 *   ns A                                        ns B
 *   tun 10.7.1.0/32 (weft_tx on its egress,     tun 10.7.2.0/32
 *   decapsulated packets enter on its ingress)
 *   veth va 192.168.77.1/24 ─────────────────── veth vb 192.168.77.2/24
 *   (weft_rx on its ingress)                    (tcx-count before/after weft's, iptables rules)
 *
 * - strict rp_filter on both (vxlan, udp, ipip): ping and TCP both ways,
 *   TcpExtIPReversePathFilter unchanged, and a `-i <tun>` rule counts the decapsulated packets
 *   (they enter as received on the TUN);
 * - a counting tcx program after weft's on the underlay ingress, the TUN egress (vxlan, ipip)
 *   and the pods' bridge (cni0 egress, with a pod namespace behind it) sees the packets weft
 *   leaves alone; one before weft's sees the tunnel traffic and weft still carries it (vxlan,
 *   ipip);
 * - an INPUT rule dropping a peer's tunnel packets (the UDP port; IPIP: protocol 4): the engine
 *   refuses and the native engine runs, which the rule stops.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { after, before, describe, test } from 'node:test';
import {
  type Node,
  type PairFormat,
  type Side,
  PORT,
  TUN,
  peersOf,
  sharedPair,
  startNode,
  stopPair,
  twoNodes,
} from '../helpers/dataplane-pair.js';
import { NetnsScope, isRoot, nsExec, nsExecAsync } from '../../src/testbed/netns.js';
import { iperf } from '../../src/testbed/probes.js';
import { TCP_FIXED, delivered } from '../helpers/carried.js';
import { PACKAGE_ROOT, waitFor } from '../../src/testbed/cluster.js';
import { tcxIn } from '../helpers/bpf.js';

const skip = isRoot() ? false : 'needs root (network namespaces, bpf)';

type Stats = { engine: string; bpf?: Record<string, number> };
const stats = async (n: Node) => (await n.send({ cmd: 'stats' })).stats as Stats;
const tunOf = (format: PairFormat) => TUN[format].name;

/** nstat's absolute value of `counter` in `ns` (history untouched). */
function nstat(ns: string, counter: string): number {
  const out = nsExec(ns, 'nstat', ['-asz', counter]);
  const m = new RegExp(`^${counter}\\s+(\\d+)`, 'm').exec(out);
  assert.ok(m, `nstat ${counter}: ${out}`);
  return Number(m[1]);
}

/** Packets counted by the first rule of `chain` (iptables -L -v -x). */
function ruleHits(ns: string, chain: string): number {
  const out = nsExec(ns, 'iptables', ['-w', '-L', chain, '-v', '-x', '-n', '--line-numbers']);
  const m = /^1\s+(\d+)/m.exec(out);
  assert.ok(m, out);
  return Number(m[1]);
}

function ifindexIn(ns: string, dev: string): number {
  return Number(JSON.parse(nsExec(ns, 'ip', ['-j', 'link', 'show', 'dev', dev]))[0].ifindex);
}

/** A counting tcx program (test/helpers/tcx-count.c) on `dev`'s hook, first or last. */
class Counter {
  readonly #lines: ((v: string) => void)[] = [];
  readonly ready: Promise<void>;
  constructor(
    scope: NetnsScope,
    bin: string,
    ns: string,
    dev: string,
    hook: 'ingress' | 'egress',
    at: 'first' | 'last',
  ) {
    const p = scope.spawn(ns, bin, [String(ifindexIn(ns, dev)), hook, at]);
    let err = '';
    p.stderr!.on('data', (d: Buffer) => (err += d.toString()));
    const rl = createInterface({ input: p.stdout! });
    let ok: () => void;
    let fail: (e: Error) => void;
    this.ready = new Promise((res, rej) => ((ok = res), (fail = rej)));
    p.once('exit', (code) => fail(new Error(`tcx-count exited ${code}: ${err}`)));
    let first = true;
    rl.on('line', (line) => {
      if (first) {
        first = false;
        ok();
      } else this.#lines.shift()?.(line);
    });
    this.proc = p;
  }
  readonly proc: ReturnType<NetnsScope['spawn']>;
  count(): Promise<number> {
    return new Promise((res) => {
      this.#lines.push((l) => res(Number(l)));
      this.proc.stdin!.write('read\n');
    });
  }
  async stop(): Promise<void> {
    const gone = new Promise((r) => this.proc.once('exit', r));
    this.proc.stdin!.end();
    await gone;
  }
}

describe('bpf engine on hardened hosts', { skip }, () => {
  const scope = new NetnsScope();
  let A: Side;
  let B: Side;
  let dir: string;
  let counterBin: string;
  before(() => {
    [A, B] = twoNodes(scope);
    dir = mkdtempSync(join(tmpdir(), 'weft-tcx-count-'));
    counterBin = join(dir, 'tcx-count');
    execFileSync('cc', ['-O2', '-o', counterBin, join(PACKAGE_ROOT, 'test/helpers/tcx-count.c')]);
  });
  after(async () => {
    await scope.cleanup();
    rmSync(dir, { recursive: true, force: true });
  });

  async function pair(format: PairFormat): Promise<[Node, Node]> {
    const nodes: [Node, Node] = [
      startNode(scope, A, format, 'bpf', { underlay: 'va', podBridge: 'cni0' }),
      startNode(scope, B, format, 'bpf', { underlay: 'vb', podBridge: 'cni0' }),
    ];
    for (const n of nodes) assert.equal((await n.ready).engine, 'bpf');
    await nodes[0].send({ cmd: 'peers', peers: peersOf(B, format) });
    await nodes[1].send({ cmd: 'peers', peers: peersOf(A, format) });
    return nodes;
  }

  const tcp = async (from: Side, to: Side) =>
    delivered((await iperf(scope, to.ns, to.v4, from.ns, ['-B', from.v4, ...TCP_FIXED])).json);

  for (const format of ['vxlan', 'udp', 'ipip'] as const) {
    test(`${format}: strict rp_filter on both nodes: ping and TCP both ways, no RPF drop, -i ${tunOf(format)} matches`, async () => {
      for (const [s, dev] of [
        [A, 'va'],
        [B, 'vb'],
      ] as const) {
        for (const c of ['all', 'default', dev])
          nsExec(s.ns, 'sysctl', ['-qw', `net.ipv4.conf.${c}.rp_filter=1`]);
      }
      const tun = tunOf(format);
      const nodes = await pair(format);
      try {
        for (const s of [A, B]) {
          nsExec(s.ns, 'sysctl', ['-qw', `net.ipv4.conf.${tun.replace('.', '/')}.rp_filter=1`]);
          nsExec(s.ns, 'iptables', ['-w', '-I', 'INPUT', '-i', tun, '-j', 'ACCEPT']);
        }
        const rpf = [
          nstat(A.ns, 'TcpExtIPReversePathFilter'),
          nstat(B.ns, 'TcpExtIPReversePathFilter'),
        ];
        const rx = [
          (await stats(nodes[0])).bpf!.rx_packets!,
          (await stats(nodes[1])).bpf!.rx_packets!,
        ];
        await nsExecAsync(A.ns, 'ping', ['-c', '3', '-i', '0.2', '-W', '2', B.v4]);
        await nsExecAsync(B.ns, 'ping', ['-c', '3', '-i', '0.2', '-W', '2', A.v4]);
        assert.ok((await tcp(A, B)) > 0);
        assert.ok((await tcp(B, A)) > 0);
        assert.deepEqual(
          [nstat(A.ns, 'TcpExtIPReversePathFilter'), nstat(B.ns, 'TcpExtIPReversePathFilter')],
          rpf,
          'no packet dropped by reverse-path filtering',
        );
        // The programs decapsulated it, and it entered on the TUN (the -i rule saw it).
        for (const [i, s] of [A, B].entries()) {
          assert.ok((await stats(nodes[i]!)).bpf!.rx_packets! > rx[i]!, `node ${i} decapsulated`);
          assert.ok(ruleHits(s.ns, 'INPUT') >= 3, `-i ${tun} rule in node ${i}`);
        }
      } finally {
        await stopPair(nodes);
        for (const [s, dev] of [
          [A, 'va'],
          [B, 'vb'],
        ] as const) {
          nsExec(s.ns, 'iptables', ['-w', '-F', 'INPUT']);
          for (const c of ['all', 'default', dev])
            nsExec(s.ns, 'sysctl', ['-qw', `net.ipv4.conf.${c}.rp_filter=0`]);
        }
      }
    });
  }

  /**
   * Counting tcx programs on A's underlay ingress and TUN egress, both `at` the first or last
   * place of their hook, while `body` runs; stopped after it.
   */
  async function withCounters(
    format: PairFormat,
    at: 'first' | 'last',
    body: (rx: Counter, tx: Counter) => Promise<void>,
  ): Promise<void> {
    const counters: Counter[] = [];
    try {
      const rx = new Counter(scope, counterBin, A.ns, 'va', 'ingress', at);
      counters.push(rx);
      const tx = new Counter(scope, counterBin, A.ns, tunOf(format), 'egress', at);
      counters.push(tx);
      await Promise.all(counters.map((c) => c.ready));
      await body(rx, tx);
    } finally {
      for (const c of counters) await c.stop();
    }
  }

  for (const format of ['vxlan', 'ipip'] as const) {
    describe(`${format}: tcx programs beside weft's: one pair`, () => {
      const onPair = sharedPair(() => pair(format));

      test(`${format}: a tcx program after weft's (underlay ingress, TUN egress) sees what weft leaves alone`, () =>
        onPair(() =>
          withCounters(format, 'last', async (rx, tx) => {
            // Not tunnel traffic: the underlay's own pings reach A's underlay ingress.
            await nsExecAsync(B.ns, 'ping', ['-c', '3', '-i', '0.2', '-W', '2', A.under]);
            assert.ok((await rx.count()) >= 3, 'the program after weft_rx ran');
            // Into the cluster route but to no peer: weft_tx leaves it to the TUN.
            await assert.rejects(
              nsExecAsync(A.ns, 'ping', ['-c', '3', '-i', '0.2', '-W', '1', '10.7.9.9']),
            );
            assert.ok((await tx.count()) >= 3, 'the program after weft_tx ran');
            // And weft still carries the tunnel traffic.
            await nsExecAsync(A.ns, 'ping', ['-c', '3', '-i', '0.2', '-W', '2', B.v4]);
          }),
        ));

      test(`${format}: a tcx program before weft's sees the tunnel traffic, and weft still carries it`, () =>
        onPair((nodes) =>
          withCounters(format, 'first', async (rx, tx) => {
            const before = await stats(nodes[0]);
            await nsExecAsync(A.ns, 'ping', ['-c', '3', '-i', '0.2', '-W', '2', B.v4]);
            assert.ok((await tcp(A, B)) > 0);
            const after = await stats(nodes[0]);
            assert.ok(
              after.bpf!.tx_packets! - before.bpf!.tx_packets! >= 3,
              'weft_tx encapsulated',
            );
            assert.ok(
              after.bpf!.rx_packets! - before.bpf!.rx_packets! >= 3,
              'weft_rx decapsulated',
            );
            assert.ok((await tx.count()) >= 3, 'the program before weft_tx saw the inner packets');
            assert.ok((await rx.count()) >= 3, 'the program before weft_rx saw the outer packets');
          }),
        ));
    });
  }

  test("a tcx program after weft_bridge on the pods' bridge (cni0 egress) sees what it leaves alone", async () => {
    // ns A: cni0 10.7.1.1/24 ─ veth ─ pod namespace P (eth0 10.7.1.2/24)
    const pod = scope.add();
    nsExec(A.ns, 'ip', ['link', 'add', 'cni0', 'type', 'bridge']);
    nsExec(A.ns, 'ip', ['addr', 'add', '10.7.1.1/24', 'dev', 'cni0']);
    nsExec(A.ns, 'ip', ['link', 'set', 'cni0', 'up']);
    scope.vethBetween(A.ns, 'vpod', pod, 'eth0');
    nsExec(A.ns, 'ip', ['link', 'set', 'vpod', 'master', 'cni0', 'up']);
    nsExec(pod, 'ip', ['addr', 'add', '10.7.1.2/24', 'dev', 'eth0']);
    nsExec(pod, 'ip', ['link', 'set', 'eth0', 'up']);
    const nodes = await pair('vxlan');
    let counter: Counter | null = null;
    try {
      // weft_bridge attaches once the engine sees the bridge.
      await waitFor(
        () => tcxIn(A.ns, 'cni0', 'egress').length === 1,
        10_000,
        'weft_bridge on cni0',
      );
      counter = new Counter(scope, counterBin, A.ns, 'cni0', 'egress', 'last');
      await counter.ready;
      await nsExecAsync(A.ns, 'ping', ['-c', '3', '-i', '0.2', '-W', '2', '10.7.1.2']);
      assert.ok((await counter.count()) >= 3, 'the program after weft_bridge ran');
    } finally {
      await counter?.stop();
      await stopPair(nodes);
      nsExec(A.ns, 'ip', ['link', 'del', 'cni0']);
    }
  });

  for (const format of ['vxlan', 'ipip'] as const) {
    // The tunnel as a rule names it: the UDP port, or IPIP's protocol (4).
    const tunnelMatch =
      format === 'ipip' ? ['-p', '4'] : ['-p', 'udp', '--dport', String(PORT[format])];
    test(`${format}: an INPUT rule dropping a peer's tunnel packets: bpf refuses, native runs and the rule applies`, async () => {
      nsExec(B.ns, 'iptables', ['-w', '-I', 'INPUT', '-s', A.under, ...tunnelMatch, '-j', 'DROP']);
      let nodes: [Node, Node] | null = null;
      try {
        nodes = [
          startNode(scope, A, format, 'bpf', { underlay: 'va' }),
          startNode(scope, B, format, 'bpf', { underlay: 'vb' }),
        ];
        assert.equal((await nodes[0].ready).engine, 'bpf');
        assert.equal((await nodes[1].ready).engine, 'native', 'B refused the bpf engine');
        await nodes[0].send({ cmd: 'peers', peers: peersOf(B, format) });
        await nodes[1].send({ cmd: 'peers', peers: peersOf(A, format) });
        // A's tunnel packets meet B's INPUT rule: the quarantine holds.
        await assert.rejects(nsExecAsync(A.ns, 'ping', ['-c', '3', '-i', '0.2', '-W', '1', B.v4]));
        assert.ok(ruleHits(B.ns, 'INPUT') >= 3, 'the DROP rule matched');
      } finally {
        if (nodes) await stopPair(nodes);
        nsExec(B.ns, 'iptables', ['-w', '-F', 'INPUT']);
      }
    });
  }
});
