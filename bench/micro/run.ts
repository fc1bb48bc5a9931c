/**
 * Micro-benchmarks (issue 5, DESIGN §8): the per-packet codec, the peer-table lookup and the
 * Internet checksum, native (the addon's test exports, src/dataplane/binding.ts) against the
 * TypeScript reference (src/dataplane/js-codec.ts), with tinybench. Never part of `npm test`;
 * nothing here asserts a time. Run: `npm run bench:micro` (no root needed).
 *
 *     JS ──N-API call──► codecEncap(format, table, cfg, packet)   one call per packet: parses the
 *                        codecDecap(format, table, cfg, src, dgram) table buffer (PeerTable::Build),
 *                        peerLookup(table, addr)                   copies in, runs the codec,
 *                        checksum(buf)                             copies out, builds a result
 *
 * The engine itself never pays any of that per packet (it stays in C++), so the native codec rows
 * are an upper bound on the codec's cost; the "binding" rows measure the call floor so the reader
 * can subtract it. Each task runs an inner loop of N operations per sample (sub-microsecond work
 * saturates the timer otherwise) and reports the median sample divided by N, which resists the
 * noise of a shared machine better than the mean.
 *
 * Output: a table on stdout and bench/results/micro-latest.md.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { cpus, loadavg } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Bench } from 'tinybench';
import { ipToBytes, parseIP } from '../../src/common/ip.js';
import { loadDataplaneBinding } from '../../src/dataplane/binding.js';
import * as js from '../../src/dataplane/js-codec.js';
import type { Format } from '../../src/dataplane/js-codec.js';
import { JsPeerTable, encodePeerTable, peerEntry } from '../../src/dataplane/peer-table.js';
import type { PeerEntry } from '../../src/dataplane/peer-table.js';

const RESULTS = join(dirname(fileURLToPath(import.meta.url)), '..', 'results', 'micro-latest.md');
const TIME_MS = Number(process.env.WEFT_MICRO_TIME_MS ?? 400);
const OUR_MAC = Buffer.from([0x02, 0x11, 0x22, 0x33, 0x44, 0x55]);
const PEER_MAC = '02:00:00:00:00:02';
const CFG = { vni: 1, vtepMac: OUR_MAC, tunMtu: 1450 };
const OUR_PUBLIC = '192.168.50.1';
const PEER_PUBLIC = '192.168.50.2';

interface Row {
  readonly group: string;
  readonly name: string;
  /** Median (over samples) nanoseconds per operation. */
  readonly ns: number;
  /** Relative margin of error of the per-sample mean, percent. */
  readonly rme: number;
  /** Bytes per operation, for a GB/s column; 0 when not a throughput figure. */
  readonly bytes: number;
}

// ---- inputs ----

function ones(buf: Buffer, start: number, end: number): number {
  return js.checksum(buf, start, end);
}

/** An IPv4/UDP packet of `total` bytes from 10.5.1.10 to `dst`, checksums valid. */
function udpPacket(total: number, src: string, dst: string): Buffer {
  const b = Buffer.alloc(total);
  b[0] = 0x45;
  b.writeUInt16BE(total, 2);
  b.writeUInt16BE(0x1234, 4);
  b.writeUInt16BE(0x4000, 6);
  b[8] = 64;
  b[9] = 17;
  ipToBytes(parseIP(src)!).copy(b, 12);
  ipToBytes(parseIP(dst)!).copy(b, 16);
  b.writeUInt16BE(ones(b, 0, 20), 10);
  b.writeUInt16BE(40000, 20);
  b.writeUInt16BE(5201, 22);
  b.writeUInt16BE(total - 20, 24);
  for (let i = 28; i < total; i++) b[i] = (i * 7) & 0xff;
  const pseudo = Buffer.alloc(12);
  b.copy(pseudo, 0, 12, 20);
  pseudo[9] = 17;
  pseudo.writeUInt16BE(total - 20, 10);
  let c = js.checksum(b, 20, total, js.checksumSum(pseudo, 0, 12));
  if (c === 0) c = 0xffff;
  b.writeUInt16BE(c, 26);
  return b;
}

/** `n` peers: 10.5.<i>.0/24 (i < 256) then 10.<6+i/256>.<i%256>.0/24, one public IP each. */
function peers(n: number): PeerEntry[] {
  const out: PeerEntry[] = [];
  for (let i = 0; i < n; i++) {
    const second = 5 + Math.floor(i / 256);
    const pub = `192.168.${50 + Math.floor((i + 2) / 256)}.${(i + 2) % 256}`;
    out.push(peerEntry(`10.${second}.${i % 256}.0/24`, pub, 8472, PEER_MAC));
  }
  return out;
}

// ---- the runner ----

type Op = () => unknown;
let sink: unknown;

