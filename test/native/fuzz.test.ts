/**
 * Builds the libFuzzer decap target (native/fuzz/decap_fuzzer.cc, clang with ASan + UBSan) and
 * runs it for a bounded time (WEFT_FUZZ_SECONDS, default 20) from a seed corpus of valid
 * flannel-udp, VXLAN and IPIP packets, and WireGuard messages of each type (selector bit 3; bit 4
 * under load). Without clang the test skips, except under CI=true where a
 * missing clang is a failure (CI must fuzz).
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { Rng, makePacket } from '../helpers/packets.js';
import { SRC_B, WgDev, ipv4Packet, pair } from '../helpers/wireguard.js';

/** One real message of each WireGuard type (from two test devices), for the seed corpus. */
function wireguardSeeds(): Buffer[] {
  const { a, b } = pair();
  const c = new WgDev();
  try {
    c.addPeer(a.publicKey);
    c.underLoad(true);
    const cookie = c.receive(a.initiate(a.addPeer(c.publicKey))!).packet!;
    const init = a.initiate()!;
    const resp = b.receive(init).packet!;
    const keepalive = a.receive(resp, SRC_B).packet!;
    const data = a.send(ipv4Packet(100)).packet!;
    return [init, resp, cookie, keepalive, data];
  } finally {
    for (const d of [a, b, c]) d.close();
  }
}

const root = fileURLToPath(new URL('../..', import.meta.url));
const hasClang = spawnSync('clang++', ['--version']).status === 0;
const seconds = Number(process.env.WEFT_FUZZ_SECONDS ?? 20);

describe('decap fuzzing (libFuzzer)', () => {
  const dir = mkdtempSync(join(tmpdir(), 'weft-fuzz-'));
  after(() => rmSync(dir, { recursive: true, force: true }));

  it(
    'clang is available (required under CI=true)',
    {
      skip:
        !hasClang && process.env.CI !== 'true'
          ? 'clang++ not installed (apt-get install clang)'
          : false,
    },
    () => {
      assert.ok(hasClang, 'clang++ is missing: CI must run the fuzzer');
    },
  );

  it(
    `the decap target runs ${seconds} s without a crash`,
    { skip: hasClang ? false : 'clang++ not installed', timeout: (seconds + 180) * 1000 },
    () => {
      const bin = join(dir, 'decap_fuzzer');
      const build = spawnSync(join(root, 'native/fuzz/build.sh'), [bin], { encoding: 'utf8' });
      assert.equal(build.status, 0, build.stderr);
      const corpus = join(dir, 'corpus');
      spawnSync('mkdir', ['-p', corpus]);
      const rng = new Rng(99);
      const mac = Buffer.from([0x02, 0, 0, 0, 0, 24]);
      for (let i = 0; i < 32; i++) {
        const v6 = i % 4 === 3;
        const p = makePacket(rng, {
          src: v6
            ? Buffer.from('fc000000000000000000000000000002', 'hex')
            : Buffer.from([10, 5, 1, 9]),
          dst: v6
            ? Buffer.from('fc000000000000010000000000000002', 'hex')
            : Buffer.from([10, 9, 0, 2]),
          payloadLen: rng.int(200),
        });
        const vx = i % 2 === 1;
        const src = Buffer.from([192, 168, 1, 2]);
        const frame = vx
          ? Buffer.concat([
              Buffer.from('0800000000000100', 'hex'),
              mac,
              Buffer.alloc(6),
              Buffer.from(v6 ? [0x86, 0xdd] : [8, 0]),
              p,
            ])
          : p;
        writeFileSync(
          join(corpus, `seed${i}`),
          Buffer.concat([Buffer.from([vx ? 1 : 0]), src, frame]),
        );
        // selector bit 5: the coalescer takes it as authenticated (WireGuard's receive path)
        writeFileSync(
          join(corpus, `auth${i}`),
          Buffer.concat([Buffer.from([(vx ? 1 : 0) | 0x20]), src, frame]),
        );
        // IPIP (selector bit 2): the whole outer IPv4 packet, protocol 4, around the packet
        const outer = Buffer.from('45000000000040004004000000000000c0a80164', 'hex');
        outer.writeUInt16BE(20 + p.length, 2);
        writeFileSync(join(corpus, `ipip${i}`), Buffer.concat([Buffer.from([4]), src, outer, p]));
      }
      wireguardSeeds().forEach((m, i) => {
        const src = Buffer.from([127, 0, 0, 1]);
        writeFileSync(join(corpus, `wg${i}`), Buffer.concat([Buffer.from([8]), src, m]));
        writeFileSync(join(corpus, `wgload${i}`), Buffer.concat([Buffer.from([8 | 16]), src, m]));
      });
      const run = spawnSync(
        bin,
        [`-max_total_time=${seconds}`, '-rss_limit_mb=1024', '-print_final_stats=1', corpus],
        {
          encoding: 'utf8',
          cwd: dir,
        },
      );
      assert.equal(run.status, 0, run.stderr.slice(-4000));
      const runs = /Done (\d+) runs/.exec(run.stderr);
      assert.ok(runs && Number(runs[1]) > 1000, `too few runs: ${runs?.[1] ?? 'none'}`);
    },
  );
});
