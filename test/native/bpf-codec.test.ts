/**
 * The bpf engine's programs (native/bpf/weft.bpf.c) under BPF_PROG_TEST_RUN against the
 * TypeScript reference codec (src/dataplane/js-codec.ts), byte for byte, on thousands of random
 * IPv4/IPv6 packets (valid and broken), both directions, both formats:
 * - whatever the reference encapsulates to a peer on an IPv4 underlay, weft_tx encapsulates to
 *   the same UDP payload behind a valid outer IPv4 + UDP header, and redirects;
 * - whatever the reference decapsulates, weft_rx decapsulates to the same inner packet and
 *   redirects it (into the TUN's ingress);
 * - everything else is left untouched (TC_ACT_UNSPEC = TCX_NEXT, same bytes) for the next tc
 *   program and the userspace engine, which drops or sends it exactly as the reference does.
 * Nothing is attached: test runs touch no device. Needs root (bpf(2)).
 */
import assert from 'node:assert/strict';
import { readFileSync, readdirSync } from 'node:fs';
import { after, before, describe, it } from 'node:test';
import { ipFromBytes } from '../../src/common/ip.js';
import {
  BPF_COUNTERS,
  TC_ACT_REDIRECT,
  TC_ACT_UNSPEC,
  bpfObjectPath,
  loadBpfBinding,
} from '../../src/dataplane/bpf-binding.js';
import { PROBE_FAIL_ENV, outerIpv4Frame, probeBpf } from '../../src/dataplane/bpf-engine.js';
import * as js from '../../src/dataplane/js-codec.js';
import type { Format as CodecFormat } from '../../src/dataplane/js-codec.js';

/** The framings the bpf programs carry (IPIP is not one). */
type Format = Exclude<CodecFormat, 'ipip'>;
import {
  OUR_MAC,
  cfg,
  outerSource,
  randomPacket,
  table,
  tableBuf,
  vxlanFrame,
} from '../helpers/codec-corpus.js';
import { Rng, makePacket } from '../helpers/packets.js';

const root = process.getuid?.() === 0;
const LOCAL = Buffer.from([192, 168, 1, 100]);
const PORT: Record<Format, number> = { udp: 8285, vxlan: 8472 };
// BPF_PROG_TEST_RUN takes at most one page of packet: large TCP packets stay under ~3.5 KB.
const BIG_MAX = 1800;
// No GSO write on the reference side for these sizes (the kernel keeps checksum state itself).
const rxCfg = { ...cfg, tunMtu: 9000 };

function eth(type: number): Buffer {
  const h = Buffer.alloc(14);
  h.writeUInt16BE(type, 12);
  return h;
}

function etherTypeOf(p: Buffer): number {
  return p.length > 0 && p[0]! >> 4 === 6 ? 0x86dd : 0x0800;
}

/** Bytes after the IP packet's own length (the programs leave such packets to userspace). */
function hasTrailer(p: Buffer): boolean {
  if (p.length < 1) return false;
  const v = p[0]! >> 4;
  if (v === 4 && p.length >= 4) return p.readUInt16BE(2) !== p.length;
  if (v === 6 && p.length >= 6) return 40 + p.readUInt16BE(4) !== p.length;
  return false;
}

/** Shorter than an IP header: BPF_PROG_TEST_RUN refuses such frames (EINVAL), and the kernel
 * never routes one into the TUN. */
function tooShortForTestRun(p: Buffer): boolean {
  return p.length < (p.length > 0 && p[0]! >> 4 === 6 ? 40 : 20);
}

function outerFrame(src: Buffer, dport: number, payload: Buffer): Buffer {
  return outerIpv4Frame(ipv4Text(src), '192.168.1.100', dport, payload);
}

function ipv4Text(b: Buffer): string {
  return [...b.subarray(0, 4)].join('.');
}

/** The packet-count slots (bytes left out) that changed between two counter reads. */
function counterDelta(a: ArrayLike<number>, b: ArrayLike<number>): Record<string, number> {
  const d: Record<string, number> = {};
  BPF_COUNTERS.forEach((name, i) => {
    if (!name.endsWith('_bytes') && b[i] !== a[i]) d[name] = b[i]! - a[i]!;
  });
  return d;
}

/** prog_id / map_id / link_id of every bpf fd this process holds (/proc/self/fdinfo). */
function heldBpfIds(): number[] {
  const ids: number[] = [];
  for (const fd of readdirSync('/proc/self/fdinfo')) {
    let text: string;
    try {
      text = readFileSync(`/proc/self/fdinfo/${fd}`, 'utf8');
    } catch {
      continue;
    }
    for (const m of text.matchAll(/^(?:prog|map|link)_id:\s+(\d+)$/gm)) ids.push(Number(m[1]));
  }
  return ids;
}

