/**
 * The dataplane below the backends: two node namespaces, each running test/helpers/dataplane-node.ts
 * (a Dataplane with its TUN addressed by hand), IPv4 and IPv6 inner traffic, both formats, both
 * engines (native with 2 workers = 2 TUN queues + 2 SO_REUSEPORT sockets, one thread each or one
 * thread per direction each; and js):
 *
 *   ns A                                        ns B
 *   tun 10.7.1.0/32 fd07:0:0:1::/128            tun 10.7.2.0/32 fd07:0:0:2::/128
 *   route 10.7.0.0/16, fd07::/48 → tun          route 10.7.0.0/16, fd07::/48 → tun
 *   veth va 192.168.77.1/24 ─────────────────── veth vb 192.168.77.2/24
 *
 * Also: peer tables swapped hundreds of times under a ping flood (no loss), a removed peer
 * answered with ICMP net-unreachable, VXLAN's flow-hashed source ports, a pod's UDP GSO (USO),
 * bursts of small datagrams batched into UDP GSO sends and USO writes, busy polling, the loops
 * hosted one per piscina pool thread, a worker that cannot enter its loop failing the start with
 * nothing left, stop/start cycles that leak no fd, and a path MTU that drops below the segment
 * size under load (UDP GSO refused with EMSGSIZE: datagrams instead, and GSO again after).
 */
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { type TestContext, after, before, describe, test } from 'node:test';
import { PACKAGE_ROOT, waitFor } from '../../src/testbed/cluster.js';
import { iperf } from '../../src/testbed/probes.js';
import { TCP_FIXED, delivered } from '../helpers/carried.js';
import { orHang } from '../helpers/hang-bound.js';
import { offloadsFromEnv } from '../../src/dataplane/offloads.js';
import { NetnsScope, ip, isRoot, nsExec, nsExecAsync } from '../../src/testbed/netns.js';
import {
  type Node,
  type Side,
  type Stats,
  peersOf,
  startNode,
  sharedPair,
  startPair,
  stopPair,
  twoNodes,
} from '../helpers/dataplane-pair.js';

const skip = isRoot() ? false : 'needs root (network namespaces)';

