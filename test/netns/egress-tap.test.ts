/**
 * Egress-TAP TX (tap_gso, native/src/tap_tx.h): TCP leaves node A as whole encapsulated
 * super-packets written into a TAP, which the kernel forwards to the underlay. A's underlay is
 * forced to software segmentation and checksums (`ethtool -K va tx off tx-udp_tnl-segmentation
 * off`), so the kernel cuts every super-packet itself and computes every checksum on the way out;
 * the receiver's /proc/net/snmp (read in its namespace) must count no UDP or TCP checksum error.
 *
 *   ns A (weft native, TAP "flannel.1-tx")       ns B (weft native, or a kernel vxlan device)
 *   veth va 192.168.77.1/24, fd77::1/64 ──────── veth vb 192.168.77.2/24, fd77::2/64
 *
 * Both formats with an IPv4 and an IPv6 underlay against weft, VXLAN against a kernel vxlan
 * device, and the start-up probe forced to fail (WEFT_TEST_TAP_PROBE_FAIL): the engine then runs
 * on split + UDP GSO.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { offloadsFromEnv } from '../../src/dataplane/offloads.js';
import { NetnsScope, ip, isRoot, nsExec, nsExecAsync } from '../../src/testbed/netns.js';
import { iperf } from '../../src/testbed/probes.js';
import { delivered } from '../helpers/carried.js';
import {
  type Node,
  type Side,
  type Stats,
  addKernelVxlan,
  peersOf,
  startNode,
  stopPair,
  twoNodes,
} from '../helpers/dataplane-pair.js';

const skip = !isRoot()
  ? 'needs root (network namespaces)'
  : !offloadsFromEnv().includes('tap_gso')
    ? 'tap_gso is off (WEFT_DATAPLANE_OFFLOADS): no egress TAP to test'
    : false;

type Full = Stats & { total: { drops: Record<string, number> } };

/** InCsumErrors of the Udp and Tcp rows of /proc/net/snmp in `ns`. */
function csumErrors(ns: string): { udp: number; tcp: number } {
  const rows = nsExec(ns, 'cat', ['/proc/net/snmp']).split('\n');
  const field = (proto: string) => {
    const [names, values] = rows
      .filter((l) => l.startsWith(`${proto}:`))
      .map((l) => l.split(/\s+/));
    return Number(values![names!.indexOf('InCsumErrors')]);
  };
  return { udp: field('Udp'), tcp: field('Tcp') };
}

