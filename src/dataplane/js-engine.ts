/**
 * The js engine: the reference codec (js-codec.ts) per packet, a dgram socket and one TUN queue.
 * It is the slow, simple path (`--dataplane-engine=js`): one JS crossing per packet, the
 * benchmark's baseline, a check on the native engine, and the fallback when the addon cannot
 * load. Node cannot issue TUNSETIFF itself, so the TUN (IFF_TUN | IFF_NO_PI) is opened by:
 * - the addon when it loads (`tunOpen`, non-blocking fd): reads are polled (drain until EAGAIN,
 *   then a 1 ms timer), writes are synchronous;
 * - else the TUN helper (tun-helper.ts, a small C program): packets cross its stdio as frames.
 *   A helper that dies is logged once (error) and every later TUN write counts as
 *   tun_write_error.
 */
import { createSocket } from 'node:dgram';
import type { RemoteInfo, Socket } from 'node:dgram';
import { closeSync, readSync, writeSync } from 'node:fs';
import { WeftError, errorMessage } from '../common/errors.js';
import { formatIP, parseIP } from '../common/ip.js';
import { LogOnce, logger } from '../common/log.js';
import { loadNative, nativeAvailable } from '../common/native.js';
import type { NativeAddon } from '../common/native-addon.js';
import { checksum, decap, encap } from './js-codec.js';
import type { CodecConfig } from './js-codec.js';
import type { Dataplane, DataplaneOptions } from './engine.js';
import { JsPeerTable, applyPeerDelta, encodePeerTable } from './peer-table.js';
import { COUNTERS, COUNTERS_PER_WORKER, DROP_REASONS, decodeCounters } from './stats.js';
import type { CounterName, DropReason } from './stats.js';
import { openTunHelper } from './tun-helper.js';

type TunOpener = Pick<NativeAddon, 'tunOpen'>;

/** One open TUN queue: packets come in through the sink given at open, go out by `write`. */
interface TunPort {
  readonly name: string;
  /** Hands one packet to the kernel; false when it could not (the caller counts the drop). */
  write(pkt: Buffer): boolean;
  close(): Promise<void>;
}

/** Receives each packet read from the TUN (a view that is only valid during the call). */
type PacketSink = (pkt: Buffer) => void;

/** The addon's non-blocking TUN fd, drained by polling. */
function addonTun(
  native: TunOpener,
  name: string,
  sink: PacketSink,
  onReadError: (err: unknown) => void,
): TunPort {
  const tun = native.tunOpen(name);
  const buf = Buffer.alloc(65536);
  let stopped = false;
  let timer: NodeJS.Timeout | null = null;
  const pump = () => {
    timer = null;
    if (stopped) return;
    for (let i = 0; i < 256; i++) {
      let n: number;
      try {
        n = readSync(tun.fd, buf, 0, buf.length, null);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'EAGAIN') onReadError(err);
        timer = setTimeout(pump, 1);
        return;
      }
      sink(buf.subarray(0, n));
    }
    setImmediate(pump);
  };
  pump();
  return {
    name: tun.name,
    write(pkt) {
      try {
        writeSync(tun.fd, pkt);
        return true;
      } catch {
        return false;
      }
    },
    async close() {
      stopped = true;
      if (timer) clearTimeout(timer);
      closeSync(tun.fd);
    },
  };
}

