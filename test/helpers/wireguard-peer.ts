/**
 * weft's WireGuard protocol code (the addon's wgDevice test export: native/src/wg_device.cc) as
 * a peer on a UDP socket, for the interop test against wireguard-go
 * (test/netns/wireguard-go-interop.test.ts). Runs inside the test's namespace:
 *
 *   ip netns exec NS node --import tsx wireguard-peer.ts '<json>'
 *   json: {privateKey, peerPublicKey, psk?, port, peerPort, ourIp, peerIp, initiate, underLoad?}
 *
 * It answers handshakes and ICMP echo requests to `ourIp` (through the tunnel), and with
 * `initiate` it starts the handshake itself and pings `peerIp` through the tunnel; with
 * `underLoad` it demands mac2 (answering cookie replies first). Every
 * verdict and event is one JSON line on stdout ({verdict} / {event: 'echo_reply', ...}). The
 * device's clock follows the real clocks (monotonic and wall) before each call. It runs until
 * killed, or until stdin closes.
 */
import { createSocket } from 'node:dgram';
import { loadNative } from '../../src/common/native.js';

const native = loadNative();
const cfg = JSON.parse(process.argv[2] ?? '{}') as {
  privateKey: string;
  peerPublicKey: string;
  psk?: string;
  port: number;
  peerPort: number;
  ourIp: string;
  peerIp: string;
  initiate: boolean;
  underLoad?: boolean;
};

const id = native.wgDevice('create', Buffer.from(cfg.privateKey, 'base64'));
const psk = cfg.psk ? Buffer.from(cfg.psk, 'base64') : null;
native.wgDevice('addPeer', id, Buffer.from(cfg.peerPublicKey, 'base64'), psk, 0);
if (cfg.underLoad) native.wgDevice('underLoad', id, true);
const sock = createSocket('udp4');
const say = (o: Record<string, unknown>) => process.stdout.write(JSON.stringify(o) + '\n');

function sync(): void {
  native.wgDevice('clock', id, Number(process.hrtime.bigint()), Date.now() * 1e6);
}

function sum16(b: Buffer): number {
  let s = 0;
  for (let i = 0; i + 1 < b.length; i += 2) s += b.readUInt16BE(i);
  if (b.length % 2) s += b[b.length - 1]! << 8;
  while (s > 0xffff) s = (s & 0xffff) + (s >>> 16);
  return ~s & 0xffff;
}

const ipBytes = (ip: string) => Buffer.from(ip.split('.').map(Number));

/** An IPv4 ICMP echo (type 8 request, 0 reply) from `src` to `dst`. */
function icmpEcho(
  type: number,
  src: string,
  dst: string,
  ident: number,
  seq: number,
  data: Buffer,
) {
  const icmp = Buffer.alloc(8 + data.length);
  icmp[0] = type;
  icmp.writeUInt16BE(ident, 4);
  icmp.writeUInt16BE(seq, 6);
  data.copy(icmp, 8);
  icmp.writeUInt16BE(sum16(icmp), 2);
  const ip = Buffer.alloc(20);
  ip[0] = 0x45;
  ip.writeUInt16BE(20 + icmp.length, 2);
  ip[8] = 64;
  ip[9] = 1;
  ipBytes(src).copy(ip, 12);
  ipBytes(dst).copy(ip, 16);
  ip.writeUInt16BE(sum16(ip), 10);
  return Buffer.concat([ip, icmp]);
}

function sendData(payload: Buffer): void {
  sync();
  const sent = native.wgDevice('send', id, 0, payload);
  say({ event: 'send', status: sent.status });
  if (sent.packet) sock.send(sent.packet, cfg.peerPort, '127.0.0.1');
}

sock.on('message', (msg, rinfo) => {
  sync();
  const src = Buffer.concat([
    ipBytes(rinfo.address),
    Buffer.from([rinfo.port >> 8, rinfo.port & 0xff]),
  ]);
  const r = native.wgDevice('receive', id, msg, src);
  say({ verdict: r.verdict, type: msg.readUInt32LE(0), len: msg.length });
  if (r.packet && r.verdict !== 'data') sock.send(r.packet, rinfo.port, rinfo.address);
  if (r.verdict === 'handshake_done' && cfg.initiate) {
    sendData(icmpEcho(8, cfg.ourIp, cfg.peerIp, 0x77, 1, Buffer.from('weft wireguard interop')));
  }
  if (r.verdict !== 'data' || !r.packet) return;
  const p = r.packet;
  const src4 = `${p[12]}.${p[13]}.${p[14]}.${p[15]}`;
  const dst4 = `${p[16]}.${p[17]}.${p[18]}.${p[19]}`;
  const ihl = (p[0]! & 15) * 4;
  if (p[9] !== 1) return;
  const type = p[ihl]!;
  const ident = p.readUInt16BE(ihl + 4);
  const seq = p.readUInt16BE(ihl + 6);
  const data = p.subarray(ihl + 8);
  if (type === 8 && dst4 === cfg.ourIp) {
    say({ event: 'echo_request', src: src4, seq });
    sendData(icmpEcho(0, cfg.ourIp, src4, ident, seq, data));
  } else if (type === 0 && dst4 === cfg.ourIp) {
    say({ event: 'echo_reply', src: src4, seq, data: data.toString() });
  }
});

sock.bind(cfg.port, '127.0.0.1', () => {
  say({ event: 'listening', port: cfg.port });
  if (cfg.initiate) {
    sync();
    const init = native.wgDevice('initiate', id, 0);
    if (init) sock.send(init, cfg.peerPort, '127.0.0.1');
    say({ event: 'initiation', sent: init !== null });
  }
});
process.stdin.on('end', () => {
  sock.close();
  native.wgDevice('close', id);
});
process.stdin.resume();
