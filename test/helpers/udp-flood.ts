/**
 * Sends datagrams at a userspace dataplane port, from inside a node namespace
 * (`ip netns exec NS node --import tsx udp-flood.ts '<json>'`):
 *   mode "random": random bytes (0..1500 long) for `seconds`, as fast as the socket takes them;
 *   mode "spoof":  exactly `count` valid ICMP echo packets whose inner source is `innerSrc`
 *                  (an address outside the sender's subnet), to `innerDst`;
 *   mode "mixed":  exactly `count` bad datagrams cycling through empty (zero-length), 1 byte,
 *                  a truncated IPv4 header (19 bytes) and random bytes (20..1500), sent in
 *                  bursts of 16 with a pause, so the receiver's socket buffer never overflows.
 * Prints {"sent":N,"empty":E} when done (E: zero-length datagrams among them).
 */
import { createSocket } from 'node:dgram';
import { ipToBytes, parseIP } from '../../src/common/ip.js';
import { Rng, makePacket } from './packets.js';

interface Args {
  readonly mode: 'random' | 'spoof' | 'mixed';
  readonly target: string;
  readonly port: number;
  readonly bindIp?: string;
  readonly seconds?: number;
  readonly count?: number;
  readonly innerSrc?: string;
  readonly innerDst?: string;
  /** Prefix each datagram with a VXLAN header + Ethernet (VNI 1, this dst MAC). */
  readonly vxlanDstMac?: string;
}

const a = JSON.parse(process.argv[2] ?? '{}') as Args;
const sock = createSocket('udp4');
await new Promise<void>((r) => sock.bind(0, a.bindIp, () => r()));
const rng = new Rng(Date.now());
let sent = 0;
let empty = 0;
const send = (b: Buffer) =>
  new Promise<void>((resolve) =>
    sock.send(b, a.port, a.target, () => {
      sent++;
      resolve();
    }),
  );
const frame = (inner: Buffer) => {
  if (!a.vxlanDstMac) return inner;
  const mac = Buffer.from(a.vxlanDstMac.split(':').map((h) => parseInt(h, 16)));
  return Buffer.concat([
    Buffer.from('0800000000000100', 'hex'),
    mac,
    Buffer.alloc(6),
    Buffer.from([8, 0]),
    inner,
  ]);
};
if (a.mode === 'random') {
  const end = Date.now() + (a.seconds ?? 3) * 1000;
  while (Date.now() < end) {
    const batch: Promise<void>[] = [];
    for (let i = 0; i < 64; i++) batch.push(send(rng.bytes(rng.int(1500))));
    await Promise.all(batch);
  }
} else if (a.mode === 'mixed') {
  const kinds = [() => Buffer.alloc(0), () => rng.bytes(1), () => rng.bytes(19)];
  kinds.push(() => rng.bytes(20 + rng.int(1481)));
  for (let i = 0; i < (a.count ?? 400); i++) {
    const b = kinds[i % kinds.length]!();
    if (b.length === 0) empty++;
    await send(b);
    if (i % 16 === 15) await new Promise((r) => setTimeout(r, 5));
  }
} else {
  const src = ipToBytes(parseIP(a.innerSrc!)!);
  const dst = ipToBytes(parseIP(a.innerDst!)!);
  for (let i = 0; i < (a.count ?? 100); i++) {
    await send(frame(makePacket(rng, { src, dst, proto: 1, payloadLen: 56, ttl: 64 })));
  }
}
sock.close();
process.stdout.write(JSON.stringify({ sent, empty }) + '\n');
