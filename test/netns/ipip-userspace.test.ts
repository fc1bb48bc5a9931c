/**
 * The ipip backend with the userspace dataplane on the native engine (raw sockets), end to end:
 * real `weft daemon`s (embedded store) in namespaces built by src/testbed/cluster.ts, net-conf
 * `"Backend": {"Type": "ipip", "Dataplane": "auto"}` (here the kernel has no ipip module, so auto
 * picks userspace; where it has one, the suite asks for "userspace" itself and says so in its
 * name) and --dataplane-engine=native (auto would run the bpf engine: bpf-daemon.test.ts, and
 * bpf-engine.test.ts for its IPIP framing):
 *
 *            underlay br0 (L2)                                   10.250.0.0/24
 *     ┌──────────┼──────────────┬──────────────┐
 *   node 0     node 1         node 2         each: TUN flannel.ipip (MTU 1480, 10.5.X.0/32,
 *   eth0 .1    eth0 .2        eth0 .3        route 10.5.0.0/16), raw IPPROTO_IPIP sockets
 *   pod 0.0    pod 1.0        pod 2.0        on eth0's address
 *
 * Every pod pair pings; iperf3 TCP and UDP; the packets on the wire are RFC 2003 IPIP exactly as
 * the kernel's flannel.ipip device frames them (captured with tcpdump, checked field by field
 * and against the reference codec); a flood of raw protocol-4 packets from a lease holder and
 * from a stranger is dropped and counted while pods keep pinging; spoofed inner sources are all
 * dropped; every bad packet is counted.
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { ipToBytes, parseCIDR, parseIP } from '../../src/common/ip.js';
import * as js from '../../src/dataplane/js-codec.js';
import { JsPeerTable, encodePeerTable } from '../../src/dataplane/peer-table.js';
import { Cluster, PACKAGE_ROOT, waitFor } from '../../src/testbed/cluster.js';
import { isRoot, nsExecAsync } from '../../src/testbed/netns.js';
import { assertPodToPod } from '../helpers/carried.js';
import { droppedByReason, receiveDrops } from '../../src/testbed/drops.js';
import { scrape } from '../helpers/scrape.js';
import { ipipMissing } from '../helpers/ipip.js';
import { captureText, tcpdumpListening } from '../helpers/capture.js';

const missing = isRoot() ? ipipMissing() : null;
const skip = isRoot() ? false : 'needs root (network namespaces)';
const dataplane = missing !== null ? 'auto' : 'userspace';
const HEALTH_PORT = '9094';
const SEND = join(PACKAGE_ROOT, 'test/helpers/ipip-send.py');

function metrics(ns: string): Promise<string> {
  return scrape(ns, HEALTH_PORT);
}

async function send(ns: string, args: Record<string, unknown>): Promise<number> {
  const out = await nsExecAsync(ns, 'python3', [SEND, JSON.stringify(args)], 60_000);
  return (JSON.parse(out) as { sent: number }).sent;
}

async function ping(ns: string, dst: string, extra: string[] = [], count = 1): Promise<string> {
  // -w: wait (≤ 30 s) for `count` replies, sending on meanwhile: a late reply is no failure.
  const args = ['-c', String(count), '-i', '0.1', '-w', '30', ...extra, dst];
  return nsExecAsync(ns, 'ping', args, 60_000);
}

/** The IPIP packets of a pcap file (Ethernet link type), each from its outer IP header on. */
function pcapIpv4(file: string): Buffer[] {
  const b = readFileSync(file);
  assert.equal(b.readUInt32LE(0), 0xa1b2c3d4, 'pcap magic (little-endian, µs)');
  assert.equal(b.readUInt32LE(20), 1, 'Ethernet link type');
  const out: Buffer[] = [];
  for (let o = 24; o + 16 <= b.length;) {
    const len = b.readUInt32LE(o + 8);
    const frame = b.subarray(o + 16, o + 16 + len);
    if (frame.readUInt16BE(12) === 0x0800 && frame[14 + 9] === 4) out.push(frame.subarray(14));
    o += 16 + len;
  }
  return out;
}

