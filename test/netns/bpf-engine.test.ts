/**
 * The bpf engine between two node namespaces (test/helpers/dataplane-node.ts on each side), and
 * against the native engine and a kernel vxlan device:
 *
 *   ns A                                        ns B
 *   tun 10.7.1.0/32 fd07:0:0:1::/128            tun 10.7.2.0/32 fd07:0:0:2::/128
 *   (weft_tx on its egress)                     (or a kernel vxlan device "vx")
 *   veth va 192.168.77.1/24 ─────────────────── veth vb 192.168.77.2/24
 *   (weft_rx on its ingress)
 *
 * The programs only ever attach to devices inside these namespaces.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { PROBE_FAIL_ENV } from '../../src/dataplane/bpf-engine.js';
import {
  type Node,
  type Side,
  addKernelVxlan,
  peersOf,
  startNode,
  stopPair,
  twoNodes,
} from '../helpers/dataplane-pair.js';
import { NetnsScope, ip, isRoot, nsExec, nsExecAsync } from '../../src/testbed/netns.js';
import { iperf as probeIperf } from '../../src/testbed/probes.js';
import { TCP_FIXED, delivered } from '../helpers/carried.js';
import { attachedIn, leftovers } from '../helpers/bpf.js';

const skip = isRoot() ? false : 'needs root (network namespaces, bpf)';

type Stats = {
  engine: string;
  total: { counters: Record<string, number>; drops: Record<string, number> };
  bpf?: Record<string, number>;
};

async function stats(n: Node): Promise<Stats> {
  return (await n.send({ cmd: 'stats' })).stats as Stats;
}

/**
 * iperf3 from `from` to `to` (client bound to its v4 address): 4 MiB of TCP, or UDP paced at
 * 10 Mbit/s for 2 s (no rate is a verdict: a loaded machine sets it). Returns the payload bytes
 * that arrived (asserted > 0).
 */
async function iperf(scope: NetnsScope, from: Side, to: Side, udp: boolean): Promise<number> {
  const args = ['-B', from.v4, ...(udp ? ['-u', '-b', '10M', '-l', '1200', '-t', '2'] : TCP_FIXED)];
  return delivered((await probeIperf(scope, to.ns, to.v4, from.ns, args)).json);
}

async function pingBoth(a: Side, b: Side): Promise<void> {
  await nsExecAsync(a.ns, 'ping', ['-c', '3', '-i', '0.2', '-W', '2', b.v4]);
  await nsExecAsync(b.ns, 'ping', ['-c', '3', '-i', '0.2', '-W', '2', a.v4]);
  await nsExecAsync(a.ns, 'ping', ['-6', '-c', '3', '-i', '0.2', '-W', '2', b.v6]);
  await nsExecAsync(b.ns, 'ping', ['-6', '-c', '3', '-i', '0.2', '-W', '2', a.v6]);
}

/** A's TUN in these tests (test/helpers/dataplane-pair.ts). */
const tunOf = (format: 'udp' | 'vxlan') => (format === 'udp' ? 'flannel0' : 'flannel.1');