describe(
  'bpf programs == TypeScript reference (BPF_PROG_TEST_RUN)',
  { skip: !root && 'needs root (bpf(2))' },
  () => {
    const bpf = root ? loadBpfBinding() : null;
    const ids: Partial<Record<Format, number>> = {};

    before(() => {
      for (const format of ['udp', 'vxlan'] as Format[]) {
        const id = bpf!.bpfLoad(bpfObjectPath());
        ids[format] = id;
        bpf!.bpfConfigure(id, {
          format,
          vni: cfg.vni,
          vtepMac: OUR_MAC,
          port: PORT[format],
          localV4: '192.168.1.100',
        });
        bpf!.bpfSetPeers(id, tableBuf);
      }
    });
    after(() => {
      for (const id of Object.values(ids)) bpf!.bpfClose(id);
    });

    for (const format of ['udp', 'vxlan'] as Format[]) {
      it(`${format} encap matches on 4000 random packets`, () => {
        const id = ids[format]!;
        const rng = new Rng(format === 'udp' ? 111 : 112);
        let handled = 0;
        let passed = 0;
        const before = bpf!.bpfCounters(id);
        for (let i = 0; i < 4000; i++) {
          const p = randomPacket(rng, BIG_MAX);
          if (tooShortForTestRun(p)) continue;
          const frame = Buffer.concat([eth(etherTypeOf(p)), p]);
          const r = bpf!.bpfTestRun(id, 'tx', frame);
          const ref = js.encap(format, table, cfg, p);
          const peer = ref.peer === null ? null : table.peers[ref.peer]!;
          const want = ref.drop === 'none' && peer!.publicIP.family === 4 && !hasTrailer(p);
          const what = `packet ${i} ${p.toString('hex')}`;
          if (!want) {
            assert.equal(r.verdict, TC_ACT_UNSPEC, `${what}: left to the next program`);
            assert.ok(r.data.equals(frame), `${what}: untouched`);
            passed++;
            continue;
          }
          handled++;
          const payload = ref.payload!;
          assert.equal(r.verdict, TC_ACT_REDIRECT, what);
          assert.equal(r.data.length, 14 + 28 + payload.length, what);
          assert.ok(r.data.subarray(42).equals(payload), `${what}: UDP payload`);
          const o = r.data.subarray(14, 42);
          assert.equal(o[0], 0x45, what);
          assert.equal(o.readUInt16BE(2), 28 + payload.length, `${what}: outer length`);
          assert.equal(o.readUInt16BE(6), 0, `${what}: DF clear, not a fragment`);
          assert.equal(o[8], 64, `${what}: outer TTL`);
          assert.equal(o[9], 17, what);
          assert.equal(js.checksum(o, 0, 20), 0, `${what}: outer IPv4 checksum`);
          assert.deepEqual(o.subarray(12, 16), LOCAL, `${what}: outer source`);
          assert.equal(ipFromBytes(o.subarray(16, 20)).addr, peer!.publicIP.addr, what);
          const sport = format === 'vxlan' ? js.vxlanSourcePort(p) : PORT.udp;
          assert.equal(o.readUInt16BE(20), sport, `${what}: source port`);
          assert.equal(o.readUInt16BE(22), peer!.port, `${what}: destination port`);
          assert.equal(o.readUInt16BE(24), 8 + payload.length, `${what}: UDP length`);
          assert.equal(o.readUInt16BE(26), 0, `${what}: UDP checksum 0, as kernel vxlan over IPv4`);
        }
        assert.ok(handled > 1000 && passed > 500, `handled ${handled}, passed ${passed}`);
        // Every packet counted once, under what happened to it.
        assert.deepEqual(counterDelta(before, bpf!.bpfCounters(id)), {
          tx_packets: handled,
          tx_passed: passed,
        });
      });

      it(`${format} decap matches on 4000 random datagrams`, () => {
        const id = ids[format]!;
        const rng = new Rng(format === 'udp' ? 121 : 122);
        let handled = 0;
        let passed = 0;
        const before = bpf!.bpfCounters(id);
        for (let i = 0; i < 4000; i++) {
          const p = randomPacket(rng, BIG_MAX);
          const d = format === 'vxlan' ? vxlanFrame(rng, p) : p;
          let src = outerSource(rng, p);
          // The programs take IPv4 underlays; an IPv6 stranger becomes an IPv4 one.
          if (src.length !== 4) src = src.subarray(0, 4);
          const frame = outerFrame(src, PORT[format], d);
          const r = bpf!.bpfTestRun(id, 'rx', frame);
          const ref = js.decap(format, table, rxCfg, ipFromBytes(src), d);
          const inner = d.subarray(format === 'vxlan' ? js.VXLAN_ENCAP_LEN : 0);
          const want = ref.drop === 'none' && !hasTrailer(inner);
          const what = `datagram ${i} ${d.toString('hex')}`;
          assert.equal(r.verdict, want ? TC_ACT_REDIRECT : TC_ACT_UNSPEC, what);
          if (!want) {
            assert.ok(r.data.equals(frame), `${what}: untouched`);
            passed++;
            continue;
          }
          handled++;
          assert.equal(ref.tun![1], 0, `${what}: no GSO write on the reference side`);
          assert.ok(r.data.subarray(14).equals(ref.tun!.subarray(10)), `${what}: inner packet`);
          assert.equal(r.data.readUInt16BE(12), etherTypeOf(inner), `${what}: EtherType`);
        }
        assert.ok(handled > 1000 && passed > 500, `handled ${handled}, passed ${passed}`);
        // Every datagram (all to our address and port) counted once: decapsulated or passed,
        // never both, none as an error.
        assert.deepEqual(counterDelta(before, bpf!.bpfCounters(id)), {
          rx_packets: handled,
          rx_passed: passed,
        });
      });
    }

    it('datagrams to another port or address, and fragments, are not looked at', () => {
      const id = ids.vxlan!;
      const rng = new Rng(131);
      const p = randomPacket(rng, BIG_MAX);
      const good = outerFrame(Buffer.from([192, 168, 1, 2]), PORT.vxlan, vxlanFrame(rng, p));
      const variants = [
        outerFrame(Buffer.from([192, 168, 1, 2]), 4789, vxlanFrame(rng, p)),
        Buffer.from(good).fill(7, 30, 34), // another destination address
        (() => {
          const f = Buffer.from(good);
          f.writeUInt16BE(0x2000, 20); // more fragments
          return f;
        })(),
      ];
      const before = bpf!.bpfCounters(id)[BPF_COUNTERS.indexOf('rx_passed')]!;
      for (const f of variants) {
        const r = bpf!.bpfTestRun(id, 'rx', f);
        assert.equal(r.verdict, TC_ACT_UNSPEC);
        assert.deepEqual(r.data, f);
      }
      // Not ours at all: not even counted as passed.
      assert.equal(bpf!.bpfCounters(id)[BPF_COUNTERS.indexOf('rx_passed')], before);
    });

    it('a GSO packet cannot be encapsulated under a test run (the kernel sees no gso_type)', () => {
      // BPF_PROG_TEST_RUN sets gso_size and gso_segs but not gso_type, and adjust_room refuses UDP
      // tunnel encap of a GSO skb that is neither TCP nor UDP_L4 GSO: the program leaves it to
      // userspace. Real GSO packets are covered by the namespace tests (TSO across the veth).
      const id = ids.vxlan!;
      const rng = new Rng(141);
      const p = makePacket(rng, {
        src: Buffer.from([10, 9, 0, 2]),
        dst: Buffer.from([10, 5, 1, 7]),
        proto: 6,
        payloadLen: 2800,
      });
      const frame = Buffer.concat([eth(0x0800), p]);
      assert.equal(bpf!.bpfTestRun(id, 'tx', frame).verdict, TC_ACT_REDIRECT, 'without GSO');
      const r = bpf!.bpfTestRun(id, 'tx', frame, 1400, 2);
      assert.equal(r.verdict, TC_ACT_UNSPEC);
      assert.deepEqual(r.data, frame);
    });

    it('counters count what moved and what was left to userspace', () => {
      const c = bpf!.bpfCounters(ids.vxlan!);
      assert.equal(c.length, BPF_COUNTERS.length);
      assert.ok(c[BPF_COUNTERS.indexOf('tx_packets')]! > 1000);
      assert.ok(c[BPF_COUNTERS.indexOf('rx_packets')]! > 1000);
      assert.ok(c[BPF_COUNTERS.indexOf('tx_passed')]! > 500);
    });

    it('the start probe accepts the programs for both formats; the test knob fails it', () => {
      for (const format of ['udp', 'vxlan'] as Format[]) {
        const id = bpf!.bpfLoad(bpfObjectPath());
        try {
          const opts = {
            format,
            engine: 'bpf' as const,
            tunName: 'unused',
            workers: 1,
            bindIp: '192.0.2.10',
            port: PORT[format],
            tunMtu: 1450,
            vni: 7,
            vtepMac: OUR_MAC,
          };
          probeBpf(bpf!, id, opts);
          process.env[PROBE_FAIL_ENV] = '1';
          assert.throws(() => probeBpf(bpf!, id, opts), { code: 'WEFT_ERR_BPF_UNAVAILABLE' });
          delete process.env[PROBE_FAIL_ENV];
          assert.throws(() => probeBpf(bpf!, id, { ...opts, bindIp: 'fd00::1' }), /not IPv4/);
        } finally {
          delete process.env[PROBE_FAIL_ENV];
          bpf!.bpfClose(id);
        }
      }
    });

    it('close releases every program and map this process held', () => {
      const id = bpf!.bpfLoad(bpfObjectPath());
      const held = bpf!.bpfObjectIds(id);
      assert.equal(held.length, 9, 'three programs and six maps');
      const open = heldBpfIds();
      for (const x of held) assert.ok(open.includes(x), `id ${x} held through an fd`);
      bpf!.bpfClose(id);
      assert.throws(() => bpf!.bpfObjectIds(id), /no such engine/);
      const still = heldBpfIds();
      assert.deepEqual(
        held.filter((x) => still.includes(x)),
        [],
        'no fd of this process refers to them',
      );
    });
  },
);