interface Case {
  readonly group: string;
  readonly name: string;
  readonly inner: number;
  readonly bytes?: number;
  readonly fn: Op;
}

async function measure(cases: readonly Case[]): Promise<Row[]> {
  const bench = new Bench({ time: TIME_MS, warmupTime: 100 });
  for (const c of cases) {
    const { fn, inner } = c;
    bench.add(c.name, () => {
      for (let i = 0; i < inner; i++) sink = fn();
    });
  }
  await bench.run();
  return cases.map((c, i) => {
    const r = bench.tasks[i]!.result;
    if (r.state !== 'completed') throw new Error(`${c.name}: ${r.state}`);
    return {
      group: c.group,
      name: c.name,
      ns: (r.latency.p50 * 1e6) / c.inner,
      rme: r.latency.rme,
      bytes: c.bytes ?? 0,
    };
  });
}

function fmtNs(ns: number): string {
  return ns >= 1e6
    ? `${(ns / 1e6).toFixed(2)} ms`
    : ns >= 1e4
      ? `${(ns / 1e3).toFixed(1)} µs`
      : `${ns.toFixed(0)} ns`;
}

function table(rows: readonly Row[]): string {
  const lines = ['| group | case | per op | ops/s | GB/s | ±% |', '|---|---|---:|---:|---:|---:|'];
  for (const r of rows) {
    const ops = 1e9 / r.ns;
    const gbs = r.bytes ? (r.bytes / r.ns).toFixed(2) : '';
    const opsText = ops >= 1e6 ? `${(ops / 1e6).toFixed(2)} M` : `${(ops / 1e3).toFixed(1)} k`;
    lines.push(
      `| ${r.group} | ${r.name} | ${fmtNs(r.ns)} | ${opsText} | ${gbs} | ${r.rme.toFixed(1)} |`,
    );
  }
  return lines.join('\n');
}

