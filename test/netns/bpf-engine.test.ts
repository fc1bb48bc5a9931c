/**
 * The bpf engine between two node namespaces (test/helpers/dataplane-node.ts on each side), and
 * against the native engine and a kernel vxlan (ipip) device, in each framing (vxlan, udp, ipip;
 * ipip carries IPv4 pods only):
 *
 *   ns A                                        ns B
 *   tun 10.7.1.0/32 fd07:0:0:1::/128            tun 10.7.2.0/32 fd07:0:0:2::/128
 *   (weft_tx on its egress)                     (or a kernel vxlan device "vx", ipip "flannel.ipip")
 *   veth va 192.168.77.1/24 ─────────────────── veth vb 192.168.77.2/24
 *   (weft_rx on its ingress)
 *
 * The programs only ever attach to devices inside these namespaces. The last describe adds an
 * IPv6 underlay (va fd00:77::1 ⇄ vb fd00:77::2) to the same drawing.
 */
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { PROBE_FAIL_ENV } from '../../src/dataplane/bpf-engine.js';
import {
  type Node,
  type PairFormat,
  type Side,
  TUN,
  addKernelVxlan,
  peersOf,
  sharedPair,
  startNode,
  stopPair,
  twoNodes,
} from '../helpers/dataplane-pair.js';
import { PACKAGE_ROOT, waitFor } from '../../src/testbed/cluster.js';
import { NetnsScope, ip, isRoot, nsExec, nsExecAsync } from '../../src/testbed/netns.js';
import { ipipMissing } from '../helpers/ipip.js';
import { iperf as probeIperf } from '../../src/testbed/probes.js';
import { TCP_FIXED, delivered } from '../helpers/carried.js';
import { attachedIn, leftovers } from '../helpers/bpf.js';
import { captureText } from '../helpers/capture.js';
import { tcpMessages } from '../helpers/tcp-messages.js';
import { OFFLOAD_NAMES } from '../../src/dataplane/offloads.js';

const skip = isRoot() ? false : 'needs root (network namespaces, bpf)';
const noIpip = isRoot() ? ipipMissing() : null;
const ipipSkip =
  noIpip === null ? false : `kernel has no ipip module (ip link add type ipip: ${noIpip})`;

type Stats = {
  engine: string;
  total: { counters: Record<string, number>; drops: Record<string, number> };
  bpf?: Record<string, number>;
};

async function stats(n: Node): Promise<Stats> {
  return (await n.send({ cmd: 'stats' })).stats as Stats;
}

/**
 * iperf3 from `from` to `to` (client bound to its v4 address): 4 MiB of TCP, or 512 datagrams
 * of UDP paced at 10 Mbit/s (no rate is a verdict: a loaded machine sets it). Returns the payload
 * bytes that arrived (asserted > 0).
 */
async function iperf(scope: NetnsScope, from: Side, to: Side, udp: boolean): Promise<number> {
  const udpArgs = ['-u', '-b', '10M', '-l', '1200', '-n', String(512 * 1200)];
  const args = ['-B', from.v4, ...(udp ? udpArgs : TCP_FIXED)];
  return delivered((await probeIperf(scope, to.ns, to.v4, from.ns, args)).json);
}

/**
 * Pings both ways, IPv4 and (but over IPIP, which carries IPv4 alone) IPv6: all at once, each
 * must be answered, none depends on another.
 */
async function pingBoth(a: Side, b: Side, v6 = true): Promise<void> {
  await Promise.all([
    nsExecAsync(a.ns, 'ping', ['-c', '3', '-i', '0.2', '-W', '2', b.v4]),
    nsExecAsync(b.ns, 'ping', ['-c', '3', '-i', '0.2', '-W', '2', a.v4]),
    ...(v6
      ? [
          nsExecAsync(a.ns, 'ping', ['-6', '-c', '3', '-i', '0.2', '-W', '2', b.v6]),
          nsExecAsync(b.ns, 'ping', ['-6', '-c', '3', '-i', '0.2', '-W', '2', a.v6]),
        ]
      : []),
  ]);
}