export async function startJsEngine(opts: DataplaneOptions): Promise<Dataplane> {
  if (opts.format === 'ipip') {
    throw new WeftError(
      'WEFT_ERR_BACKEND_UNSUPPORTED',
      'ipip: the js engine cannot send IPIP (Node has no raw sockets); use the native engine',
    );
  }
  if (opts.format === 'wireguard') {
    throw new WeftError(
      'WEFT_ERR_BACKEND_UNSUPPORTED',
      'wireguard: the js engine has no WireGuard framing; use the native engine',
    );
  }
  const format = opts.format;
  const log = opts.log ?? logger('dataplane-js');
  const once = new LogOnce();
  const counters = new Float64Array(COUNTERS_PER_WORKER);
  const count = (c: CounterName, n = 1) => {
    counters[COUNTERS.indexOf(c)]! += n;
  };
  const drop = (r: DropReason) => {
    counters[COUNTERS.length + DROP_REASONS.indexOf(r)]! += 1;
  };
  const cfg: CodecConfig = { vni: opts.vni, vtepMac: opts.vtepMac, tunMtu: opts.tunMtu };
  let table = new JsPeerTable(Buffer.alloc(0));
  // Null until the UDP socket is bound (and after close): TUN packets are then dropped.
  // By underlay family (one, or both on a dual-stack underlay).
  let socks: Map<number, Socket> | null = null;
  // Set once the TUN is open; the sink below only runs after that.
  let tun: TunPort | null = null;

  const writeTun = (pkt: Buffer): boolean => {
    if (tun?.write(pkt)) return true;
    drop('tun_write_error');
    return false;
  };

  /** A packet the kernel routed into the TUN: encapsulate and send, or drop (maybe ICMP back). */
  const fromTun: PacketSink = (pkt) => {
    count('tun_reads');
    const r = encap(format, table, cfg, pkt);
    if (r.drop !== 'none' || !r.payload || r.peer === null) {
      drop(r.drop);
      if (r.icmp && writeTun(r.icmp)) count('icmp_sent');
      return;
    }
    const peer = table.peers[r.peer]!;
    const sock = socks?.get(peer.publicIP.family);
    if (!sock) {
      drop(socks ? 'no_route' : 'send_error');
      return;
    }
    const inner = opts.format === 'vxlan' ? r.payload.length - 22 : r.payload.length;
    sock.send(r.payload, peer.port, formatIP(peer.publicIP.family, peer.publicIP.addr), (err) => {
      if (err) drop('send_error');
    });
    count('tx_packets');
    count('tx_bytes', inner);
    count('send_batches');
  };

  let closed: Promise<void> | null = null;
  let fail!: (e: WeftError) => void;
  const failed = new Promise<WeftError>((resolve) => (fail = resolve));
  try {
    if (nativeAvailable()) {
      tun = addonTun(loadNative(), opts.tunName, fromTun, (err) => {
        if (once.first('tun-read')) log.warn({ err: errorMessage(err) }, 'tun read failed');
      });
    } else {
      tun = await openTunHelper(opts.tunName, {
        onPackets: (pkts) => pkts.forEach(fromTun),
        onExit: (why) => {
          if (closed) return;
          if (once.first('tun-helper-exit'))
            log.error({ tun: opts.tunName, why }, 'tun helper exited; the js dataplane is down');
          fail(
            new WeftError('WEFT_ERR_DATAPLANE', `tun helper exited (${why})`, {
              details: { tun: opts.tunName },
            }),
          );
        },
      });
      log.info({ tun: tun.name }, 'tun opened through the helper (native addon unavailable)');
    }
  } catch (err) {
    throw new WeftError('WEFT_ERR_DATAPLANE', `tun ${opts.tunName}: ${errorMessage(err)}`, {
      cause: err,
    });
  }
  const port = tun;

  const onMessage = (msg: Buffer, rinfo: RemoteInfo) => {
    const src = parseIP(rinfo.address);
    if (!src) {
      drop('unknown_source');
      return;
    }
    const r = decap(format, table, cfg, src, msg);
    if (r.drop !== 'none' || !r.tun) {
      drop(r.drop);
      return;
    }
    // No vnet header on this TUN: a GSO write is not possible, so a partial checksum is finished
    // here (the header's csum_start/offset say where).
    const h = r.tun;
    if (h[0] === 1) {
      const start = h.readUInt16LE(6);
      const off = h.readUInt16LE(8);
      const pkt = h.subarray(10);
      pkt.writeUInt16BE(checksum(pkt, start, pkt.length), start + off);
    }
    if (writeTun(h.subarray(10))) {
      count('rx_packets');
      count('rx_bytes', h.length - 10);
    }
  };
  const bound = new Map<number, Socket>();
  const closeAll = () =>
    Promise.all([...bound.values()].map((x) => new Promise<void>((r) => x.close(() => r()))));
  for (const bindIp of [opts.bindIp, ...(opts.bindIp6 ? [opts.bindIp6] : [])]) {
    const family = parseIP(bindIp)?.family ?? 4;
    const s: Socket = createSocket({ type: family === 4 ? 'udp4' : 'udp6', reuseAddr: false });
    await new Promise<void>((resolve, reject) => {
      s.once('error', reject);
      s.bind(opts.port, bindIp, () => {
        s.off('error', reject);
        resolve();
      });
    }).catch(async (err: unknown) => {
      await closeAll();
      await port.close();
      throw new WeftError(
        'WEFT_ERR_DATAPLANE',
        `udp ${bindIp}:${opts.port}: ${errorMessage(err)}`,
        {
          cause: err,
        },
      );
    });
    s.on('error', (err) => {
      if (once.first('udp-error')) log.warn({ err: errorMessage(err) }, 'udp socket error');
    });
    s.on('message', onMessage);
    bound.set(family, s);
  }
  socks = bound;
  log.debug({ tun: port.name }, 'js dataplane started');

  return {
    engine: 'js',
    tunName: port.name,
    failed,
    setPeers(entries) {
      table = new JsPeerTable(encodePeerTable(entries));
    },
    updatePeerTable(delta) {
      table = new JsPeerTable(applyPeerDelta(table.buffer, delta));
    },
    setPeerTable(buf) {
      table = new JsPeerTable(buf);
    },
    stats() {
      return decodeCounters('js', counters);
    },
    close() {
      closed ??= (async () => {
        socks = null;
        await closeAll();
        await port.close();
        log.debug({ tun: port.name }, 'js dataplane stopped');
      })();
      return closed;
    },
  };
}