describe('dataplane engine between two namespaces', { skip }, () => {
  const scope = new NetnsScope();
  let A: Side;
  let B: Side;
  before(() => {
    [A, B] = twoNodes(scope);
  });
  // C fixtures: a UDP GSO (QUIC-like) sender and a sendmmsg burst sender.
  const bin = mkdtempSync(join(tmpdir(), 'weft-dp-fixtures-'));
  const fixture = (name: string) => join(bin, name);
  before(() => {
    for (const name of ['udp-gso-send', 'udp-burst-send']) {
      execFileSync('cc', [
        '-O2',
        '-o',
        fixture(name),
        join(PACKAGE_ROOT, `test/fixtures/${name}.c`),
      ]);
    }
  });
  after(() => {
    scope.cleanup();
    rmSync(bin, { recursive: true, force: true });
  });

  /**
   * A UDP receiver on B's TUN address, IPv4 or IPv6 (it exists once B's dataplane is up), with
   * an 8 MiB receive buffer (SO_RCVBUFFORCE: however late a loaded machine lets it read, the
   * kernel keeps every datagram of a test); dump(n) waits (≤ 30 s) until n datagrams came and
   * lists what came, in order: [length, first 4 bytes as a u32, whether bytes 4.. all equal
   * byte 4]. It answers only with its socket drained.
   */
  async function udpCapture(
    port: number,
    v6: boolean,
  ): Promise<{
    proc: ChildProcess;
    dump(n: number): Promise<[number, number, boolean][]>;
  }> {
    const proc = scope.spawn(B.ns, 'python3', [
      '-c',
      `import json, select, socket, sys
s = socket.socket(socket.AF_INET6 if ${v6 ? 'True' : 'False'} else socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)  # SO_RCVBUFFORCE
s.bind(('${v6 ? B.v6 : B.v4}', ${port}))
print('bound', flush=True)
got = []
while True:
    r = select.select([s, sys.stdin], [], [])[0]
    if s in r:
        m = s.recv(65535)
        got.append([len(m), int.from_bytes(m[:4], 'big'), all(b == m[4] for b in m[4:])])
    elif not sys.stdin.readline():
        break
    else:
        print(json.dumps(got), flush=True)`,
    ]);
    const lines = createInterface({ input: proc.stdout! })[Symbol.asyncIterator]();
    assert.equal((await lines.next()).value, 'bound');
    return {
      proc,
      async dump(n: number) {
        const deadline = Date.now() + 30_000;
        for (;;) {
          proc.stdin!.write('dump\n');
          const got = JSON.parse((await lines.next()).value as string) as [
            number,
            number,
            boolean,
          ][];
          if (got.length >= n || Date.now() > deadline) return got;
          await new Promise((r) => setTimeout(r, 200));
        }
      },
    };
  }

  /**
   * Packets the kernel dropped on the way from A's TUN to B's receivers: A's TUN queue (the
   * engine reading late), B's TUN, and B's UDP receive errors (a full socket buffer).
   */
  function kernelDrops(format: 'udp' | 'vxlan'): number {
    const tun = format === 'udp' ? 'flannel0' : 'flannel.1';
    const link = (ns: string) =>
      (
        JSON.parse(ip(ns, '-s', '-j', 'link', 'show', tun)) as Array<{
          stats64: { rx: { dropped: number }; tx: { dropped: number } };
        }>
      )[0]!.stats64;
    const snmp = nsExec(B.ns, 'cat', ['/proc/net/snmp']).split('\n');
    const [head, vals] = snmp.filter((l) => l.startsWith('Udp: ')).map((l) => l.split(' '));
    const udp6 = /^Udp6InErrors\s+(\d+)$/m.exec(nsExec(B.ns, 'cat', ['/proc/net/snmp6']));
    return (
      link(A.ns).tx.dropped +
      link(B.ns).rx.dropped +
      Number(vals![head!.indexOf('InErrors')]) +
      Number(udp6?.[1] ?? 0)
    );
  }

  /**
   * What the capture got of `want`: every datagram intact and in the order sent (a loaded
   * machine may lose some, but then the kernel or the engines counted each one lost); returns
   * how many arrived.
   */
  function assertArrived(
    got: [number, number, boolean][],
    want: [number, number, boolean][],
    counted: number,
  ): number {
    if (got.length === want.length) {
      assert.deepEqual(got, want);
      return got.length;
    }
    // A subsequence of what was sent, in its order.
    let i = 0;
    for (const g of got) {
      while (i < want.length && JSON.stringify(want[i]) !== JSON.stringify(g)) i++;
      assert.ok(i < want.length, `${JSON.stringify(g)} was not sent, or came out of order`);
      i++;
    }
    const lost = want.length - got.length;
    assert.ok(lost <= counted, `${lost} datagrams lost, ${counted} drops counted`);
    return got.length;
  }

  /** One pair for the tests of a describe (test/helpers/dataplane-pair.ts). */
  const pairFor = (
    format: 'udp' | 'vxlan',
    engine: 'native' | 'js',
    extra: Record<string, unknown> = {},
  ) => sharedPair(() => startPair(scope, [A, B], format, engine, extra));

  /** A node's stats. */
  const statsOf = async (n: Node) => (await n.send({ cmd: 'stats' })).stats as Full;
  type Full = Stats & { total: { drops: Record<string, number> } };
  /** How much each counter of `after` grew from `before`. */
  const grown = (before: Full, after: Full) =>
    Object.fromEntries(
      Object.entries(after.total.counters).map(([k, v]) => [
        k,
        v - (before.total.counters[k] ?? 0),
      ]),
    );

  /** Runs `fn` with a UDP capture on B's `port` (the pair's framing `format`). */
  async function withCapture(
    o: { format: 'udp' | 'vxlan'; port: number; v6?: boolean },
    fn: (
      dump: (n: number) => Promise<[number, number, boolean][]>,
      drops: () => number,
    ) => Promise<void>,
  ): Promise<void> {
    let capture: ChildProcess | undefined;
    try {
      const c = await udpCapture(o.port, o.v6 ?? false);
      capture = c.proc;
      const before = kernelDrops(o.format);
      await fn(c.dump, () => kernelDrops(o.format) - before);
    } finally {
      capture?.kill();
    }
  }

  /** Pings both ways over IPv4 and IPv6, then a fixed amount of TCP through B's engine. */
  async function pingAndTcp(nodes: [Node, Node], engine: 'native' | 'js'): Promise<void> {
    // The four pings at once: each must be answered, none depends on another.
    await Promise.all([
      nsExecAsync(A.ns, 'ping', ['-c', '3', '-i', '0.2', '-W', '2', B.v4]),
      nsExecAsync(B.ns, 'ping', ['-c', '3', '-i', '0.2', '-W', '2', A.v4]),
      nsExecAsync(A.ns, 'ping', ['-6', '-c', '3', '-i', '0.2', '-W', '2', B.v6]),
      nsExecAsync(B.ns, 'ping', ['-6', '-c', '3', '-i', '0.2', '-W', '2', A.v6]),
    ]);
    // A fixed amount, however long it takes (a rate floor is the machine's load): it arrived,
    // through B's engine.
    const before = await statsOf(nodes[1]);
    const tcp = await iperf(scope, B.ns, B.v4, A.ns, ['-B', A.v4, ...TCP_FIXED]);
    const bytes = delivered(tcp.json);
    const stats = (await statsOf(nodes[1])) as Full & { workers: unknown[] };
    assert.equal(stats.workers.length, engine === 'native' ? 2 : 1);
    const grew = grown(before, stats);
    assert.ok(grew.rx_bytes! >= bytes, JSON.stringify(grew));
  }

  /** A UDP GSO (USO) sender in A's pod namespace; the pair's framing is vxlan. */
  async function usoCrosses(nodes: [Node, Node]): Promise<void> {
    await withCapture({ format: 'vxlan', port: 7000 }, async (dump, drops) => {
      // A QUIC-like sender: 20 super-datagrams of 12,000 bytes cut into 1,200-byte datagrams,
      // byte k of each filled with its index k in the super-datagram.
      const before = await statsOf(nodes[0]);
      await nsExecAsync(A.ns, fixture('udp-gso-send'), [B.v4, '7000', '1200', '12000', '20']);
      const want = Array.from({ length: 20 }, () =>
        Array.from({ length: 10 }, (_, k): [number, number, boolean] => [
          1200,
          k * 0x01010101,
          true,
        ]),
      ).flat();
      const stats = await statsOf(nodes[0]);
      const arrived = assertArrived(await dump(want.length), want, drops());
      if (stats.offloads.uso4) {
        // The dataplane, not the kernel, cut them: the TUN handed over the USO packets.
        const grew = grown(before, stats);
        assert.ok(grew.tso_segments! >= arrived, JSON.stringify(grew));
      }
    });
  }

  /** sendmmsg bursts of small datagrams from A to B (IPv4 or IPv6); the pair's framing is udp. */
  async function burstsCross(nodes: [Node, Node], v6: boolean): Promise<void> {
    await withCapture({ format: 'udp', port: 7001, v6 }, async (dump, drops) => {
      // 20 bursts of 64 datagrams, each burst one sendmmsg: datagram n is 64 bytes (100 when
      // n % 10 == 9, so runs end mid-burst) and carries n, then n & 0xff in every other byte.
      const dst = v6 ? B.v6 : B.v4;
      const sent0 = await statsOf(nodes[0]);
      const recv0 = await statsOf(nodes[1]);
      await nsExecAsync(A.ns, fixture('udp-burst-send'), [dst, '7001', '64', '20', '20']);
      const want = Array.from({ length: 1280 }, (_, n): [number, number, boolean] => [
        n % 10 === 9 ? 100 : 64,
        n,
        true,
      ]);
      assertArrived(await dump(want.length), want, drops());
      const sent = await statsOf(nodes[0]);
      const recv = await statsOf(nodes[1]);
      if (sent.offloads.udp_gso) {
        const grew = grown(sent0, sent);
        assert.ok(grew.gso_sends! >= 1, JSON.stringify(grew));
      }
      if (recv.offloads.gro && recv.offloads[v6 ? 'uso6' : 'uso4']) {
        const grew = grown(recv0, recv);
        assert.ok(grew.gro_writes! >= 1, JSON.stringify(grew));
      }
    });
  }

  /**
   * A's requests to B of a 200-ping flood that were never answered while `change(i)` ran 300
   * times. -w: ping sends on until 200 replies came (≤ 60 s), so a late reply on a loaded
   * machine is no loss; a lost packet is a request of the first 200 never answered.
   */
  async function lostUnderFlood(change: (i: number) => Promise<unknown>): Promise<number[]> {
    const pinging = nsExecAsync(
      A.ns,
      'ping',
      ['-c', '200', '-i', '0.01', '-w', '60', B.v4],
      90_000,
    );
    for (let i = 0; i < 300; i++) await change(i);
    const out = await pinging;
    const answered = new Set([...out.matchAll(/icmp_seq=(\d+)/g)].map((m) => Number(m[1])));
    return Array.from({ length: 200 }, (_, i) => i + 1).filter((q) => !answered.has(q));
  }

  /** A (udp) given B's records alone again: what a test that changed A's table ends with. */
  const restorePeers = (nodes: [Node, Node]) =>
    nodes[0].send({ cmd: 'peers', peers: peersOf(B, 'udp') });

  /** A delta removes B (udp) from A's table, and a delta adds it back. */
  async function deltaRemovesPeer(nodes: [Node, Node], engine: 'native' | 'js'): Promise<void> {
    try {
      await nodes[0].send({ cmd: 'delta', removed: peersOf(B, 'udp'), upserts: [] });
      const out = await nsExecAsync(A.ns, 'ping', ['-c', '1', '-W', '2', B.v4]).then(
        () => assert.fail('B answered without a peer record'),
        (e: Error) => e.message,
      );
      // the native engine answers a miss with ICMP net-unreachable; the js engine drops it
      if (engine === 'native') assert.match(out, /Destination Net Unreachable/);
      await nodes[0].send({ cmd: 'delta', removed: [], upserts: peersOf(B, 'udp') });
      await nsExecAsync(A.ns, 'ping', ['-c', '2', '-i', '0.2', '-W', '5', B.v4]);
    } finally {
      await restorePeers(nodes);
    }
  }

  /**
   * With A's route to B down to MTU 1200 while iperf3 TCP runs (the change a second in, the
   * run 2 s): the TCP bytes that arrived. The route is deleted again before this returns, also
   * when something fails.
   */
  async function tcpAcrossMtuDrop(): Promise<number> {
    const host = `${B.under}/32`;
    try {
      const client = iperf(scope, B.ns, B.v4, A.ns, ['-B', A.v4, '-t', '2']);
      await new Promise((r) => setTimeout(r, 1000));
      ip(A.ns, 'route', 'replace', host, 'dev', 'va', 'mtu', '1200');
      return ((await client).json as { end: { sum_received: { bytes: number } } }).end.sum_received
        .bytes;
    } finally {
      try {
        ip(A.ns, 'route', 'del', host);
      } catch {
        // already gone
      }
    }
  }

  /**
   * A path MTU below the segment size under load, TCP by the egress TAP (the pair's own
   * offloads): the kernel fragments the outer packets (DF clear), nothing is lost.
   */
  async function tapUnderMtuDrop(nodes: [Node, Node], t: TestContext): Promise<void> {
    const before = await statsOf(nodes[0]);
    if (!before.offloads.tap_gso) {
      t.skip('tap_gso is off (WEFT_DATAPLANE_OFFLOADS or a kernel before 6.17)');
      return;
    }
    /** Ip FragCreates in A's /proc/net/snmp. */
    const fragCreates = () => {
      const rows = nsExec(A.ns, 'cat', ['/proc/net/snmp'])
        .split('\n')
        .filter((l) => l.startsWith('Ip:'))
        .map((l) => l.split(/\s+/));
      return Number(rows[1]![rows[0]!.indexOf('FragCreates')]);
    };
    const frags0 = fragCreates();
    const bytes = await tcpAcrossMtuDrop();
    assert.ok(bytes > 0, 'no TCP byte arrived');
    const s = await statsOf(nodes[0]);
    const grew = grown(before, s);
    assert.ok(grew.tap_writes! > 0, JSON.stringify(grew));
    assert.equal(s.total.counters.tap_disabled, 0);
    assert.equal(s.total.drops.send_error, 0, JSON.stringify(s.total.drops));
    // The kernel cut the forwarded outer packets into fragments on the way out.
    assert.ok(fragCreates() > frags0, 'no fragment created');
  }

  /** Online CPUs, as the engine counts them for CPU-affine queues (get_nprocs). */
  const onlineCpus = () => Number(execFileSync('getconf', ['_NPROCESSORS_ONLN']).toString());

  /** TCP states in which a socket sends by itself (retransmitted SYNs and FINs). */
  const SENDING_STATES = ['syn-sent', 'syn-recv', 'fin-wait-1', 'closing', 'last-ack'].flatMap(
    (s) => ['state', s],
  );
  /** Whether A or B holds a TCP socket that is opening or closing. */
  const closing = () =>
    [A, B].some((n) => nsExec(n.ns, 'ss', ['-Htn', ...SENDING_STATES]).trim() !== '');
  /** A's established connections to B's sink, one `ss` line each. */
  const toSink = () =>
    nsExec(A.ns, 'ss', ['-Htn', 'state', 'established', '( dport = :5201 )'])
      .split('\n')
      .filter((l) => l.trim());

  /** 20 new TCP connections, one at a time, from A to B: each leaves A by one queue. */
  async function connectionsStayOnOneQueue(nodes: [Node, Node]): Promise<void> {
    // A sink on B that says 'got' once a connection has brought it 1 MB: by then every packet
    // of that connection has crossed A's engine. On A, one client process: each line on its
    // stdin opens a new connection that writes 1 MB and then stays open and idle until the
    // end, so no closing packets (FIN, last ACK, their retransmissions) of an earlier
    // connection come out of the TUN while a later one is measured.
    const sink = scope.spawn(B.ns, process.execPath, [
      '-e',
      `require('node:net').createServer((c) => {
         let n = 0;
         c.on('data', (d) => { n += d.length; if (n >= 1 << 20 && n - d.length < 1 << 20) console.log('got'); });
       }).listen(5201, '${B.v4}', () => console.log('listening'));`,
    ]);
    const client = scope.spawn(A.ns, process.execPath, [
      '-e',
      `const open = [];
       require('node:readline').createInterface({ input: process.stdin }).on('line', () => {
         const c = require('node:net').connect(5201, '${B.v4}', () => c.write(Buffer.alloc(1 << 20)));
         c.on('error', (e) => console.log('error ' + e.message));
         open.push(c);
       });`,
    ]);
    // The flow program hands the TUN the packet's hash: for A's own TCP, the socket's. TCP picks
    // a new one after a retransmission timeout (net.core.txrehash), which moves the connection
    // to another queue by design; a machine that stalls can time one out, so A keeps its hashes.
    nsExec(A.ns, 'sysctl', ['-qw', 'net.core.txrehash=0']);
    // Every earlier connection has had all its data acknowledged: none sends again. And no
    // socket in either namespace is opening or closing (an earlier test's, orphaned when its
    // processes were killed): those retransmit SYNs and FINs on their own schedule, and their
    // packets would leave A by whichever queue their hash picks.
    const drained = () => toSink().every((l) => l.trim().split(/\s+/)[1] === '0') && !closing();
    try {
      const lines = createInterface({ input: sink.stdout! })[Symbol.asyncIterator]();
      assert.equal((await lines.next()).value, 'listening');
      const first = (await statsOf(nodes[0])) as Full & { steering: string };
      assert.equal(first.steering, 'flow');
      const sent = async () =>
        (
          (await nodes[0].send({ cmd: 'stats' })).stats as {
            workers: { counters: Record<string, number> }[];
          }
        ).workers.map((w) => w.counters.tx_packets!);
      for (let i = 0; i < 20; i++) {
        await waitFor(drained, 60_000, `connections before ${i} acknowledged`);
        const before = await sent();
        client.stdin!.write('connect\n');
        // Bounded only so that a connection that failed (the client says why) fails the test.
        const got = await orHang(lines.next(), 60_000, () => ({ value: 'no 1 MB within 60 s' }));
        assert.equal(got.value, 'got', `connection ${i}: ${client.stdout!.read() ?? ''}`);
        const after = await sent();
        const grew = after.map((n, q) => n - before[q]!);
        // Without the steering program the TUN moved a new connection to the queue its first
        // replies came in on (the one our SO_REUSEPORT group picked by outer addresses).
        assert.equal(
          grew.filter((d) => d > 0).length,
          1,
          `connection ${i} left by more than one queue: ${before} → ${after}`,
        );
      }
    } finally {
      client.kill();
      sink.kill();
      nsExec(A.ns, 'sysctl', ['-qw', 'net.core.txrehash=1']);
      // The connections close while the engines still carry their FINs (stopPair comes next),
      // so that none is left retransmitting into the next test's pair: the client's are gone
      // from ESTABLISHED once it has exited, and no socket is closing.
      await waitFor(() => toSink().length === 0 && !closing(), 10_000, 'connections closed').catch(
        () => undefined,
      );
    }
  }

  // The traffic tests run twice: with every offload the kernel grants, and with all of them off.
  // The js engine has no offload (it never reads the option): with every offload off it would
  // run the very same pair, so it runs once. The tests that need the same pair share one.

  describe('udp / native: one pair', () => {
    const onPair = pairFor('udp', 'native');

    test('udp / native: IPv4 and IPv6 ping both ways, TCP through iperf3', () =>
      onPair((nodes) => pingAndTcp(nodes, 'native')));

    for (const v6 of [false, true]) {
      const family = v6 ? 'IPv6' : 'IPv4';
      test(`${family} bursts of small datagrams cross as UDP GSO sends and USO writes, each intact, in order`, () =>
        onPair((nodes) => burstsCross(nodes, v6)));
    }

    test('peer tables swapped 300 times under a ping flood lose no packet', () =>
      onPair(async (nodes) => {
        try {
          const lost = await lostUnderFlood((i) => {
            // Alternate between two tables that both hold the peer (plus filler peers).
            const filler = Array.from({ length: i % 2 ? 50 : 3 }, (_, k) => ({
              subnet: `10.8.${k}.0/24`,
              publicIP: '192.168.77.9',
              port: 8285,
            }));
            return nodes[0].send({ cmd: 'peers', peers: [...peersOf(B, 'udp'), ...filler] });
          });
          assert.deepEqual(lost, []);
        } finally {
          await restorePeers(nodes);
        }
      }));

    test('peer table deltas applied 300 times under a ping flood lose no packet', () =>
      onPair(async (nodes) => {
        const filler = (k: number) => ({
          subnet: `10.8.${k % 200}.0/24`,
          publicIP: `192.168.77.${k % 250}`,
          port: 8285,
        });
        try {
          // Each delta adds a filler peer and removes an older one; every tenth also upserts the
          // live peer's records again (replaced by the same records).
          const lost = await lostUnderFlood((i) =>
            nodes[0].send({
              cmd: 'delta',
              removed: i >= 20 ? [filler(i - 20)] : [],
              upserts: [filler(i), ...(i % 10 === 0 ? peersOf(B, 'udp') : [])],
            }),
          );
          assert.deepEqual(lost, []);
        } finally {
          await restorePeers(nodes);
        }
      }));

    test('native: a peer a delta removes is unreachable; a delta that adds it back restores it', () =>
      onPair((nodes) => deltaRemovesPeer(nodes, 'native')));

    test('a delta that does not apply is refused and the table kept', () =>
      onPair(async (nodes) => {
        const r = await nodes[0].send({
          cmd: 'delta',
          removed: [{ subnet: '10.9.9.0/24', publicIP: '192.168.77.1', port: 8285 }],
          upserts: [],
        });
        assert.equal(r.ok, false);
        assert.match(String(r.error), /subnet not in the table/);
        await nsExecAsync(A.ns, 'ping', ['-c', '2', '-i', '0.2', '-W', '5', B.v4]);
      }));

    test('a destination without a peer is answered with ICMP net-unreachable', () =>
      onPair(async (nodes) => {
        try {
          const before = await statsOf(nodes[0]);
          await nodes[0].send({ cmd: 'peers', peers: [] });
          const out = await nsExecAsync(A.ns, 'ping', ['-c', '1', '-W', '10', B.v4]).catch(
            (e: Error) => e.message,
          );
          assert.match(out, /Destination Net Unreachable/);
          const after = await statsOf(nodes[0]);
          const grew = grown(before, after);
          assert.ok(grew.icmp_sent! >= 1, JSON.stringify(grew));
          const noRoute = after.total.drops.no_route! - before.total.drops.no_route!;
          assert.ok(noRoute >= 1, JSON.stringify(after.total.drops));
        } finally {
          await restorePeers(nodes);
        }
      }));

    test('without busy polling every drain starts with a wake-up', () =>
      onPair(async (nodes) => {
        const before = await statsOf(nodes[0]);
        await nsExecAsync(A.ns, 'ping', ['-c', '5', '-i', '0.05', '-W', '2', B.v4]);
        const after = await statsOf(nodes[0]);
        // Every drain began with a wake-up: none by polling (ever, on this pair), and the pings
        // were drained.
        assert.equal(after.total.counters.busy_polls, 0);
        const grew = grown(before, after);
        assert.ok(grew.wakeups! > 0, JSON.stringify(grew));
      }));

    test('udp: a path MTU below the segment size under load, TCP by the egress TAP: the kernel fragments (outer DF clear), nothing is lost', (t) =>
      onPair((nodes) => tapUnderMtuDrop(nodes, t)));
  });

  describe('vxlan / native: one pair', () => {
    const onPair = pairFor('vxlan', 'native');

    test('vxlan / native: IPv4 and IPv6 ping both ways, TCP through iperf3', () =>
      onPair((nodes) => pingAndTcp(nodes, 'native')));

    test('UDP GSO from a pod (USO) leaves as its datagrams, each intact, in order', () =>
      onPair(usoCrosses));

    test('vxlan: a path MTU below the segment size under load, TCP by the egress TAP: the kernel fragments (outer DF clear), nothing is lost', (t) =>
      onPair((nodes) => tapUnderMtuDrop(nodes, t)));

    // Last on this pair: it closes and starts A's engine again (the same peer table).
    test('stop/start cycles leak no fd and traffic flows after them', () =>
      onPair(async (nodes) => {
        await nodes[0].send({ cmd: 'cycle', n: 1 }); // warm up lazily opened fds (worker threads)
        // A leak of one fd a cycle or more shows in any count of cycles.
        const r = await nodes[0].send({ cmd: 'cycle', n: 2 });
        const [before, after] = r.fds as [number, number];
        assert.equal(after, before, `fds ${before} → ${after}`);
        await nsExecAsync(A.ns, 'ping', ['-c', '2', '-i', '0.2', '-W', '2', B.v4]);
      }));
  });

  describe('udp / native, every offload off: one pair', () => {
    const onPair = pairFor('udp', 'native', { offloads: [] });

    test('udp / native, every offload off: IPv4 and IPv6 ping both ways, TCP through iperf3', () =>
      onPair((nodes) => pingAndTcp(nodes, 'native')));

    for (const v6 of [false, true]) {
      const family = v6 ? 'IPv6' : 'IPv4';
      test(`${family} bursts of small datagrams cross as UDP GSO sends and USO writes, each intact, in order, every offload off`, () =>
        onPair((nodes) => burstsCross(nodes, v6)));
    }
  });

  describe('vxlan / native, every offload off: one pair', () => {
    const onPair = pairFor('vxlan', 'native', { offloads: [] });

    test('vxlan / native, every offload off: IPv4 and IPv6 ping both ways, TCP through iperf3', () =>
      onPair((nodes) => pingAndTcp(nodes, 'native')));

    test('UDP GSO from a pod (USO) leaves as its datagrams, each intact, in order, every offload off', () =>
      onPair(usoCrosses));
  });

  for (const off of [false, true]) {
    const when = off ? ', every offload off' : '';
    for (const format of ['udp', 'vxlan'] as const) {
      const extra = { queueThreads: 2, ...(off ? { offloads: [] } : {}) };
      test(`${format} / native, a thread per direction${when}: IPv4 and IPv6 ping both ways, TCP through iperf3`, async () => {
        const nodes = await startPair(scope, [A, B], format, 'native', extra);
        try {
          await pingAndTcp(nodes, 'native');
        } finally {
          await stopPair(nodes);
        }
      });
    }
  }

  describe('udp / js: one pair', () => {
    const onPair = pairFor('udp', 'js');

    test('udp / js: IPv4 and IPv6 ping both ways, TCP through iperf3', () =>
      onPair((nodes) => pingAndTcp(nodes, 'js')));

    test('js: a peer a delta removes is unreachable; a delta that adds it back restores it', () =>
      onPair((nodes) => deltaRemovesPeer(nodes, 'js')));
  });

  test('vxlan / js: IPv4 and IPv6 ping both ways, TCP through iperf3', async () => {
    const nodes = await startPair(scope, [A, B], 'vxlan', 'js');
    try {
      await pingAndTcp(nodes, 'js');
    } finally {
      await stopPair(nodes);
    }
  });

  test('before its first peer table a miss is dropped quietly (an engine on an adopted TUN)', async () => {
    // A alone, never given a table
    const a = startNode(scope, A, 'udp', 'native');
    try {
      assert.equal((await a.ready).ready, true);
      const out = await nsExecAsync(A.ns, 'ping', ['-c', '1', '-W', '1', B.v4]).catch(
        (e: Error) => e.message,
      );
      assert.doesNotMatch(out, /Unreachable/);
      type Counts = { counters: Record<string, number>; drops: Record<string, number> };
      const total = async () => ((await a.send({ cmd: 'stats' })).stats as { total: Counts }).total;
      // The engine reads the request when it gets the CPU: wait for the drop to be counted.
      await waitFor(
        async () => (await total()).drops.no_route! >= 1,
        30_000,
        'the miss counted as no_route',
      );
      assert.equal((await total()).counters.icmp_sent, 0);
    } finally {
      const exited = new Promise((r) => a.proc.once('exit', r));
      await a.send({ cmd: 'close' });
      await exited;
    }
  });

  test('vxlan sends each inner flow from one flow-hashed outer source port (one set for all queues), never the VXLAN port', async () => {
    // Only A runs a dataplane; B's 8472 is a plain socket that records, per inner UDP
    // destination port (one flow each), the outer source ports it came from.
    const capture = scope.spawn(B.ns, process.execPath, [
      '-e',
      `const s = require('node:dgram').createSocket('udp4');
       const flows = {};
       s.on('message', (m, r) => {
         const ip = 8 + 14, ihl = (m[ip] & 15) * 4, dport = m.readUInt16BE(ip + ihl + 2);
         (flows[dport] ??= new Set()).add(r.port);
       });
       s.bind(8472, '${B.under}', () => console.log('bound'));
       process.stdin.on('data', () => {
         console.log(JSON.stringify(Object.fromEntries(Object.entries(flows).map(([k, v]) => [k, [...v]]))));
       });`,
    ]);
    const lines = createInterface({ input: capture.stdout! })[Symbol.asyncIterator]();
    assert.equal((await lines.next()).value, 'bound');
    // Two queues: the TUN spreads the 32 flows over both, and both send from the engine's one
    // set of 8 source sockets (a set per queue let a flow change port when it changed queue).
    const node = startNode(scope, A, 'vxlan', 'native', { workers: 2 });
    try {
      assert.equal((await node.ready).ready, true);
      await node.send({ cmd: 'peers', peers: peersOf(B, 'vxlan') });
      await nsExecAsync(A.ns, process.execPath, [
        '-e',
        `const s = require('node:dgram').createSocket('udp4');
         let n = 0;
         for (let r = 0; r < 3; r++)
           for (let p = 0; p < 32; p++)
             s.send('x', 6000 + p, '10.7.2.9', () => { if (++n === 96) s.close(); });`,
      ]);
      // Poll (≤ 30 s) until every flow came: a loaded machine forwards late, not differently.
      let flows: Record<string, number[]> = {};
      const deadline = Date.now() + 30_000;
      while (Object.keys(flows).length < 32 && Date.now() < deadline) {
        capture.stdin!.write('dump\n');
        flows = JSON.parse((await lines.next()).value as string) as Record<string, number[]>;
        if (Object.keys(flows).length < 32) await new Promise((r) => setTimeout(r, 200));
      }
      assert.equal(Object.keys(flows).length, 32, JSON.stringify(flows));
      const ports = new Set<number>();
      for (const [dport, sports] of Object.entries(flows)) {
        assert.equal(sports.length, 1, `flow to :${dport} left from ${sports.join(', ')}`);
        assert.notEqual(sports[0], 8472);
        ports.add(sports[0]!);
      }
      assert.ok(ports.size >= 4, `32 flows used only ${ports.size} source port(s)`);
      assert.ok(ports.size <= 8, `32 flows used ${ports.size} source ports: a set per queue?`);
    } finally {
      const exited = new Promise((r) => node.proc.once('exit', r));
      await node.send({ cmd: 'close' });
      await exited;
      capture.kill();
    }
  });

  test('after a light drain the worker polls instead of sleeping, and picks up the next packets that way', async () => {
    // One thread per queue: the thread that sent the request is the one polling for the reply.
    // The polling window (60 s) outlasts the whole exchange, however the threads are scheduled:
    // once A's thread has drained the first packet it never sleeps again, so every later drain
    // starts by polling. (With a real window of µs, how many replies land inside it depends on
    // scheduling; the mechanism does not.)
    const nodes = await startPair(scope, [A, B], 'udp', 'native', {
      busyPollUs: 60_000_000,
      queueThreads: 1,
      workers: 1,
    });
    const counters = async () =>
      (
        (await nodes[0].send({ cmd: 'stats' })).stats as {
          total: { counters: Record<string, number> };
        }
      ).total.counters;
    try {
      const before = await counters();
      await nsExecAsync(A.ns, 'ping', ['-c', '5', '-i', '0.2', '-W', '2', B.v4]);
      const after = await counters();
      const wakeups = after.wakeups! - before.wakeups!;
      const polls = after.busy_polls! - before.busy_polls!;
      const seen = JSON.stringify({ wakeups, polls });
      // At most one sleep ended (by the first request, unless a stray packet had already set
      // A polling); every later drain (the replies, the requests 200 ms apart) began by polling.
      assert.ok(wakeups <= 1, seen);
      assert.ok(polls >= 1, seen);
    } finally {
      await stopPair(nodes);
    }
  });

  /**
   * Runs test/helpers/dataplane-probe.ts in ns A once, both modes in the one process (one
   * warm-up), and returns its report for `mode`.
   */
  let probed: Promise<string[]> | null = null;
  async function probe(mode: 'pool' | 'no-addon'): Promise<Record<string, unknown>> {
    probed ??= runProbe();
    const lines = await probed;
    return JSON.parse(lines[mode === 'pool' ? 0 : 1]!) as Record<string, unknown>;
  }
  async function runProbe(): Promise<string[]> {
    const cfg = {
      format: 'udp',
      tunName: 'wprobe0',
      workers: 3,
      queueThreads: 2,
      bindIp: A.under,
      port: 8999,
      tunMtu: 1472,
      vni: 1,
      vtepMac: A.mac,
    };
    const out = await nsExecAsync(
      A.ns,
      process.execPath,
      [
        '--import',
        'tsx',
        join(PACKAGE_ROOT, 'test/helpers/dataplane-probe.ts'),
        'pool,no-addon',
        JSON.stringify(cfg),
      ],
      60_000,
    );
    const lines = out.trim().split('\n');
    assert.ok(lines.length >= 2, out);
    return lines.slice(-2);
  }

  test('each queue runs a tx and an rx loop on their own piscina threads, and close ends them all', async () => {
    const r = (await probe('pool')) as {
      threadIds: number[];
      statsWorkers: number;
      threads: [number, number, number];
      fds: [number, number];
    };
    assert.equal(r.threadIds.length, 6);
    assert.equal(new Set(r.threadIds).size, 6, `thread ids ${r.threadIds.join(',')}`);
    assert.ok(!r.threadIds.includes(0), 'a queue ran on the main thread');
    assert.equal(r.statsWorkers, 3);
    const [before, running, after] = r.threads;
    assert.ok(running >= before + 6, `threads ${before} → ${running} while running`);
    assert.equal(after, before, `threads ${before} → ${after} after close`);
    assert.equal(r.fds[1], r.fds[0], `fds ${r.fds[0]} → ${r.fds[1]}`);
  });

  test('a worker that cannot enter its loop fails startDataplane with nothing left', async () => {
    // The probe exits by itself (nsExecAsync rejects on a timeout): no thread or handle is left.
    const r = (await probe('no-addon')) as {
      error: { name: string; code: string; message: string } | null;
      tunLeft: boolean;
      threads: [number, number];
      fds: [number, number];
    };
    assert.ok(r.error, 'startDataplane succeeded without the addon in its workers');
    assert.equal(r.error.name, 'WeftError');
    assert.equal(r.error.code, 'WEFT_ERR_DATAPLANE');
    assert.match(r.error.message, /^worker \d: .*native addon unavailable/);
    assert.equal(r.tunLeft, false, 'the TUN device outlived the failed start');
    assert.equal(r.threads[1], r.threads[0], `threads ${r.threads[0]} → ${r.threads[1]}`);
    assert.equal(r.fds[1], r.fds[0], `fds ${r.fds[0]} → ${r.fds[1]}`);
  });

  for (const format of ['udp', 'vxlan'] as const) {
    test(`${format}: a path MTU below the segment size under load: GSO messages go as datagrams (counted), and GSO resumes when it grows back`, async (t) => {
      // TCP by the sockets (split + UDP GSO): the egress TAP off.
      const nodes = await startPair(scope, [A, B], format, 'native', {
        offloads: offloadsFromEnv().filter((o) => o !== 'tap_gso'),
      });
      type Full = Stats & { total: { drops: Record<string, number> } };
      const stats = async () => (await nodes[0].send({ cmd: 'stats' })).stats as Full;
      const run = async (args: string[], during?: () => void) => {
        const client = iperf(scope, B.ns, B.v4, A.ns, ['-B', A.v4, ...args]);
        if (during) {
          await new Promise((r) => setTimeout(r, 1000));
          during();
        }
        const json = (await client).json as { end: { sum_received: { bytes: number } } };
        return json.end.sum_received.bytes;
      };
      const host = `${B.under}/32`;
      try {
        if (!(await stats()).offloads.udp_gso) {
          // WEFT_DATAPLANE_OFFLOADS without udp_gso: no GSO message for the path MTU to refuse.
          t.skip('udp_gso is off (WEFT_DATAPLANE_OFFLOADS): no GSO message to refuse');
          return;
        }
        // Outer datagrams are up to 1500 bytes; the route to B now takes 1200.
        const bytes = await run(['-t', '2'], () =>
          ip(A.ns, 'route', 'replace', host, 'dev', 'va', 'mtu', '1200'),
        );
        const s1 = await stats();
        assert.ok(bytes > 0);
        assert.equal(s1.total.drops.send_error, 0, JSON.stringify(s1.total.drops));
        assert.ok(s1.total.counters.gso_fallbacks! > 0, JSON.stringify(s1.total.counters));
        // The MTU grows back; once the pause (1 s) is over, GSO messages go whole again.
        ip(A.ns, 'route', 'del', host);
        await new Promise((r) => setTimeout(r, 1100));
        await run(['-n', '20M']);
        const s2 = await stats();
        assert.ok(s2.total.counters.gso_sends! > s1.total.counters.gso_sends!);
        assert.equal(s2.total.counters.gso_fallbacks, s1.total.counters.gso_fallbacks);
        assert.equal(s2.total.drops.send_error, 0);
      } finally {
        try {
          ip(A.ns, 'route', 'del', host);
        } catch {
          // already gone
        }
        await stopPair(nodes);
      }
    });
  }

  // A fresh pair each: a stray packet of an earlier test's connection (a late retransmission)
  // would count as a second queue.
  for (const format of ['udp', 'vxlan'] as const) {
    test(`${format}: 20 new TCP connections through 2 queues each stay on one queue (the TUN steers by flow)`, async () => {
      const nodes = await startPair(scope, [A, B], format, 'native');
      try {
        await connectionsStayOnOneQueue(nodes);
      } finally {
        await stopPair(nodes);
      }
    });
  }

  test('CPU-affine queues: pinned, the TUN steers by the sending CPU, traffic flows', async () => {
    const nodes = await startPair(scope, [A, B], 'vxlan', 'native', { cpuAffine: true });
    try {
      const cpus = onlineCpus();
      const stats = (await nodes[0].send({ cmd: 'stats' })).stats as Stats & { steering: string };
      // 2 queues: affine where the machine has 2 CPUs; elsewhere run unpinned, steered by flow.
      assert.equal(stats.steering, cpus === 2 ? 'cpu' : 'flow');
      await nsExecAsync(A.ns, 'ping', ['-c', '3', '-i', '0.2', '-W', '2', B.v4]);
      const tcp = await iperf(scope, B.ns, B.v4, A.ns, ['-B', A.v4, ...TCP_FIXED]);
      const after = (await nodes[1].send({ cmd: 'stats' })).stats as Stats;
      assert.ok(after.total.counters.rx_bytes! >= delivered(tcp.json));
      assert.equal(typeof after.total.counters.remote_wakeups, 'number');
    } finally {
      await stopPair(nodes);
    }
  });

  /**
   * CPU-affine steering, one queue per CPU: one UDP socket in A sends to B from CPU 0, then from
   * CPU 1, `pauseS` apart; returns how many packets each of A's queues sent meanwhile.
   */
  async function sentFromTwoCpus(gapUs: number, pauseS: number): Promise<number[] | string> {
    const cpus = onlineCpus();
    if (cpus < 2 || cpus > 16) return `CPU-affine queues need 2-16 CPUs here, not ${cpus}`;
    const nodes = await startPair(scope, [A, B], 'udp', 'native', {
      cpuAffine: true,
      workers: cpus,
      steeringGapUs: gapUs,
    });
    try {
      const stats = (await nodes[0].send({ cmd: 'stats' })).stats as Stats & { steering: string };
      assert.equal(stats.steering, 'cpu');
      const sent = async () =>
        (
          (await nodes[0].send({ cmd: 'stats' })).stats as {
            workers: { counters: Record<string, number> }[];
          }
        ).workers.map((w) => w.counters.tx_packets!);
      const before = await sent();
      // sched_setaffinity returns once the thread runs on the CPU asked for; each sendto then
      // reaches the TUN from that CPU.
      nsExec(A.ns, 'python3', [
        '-c',
        `import os, socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for cpu in (0, 1):
    time.sleep(${pauseS})
    os.sched_setaffinity(0, {cpu})
    s.sendto(b'x', ('${B.v4}', 9))`,
      ]);
      // Both packets are counted once the engine has sent them.
      let after = before;
      await waitFor(
        async () => {
          after = await sent();
          return after.reduce((a, n) => a + n, 0) - before.reduce((a, n) => a + n, 0) >= 2;
        },
        10_000,
        'A to send both packets',
      );
      return after.map((n, q) => n - before[q]!);
    } finally {
      await stopPair(nodes);
    }
  }

  test('CPU-affine steering: a flow sent from two CPUs in turn keeps the queue it started on', async (t) => {
    // A pause far longer than the test: the flow never pauses, so it never moves.
    const grew = await sentFromTwoCpus(600_000_000, 0);
    if (typeof grew === 'string') return t.skip(grew);
    assert.equal(grew.filter((d) => d > 0).length, 1, `by queue: ${grew}`);
    assert.equal(Math.max(...grew), 2);
  });

  test('CPU-affine steering: after a pause the flow moves to the sending CPU’s queue', async (t) => {
    // 1 ms of pause moves a flow; each packet follows a sleep of 200 ms (a stall only adds).
    const grew = await sentFromTwoCpus(1000, 0.2);
    if (typeof grew === 'string') return t.skip(grew);
    assert.deepEqual(
      grew,
      grew.map((_, q) => (q < 2 ? 1 : 0)),
    );
  });

  test('--dataplane-sched-fifo: the loop threads alone run SCHED_FIFO at that priority', async () => {
    const nodes = await startPair(scope, [A, B], 'vxlan', 'native', { schedFifo: 7 });
    try {
      // /proc/PID/task/TID/stat: field 40 rt_priority, 41 policy (1 = SCHED_FIFO), counted
      // after the ")" that ends the thread's name.
      const pid = nodes[0].proc.pid!;
      const fifo = readdirSync(`/proc/${pid}/task`).filter((tid) => {
        const stat = readFileSync(`/proc/${pid}/task/${tid}/stat`, 'utf8');
        const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
        return f[41 - 3] === '1' && f[40 - 3] === '7';
      });
      assert.equal(fifo.length, 2, 'one loop thread per queue');
      await nsExecAsync(A.ns, 'ping', ['-c', '2', '-i', '0.2', '-W', '2', B.v4]);
    } finally {
      await stopPair(nodes);
    }
  });
});