describe('egress-TAP TX between two namespaces', { skip }, () => {
  const scope = new NetnsScope();
  let A: Side;
  let B: Side;
  before(() => {
    [A, B] = twoNodes(scope);
    ip(A.ns, 'addr', 'add', 'fd77::1/64', 'dev', 'va', 'nodad');
    ip(B.ns, 'addr', 'add', 'fd77::2/64', 'dev', 'vb', 'nodad');
    // A's underlay segments and checksums in software: every super-packet is cut by the kernel.
    nsExec(A.ns, 'ethtool', ['-K', 'va', 'tx', 'off', 'tx-udp_tnl-segmentation', 'off']);
  });
  after(() => scope.cleanup());

  async function start(side: Side, format: 'udp' | 'vxlan', extra = {}): Promise<Node> {
    const n = startNode(scope, side, format, 'native', extra);
    const ready = await n.ready;
    assert.equal(ready.ready, true, JSON.stringify(ready));
    return n;
  }
  const stats = async (n: Node) => (await n.send({ cmd: 'stats' })).stats as Full;

  /**
   * A and B at once (each start waits on its own namespace only); `envA` is set while A's
   * process is spawned, for A alone.
   */
  async function startBoth(
    format: 'udp' | 'vxlan',
    extraA: Record<string, unknown> = {},
    extraB: Record<string, unknown> = {},
    envA: Record<string, string> = {},
  ): Promise<[Node, Node]> {
    Object.assign(process.env, envA);
    let a: Node;
    try {
      a = startNode(scope, A, format, 'native', extraA);
    } finally {
      for (const k of Object.keys(envA)) delete process.env[k];
    }
    const b = startNode(scope, B, format, 'native', extraB);
    for (const n of [a, b]) {
      const ready = await n.ready;
      assert.equal(ready.ready, true, JSON.stringify(ready));
    }
    return [a, b];
  }

  /**
   * iperf3 TCP from A to B: a fixed amount (`mib` MiB, however long it takes on a loaded
   * machine), asserted arrived (iperf3's server stops counting when the sender is done, so what
   * it reports can be a little less than what was sent).
   */
  async function tcp(mib: number, v6 = false): Promise<void> {
    const [src, dst] = v6 ? [A.v6, B.v6] : [A.v4, B.v4];
    delivered((await iperf(scope, B.ns, dst, A.ns, ['-B', src, '-n', `${mib}M`])).json);
  }

  /** Peers of `s` reached over the IPv6 underlay. */
  const peers6 = (s: Side, format: 'udp' | 'vxlan') =>
    peersOf(s, format).map((p) => ({ ...p, publicIP: s === A ? 'fd77::1' : 'fd77::2' }));

  for (const format of ['udp', 'vxlan'] as const) {
    for (const v6 of [false, true]) {
      const under = v6 ? 'IPv6' : 'IPv4';
      test(`${format}, ${under} underlay: TCP leaves by the TAP as whole super-packets, the receiver counts no checksum error`, async () => {
        // An IPv6 underlay costs 20 bytes more (a forwarded IPv6 packet is never fragmented).
        const v6mtu = { tunMtu: format === 'udp' ? 1452 : 1430 };
        const nodes = await startBoth(
          format,
          v6 ? { bindIp: 'fd77::1', ...v6mtu } : {},
          v6 ? { bindIp: 'fd77::2', ...v6mtu } : {},
        );
        try {
          await nodes[0].send({ cmd: 'peers', peers: v6 ? peers6(B, format) : peersOf(B, format) });
          await nodes[1].send({ cmd: 'peers', peers: v6 ? peers6(A, format) : peersOf(A, format) });
          const s0 = await stats(nodes[0]);
          assert.equal(s0.offloads.tap_gso, true, JSON.stringify(s0.offloads));
          const errs0 = csumErrors(B.ns);
          await nsExecAsync(A.ns, 'ping', ['-c', '2', '-i', '0.2', '-W', '2', B.v4]);
          await tcp(32);
          await tcp(4, true); // IPv6 inner TCP
          const s = await stats(nodes[0]);
          const c = s.total.counters;
          // Super-packets went whole: far fewer TAP frames than the segments they carried.
          assert.ok(c.tap_writes! > 100, JSON.stringify(c));
          assert.ok(c.tso_segments! > 2 * c.tap_writes!, JSON.stringify(c));
          assert.equal(c.tap_disabled, 0);
          assert.equal(s.total.drops.send_error, 0, JSON.stringify(s.total.drops));
          // The receiver took what the kernel cut and checksummed: all of it, no checksum error.
          const r = (await stats(nodes[1])).total.counters;
          assert.ok(r.rx_packets! > 1000, JSON.stringify(r));
          assert.deepEqual(csumErrors(B.ns), errs0);
        } finally {
          await stopPair(nodes);
        }
      });
    }
  }

  test('vxlan: the TAP path against a kernel vxlan device, no checksum error there', async () => {
    let a: Node | undefined;
    try {
      addKernelVxlan(B, 'vb', A);
      a = await start(A, 'vxlan');
      await a.send({ cmd: 'peers', peers: peersOf(B, 'vxlan') });
      const errs0 = csumErrors(B.ns);
      await nsExecAsync(A.ns, 'ping', ['-c', '2', '-i', '0.2', '-W', '2', B.v4]);
      await tcp(32);
      await tcp(4, true); // IPv6 inner TCP
      const c = (await stats(a)).total.counters;
      assert.ok(c.tap_writes! > 100 && c.tso_segments! > 2 * c.tap_writes!, JSON.stringify(c));
      assert.deepEqual(csumErrors(B.ns), errs0);
    } finally {
      if (a) {
        const node = a;
        const exited = new Promise((r) => node.proc.once('exit', r));
        await node.send({ cmd: 'close' });
        await exited;
      }
      ip(B.ns, 'link', 'del', 'vx');
    }
  });

  test('vxlan: a frame the TAP refuses at run time (WEFT_TEST_TAP_FAIL_AT) switches the engine back to the sockets for good, nothing lost', async () => {
    const nodes = await startBoth('vxlan', { workers: 1 }, {}, { WEFT_TEST_TAP_FAIL_AT: '200' });
    try {
      await nodes[0].send({ cmd: 'peers', peers: peersOf(B, 'vxlan') });
      await nodes[1].send({ cmd: 'peers', peers: peersOf(A, 'vxlan') });
      assert.equal((await stats(nodes[0])).offloads.tap_gso, true);
      const errs0 = csumErrors(B.ns);
      await tcp(32);
      const s = await stats(nodes[0]);
      const c = s.total.counters;
      // Frames 1..199 went by the TAP, frame 200 was refused and went by the sockets, as did
      // everything after it (split + UDP GSO).
      assert.equal(c.tap_disabled, 1, JSON.stringify(c));
      assert.equal(c.tap_writes, 199, JSON.stringify(c));
      assert.ok(c.gso_sends! > 0, JSON.stringify(c));
      assert.equal(s.total.drops.send_error, 0, JSON.stringify(s.total.drops));
      assert.deepEqual(csumErrors(B.ns), errs0);
    } finally {
      await stopPair(nodes);
    }
  });

  for (const format of ['udp', 'vxlan'] as const) {
    test(`${format}: the probe refused (WEFT_TEST_TAP_PROBE_FAIL): split + UDP GSO, traffic flows`, async () => {
      const nodes = await startBoth(format, {}, {}, { WEFT_TEST_TAP_PROBE_FAIL: '1' });
      try {
        await nodes[0].send({ cmd: 'peers', peers: peersOf(B, format) });
        await nodes[1].send({ cmd: 'peers', peers: peersOf(A, format) });
        assert.equal((await stats(nodes[0])).offloads.tap_gso, false);
        assert.equal((await stats(nodes[1])).offloads.tap_gso, true);
        // No TAP left behind in A: the engine closed it when the probe failed.
        assert.doesNotMatch(nsExec(A.ns, 'ip', ['-o', 'link']), /-tx[:@]/);
        const errs0 = csumErrors(B.ns);
        await tcp(32);
        const c = (await stats(nodes[0])).total.counters;
        assert.equal(c.tap_writes, 0);
        assert.ok(c.gso_sends! > 0, JSON.stringify(c));
        assert.deepEqual(csumErrors(B.ns), errs0);
      } finally {
        await stopPair(nodes);
      }
    });
  }
});
