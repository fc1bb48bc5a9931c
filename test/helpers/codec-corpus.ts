/**
 * The codec corpus: one peer table (nested prefixes on purpose) and the random packets, VXLAN
 * frames and outer sources the codec tests (native and bpf) run against the reference codec.
 */
import { ipFromBytes, ipToBytes, parseCIDR } from '../../src/common/ip.js';
import { JsPeerTable, encodePeerTable, peerEntry } from '../../src/dataplane/peer-table.js';
import { corrupt, makePacket } from './packets.js';
import type { Rng } from './packets.js';

export const OUR_MAC = Buffer.from([0x02, 0x11, 0x22, 0x33, 0x44, 0x55]);
/** Our underlay address (the IPIP outer source). */
export const LOCAL_IP = Buffer.from([192, 168, 1, 100]);
export const cfg = { vni: 1, vtepMac: OUR_MAC, tunMtu: 1450, localIp: LOCAL_IP };

// Peers: nested prefixes on purpose (a /16 holding /24s and a /28), IPv6 /64s and a /56.
export const entries = [
  peerEntry('10.5.0.0/16', '192.168.1.1', 8472, '02:00:00:00:00:01'),
  peerEntry('10.5.1.0/24', '192.168.1.2', 8472, '02:00:00:00:00:02'),
  peerEntry('10.5.2.0/24', '192.168.1.3', 8472, '02:00:00:00:00:03'),
  peerEntry('10.5.2.16/28', '192.168.1.4', 8472, '02:00:00:00:00:04'),
  peerEntry('10.6.0.0/24', '192.168.1.5', 8285),
  peerEntry('fc00:0:0:1::/64', '192.168.1.2', 8472, '02:00:00:00:00:02'),
  peerEntry('fc00:0:0:2::/64', 'fd00::7', 8472, '02:00:00:00:00:07'),
  peerEntry('fc00:0:1::/56', '192.168.1.8', 8285),
];
export const tableBuf = encodePeerTable(entries);
export const table = new JsPeerTable(tableBuf);

function addrIn(rng: Rng, cidr: string): Buffer {
  const net = parseCIDR(cidr)!;
  const bitsTotal = net.family === 4 ? 32 : 128;
  const host = BigInt(rng.u32()) * 2n ** 32n + BigInt(rng.u32());
  const span = 1n << BigInt(bitsTotal - net.prefix);
  return ipToBytes({ family: net.family, addr: net.addr + (host % span) });
}

function randomAddr(rng: Rng, v6: boolean): Buffer {
  if (rng.chance(0.8)) {
    const subnets = entries.filter((e) => (e.subnet.family === 6) === v6);
    const e = rng.pick(subnets);
    return addrIn(
      rng,
      `${e.subnet.family === 4 ? ipv4(e.subnet.addr) : ipv6(e.subnet.addr)}/${e.subnet.prefix}`,
    );
  }
  if (!v6 && rng.chance(0.1)) return Buffer.from([0, 0, 0, 0]);
  if (!v6 && rng.chance(0.1)) return Buffer.from([224 + rng.int(16), 0, 0, 1]);
  return rng.bytes(v6 ? 16 : 4);
}
function ipv4(a: bigint): string {
  return [24n, 16n, 8n, 0n].map((s) => String((a >> s) & 0xffn)).join('.');
}
function ipv6(a: bigint): string {
  const parts: string[] = [];
  for (let s = 112n; s >= 0n; s -= 16n) parts.push(((a >> s) & 0xffffn).toString(16));
  return parts.join(':');
}

/** A random inner packet; `bigMax` bounds the extra payload of the large TCP ones. */
export function randomPacket(rng: Rng, bigMax = 30000): Buffer {
  const v6 = rng.chance(0.4);
  const big = rng.chance(0.1);
  const p = makePacket(rng, {
    src: randomAddr(rng, v6),
    dst: randomAddr(rng, v6),
    proto: big ? 6 : undefined,
    payloadLen: big ? 1500 + rng.int(bigMax) : undefined,
    ttl: rng.chance(0.1) ? rng.int(3) : undefined,
    partial: rng.chance(0.3),
  });
  return rng.chance(0.15) ? corrupt(rng, p) : p;
}

export function vxlanFrame(rng: Rng, inner: Buffer): Buffer {
  const h = Buffer.alloc(22);
  h[0] = 0x08;
  h.writeUIntBE(rng.chance(0.9) ? cfg.vni : rng.int(1 << 24), 4, 3);
  (rng.chance(0.9) ? OUR_MAC : rng.bytes(6)).copy(h, 8);
  rng.bytes(6).copy(h, 14);
  const v = inner.length > 0 ? inner[0]! >> 4 : 4;
  h.writeUInt16BE(
    rng.chance(0.95) ? (v === 6 ? 0x86dd : 0x0800) : rng.pick([0x0806, 0x0800, 0x86dd, 0]),
    20,
  );
  if (rng.chance(0.03)) h[rng.pick([0, 1, 2, 3, 7])] = rng.int(256);
  const f = Buffer.concat([h, inner]);
  return rng.chance(0.03) ? f.subarray(0, rng.int(f.length)) : f;
}

/**
 * An IPIP packet as a raw socket returns it: an outer IPv4 header (protocol 4, random ECN, the
 * right total length) before `inner`; sometimes a broken outer header, another protocol, or cut.
 */
export function ipipFrame(rng: Rng, inner: Buffer): Buffer {
  const h = Buffer.alloc(20);
  h[0] = 0x45;
  h[1] = rng.int(4);
  h.writeUInt16BE(20 + inner.length, 2);
  h[8] = 64;
  h[9] = rng.chance(0.95) ? 4 : rng.pick([17, 41, 0]);
  LOCAL_IP.copy(h, 16);
  if (rng.chance(0.03)) h[rng.pick([0, 2, 3])] = rng.int(256);
  const f = Buffer.concat([h, inner]);
  return rng.chance(0.03) ? f.subarray(0, rng.int(f.length)) : f;
}

export function outerSource(rng: Rng, inner: Buffer): Buffer {
  // Mostly the peer that owns the inner source; sometimes another peer; sometimes a stranger.
  const v = inner.length > 0 ? inner[0]! >> 4 : 4;
  const srcOff = v === 6 ? 8 : 12;
  const len = v === 6 ? 16 : 4;
  if (inner.length >= srcOff + len && rng.chance(0.7)) {
    const owner = table.lookup(ipFromBytes(inner.subarray(srcOff, srcOff + len)));
    if (owner) return ipToBytes(owner.publicIP);
  }
  if (rng.chance(0.5)) return ipToBytes(rng.pick(table.peers).publicIP);
  return rng.bytes(rng.chance(0.8) ? 4 : 16);
}
