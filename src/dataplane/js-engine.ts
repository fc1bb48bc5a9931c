/**
 * The js engine: the reference codec (js-codec.ts) per packet, a dgram socket and one TUN queue.
 * It is the slow, simple path (`--dataplane-engine=js`): one JS crossing per packet, the
 * benchmark's baseline and a check on the native engine. Node cannot issue TUNSETIFF itself,
 * so the addon opens the TUN (`tunOpen`: IFF_TUN | IFF_NO_PI, non-blocking); reads are polled
 * (drain until EAGAIN, then a 1 ms timer), writes are synchronous.
 */
import { createSocket } from 'node:dgram';
import type { RemoteInfo, Socket } from 'node:dgram';
import { closeSync, readSync, writeSync } from 'node:fs';
import { WeftError, errorMessage } from '../common/errors.js';
import { formatIP, parseIP } from '../common/ip.js';
import { LogOnce, logger } from '../common/log.js';
import { loadNative } from '../common/native.js';
import { checksum, decap, encap } from './js-codec.js';
import type { CodecConfig } from './js-codec.js';
import type { Dataplane, DataplaneOptions } from './index.js';
import { JsPeerTable, encodePeerTable } from './peer-table.js';
import { COUNTERS, COUNTERS_PER_WORKER, DROP_REASONS, decodeCounters } from './stats.js';
import type { CounterName, DropReason } from './stats.js';

interface TunOpener {
  tunOpen(name: string): { fd: number; name: string };
}

export async function startJsEngine(opts: DataplaneOptions): Promise<Dataplane> {
  const log = opts.log ?? logger('dataplane-js');
  const once = new LogOnce();
  const native = loadNative<TunOpener>();
  let tun: { fd: number; name: string };
  try {
    tun = native.tunOpen(opts.tunName);
  } catch (err) {
    throw new WeftError('WEFT_ERR_DATAPLANE', `tun ${opts.tunName}: ${errorMessage(err)}`, {
      cause: err,
    });
  }
  const counters = new Float64Array(COUNTERS_PER_WORKER);
  const count = (c: CounterName, n = 1) => {
    counters[COUNTERS.indexOf(c)]! += n;
  };
  const drop = (r: DropReason) => {
    counters[COUNTERS.length + DROP_REASONS.indexOf(r)]! += 1;
  };
  const cfg: CodecConfig = { vni: opts.vni, vtepMac: opts.vtepMac, tunMtu: opts.tunMtu };
  let table = new JsPeerTable(Buffer.alloc(0));
  const family = parseIP(opts.bindIp)?.family ?? 4;
  const sock: Socket = createSocket({ type: family === 4 ? 'udp4' : 'udp6', reuseAddr: false });
  await new Promise<void>((resolve, reject) => {
    sock.once('error', reject);
    sock.bind(opts.port, opts.bindIp, () => {
      sock.off('error', reject);
      resolve();
    });
  }).catch((err: unknown) => {
    closeSync(tun.fd);
    throw new WeftError(
      'WEFT_ERR_DATAPLANE',
      `udp ${opts.bindIp}:${opts.port}: ${errorMessage(err)}`,
      { cause: err },
    );
  });
  sock.on('error', (err) => {
    if (once.first('udp-error')) log.warn({ err: errorMessage(err) }, 'udp socket error');
  });

  const writeTun = (pkt: Buffer): boolean => {
    try {
      writeSync(tun.fd, pkt);
      return true;
    } catch {
      drop('tun_write_error');
      return false;
    }
  };

  sock.on('message', (msg: Buffer, rinfo: RemoteInfo) => {
    const src = parseIP(rinfo.address);
    if (!src) return;
    const r = decap(opts.format, table, cfg, src, msg);
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
  });

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
        if ((err as NodeJS.ErrnoException).code !== 'EAGAIN' && once.first('tun-read')) {
          log.warn({ err: errorMessage(err) }, 'tun read failed');
        }
        timer = setTimeout(pump, 1);
        return;
      }
      count('tun_reads');
      const r = encap(opts.format, table, cfg, buf.subarray(0, n));
      if (r.drop !== 'none' || !r.payload || r.peer === null) {
        drop(r.drop);
        if (r.icmp && writeTun(r.icmp)) count('icmp_sent');
        continue;
      }
      const peer = table.peers[r.peer]!;
      const inner = opts.format === 'vxlan' ? r.payload.length - 22 : r.payload.length;
      sock.send(r.payload, peer.port, formatIP(peer.publicIP.family, peer.publicIP.addr), (err) => {
        if (err) drop('send_error');
      });
      count('tx_packets');
      count('tx_bytes', inner);
      count('send_batches');
    }
    setImmediate(pump);
  };
  pump();
  log.debug({ tun: tun.name }, 'js dataplane started');

  let closed: Promise<void> | null = null;
  return {
    engine: 'js',
    tunName: tun.name,
    setPeers(entries) {
      table = new JsPeerTable(encodePeerTable(entries));
    },
    stats() {
      return decodeCounters('js', counters);
    },
    close() {
      closed ??= (async () => {
        stopped = true;
        if (timer) clearTimeout(timer);
        await new Promise<void>((r) => sock.close(() => r()));
        closeSync(tun.fd);
        log.debug({ tun: tun.name }, 'js dataplane stopped');
      })();
      return closed;
    },
  };
}
