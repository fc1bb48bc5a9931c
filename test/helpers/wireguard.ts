/**
 * WireGuard test devices (the addon's wgDevice test export, native/src/wg_harness.h) for the
 * tests in test/native/wireguard-*.test.ts: a pair that knows each other, a manual clock per
 * device, and small IP packets to carry.
 */
import { randomBytes } from 'node:crypto';
import { afterEach } from 'node:test';
import { loadNative } from '../../src/common/native.js';
import type { WgReceived } from '../../src/common/native-addon.js';

export const native = loadNative();
export const SECOND = 1_000_000_000;
const WALL0 = 1_700_000_000 * SECOND;

/** One test device and its clock (monotonic and wall time move together). */
export class WgDev {
  readonly id: number;
  readonly publicKey: Buffer;
  mono = SECOND;
  constructor(readonly privateKey: Buffer = randomBytes(32)) {
    this.id = native.wgDevice('create', privateKey);
    this.publicKey = native.wgDevice('publicKey', this.id);
  }
  addPeer(pub: Buffer, psk: Buffer | null = null, keepaliveNs = 0): number {
    return native.wgDevice('addPeer', this.id, pub, psk, keepaliveNs);
  }
  /** Moves this device's clocks forward by `ns`. */
  advance(ns: number): void {
    this.at(this.mono + ns);
  }
  at(mono: number): void {
    this.mono = mono;
    native.wgDevice('clock', this.id, mono, WALL0 + mono);
  }
  underLoad(on: boolean): void {
    native.wgDevice('underLoad', this.id, on);
  }
  initiate(peer = 0): Buffer | null {
    return native.wgDevice('initiate', this.id, peer);
  }
  receive(packet: Buffer, src: Buffer = SRC_A): WgReceived {
    return native.wgDevice('receive', this.id, packet, src);
  }
  send(payload: Buffer, peer = 0) {
    return native.wgDevice('send', this.id, peer, payload);
  }
  tick(peer = 0): string[] {
    return native.wgDevice('tick', this.id, peer);
  }
  peer(peer = 0) {
    const s = native.wgDevice('peer', this.id, peer);
    if (!s) throw new Error(`no peer ${peer}`);
    return s;
  }
  close(): void {
    native.wgDevice('close', this.id);
  }
}

/** Opaque source addresses (IPv4 + port) the cookie binds to. */
export const SRC_A = Buffer.from([127, 0, 0, 1, 0xca, 0x6c]);
export const SRC_B = Buffer.from([127, 0, 0, 2, 0xca, 0x6c]);

/** Two devices that know each other (same PSK unless told), each with peer number 0. */
export function pair(opts: { psk?: Buffer; pskB?: Buffer } = {}): { a: WgDev; b: WgDev } {
  const a = new WgDev();
  const b = new WgDev();
  a.addPeer(b.publicKey, opts.psk ?? null);
  b.addPeer(a.publicKey, opts.pskB ?? opts.psk ?? null);
  return { a, b };
}

/** A completes a handshake with B (initiation, response, confirming keepalive). */
export function handshake(a: WgDev, b: WgDev): void {
  const init = a.initiate();
  if (!init) throw new Error('no initiation');
  const resp = b.receive(init);
  if (resp.verdict !== 'response' || !resp.packet) throw new Error(`b: ${resp.verdict}`);
  const done = a.receive(resp.packet, SRC_B);
  if (done.verdict !== 'handshake_done' || !done.packet) throw new Error(`a: ${done.verdict}`);
  const ka = b.receive(done.packet);
  if (ka.verdict !== 'keepalive') throw new Error(`b keepalive: ${ka.verdict}`);
}

/** An IPv4 UDP packet of `payload` bytes (headers valid enough for the length trim). */
export function ipv4Packet(payload: number, fill = 0xab): Buffer {
  const p = Buffer.alloc(28 + payload, fill);
  p[0] = 0x45;
  p[1] = 0;
  p.writeUInt16BE(28 + payload, 2);
  p.writeUInt32BE(0, 4);
  p[8] = 64;
  p[9] = 17;
  p.writeUInt16BE(0, 10);
  Buffer.from([10, 0, 0, 1]).copy(p, 12);
  Buffer.from([10, 0, 0, 2]).copy(p, 16);
  p.writeUInt16BE(1000, 20);
  p.writeUInt16BE(2000, 22);
  p.writeUInt16BE(8 + payload, 24);
  p.writeUInt16BE(0, 26);
  return p;
}

/**
 * A `track(pair)` for a test file: every device of a tracked pair (or a lone device) is closed
 * after each test, whatever the test did.
 */
export function trackedPairs(): <T extends { a: WgDev; b: WgDev } | WgDev>(p: T) => T {
  const open: WgDev[] = [];
  afterEach(() => {
    for (const d of open.splice(0)) d.close();
  });
  return (p) => {
    if (p instanceof WgDev) open.push(p);
    else open.push(p.a, p.b);
    return p;
  };
}