describe('bpf engine between two namespaces', { skip }, () => {
  const scope = new NetnsScope();
  let A: Side;
  let B: Side;
  before(() => {
    [A, B] = twoNodes(scope);
  });
  after(() => scope.cleanup());

  async function start(
    side: Side,
    format: 'udp' | 'vxlan',
    engine: 'bpf' | 'native',
    extra: Record<string, unknown> = {},
  ): Promise<Node> {
    const dev = side === A ? 'va' : 'vb';
    const n = startNode(scope, side, format, engine, { underlay: dev, ...extra });
    const ready = await n.ready;
    assert.equal(ready.ready, true, JSON.stringify(ready));
    return n;
  }

  async function pair(
    format: 'udp' | 'vxlan',
    engines: ['bpf' | 'native', 'bpf' | 'native'],
  ): Promise<[Node, Node]> {
    const nodes: [Node, Node] = [
      await start(A, format, engines[0]),
      await start(B, format, engines[1]),
    ];
    await nodes[0].send({ cmd: 'peers', peers: peersOf(B, format) });
    await nodes[1].send({ cmd: 'peers', peers: peersOf(A, format) });
    return nodes;
  }

  for (const format of ['vxlan', 'udp'] as const) {
    for (const engines of [
      ['bpf', 'bpf'],
      ['bpf', 'native'],
    ] as const) {
      test(`${format}: ${engines[0]} ⇄ ${engines[1]}: ping v4/v6 both ways, iperf3 TCP and UDP`, async () => {
        const nodes = await pair(format, [...engines]);
        const ids = attachedIn(A.ns, 'va', tunOf(format));
        try {
          assert.equal(ids.length, 2, `tx and rx attached in A: ${ids.join(', ')}`);
          assert.equal((await nodes[0].ready).engine, 'bpf');
          await pingBoth(A, B);
          const sent = (await iperf(scope, A, B, false)) + (await iperf(scope, A, B, true));
          const back = await iperf(scope, B, A, false);
          // The programs sent it, not the userspace engine behind them.
          const s = await stats(nodes[0]);
          assert.equal(s.engine, 'bpf');
          assert.ok(s.bpf!.tx_bytes! >= sent, JSON.stringify(s.bpf));
          assert.ok(s.total.counters.rx_bytes! >= back, JSON.stringify(s.total.counters));
          if (engines[1] === 'bpf') {
            // And decapsulated it.
            assert.ok(s.bpf!.rx_bytes! >= back, JSON.stringify(s.bpf));
          } else {
            // From a native sender, TCP leaves through its egress TAP as tunnel-GSO frames (one
            // well-formed datagram each: the program decapsulates them) or, with tap_gso off, as
            // UDP GSO trains that cross the veth as one skb, which the program leaves to the
            // socket (on a wire they arrive one by one). Either way one of the two saw it.
            assert.ok(s.bpf!.rx_packets! + s.bpf!.rx_passed! > 0, JSON.stringify(s.bpf));
          }
        } finally {
          await stopPair(nodes);
        }
        assert.deepEqual(await leftovers(A.ns, 'va', tunOf(format), ids), [], 'nothing left');
      });
    }
  }

  test('vxlan: bpf ⇄ a hand-made kernel vxlan device, both ways', async () => {
    // B: a kernel vxlan device programmed as flannel does (neighbour + fdb for A's VtepMAC).
    try {
      addKernelVxlan(B, 'vb', A);
      const a = await start(A, 'vxlan', 'bpf');
      try {
        await a.send({ cmd: 'peers', peers: peersOf(B, 'vxlan') });
        await pingBoth(A, B);
        const sent = await iperf(scope, A, B, false);
        const back = await iperf(scope, B, A, false);
        const s = await stats(a);
        assert.ok(s.bpf!.tx_bytes! >= sent && s.bpf!.rx_bytes! >= back, JSON.stringify(s.bpf));
        // The kernel device saw no checksum errors in what the programs sent.
        const snmp = nsExec(B.ns, 'cat', ['/proc/net/snmp']);
        const udpRow = snmp.split('\n').filter((l) => l.startsWith('Udp:'));
        const [names, values] = udpRow.map((l) => l.split(/\s+/));
        assert.equal(values![names!.indexOf('InCsumErrors')], '0', udpRow.join('\n'));
      } finally {
        const exited = new Promise((r) => a.proc.once('exit', r));
        await a.send({ cmd: 'close' });
        await exited;
      }
    } finally {
      ip(B.ns, 'link', 'del', 'vx');
    }
  });

  test('garbage and spoofed datagrams are counted and never delivered', async () => {
    const nodes = await pair('vxlan', ['bpf', 'bpf']);
    try {
      const before = await stats(nodes[1]);
      // From A's namespace: 200 random datagrams, then 100 well-formed VXLAN frames whose inner
      // source (10.7.9.9) is not in A's subnet, all to B's port from A's underlay address.
      const script = `
        const s = require('node:dgram').createSocket('udp4');
        s.bind(0, '${A.under}', async () => {
          const send = (b) => new Promise((r) => s.send(b, 8472, '${B.under}', r));
          for (let i = 0; i < 200; i++) {
            const b = Buffer.alloc(20 + (i % 90));
            for (let k = 0; k < b.length; k++) b[k] = (i * 31 + k * 7) & 0xff;
            await send(b);
          }
          const inner = Buffer.alloc(28);
          inner[0] = 0x45; inner.writeUInt16BE(28, 2); inner[8] = 64; inner[9] = 17;
          Buffer.from([10, 7, 9, 9]).copy(inner, 12); Buffer.from([10, 7, 2, 0]).copy(inner, 16);
          inner.writeUInt16BE(9, 20); inner.writeUInt16BE(9, 22); inner.writeUInt16BE(8, 24);
          const vx = Buffer.alloc(22);
          vx[0] = 8; vx[6] = 1;
          Buffer.from('${B.mac.replaceAll(':', '')}', 'hex').copy(vx, 8);
          vx.writeUInt16BE(0x0800, 20);
          for (let i = 0; i < 100; i++) await send(Buffer.concat([vx, inner]));
          s.close();
        });`;
      await nsExecAsync(A.ns, process.execPath, ['-e', script]);
      const after = await stats(nodes[1]);
      const d = (r: string) => after.total.drops[r]! - before.total.drops[r]!;
      assert.equal(d('spoofed_source'), 100, JSON.stringify(after.total.drops));
      const garbage =
        d('malformed') + d('truncated') + d('bad_vni') + d('bad_mac') + d('bad_ethertype');
      assert.equal(garbage, 200, JSON.stringify(after.total.drops));
      assert.equal(after.bpf!.rx_passed! - before.bpf!.rx_passed!, 300, 'all left to userspace');
      assert.equal(
        after.total.counters.rx_packets,
        before.total.counters.rx_packets,
        'none delivered',
      );
    } finally {
      await stopPair(nodes);
    }
  });

  test('a peer leaving: its traffic stops', async () => {
    const nodes = await pair('vxlan', ['bpf', 'bpf']);
    try {
      await nsExecAsync(A.ns, 'ping', ['-c', '2', '-i', '0.2', '-W', '2', B.v4]);
      await nodes[1].send({ cmd: 'peers', peers: [] });
      const before = await stats(nodes[1]);
      await assert.rejects(nsExecAsync(A.ns, 'ping', ['-c', '3', '-i', '0.2', '-W', '1', B.v4]));
      const after = await stats(nodes[1]);
      assert.equal(after.bpf!.rx_packets, before.bpf!.rx_packets, 'nothing decapsulated from it');
      assert.ok(after.total.drops.unknown_source! - before.total.drops.unknown_source! >= 3);
    } finally {
      await stopPair(nodes);
    }
  });

  test('a peer leaving by a delta: its traffic stops; back by a delta: it flows', async () => {
    const nodes = await pair('vxlan', ['bpf', 'bpf']);
    try {
      await nsExecAsync(A.ns, 'ping', ['-c', '2', '-i', '0.2', '-W', '2', B.v4]);
      await nodes[1].send({ cmd: 'delta', removed: peersOf(A, 'vxlan'), upserts: [] });
      const before = await stats(nodes[1]);
      await assert.rejects(nsExecAsync(A.ns, 'ping', ['-c', '3', '-i', '0.2', '-W', '1', B.v4]));
      const after = await stats(nodes[1]);
      assert.equal(after.bpf!.rx_packets, before.bpf!.rx_packets, 'nothing decapsulated from it');
      assert.ok(after.total.drops.unknown_source! - before.total.drops.unknown_source! >= 3);
      await nodes[1].send({ cmd: 'delta', removed: [], upserts: peersOf(A, 'vxlan') });
      await nsExecAsync(A.ns, 'ping', ['-c', '2', '-i', '0.2', '-W', '5', B.v4]);
    } finally {
      await stopPair(nodes);
    }
  });

  test('a probe that fails (test knob) falls back to native, which carries the traffic', async () => {
    process.env[PROBE_FAIL_ENV] = '1';
    let a: Node;
    try {
      a = startNode(scope, A, 'vxlan', 'bpf', { underlay: 'va' });
    } finally {
      delete process.env[PROBE_FAIL_ENV];
    }
    const b = await start(B, 'vxlan', 'bpf');
    const nodes: [Node, Node] = [a, b];
    try {
      assert.equal((await a.ready).engine, 'native');
      assert.equal((await b.ready).engine, 'bpf');
      await a.send({ cmd: 'peers', peers: peersOf(B, 'vxlan') });
      await b.send({ cmd: 'peers', peers: peersOf(A, 'vxlan') });
      await pingBoth(A, B);
      assert.equal((await stats(a)).engine, 'native');
    } finally {
      await stopPair(nodes);
    }
  });

  test('clsact fallback: a filter left by kill -9 is replaced at restart and removed at stop', async () => {
    process.env.WEFT_BPF_ATTACH = 'clsact';
    const ids: number[] = [];
    try {
      const first = await start(A, 'vxlan', 'bpf');
      const exited = new Promise((r) => first.proc.once('exit', r));
      first.proc.kill('SIGKILL');
      await exited;
      const left = nsExec(A.ns, 'tc', ['filter', 'show', 'dev', 'va', 'ingress']);
      assert.match(left, /weft/, 'the killed process left its filter (clsact outlives it)');
      ids.push(...attachedIn(A.ns, 'va', 'flannel.1'));
      const nodes: [Node, Node] = [await start(A, 'vxlan', 'bpf'), await start(B, 'vxlan', 'bpf')];
      try {
        const filters = nsExec(A.ns, 'tc', ['filter', 'show', 'dev', 'va', 'ingress']);
        assert.equal(filters.match(/^filter .* handle 0x77ef/gm)?.length, 1, filters);
        ids.push(...attachedIn(A.ns, 'va', 'flannel.1'));
        await nodes[0].send({ cmd: 'peers', peers: peersOf(B, 'vxlan') });
        await nodes[1].send({ cmd: 'peers', peers: peersOf(A, 'vxlan') });
        await pingBoth(A, B);
      } finally {
        await stopPair(nodes);
      }
    } finally {
      delete process.env.WEFT_BPF_ATTACH;
    }
    assert.ok(ids.length > 0, 'the filters held programs');
    assert.deepEqual(await leftovers(A.ns, 'va', 'flannel.1', ids), [], 'nothing left behind');
  });

  test('tcx: kill -9 leaves nothing attached', async () => {
    const a = await start(A, 'vxlan', 'bpf');
    const ids = attachedIn(A.ns, 'va', 'flannel.1');
    assert.equal(ids.length, 2, `tx and rx attached: ${ids.join(', ')}`);
    const exited = new Promise((r) => a.proc.once('exit', r));
    a.proc.kill('SIGKILL');
    await exited;
    assert.deepEqual(await leftovers(A.ns, 'va', 'flannel.1', ids), []);
  });
});
