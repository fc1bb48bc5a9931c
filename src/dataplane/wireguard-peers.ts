/**
 * The WireGuard peers the native engine's `wireguard` framing talks to, as the backend hands
 * them over (Dataplane.setWireguardPeers): one fixed-size record per peer, the layout of
 * native/src/wg_engine.h (64 bytes, network byte order):
 *   0  u8[32]  public key           36 u16     persistent keepalive, s (0: off)
 *   32 u8      endpoint family 4|6  38 u8[10]  reserved, zero
 *   33 u8      reserved, zero       48 u8[16]  endpoint address (IPv4 in the first 4 bytes)
 *   34 u16     endpoint port
 * A peer's AllowedIPs are the peer table's subnets (peer-table.ts) whose public address is its
 * endpoint address: flannel's `AllowedIPs = the peer's subnet(s)`, endpoint `PublicIP:Port`.
 */
import { WeftError } from '../common/errors.js';
import { formatIP, ipToBytes, parseIP } from '../common/ip.js';

export const WG_PEER_RECORD_SIZE = 64;

export interface WireguardPeer {
  /** X25519 public key, 32 bytes. */
  readonly publicKey: Buffer;
  /** The peer's public address (its lease's PublicIP) and its listen port. */
  readonly endpoint: string;
  readonly port: number;
  /** Persistent keepalive interval in seconds (flannel's PersistentKeepaliveInterval; 0: off). */
  readonly persistentKeepalive?: number;
}

/**
 * A WireGuard device as `wg show` reports it (Dataplane.wireguardState): a copy the engine took
 * under its own lock. No secrets: the private key and the PSK stay with whoever handed them to
 * the engine (wireguard-uapi.ts prints them from its own options).
 */
export interface WireguardState {
  /** Our static public key (32 bytes). */
  readonly publicKey: Buffer;
  /** The UDP port we listen on (0: unknown, left out of `get=1`). */
  readonly listenPort: number;
  readonly peers: readonly WireguardPeerState[];
}

export interface WireguardPeerState {
  readonly publicKey: Buffer;
  /** Whether a preshared key is mixed into its handshakes (the cluster-wide PSK). */
  readonly hasPsk: boolean;
  /** Where datagrams to it go now (null: nowhere yet). */
  readonly endpoint: { readonly address: string; readonly port: number } | null;
  /** Its AllowedIPs: the peer table's subnets on its public address, `net/len`. */
  readonly allowedIps: readonly string[];
  /** Wall-clock time of its last completed handshake (0 and 0: none yet). */
  readonly lastHandshakeSec: number;
  readonly lastHandshakeNsec: number;
  /** Bytes of WireGuard datagrams authenticated from it / sealed for it (handshakes included). */
  readonly rxBytes: number;
  readonly txBytes: number;
  /** Persistent keepalive interval, seconds (0: off). */
  readonly persistentKeepalive: number;
}

/** The peers `encodeWireguardPeers` encoded (a fast-start record keeps them so). */
export function decodeWireguardPeers(buf: Buffer): WireguardPeer[] {
  if (buf.length % WG_PEER_RECORD_SIZE !== 0)
    throw new WeftError('WEFT_ERR_DATAPLANE', 'wireguard peers: not a whole number of records');
  const out: WireguardPeer[] = [];
  for (let o = 0; o < buf.length; o += WG_PEER_RECORD_SIZE) {
    const family = buf[o + 32];
    const addr = buf.subarray(o + 48, o + 48 + (family === 4 ? 4 : 16));
    const endpoint = formatIP(family === 4 ? 4 : 6, BigInt(`0x${addr.toString('hex')}`));
    out.push({
      publicKey: Buffer.from(buf.subarray(o, o + 32)),
      endpoint,
      port: buf.readUInt16BE(o + 34),
      persistentKeepalive: buf.readUInt16BE(o + 36),
    });
  }
  return out;
}

export function encodeWireguardPeers(peers: readonly WireguardPeer[]): Buffer {
  const buf = Buffer.alloc(peers.length * WG_PEER_RECORD_SIZE);
  peers.forEach((p, i) => {
    const o = i * WG_PEER_RECORD_SIZE;
    const bad = (rule: string) =>
      new WeftError('WEFT_ERR_DATAPLANE', `wireguard peer ${i}: ${rule}`, {
        details: { endpoint: p.endpoint, port: p.port },
      });
    if (p.publicKey.length !== 32) throw bad('publicKey must be 32 bytes');
    const ip = parseIP(p.endpoint);
    if (!ip) throw bad(`endpoint ${p.endpoint} is not an IP address`);
    if (!Number.isInteger(p.port) || p.port < 1 || p.port > 65535)
      throw bad('port must be 1..65535');
    const keepalive = p.persistentKeepalive ?? 0;
    if (!Number.isInteger(keepalive) || keepalive < 0 || keepalive > 65535)
      throw bad('persistentKeepalive must be 0..65535 seconds');
    p.publicKey.copy(buf, o);
    buf[o + 32] = ip.family;
    buf.writeUInt16BE(p.port, o + 34);
    buf.writeUInt16BE(keepalive, o + 36);
    ipToBytes(ip).copy(buf, o + 48);
  });
  return buf;
}