/** A's TUN in these tests (test/helpers/dataplane-pair.ts). */
const tunOf = (format: PairFormat) => TUN[format].name;

/** A device's transmit counters in `ns` (/sys/class/net/<dev>/statistics). */
function txOf(ns: string, dev: string): { packets: number; bytes: number } {
  const read = (what: string) =>
    Number(nsExec(ns, 'cat', [`/sys/class/net/${dev}/statistics/tx_${what}`]).trim());
  return { packets: read('packets'), bytes: read('bytes') };
}

/** Sends raw IPIP packets from `ns` (test/helpers/ipip-send.py); returns how many went. */
async function sendIpip(ns: string, args: Record<string, unknown>): Promise<number> {
  const send = join(PACKAGE_ROOT, 'test/helpers/ipip-send.py');
  const out = await nsExecAsync(ns, 'python3', [send, JSON.stringify(args)], 60_000);
  return (JSON.parse(out) as { sent: number }).sent;
}

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
    format: PairFormat,
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
    format: PairFormat,
    engines: ['bpf' | 'native', 'bpf' | 'native'],
  ): Promise<[Node, Node]> {
    // Both at once: each start waits on its own namespace only.
    const nodes = (await Promise.all([
      start(A, format, engines[0]),
      start(B, format, engines[1]),
    ])) as [Node, Node];
    await nodes[0].send({ cmd: 'peers', peers: peersOf(B, format) });
    await nodes[1].send({ cmd: 'peers', peers: peersOf(A, format) });
    return nodes;
  }

  for (const format of ['vxlan', 'udp', 'ipip'] as const) {
    for (const engines of [
      ['bpf', 'bpf'],
      ['bpf', 'native'],
    ] as const) {
      const families = format === 'ipip' ? 'v4' : 'v4/v6';
      test(`${format}: ${engines[0]} ⇄ ${engines[1]}: ping ${families} both ways, iperf3 TCP and UDP`, async () => {
        const nodes = await pair(format, [...engines]);
        const ids = attachedIn(A.ns, 'va', tunOf(format));
        try {
          assert.equal(ids.length, 2, `tx and rx attached in A: ${ids.join(', ')}`);
          assert.equal((await nodes[0].ready).engine, 'bpf');
          await pingBoth(A, B, format !== 'ipip');
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

  test(
    'ipip: bpf ⇄ a hand-made kernel ipip device (flannel.ipip as flannel makes it), both ways',
    {
      skip: ipipSkip,
    },
    async () => {
      // B: flannel's device (local = the interface address, ttl inherit, nopmtudisc) and route.
      try {
        ip(
          B.ns,
          'link',
          'add',
          'flannel.ipip',
          'type',
          'ipip',
          'local',
          B.under,
          'ttl',
          'inherit',
          'nopmtudisc',
        );
        ip(B.ns, 'link', 'set', 'flannel.ipip', 'mtu', '1480', 'up');
        ip(B.ns, 'addr', 'add', `${B.v4}/32`, 'dev', 'flannel.ipip');
        ip(B.ns, 'route', 'add', A.subnet, 'via', A.under, 'dev', 'flannel.ipip', 'onlink');
        const a = await start(A, 'ipip', 'bpf');
        try {
          await a.send({ cmd: 'peers', peers: peersOf(B, 'ipip') });
          await pingBoth(A, B, false);
          const sent = await iperf(scope, A, B, false);
          const back = await iperf(scope, B, A, false);
          const s = await stats(a);
          assert.ok(s.bpf!.tx_bytes! >= sent && s.bpf!.rx_bytes! >= back, JSON.stringify(s.bpf));
        } finally {
          const exited = new Promise((r) => a.proc.once('exit', r));
          await a.send({ cmd: 'close' });
          await exited;
        }
      } finally {
        ip(B.ns, 'link', 'del', 'flannel.ipip');
      }
    },
  );

  describe('ipip: bpf ⇄ bpf: one pair', () => {
    const onPair = sharedPair(() => pair('ipip', ['bpf', 'bpf']));

    // First on this pair: nothing but its own packets may cross while it counts (a late packet
    // of an earlier test's TCP connection would be decapsulated).
    test('ipip: spoofed inner sources and strangers go on to the raw socket, dropped and counted', () =>
      onPair(async (nodes) => {
        await pingBoth(A, B, false);
        const before = await stats(nodes[1]);
        const spoof = { mode: 'spoof', target: B.under, count: 100, innerDst: B.v4 };
        // From A's address, an inner source outside A's subnet; from a stranger, one inside it.
        const sent =
          (await sendIpip(A.ns, { ...spoof, outerSrc: A.under, innerSrc: '10.7.9.9' })) +
          (await sendIpip(A.ns, { ...spoof, outerSrc: '192.168.77.99', innerSrc: '10.7.1.9' }));
        assert.equal(sent, 200);
        // The raw socket's reader counts them as it gets to them: wait for all 200.
        let after = before;
        await waitFor(
          async () => {
            after = await stats(nodes[1]);
            const dropped = (r: string) => after.total.drops[r]! - before.total.drops[r]!;
            return dropped('spoofed_source') + dropped('unknown_source') >= 200;
          },
          15_000,
          'the 200 drops counted',
        ).catch(() => undefined); // the assertions below name what was counted
        const d = (r: string) => after.total.drops[r]! - before.total.drops[r]!;
        assert.equal(d('spoofed_source'), 100, JSON.stringify(after.total.drops));
        assert.equal(d('unknown_source'), 100, JSON.stringify(after.total.drops));
        assert.equal(after.bpf!.rx_passed! - before.bpf!.rx_passed!, 200, 'all left to userspace');
        assert.equal(after.bpf!.rx_packets, before.bpf!.rx_packets, 'none decapsulated');
      }));

    test('ipip: TCP super-packets cross the underlay whole (SKB_GSO_IPXIP4), decapsulated whole', () =>
      onPair(async (nodes) => {
        await pingBoth(A, B, false);
        const s0 = await stats(nodes[1]);
        const before = txOf(A.ns, 'va');
        const sent = await iperf(scope, A, B, false);
        const after = txOf(A.ns, 'va');
        // Segmented, no frame on the veth would be over the 1500-byte underlay MTU.
        const perPacket = (after.bytes - before.bytes) / (after.packets - before.packets);
        assert.ok(sent > 0 && perPacket > 1500, `${perPacket} bytes per veth packet`);
        const s = await stats(nodes[1]);
        assert.ok(s.bpf!.rx_bytes! - s0.bpf!.rx_bytes! >= sent, JSON.stringify(s.bpf));
      }));
  });

  describe('vxlan: bpf ⇄ bpf: one pair', () => {
    const onPair = sharedPair(() => pair('vxlan', ['bpf', 'bpf']));

    // First on this pair: nothing but its own datagrams may cross while it counts.
    test('garbage and spoofed datagrams are counted and never delivered', () =>
      onPair(async (nodes) => {
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
      }));

    /** B given A's records alone again: what a test that changed B's table ends with. */
    const restorePeers = (nodes: [Node, Node]) =>
      nodes[1].send({ cmd: 'peers', peers: peersOf(A, 'vxlan') });

    /**
     * A, removed from B's table: A's pings to B get no answer, B's programs decapsulate nothing
     * from it, and B's engine drops each as from an unknown source.
     */
    async function assertGoneFromB(b: Node): Promise<void> {
      const before = await stats(b);
      await assert.rejects(nsExecAsync(A.ns, 'ping', ['-c', '3', '-i', '0.2', '-W', '1', B.v4]));
      const after = await stats(b);
      assert.equal(after.bpf!.rx_packets, before.bpf!.rx_packets, 'nothing decapsulated from it');
      assert.ok(after.total.drops.unknown_source! - before.total.drops.unknown_source! >= 3);
    }

    test('a peer leaving: its traffic stops', () =>
      onPair(async (nodes) => {
        try {
          await nsExecAsync(A.ns, 'ping', ['-c', '2', '-i', '0.2', '-W', '2', B.v4]);
          await nodes[1].send({ cmd: 'peers', peers: [] });
          await assertGoneFromB(nodes[1]);
        } finally {
          await restorePeers(nodes);
        }
      }));

    test('a peer leaving by a delta: its traffic stops; back by a delta: it flows', () =>
      onPair(async (nodes) => {
        try {
          await nsExecAsync(A.ns, 'ping', ['-c', '2', '-i', '0.2', '-W', '2', B.v4]);
          await nodes[1].send({ cmd: 'delta', removed: peersOf(A, 'vxlan'), upserts: [] });
          await assertGoneFromB(nodes[1]);
          await nodes[1].send({ cmd: 'delta', removed: [], upserts: peersOf(A, 'vxlan') });
          await nsExecAsync(A.ns, 'ping', ['-c', '2', '-i', '0.2', '-W', '5', B.v4]);
        } finally {
          await restorePeers(nodes);
        }
      }));
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
      const nodes = (await Promise.all([start(A, 'vxlan', 'bpf'), start(B, 'vxlan', 'bpf')])) as [
        Node,
        Node,
      ];
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

/**
 * The same two namespaces with an IPv6 underlay beside the IPv4 one (va fd00:77::1 ⇄ vb
 * fd00:77::2): the bpf engine over IPv6 alone (IPv4 and IPv6 pods in IPv6 outer packets, as an
 * IPv6-only cluster's nodes) and dual-stack (IPv4 pods to the peer's IPv4 address, IPv6 pods to
 * its IPv6 one: flannel.1 and flannel-v6.1 in one engine), against the native engine and a
 * kernel vxlan device over IPv6 (flannel-v6.1 as flannel makes it).
 */
describe('bpf engine over an IPv6 underlay, and dual-stack', { skip }, () => {
  const scope = new NetnsScope();
  let A: Side;
  let B: Side;
  const U6 = { A: 'fd00:77::1', B: 'fd00:77::2' } as const;
  // The IPv6 outer header is 20 bytes longer: TUN MTU 1430 for vxlan, 1452 for udp.
  const MTU6 = { vxlan: 1430, udp: 1452 } as const;
  before(() => {
    [A, B] = twoNodes(scope);
    ip(A.ns, 'addr', 'add', `${U6.A}/64`, 'dev', 'va', 'nodad');
    ip(B.ns, 'addr', 'add', `${U6.B}/64`, 'dev', 'vb', 'nodad');
  });
  after(() => scope.cleanup());

  const u6 = (s: Side) => (s === A ? U6.A : U6.B);
  type Underlay = 'v6' | 'dual';

  /** `s`'s peer records: both subnets over IPv6, or (dual) each subnet in its own family. */
  function peers6(s: Side, format: 'vxlan' | 'udp', under: Underlay) {
    return peersOf(s, format).map((p) =>
      under === 'v6' || p.subnet.includes(':') ? { ...p, publicIP: u6(s) } : p,
    );
  }

  async function start6(
    side: Side,
    format: 'vxlan' | 'udp',
    engine: 'bpf' | 'native',
    under: Underlay,
    extra: Record<string, unknown> = {},
  ): Promise<Node> {
    const opts =
      under === 'v6'
        ? { bindIp: u6(side), tunMtu: MTU6[format], ...extra }
        : { bindIp: side.under, bindIp6: u6(side), tunMtu: MTU6[format], ...extra };
    const n = startNode(scope, side, format, engine, {
      underlay: side === A ? 'va' : 'vb',
      ...opts,
    });
    const ready = await n.ready;
    assert.equal(ready.ready, true, JSON.stringify(ready));
    return n;
  }

  /** iperf3 TCP (4 MiB) from `from` to `to` over the pods' `family`; the bytes that arrived. */
  async function tcp(from: Side, to: Side, family: 4 | 6): Promise<number> {
    const [src, dst] = family === 4 ? [from.v4, to.v4] : [from.v6, to.v6];
    return delivered(
      (await probeIperf(scope, to.ns, dst, from.ns, ['-B', src, ...TCP_FIXED])).json,
    );
  }

  /** Udp6 InCsumErrors in `ns` (/proc/net/snmp6). */
  function udp6CsumErrors(ns: string): number {
    const m = /^Udp6InCsumErrors\s+(\d+)$/m.exec(nsExec(ns, 'cat', ['/proc/net/snmp6']));
    assert.ok(m, 'Udp6InCsumErrors in /proc/net/snmp6');
    return Number(m[1]);
  }

  for (const [format, under] of [
    ['vxlan', 'v6'],
    ['udp', 'v6'],
    ['vxlan', 'dual'],
  ] as const) {
    const what = under === 'v6' ? 'over IPv6' : 'dual-stack';
    test(`${format} ${what}: bpf ⇄ native: ping v4/v6 both ways, iperf3 TCP both ways`, async () => {
      const nodes = (await Promise.all([
        start6(A, format, 'bpf', under),
        start6(B, format, 'native', under),
      ])) as [Node, Node];
      try {
        assert.equal((await nodes[0].ready).engine, 'bpf');
        await nodes[0].send({ cmd: 'peers', peers: peers6(B, format, under) });
        await nodes[1].send({ cmd: 'peers', peers: peers6(A, format, under) });
        await pingBoth(A, B);
        const sent = await tcp(A, B, 4);
        const back = await tcp(B, A, 6);
        const s = await stats(nodes[0]);
        // The programs sent it (what they left to the native engine, tx_passed: over IPv6 a
        // super-packet whose last segment is short, the native engine sent: in the totals);
        // and took (or, for the native sender's UDP GSO trains, left to the socket) what came
        // back.
        assert.ok(s.bpf!.tx_packets! > 0, JSON.stringify(s.bpf));
        assert.ok(s.bpf!.tx_bytes! >= sent || s.bpf!.tx_passed! > 0, JSON.stringify(s.bpf));
        assert.ok(s.total.counters.tx_bytes! >= sent, JSON.stringify(s.total.counters));
        assert.ok(s.total.counters.rx_bytes! >= back, JSON.stringify(s.total.counters));
        assert.ok(s.bpf!.rx_packets! + s.bpf!.rx_passed! > 0, JSON.stringify(s.bpf));
        if (under === 'dual') {
          // Each pod family in its own underlay family, on the wire into B.
          const port = format === 'vxlan' ? 8472 : 8285;
          const seen = (filter: string, dst: string) =>
            captureText(
              scope,
              B.ns,
              `${filter} and udp dst port ${port}`,
              2,
              () => nsExecAsync(A.ns, 'ping', ['-c', '3', '-i', '0.2', '-W', '2', dst]),
              'vb',
            );
          assert.match(await seen('ip6', B.v6), /IP6 fd00:77::1\.\d+ > fd00:77::2\./);
          assert.match(await seen('ip', B.v4), /IP 192\.168\.77\.1\.\d+ > 192\.168\.77\.2\./);
        }
      } finally {
        await stopPair(nodes);
      }
    });
  }

  /**
   * The bpf engine on A (vxlan over IPv6) with B's kernel vxlan device as its peer, pinging both
   * ways, then `body`; removed after it, and va's checksum offload turned back on. The userspace
   * engine behind the programs sends one datagram per segment (no UDP GSO, no egress TAP): only
   * the programs' packets can be larger than the MTU on the veth.
   */
  async function withKernelPeer6(body: (a: Awaited<ReturnType<typeof start6>>) => Promise<void>) {
    try {
      addKernelVxlan(B, 'vb', A, { local: U6.B, peer: U6.A });
      const offloads = OFFLOAD_NAMES.filter((o) => o !== 'udp_gso' && o !== 'tap_gso');
      const a = await start6(A, 'vxlan', 'bpf', 'v6', { offloads });
      try {
        await a.send({ cmd: 'peers', peers: peers6(B, 'vxlan', 'v6') });
        await pingBoth(A, B);
        await body(a);
      } finally {
        const exited = new Promise((r) => a.proc.once('exit', r));
        await a.send({ cmd: 'close' });
        await exited;
      }
    } finally {
      ip(B.ns, 'link', 'del', 'vx');
      nsExec(A.ns, 'ethtool', ['-K', 'va', 'tx', 'on']);
    }
  }

  test('vxlan over IPv6: bpf ⇄ a kernel vxlan device: super-packets whole, every segment checksummed', async () => {
    await withKernelPeer6(async (a) => {
      const errors = udp6CsumErrors(B.ns);
      // TCP super-packets cross the veth whole (SKB_GSO_UDP_TUNNEL; segmented, no frame would
      // be over 1514 bytes: the 1500-byte MTU and the Ethernet header), the kernel device
      // takes them.
      const s0 = await stats(a);
      let before = txOf(A.ns, 'va');
      const whole = await tcp(A, B, 4);
      let after = txOf(A.ns, 'va');
      const perPacket = (after.bytes - before.bytes) / (after.packets - before.packets);
      assert.ok(perPacket > 1514, `${perPacket} bytes per veth packet`);
      const s1 = await stats(a);
      // Without checksum offload on the veth, the kernel cuts them in software into
      // datagrams that carry the program's outer UDP checksum, which the receiver checks:
      // right for every segment.
      nsExec(A.ns, 'ethtool', ['-K', 'va', 'tx', 'off']);
      before = txOf(A.ns, 'va');
      const cut = (await tcp(A, B, 4)) + (await tcp(A, B, 6));
      after = txOf(A.ns, 'va');
      const segPacket = (after.bytes - before.bytes) / (after.packets - before.packets);
      // (A frame's bytes include its Ethernet header: 1514 at the 1500-byte MTU.)
      assert.ok(segPacket <= 1514, `${segPacket} bytes per veth packet`);
      assert.equal(udp6CsumErrors(B.ns), errors, 'the kernel found no bad UDP checksum');
      const s2 = await stats(a);
      // The programs sent in both runs (a super-packet whose last segment is short goes to
      // the userspace engine, which checksums each datagram itself); weft sent it all.
      assert.ok(s1.bpf!.tx_bytes! > s0.bpf!.tx_bytes!, JSON.stringify(s1.bpf));
      assert.ok(s2.bpf!.tx_bytes! > s1.bpf!.tx_bytes!, JSON.stringify(s2.bpf));
      const total = s2.total.counters.tx_bytes! - s0.total.counters.tx_bytes!;
      assert.ok(total >= whole + cut, `${total} < ${whole + cut}`);
      const back = (await tcp(B, A, 4)) + (await tcp(B, A, 6));
      const s = await stats(a);
      assert.ok(s.bpf!.rx_bytes! >= back, JSON.stringify(s.bpf));
    });
  });

  test('vxlan over IPv6: a TCP GSO packet with a short last segment is re-cut into equal segments, each checksummed', async () => {
    await withKernelPeer6(async (a) => {
      // The kernel cuts what leaves va in software, and the kernel vxlan device checks the
      // outer UDP checksum of every datagram.
      nsExec(A.ns, 'ethtool', ['-K', 'va', 'tx', 'off']);
      const errors = udp6CsumErrors(B.ns);
      // 5200 payload bytes: 3 full segments and a short one at either family's MSS through the
      // 1430-byte TUN (1378 for IPv4 pods, 1358 for IPv6 ones), 4 equal ones of 1300.
      const SIZE = 5200;
      const COUNT = 20;
      for (const dst of [B.v4, B.v6]) {
        const s0 = (await stats(a)).bpf!;
        const r = await tcpMessages(scope, B.ns, dst, A.ns, SIZE, COUNT);
        assert.deepEqual(r, { received: SIZE * COUNT, bad: 0 });
        const s1 = (await stats(a)).bpf!;
        // Re-cut by the program (not left to the userspace engine): each message whole in
        // one GSO packet is one re-cut (a stack that split a message otherwise would re-cut
        // fewer; none at all would mean the mechanism is gone).
        assert.ok(s1.tx_recut! > s0.tx_recut!, `${dst}: ${JSON.stringify(s1)}`);
        assert.ok(s1.tx_bytes! - s0.tx_bytes! >= SIZE * COUNT, JSON.stringify(s1));
      }
      assert.equal(udp6CsumErrors(B.ns), errors, 'the kernel found no bad UDP checksum');
    });
  });
});