async function main(): Promise<void> {
  const native = loadDataplaneBinding();
  const formats: readonly Format[] = ['udp', 'vxlan'];
  const sizes = [64, 1400] as const;

  // A small table (2 peers) for the codec rows, so PeerTable::Build stays a small part of a call.
  const codecEntries = [
    peerEntry('10.5.1.0/24', OUR_PUBLIC, 8472, '02:11:22:33:44:55'),
    peerEntry('10.5.2.0/24', PEER_PUBLIC, 8472, PEER_MAC),
  ];
  const codecBuf = encodePeerTable(codecEntries);
  const codecTable = new JsPeerTable(codecBuf);
  const peerSrcBytes = ipToBytes(parseIP(PEER_PUBLIC)!);
  const peerSrc = parseIP(PEER_PUBLIC)!;

  const cases: Case[] = [];
  // Binding floor: the cheapest calls that still cross N-API with a Buffer argument.
  const empty = Buffer.alloc(0);
  const emptyTable = encodePeerTable([]);
  const addr4 = ipToBytes(parseIP('10.5.2.9')!);
  cases.push({
    group: 'binding',
    name: 'checksum(0 B) — N-API call floor',
    inner: 1000,
    fn: () => native.checksum(empty),
  });
  cases.push({
    group: 'binding',
    name: 'peerLookup(empty table)',
    inner: 1000,
    fn: () => native.peerLookup(emptyTable, addr4),
  });
  cases.push({
    group: 'binding',
    name: 'codecEncap(0 B packet → truncated) — codec call floor',
    inner: 500,
    fn: () => native.codecEncap('udp', codecBuf, CFG, empty),
  });

  for (const format of formats) {
    for (const size of sizes) {
      // Encap: a packet from our pod to the peer's pod.
      const inner = udpPacket(size, '10.5.1.10', '10.5.2.20');
      // Decap: what the peer would send us (its pod → our pod).
      const back = udpPacket(size, '10.5.2.20', '10.5.1.10');
      const wire = js.encap(
        format,
        new JsPeerTable(
          encodePeerTable([peerEntry('10.5.1.0/24', OUR_PUBLIC, 8472, '02:11:22:33:44:55')]),
        ),
        CFG,
        back,
      );
      if (!wire.payload) throw new Error(`cannot build a ${format} datagram: ${wire.drop}`);
      const dgram = Buffer.from(wire.payload);
      for (const [impl, enc, dec] of [
        [
          'native',
          () => native.codecEncap(format, codecBuf, CFG, inner),
          () => native.codecDecap(format, codecBuf, CFG, peerSrcBytes, dgram),
        ],
        [
          'js',
          () => js.encap(format, codecTable, CFG, inner),
          () => js.decap(format, codecTable, CFG, peerSrc, dgram),
        ],
      ] as const) {
        const e = enc() as { drop: string };
        const d = dec() as { drop: string };
        if (e.drop !== 'none' || d.drop !== 'none') {
          throw new Error(`${impl} ${format} ${size}: encap ${e.drop}, decap ${d.drop}`);
        }
        const n = impl === 'native' ? 300 : 100;
        cases.push({
          group: `codec ${format}`,
          name: `${impl} ${format} encap ${size} B`,
          inner: n,
          bytes: size,
          fn: enc,
        });
        cases.push({
          group: `codec ${format}`,
          name: `${impl} ${format} decap ${size} B`,
          inner: n,
          bytes: size,
          fn: dec,
        });
      }
    }
  }

  for (const n of [10, 1000, 10000]) {
    const entries = peers(n);
    const buf = encodePeerTable(entries);
    const t = new JsPeerTable(buf);
    // A hit in the last subnet, so a linear scan pays its full length.
    const last = entries[n - 1]!.subnet;
    const hit = { family: last.family, addr: last.addr + 7n };
    const hitBytes = ipToBytes(hit);
    if (native.peerLookup(buf, hitBytes) !== n - 1 || t.lookup(hit)?.index !== n - 1) {
      throw new Error(`lookup at ${n} peers did not find the last peer`);
    }
    cases.push({
      group: 'peer table',
      name: `native peerLookup, ${n} peers (builds the table per call)`,
      inner: n >= 10000 ? 2 : n >= 1000 ? 20 : 500,
      fn: () => native.peerLookup(buf, hitBytes),
    });
    cases.push({
      group: 'peer table',
      name: `js JsPeerTable.lookup, ${n} peers (prebuilt, linear)`,
      inner: n >= 10000 ? 2 : n >= 1000 ? 20 : 500,
      fn: () => t.lookup(hit),
    });
    cases.push({
      group: 'peer table',
      name: `encodePeerTable, ${n} peers (control side, per change)`,
      inner: n >= 10000 ? 1 : n >= 1000 ? 5 : 200,
      fn: () => encodePeerTable(entries),
    });
  }

  for (const size of [1500, 65536]) {
    const data = Buffer.alloc(size);
    for (let i = 0; i < size; i++) data[i] = (i * 31 + 7) & 0xff;
    if (native.checksum(data) !== js.checksum(data)) throw new Error('checksums disagree');
    const label = size === 1500 ? '1500 B' : '64 KB';
    cases.push({
      group: 'checksum',
      name: `native ${label}`,
      inner: size === 1500 ? 500 : 20,
      bytes: size,
      fn: () => native.checksum(data),
    });
    cases.push({
      group: 'checksum',
      name: `js ${label}`,
      inner: size === 1500 ? 20 : 1,
      bytes: size,
      fn: () => js.checksum(data),
    });
  }

  process.stderr.write(
    `running ${cases.length} micro-benchmarks, ~${((cases.length * (TIME_MS + 100)) / 1000).toFixed(0)} s...\n`,
  );
  const rows = await measure(cases);
  void sink;

  const floor = rows.find((r) => r.group === 'binding' && r.name.startsWith('checksum'))!.ns;
  const codecFloor = rows.find((r) => r.name.startsWith('codecEncap(0 B'))!.ns;
  const text = table(rows);
  const cpu = cpus()[0]?.model ?? 'unknown cpu';
  const md = [
    '# weft micro-benchmarks',
    '',
    `${new Date().toISOString()} · Node ${process.version} · ${cpu} · tinybench, ${TIME_MS} ms per task · load average ${loadavg()[0]!.toFixed(1)} on ${cpus().length} cpus (figures swing with it)`,
    '',
    text,
    '',
    'Notes:',
    `- Native rows go through one N-API call per operation. The bare call floor is ${fmtNs(floor)}; a`,
    `  codec call that drops at once (argument conversion, PeerTable::Build of 2 records, result`,
    `  object) costs ${fmtNs(codecFloor)}. The engine pays none of this per packet (it loops in C++),`,
    '  so subtract the codec floor to estimate the codec work itself.',
    '- A native codec row near or above its js row measures the per-call conversion, not the C++',
    '  codec: these exports copy in and out and rebuild the peer table on every call.',
    '- `native peerLookup` rebuilds the hash table from the buffer on every call (the test export',
    '  takes the table as an argument), so its figure is Build(n) + one lookup, not a lookup.',
    '- GB/s = inner packet (or checksummed) bytes / time per operation.',
    '',
  ].join('\n');
  process.stdout.write(text + '\n');
  process.stdout.write(
    `\nN-API call floor ${fmtNs(floor)}; codec call floor ${fmtNs(codecFloor)}.\n`,
  );
  mkdirSync(dirname(RESULTS), { recursive: true });
  writeFileSync(RESULTS, md);
  process.stdout.write(`wrote ${RESULTS}\n`);
}

await main();