describe(`ipip backend, Dataplane "${dataplane}", userspace across 3 nodes`, { skip }, () => {
  let c: Cluster;
  before(async () => {
    c = await Cluster.create({
      backend: { Type: 'ipip', Dataplane: dataplane },
      flags: [
        '--dataplane-engine',
        'native',
        '--healthz-port',
        HEALTH_PORT,
        '--healthz-ip',
        '127.0.0.1',
      ],
    });
  });
  after(async () => {
    await c?.destroy();
  });

  test('auto picked the userspace dataplane: flannel.ipip is a TUN, MTU interface − 20, subnet address, network route', () => {
    if (dataplane === 'auto') {
      assert.ok(
        c.nodes[0]!.logs.some((l) => l.msg === 'no kernel ipip; using the userspace dataplane'),
        'auto did not say it fell back',
      );
    }
    const link = c.ipIn(0, '-d', 'link', 'show', 'flannel.ipip');
    assert.match(link, /mtu 1480/);
    assert.match(link, /\btun\b/);
    const net = c.nodes[0]!.env.FLANNEL_SUBNET!.replace(/\.1\/24$/, '.0');
    assert.match(c.ipIn(0, 'addr', 'show', 'flannel.ipip'), new RegExp(`inet ${net}/32`));
    assert.match(c.ipIn(0, 'route', 'show', '10.5.0.0/16'), /dev flannel\.ipip/);
    assert.equal(c.nodes[0]!.env.FLANNEL_MTU, '1480');
  });

  test('every pod pair pings', async () => {
    await waitFor(
      async () => {
        await ping(c.pods[0]!.ns, c.pods[1]!.ip);
        return true;
      },
      30_000,
      'first ping',
    );
    for (const a of c.pods) for (const b of c.pods) if (a !== b) await ping(a.ns, b.ip);
  });

  test('iperf3 TCP and UDP carry traffic pod to pod, through the dataplane', async () => {
    // Mechanism, not rate: what arrived, and the receiving node's counters holding it (a bit
    // rate or a loss figure depends on machine load).
    await assertPodToPod(c, c.pods[0]!, c.pods[1]!, (ns) => metrics(ns));
  });

  test('on the wire: RFC 2003 IPIP as the kernel flannel.ipip device sends it (TTL, DF, ECN of the inner packet; DSCP 0; protocol 4)', async () => {
    const [n0, n1] = [c.nodes[0]!, c.nodes[1]!];
    const file = join(c.dir, 'ipip.pcap');
    const cap = c.scope.spawn(n1.ns, 'tcpdump', [
      '-n',
      '--immediate-mode', // else packets wait in a 1 s block that SIGINT throws away
      '-U',
      '-Z',
      'root',
      '-s',
      '0',
      '-i',
      'eth0',
      '-w',
      file,
    ]);
    const exited = new Promise((r) => cap.once('exit', r));
    await tcpdumpListening(cap);
    // DF set, TOS 0xb8 + ECT(1), TTL 50; then DF clear, TOS 0x03 (CE), TTL 33.
    await ping(c.pods[0]!.ns, c.pods[1]!.ip, ['-M', 'do', '-Q', '0xb9', '-t', '50'], 3);
    await ping(
      c.pods[0]!.ns,
      c.pods[1]!.ip,
      ['-M', 'dont', '-Q', '0x03', '-t', '33', '-s', '1200'],
      3,
    );
    // tcpdump writes each packet as it reads it (-U): stop once the file holds the six pings'
    // requests, however long a loaded machine takes to get tcpdump there.
    const n0Ip = ipToBytes(parseIP(n0.ip)!);
    const fromNode0 = () => pcapIpv4(file).filter((p) => p.subarray(12, 16).equals(n0Ip));
    await waitFor(
      () => fromNode0().length >= 6,
      30_000,
      'six IPIP packets from node 0 captured',
    ).catch(
      () => undefined, // the assertion below names what was captured
    );
    cap.kill('SIGINT');
    await exited;
    const pkts = pcapIpv4(file);
    const fromN0 = fromNode0();
    assert.ok(
      fromN0.length >= 6,
      `captured ${pkts.length} IPIP packets, ${fromN0.length} from node 0`,
    );
    // The reference codec, given node 1's lease and node 0's address, must produce each
    // captured packet byte for byte but for the ID (and so the header checksum).
    const n1Subnet = n1.env.FLANNEL_SUBNET!.replace(/\.1\/24$/, '.0/24');
    const table = new JsPeerTable(
      encodePeerTable([
        { subnet: parseCIDR(n1Subnet)!, publicIP: parseIP(n1.ip)!, port: 0, vtepMac: null },
      ]),
    );
    const cfg = {
      vni: 0,
      vtepMac: Buffer.alloc(6),
      tunMtu: 1480,
      localIp: ipToBytes(parseIP(n0.ip)!),
    };
    let df = 0;
    for (const o of fromN0) {
      const inner = o.subarray(20);
      assert.equal(o[0], 0x45, 'version 4, IHL 5');
      assert.equal(o[9], 4, 'protocol 4');
      assert.equal(o.readUInt16BE(2), o.length, 'total length');
      assert.equal(js.checksum(o, 0, 20), 0, 'header checksum');
      assert.deepEqual(o.subarray(16, 20), ipToBytes(parseIP(n1.ip)!), 'to the peer PublicIP');
      assert.equal(o[8], inner[8], 'TTL inherited from the inner packet');
      assert.equal(o[1]! & 0xfc, 0, 'DSCP 0');
      const ecn = inner[1]! & 3;
      assert.equal(o[1]! & 3, ecn === 3 ? 2 : ecn, 'ECN copied, CE sent as ECT(0)');
      assert.equal(o.readUInt16BE(6) & 0xbfff, 0, 'no fragment');
      assert.equal(o[6]! & 0x40, inner[6]! & 0x40, 'DF copied from the inner packet');
      if ((o[6]! & 0x40) !== 0) df++;
      const ref = js.encap('ipip', table, cfg, inner);
      assert.equal(ref.drop, 'none');
      const masked = (b: Buffer) =>
        Buffer.concat([b.subarray(0, 4), b.subarray(6, 10), b.subarray(12)]);
      assert.deepEqual(masked(o), masked(ref.payload!), 'the reference codec frames it the same');
    }
    assert.ok(df > 0 && df < fromN0.length, `both DF cases seen (${df}/${fromN0.length} with DF)`);
    assert.ok(fromN0.some((o) => o[8] === 49) && fromN0.some((o) => o[8] === 32), 'TTLs 49 and 32');
  });

  test('a flood of raw IPIP packets (a lease holder, a stranger) is dropped and counted while pods keep pinging', async () => {
    const target = c.nodes[1]!;
    const before = droppedByReason(await metrics(target.ns));
    const [sent, sentStranger, pings] = await Promise.all([
      send(c.nodes[0]!.ns, {
        mode: 'random',
        outerSrc: c.nodes[0]!.ip,
        target: target.ip,
        seconds: 4,
      }),
      send(c.nodes[2]!.ns, {
        mode: 'random',
        outerSrc: '10.250.0.99',
        target: target.ip,
        seconds: 4,
      }),
      // No -w: replies during the flood, not after it. How many of them is the machine's load.
      nsExecAsync(c.pods[0]!.ns, 'ping', ['-c', '30', '-i', '0.1', '-W', '2', c.pods[1]!.ip]),
    ]);
    assert.ok(sent > 1000 && sentStranger > 1000, `sent ${sent} + ${sentStranger}`);
    assert.match(pings, / [1-9]\d* received/, pings);
    assert.equal(target.daemon!.exitCode, null, 'daemon alive');
    await ping(c.pods[0]!.ns, c.pods[1]!.ip, [], 3);
    const after = droppedByReason(await metrics(target.ns));
    const d = (r: string) => (after[r] ?? 0) - (before[r] ?? 0);
    assert.ok(d('unknown_source') > 500, `unknown_source ${d('unknown_source')}`);
    const garbage = d('malformed') + d('truncated') + d('spoofed_source');
    assert.ok(garbage > 500, `malformed+truncated+spoofed ${garbage}`);
  });

  test('spoofed inner sources are all dropped, none forwarded', async () => {
    const target = c.nodes[1]!;
    const before = droppedByReason(await metrics(target.ns));
    const other = c.nodes[2]!.env.FLANNEL_SUBNET!.replace(/\.1\/24$/, '.77');
    let sent = 0;
    // What reaches the pod meanwhile: nothing from the spoofed source.
    const reached = await captureText(c.scope, c.pods[1]!.ns, `src host ${other}`, 1, async () => {
      sent = await send(c.nodes[0]!.ns, {
        mode: 'spoof',
        outerSrc: c.nodes[0]!.ip,
        target: target.ip,
        count: 300,
        innerSrc: other,
        innerDst: c.pods[1]!.ip,
      });
    });
    assert.equal(sent, 300);
    assert.equal(reached.trim(), '', `a spoofed packet reached the pod: ${reached}`);
    await waitFor(
      async () => {
        const after = droppedByReason(await metrics(target.ns));
        return (after.spoofed_source ?? 0) - (before.spoofed_source ?? 0) >= 300;
      },
      15_000,
      'spoofed drops counted',
    );
    const after = droppedByReason(await metrics(target.ns));
    assert.equal((after.spoofed_source ?? 0) - (before.spoofed_source ?? 0), 300);
  });

  test('every bad packet is counted (no inner packet, cut, IPv6 inside, too long, random)', async () => {
    const target = c.nodes[1]!;
    const before = receiveDrops(await metrics(target.ns));
    const sent = await send(c.nodes[0]!.ns, {
      mode: 'mixed',
      outerSrc: c.nodes[0]!.ip,
      target: target.ip,
      count: 360,
    });
    assert.equal(sent, 360);
    let counted = 0;
    await waitFor(
      async () => {
        counted = receiveDrops(await metrics(target.ns)) - before;
        return counted >= sent;
      },
      15_000,
      'every bad packet counted',
    ).catch(() => undefined);
    assert.equal(counted, sent, JSON.stringify(droppedByReason(await metrics(target.ns))));
  });
});
