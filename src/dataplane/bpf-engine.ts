/**
 * The bpf engine: the native engine (TUN, sockets, the same peer table) with the TC-BPF programs
 * of native/bpf/weft.bpf.c in front of it, so the payload never leaves the kernel:
 *
 *   pod → TUN egress ── weft_tx: encap + redirect_neigh ──→ underlay       (fast path)
 *                    └─ anything it does not handle → TUN → native engine  (slow path, counted)
 *   underlay ingress ── weft_rx: checks + decap → TUN ingress → stack → pod (fast path)
 *                    └─ anything it does not handle → UDP socket → native engine
 *
 * What the programs leave alone goes on to the next tc program (TC_ACT_UNSPEC = TCX_NEXT). The
 * outer packets never meet netfilter (tc ingress is before INPUT, redirect_neigh skips OUTPUT):
 * where the host has rules on the tunnel port (bpf-firewall.ts), the engine refuses to start.
 *
 * Underlays: IPv4, IPv6 (IPv6-only clusters) or both (dual-stack: bindIp and bindIp6, flannel's
 * flannel.<VNI> and flannel-v6.<VNI> in one engine); each peer record names the family its
 * packets ride (IPIP: IPv4 only).
 *
 * Start: the programs load (verifier), a probe runs them under BPF_PROG_TEST_RUN on a small and
 * a page-sized packet of each family over each underlay family and compares the bytes with the
 * reference codec, then they
 * attach (tcx links, else clsact). Any failure throws WEFT_ERR_BPF_UNAVAILABLE naming the step;
 * the seam (index.ts) logs it and runs the native engine instead. setPeers writes the native
 * table and the BPF maps from the same records (the maps add before they remove). close()
 * detaches and frees every program, map and link, then stops the native engine.
 *
 * Pinned links (bpf-pins.ts): where a bpffs is mounted, the tcx links are pinned per TUN and
 * namespace, so a kill -9 leaves the programs forwarding with the last peer table. The next
 * engine adopts the links it finds there (weft's program, same device and hook; anything else is
 * unpinned and replaced), leaves the old programs running until its maps hold a peer table (the
 * last run's record or the store's first snapshot), then swaps its programs in with
 * bpf_link_update, one atomic step per link: no moment without a program. Only an engine whose
 * TUN outlives it (`persist`) pins, and its close() keeps the pins and the programs attached;
 * whoever removes that TUN removes them (bpf-pins.ts removeBpfPins).
 */
import { readFileSync } from 'node:fs';
import { WeftError, errorMessage } from '../common/errors.js';
import { ipToBytes, parseIP } from '../common/ip.js';
import { type Logger, logger } from '../common/log.js';
import {
  BPF_COUNTERS,
  TC_ACT_REDIRECT,
  bpfObjectPath,
  bpfSourceDir,
  bpfSourceHash,
  loadBpfBinding,
} from './bpf-binding.js';
import type { BpfAttachMode, BpfConfig, NativeBpf } from './bpf-binding.js';
import type { Dataplane, DataplaneOptions, PodBridge } from './engine.js';
import { checksum, decap, encap, pseudoSumFor } from './js-codec.js';
import { bypassedFirewallRules } from './bpf-firewall.js';
import { preparePinDir, removeBpfPins } from './bpf-pins.js';
import { startNativeEngine } from './native-engine.js';
import { JsPeerTable, encodePeerTable, formatMac, parseMac, peerEntry } from './peer-table.js';
import { BPF_COUNTER_TABLE, COUNTERS, emptyWorkerStats } from './stats.js';
import type { DataplaneStats } from './stats.js';

/** Test knob: a probe that always fails (the fallback path, exercised end to end). */
export const PROBE_FAIL_ENV = 'WEFT_BPF_PROBE_FAIL';

function unavailable(step: string, err?: unknown): WeftError {
  const why = err === undefined ? step : `${step}: ${errorMessage(err)}`;
  return new WeftError('WEFT_ERR_BPF_UNAVAILABLE', `bpf engine unavailable (${why})`, {
    cause: err,
  });
}

/** A well-formed TCP/IP packet from `src` to `dst` with `len` bytes of payload (checksums right). */
function probePacket(src: string, dst: string, len: number): Buffer {
  const s = parseIP(src)!;
  const d = parseIP(dst)!;
  const v6 = s.family === 6;
  const hl = v6 ? 40 : 20;
  const p = Buffer.alloc(hl + 20 + len);
  for (let i = 0; i < len; i++) p[hl + 20 + i] = (i * 7) & 0xff;
  const addr = ipToBytes;
  if (v6) {
    p[0] = 0x60;
    p.writeUInt16BE(20 + len, 4);
    p[6] = 6;
    p[7] = 64;
    addr(s).copy(p, 8);
    addr(d).copy(p, 24);
  } else {
    p[0] = 0x45;
    p.writeUInt16BE(p.length, 2);
    p[6] = 0x40; // DF, as TCP sends
    p[8] = 64;
    p[9] = 6;
    addr(s).copy(p, 12);
    addr(d).copy(p, 16);
    p.writeUInt16BE(checksum(p, 0, 20), 10);
  }
  p.writeUInt16BE(40000, hl);
  p.writeUInt16BE(80, hl + 2);
  p[hl + 12] = 0x50;
  p[hl + 13] = 0x18;
  const pseudo = pseudoSumFor(addr(s), addr(d), 6, 20 + len);
  p.writeUInt16BE(checksum(p, hl, p.length, pseudo), hl + 16);
  return p;
}

/** The probe's peer, on each underlay family. */
const PROBE_PEER_PUBLIC = { 4: '198.51.100.7', 6: '2001:db8:77::7' } as const;

/**
 * Our underlay addresses: bindIp's family, and bindIp6 on a dual-stack underlay (flannel's
 * flannel.<VNI> and flannel-v6.<VNI>: each peer record names the family its packets ride).
 */
export function underlayAddrs(opts: DataplaneOptions): { 4?: string; 6?: string } {
  const a = parseIP(opts.bindIp);
  const out: { 4?: string; 6?: string } = {};
  if (a?.family === 4) out[4] = opts.bindIp;
  if (a?.family === 6) out[6] = opts.bindIp;
  if (opts.bindIp6 && parseIP(opts.bindIp6)?.family === 6) out[6] = opts.bindIp6;
  return out;
}

/** Whether the outer UDP checksum of the IPv6 datagram at `ip6` (its header's offset) is right. */
function udp6ChecksumOk(f: Buffer, ip6: number): boolean {
  const len = f.readUInt16BE(ip6 + 4);
  const src = f.subarray(ip6 + 8, ip6 + 24);
  const dst = f.subarray(ip6 + 24, ip6 + 40);
  const u = ip6 + 40;
  return (
    f.readUInt16BE(u + 6) !== 0 && checksum(f, u, u + len, pseudoSumFor(src, dst, 17, len)) === 0
  );
}

/**
 * Configures the programs for `opts` (no devices yet), runs both on small and page-sized IPv4 and
 * IPv6 packets (IPIP: IPv4, the one family it carries) over each underlay family the node has
 * (IPv4, IPv6, or both on a dual-stack underlay) and compares every byte with the reference
 * codec (the UDP payload; over IPv6 also the outer header and a right UDP checksum); throws
 * naming the first difference. Leaves the peer maps empty.
 */
export function probeBpf(bpf: NativeBpf, id: number, opts: DataplaneOptions): void {
  if (process.env[PROBE_FAIL_ENV]) throw unavailable(`probe forced to fail by ${PROBE_FAIL_ENV}`);
  const format = opts.format;
  if (format === 'wireguard') throw unavailable('its programs have no WireGuard framing');
  const local = underlayAddrs(opts);
  const ipip = opts.format === 'ipip';
  if (ipip && !local[4]) throw unavailable(`the underlay address ${opts.bindIp} is not IPv4`);
  if (!local[4] && !local[6]) throw unavailable(`the underlay address ${opts.bindIp} is not an IP`);
  // Configured as it will run, minus the devices (a test run carries an Ethernet header).
  bpf.bpfConfigure(id, bpfConfigOf(opts));
  const base = { vni: opts.vni, vtepMac: opts.vtepMac, tunMtu: 65535 };
  const pairs = [
    ['198.18.8.2', '198.18.7.9'],
    ['fd77:0:0:8::2', 'fd77:0:0:7::9'],
  ] as const;
  try {
    for (const family of [4, 6] as const) {
      const ours = local[family];
      if (!ours || (ipip && family === 6)) continue;
      const peerPub = PROBE_PEER_PUBLIC[family];
      const peers = [
        peerEntry('198.18.7.0/24', peerPub, opts.port, '02:00:00:00:00:07'),
        peerEntry('fd77:0:0:7::/64', peerPub, opts.port, '02:00:00:00:00:07'),
      ];
      // Our own subnet as the reference sees it from the peer's side (for decap).
      const ourPeers = [
        peerEntry('198.18.8.0/24', ours, opts.port, formatMac(opts.vtepMac)),
        peerEntry('fd77:0:0:8::/64', ours, opts.port, formatMac(opts.vtepMac)),
      ];
      const table = new JsPeerTable(encodePeerTable(peers));
      const ourTable = new JsPeerTable(encodePeerTable(ourPeers));
      // IPIP's outer source is the sender's address: ours, and the peer's for what it sends us.
      const cfg = { ...base, localIp: ipToBytes(parseIP(ours)!) };
      const peerCfg = { ...base, localIp: ipToBytes(parseIP(peerPub)!) };
      bpf.bpfSetPeers(id, encodePeerTable(peers));
      // Outer IPv4 + UDP, IPv6 + UDP, or IPIP's IPv4 header (part of the reference's payload).
      const outer = ipip ? 0 : family === 4 ? 28 : 48;
      for (const [src, dst] of ipip ? pairs.slice(0, 1) : pairs) {
        for (const len of [32, 2800]) {
          const what = `${dst} ${len} B over IPv${family}`;
          // TX: inner packet → the reference's UDP payload behind the outer headers.
          const p = probePacket(src, dst, len);
          const eth = Buffer.alloc(14);
          eth.writeUInt16BE(src.includes(':') ? 0x86dd : 0x0800, 12);
          const tx = bpf.bpfTestRun(id, 'tx', Buffer.concat([eth, p]));
          const ref = encap(format, table, cfg, p);
          if (tx.verdict !== TC_ACT_REDIRECT || !ref.payload)
            throw unavailable(`probe: encap of ${what} returned verdict ${tx.verdict}`);
          // UDP framings: the UDP payload; IPIP: the whole outer packet (its ID is 0 with DF).
          if (!tx.data.subarray(14 + outer).equals(ref.payload))
            throw unavailable(`probe: encap of ${what} differs from the reference codec`);
          if (family === 4 && checksum(tx.data, 14, 34) !== 0)
            throw unavailable(`probe: outer IPv4 checksum of ${what} is wrong`);
          if (family === 6 && !outerIpv6Ok(tx.data, ours, peerPub, opts.port))
            throw unavailable(`probe: outer IPv6 header or UDP checksum of ${what} is wrong`);
          // RX: a datagram from the peer to us, as the reference would have sent it.
          const payload = encap(format, ourTable, peerCfg, probePacket(dst, src, len)).payload!;
          const frame = ipip
            ? Buffer.concat([eth, payload])
            : family === 4
              ? outerIpv4Frame(peerPub, ours, opts.port, payload)
              : outerIpv6Frame(peerPub, ours, opts.port, payload);
          const expect = decap(format, table, cfg, parseIP(peerPub)!, payload);
          const rx = bpf.bpfTestRun(id, 'rx', frame);
          if (
            rx.verdict !== TC_ACT_REDIRECT ||
            !expect.tun ||
            !rx.data.subarray(14).equals(expect.tun.subarray(10))
          )
            throw unavailable(`probe: decap of ${what} differs from the reference codec`);
        }
      }
    }
  } finally {
    bpf.bpfSetPeers(id, Buffer.alloc(0));
  }
}

/**
 * Whether the frame `f` (Ethernet) carries the outer IPv6 header and UDP header the programs
 * must write: EtherType IPv6, traffic class 0, hop limit 64, UDP, `src` → `dst`, destination
 * port `dport`, lengths that match, and a right (non-zero) UDP checksum.
 */
export function outerIpv6Ok(f: Buffer, src: string, dst: string, dport: number): boolean {
  if (f.length < 62 || f.readUInt16BE(12) !== 0x86dd) return false;
  if (f[14]! >> 4 !== 6 || (f.readUInt16BE(14) & 0x0ff0) !== 0) return false;
  if (f[20] !== 17 || f[21] !== 64 || f.readUInt16BE(18) !== f.length - 54) return false;
  if (!f.subarray(22, 38).equals(ipToBytes(parseIP(src)!))) return false;
  if (!f.subarray(38, 54).equals(ipToBytes(parseIP(dst)!))) return false;
  if (f.readUInt16BE(56) !== dport || f.readUInt16BE(58) !== f.length - 54) return false;
  return udp6ChecksumOk(f, 14);
}

/** The programs' configuration for `opts`, without the devices. */
function bpfConfigOf(opts: DataplaneOptions): BpfConfig {
  if (opts.format === 'wireguard') throw unavailable('its programs have no WireGuard framing');
  const local = underlayAddrs(opts);
  return {
    format: opts.format,
    vni: opts.vni,
    vtepMac: opts.vtepMac,
    port: opts.port,
    ...(local[4] ? { localV4: local[4] } : {}),
    ...(local[6] ? { localV6: local[6] } : {}),
  };
}

/** An Ethernet + IPv4 + UDP frame carrying `payload` (source port 40000, TTL 64). */
export function outerIpv4Frame(src: string, dst: string, dport: number, payload: Buffer): Buffer {
  const f = Buffer.alloc(42 + payload.length);
  f.writeUInt16BE(0x0800, 12);
  f[14] = 0x45;
  f.writeUInt16BE(28 + payload.length, 16);
  f[22] = 64;
  f[23] = 17;
  ipToBytes(parseIP(src)!).copy(f, 26);
  ipToBytes(parseIP(dst)!).copy(f, 30);
  f.writeUInt16BE(checksum(f, 14, 34), 24);
  f.writeUInt16BE(40000, 34);
  f.writeUInt16BE(dport, 36);
  f.writeUInt16BE(8 + payload.length, 38);
  payload.copy(f, 42);
  return f;
}

/** An Ethernet + IPv6 + UDP frame carrying `payload` (source port 40000, hop limit 64, checksum). */
export function outerIpv6Frame(src: string, dst: string, dport: number, payload: Buffer): Buffer {
  const f = Buffer.alloc(62 + payload.length);
  f.writeUInt16BE(0x86dd, 12);
  f[14] = 0x60;
  f.writeUInt16BE(8 + payload.length, 18);
  f[20] = 17;
  f[21] = 64;
  ipToBytes(parseIP(src)!).copy(f, 22);
  ipToBytes(parseIP(dst)!).copy(f, 38);
  f.writeUInt16BE(40000, 54);
  f.writeUInt16BE(dport, 56);
  f.writeUInt16BE(8 + payload.length, 58);
  payload.copy(f, 62);
  const pseudo = pseudoSumFor(f.subarray(22, 38), f.subarray(38, 54), 17, 8 + payload.length);
  f.writeUInt16BE(checksum(f, 54, f.length, pseudo) || 0xffff, 60);
  return f;
}

const SOURCE_MARK = 'weft-bpf-source-sha256:';

/**
 * Throws unless the object at `objectPath` was built from the sources in `sourceDir` as they are
 * now (the SHA-256 scripts/build-native.mjs writes into it, bpfSourceHash). A stale object loads
 * and passes the probe (its test runs cannot take the TUN's path) yet may not be the code this
 * engine drives: refuse it, naming the rebuild. No sources beside the package (an object
 * shipped alone): nothing to compare.
 */
export function checkBpfObjectSource(objectPath: string, sourceDir = bpfSourceDir()): void {
  const want = bpfSourceHash(sourceDir);
  if (want === null) return;
  let object: Buffer;
  try {
    object = readFileSync(objectPath);
  } catch (err) {
    throw unavailable(`load ${objectPath}`, err);
  }
  const at = object.indexOf(SOURCE_MARK);
  const built =
    at < 0
      ? 'an unknown source'
      : object.toString('latin1', at + SOURCE_MARK.length, at + SOURCE_MARK.length + 64);
  if (built !== want) {
    throw unavailable(
      `stale object ${objectPath}: built from ${at < 0 ? built : `sources ${built.slice(0, 12)}`}, not ${sourceDir} (${want.slice(0, 12)}); rebuild it: node scripts/build-native.mjs --bpf`,
    );
  }
}

export async function startBpfEngine(opts: DataplaneOptions): Promise<Dataplane> {
  const log = opts.log ?? logger('dataplane-bpf');
  if (!opts.underlay) throw unavailable('no underlay device given');
  if (opts.format === 'wireguard') throw unavailable('its programs have no WireGuard framing');
  // The outer packets never meet netfilter here: a rule on the tunnel port would not apply
  // (iptables and ip6tables alike where the underlay has that family).
  const ipip = opts.format === 'ipip';
  const families = Object.keys(underlayAddrs(opts)).map(Number) as (4 | 6)[];
  const rules = bypassedFirewallRules(ipip ? 'ipip' : opts.port, families);
  if (rules.length > 0) {
    const on = ipip ? 'IPIP (IP protocol 4)' : `UDP port ${opts.port}`;
    throw unavailable(
      `the host firewall has ${rules.length} rule(s) on ${on} that its programs would bypass (tc ingress runs before INPUT, bpf_redirect_neigh skips OUTPUT; the native engine meets them): ${rules[0]}`,
    );
  }
  let bpf: NativeBpf;
  let id: number;
  checkBpfObjectSource(bpfObjectPath());
  try {
    bpf = loadBpfBinding();
    id = bpf.bpfLoad(bpfObjectPath());
  } catch (err) {
    throw unavailable(`load ${bpfObjectPath()}`, err);
  }
  try {
    probeBpf(bpf, id, opts);
  } catch (err) {
    bpf.bpfClose(id);
    throw err instanceof WeftError ? err : unavailable('probe', err);
  }
  // The probe's test runs counted: the engine reports from here.
  const base = Float64Array.from(bpf.bpfCounters(id));
  const counters = () => bpf.bpfCounters(id).map((v, i) => v - (base[i] ?? 0));
  let native: Dataplane;
  try {
    native = await startNativeEngine({ ...opts, engine: 'native' });
  } catch (err) {
    bpf.bpfClose(id);
    throw err;
  }
  let attached: { mode: BpfAttachMode; adopted: string[]; replaced: string[] };
  // Pins follow the TUN: only one that outlives the process (persist) gets them; links a
  // persistent run left on it go.
  if (!opts.persist) removeBpfPins(native.tunName, log);
  const pins = opts.persist ? preparePinDir(native.tunName) : { why: 'the tun is not persistent' };
  const pinDir = 'dir' in pins ? pins.dir : '';
  try {
    bpf.bpfConfigure(id, { ...bpfConfigOf(opts), tun: native.tunName, underlay: opts.underlay });
    attached = bpf.bpfAttach(id, native.tunName, opts.underlay, attachModeFromEnv(), pinDir);
  } catch (err) {
    bpf.bpfClose(id);
    await native.close();
    throw unavailable('attach', err);
  }
  const { mode, adopted, replaced } = attached;
  const pinned = mode === 'tcx' && pinDir !== '';
  if (replaced.length > 0) log.info({ dir: pinDir, replaced }, 'pinned bpf links replaced');
  log.info(
    {
      tun: native.tunName,
      underlay: opts.underlay,
      attach: mode,
      ...(pinned ? { pinned: pinDir, adopted } : { pinned: false }),
      ...('why' in pins && mode === 'tcx' ? { notPinned: pins.why } : {}),
    },
    'bpf programs attached',
  );
  // Adopted links run the last process's programs (and its peer table) until ours have one.
  let takeOver = adopted.length > 0;
  const bridge = new BridgeBypass(bpf, id, log);
  let closed: Promise<void> | null = null;
  // After our maps hold a table (whole, or changed by a delta), our programs take the links.
  const takeOverOnce = () => {
    if (!takeOver) return;
    takeOver = false;
    try {
      const n = bpf.bpfTakeOver(id);
      log.info({ dir: pinDir, links: n }, 'bpf programs took over the pinned links');
    } catch (err) {
      log.warn({ dir: pinDir, err: errorMessage(err) }, 'pinned bpf links not taken over');
    }
  };
  const setTable = (table: Buffer) => {
    native.setPeerTable(table);
    bpf.bpfSetPeers(id, table);
    takeOverOnce();
  };
  return {
    engine: 'bpf',
    tunName: native.tunName,
    threadIds: native.threadIds,
    failed: native.failed,
    setPeers(entries) {
      if (closed) return;
      setTable(encodePeerTable(entries));
    },
    setPeerTable(table) {
      if (closed) return;
      setTable(table);
    },
    updatePeerTable(delta) {
      if (closed) return;
      native.updatePeerTable(delta);
      bpf.bpfUpdatePeers(id, delta.removed, delta.upserts);
      takeOverOnce();
    },
    setPodBridge(b) {
      if (closed) return;
      bridge.set(b);
    },
    podBridge() {
      const on = bridge.bridge;
      return on ? { ...on, ports: bridge.ports } : null;
    },
    stats() {
      const slowStats = native.stats();
      if (closed) return { ...slowStats, engine: 'bpf' };
      return withBpfCounters(slowStats, counters());
    },
    close() {
      closed ??= (async () => {
        // The TUN stays (persist): so do the pinned programs, forwarding until the next engine.
        const keep = pinned;
        bpf.bpfClose(id, keep);
        await native.close();
        log.debug(
          { tun: native.tunName, ...(keep ? { pinned: pinDir } : {}) },
          keep ? 'bpf programs left attached (pinned)' : 'bpf programs detached',
        );
      })();
      return closed;
    },
  };
}

/** bpfSetPorts records for a port map: per MAC, the MAC, 2 pad bytes and the port's ifindex. */
export function portRecords(table: ReadonlyMap<string, number>): Buffer {
  const out = Buffer.alloc(table.size * 12);
  let off = 0;
  for (const [mac, ifindex] of table) {
    const m = parseMac(mac);
    if (!m) continue;
    m.copy(out, off);
    out.writeUInt32LE(ifindex, off + 8);
    off += 12;
  }
  return out.subarray(0, off);
}

/**
 * weft_bridge on the pods' bridge and its port map, as control reports the bridge (its name, and
 * the ports with the MACs its FDB holds behind them: control/netlink/pod-bridge.ts follows them
 * through rtnetlink): attached when the bridge appears, moved when it is recreated, detached
 * when it goes; the map written whole on every report. Until both are there, GSO packets take
 * the bridge (segmented in software: slower, never lost). A failure (no tcx) is logged once per
 * reason.
 */
export class BridgeBypass {
  readonly #bpf: Pick<NativeBpf, 'bpfAttachBridge' | 'bpfSetPorts'>;
  readonly #id: number;
  readonly #log: Logger;
  #attached = 0;
  #name = '';
  #failed = '';
  #table: ReadonlyMap<string, number> = new Map();

  constructor(bpf: Pick<NativeBpf, 'bpfAttachBridge' | 'bpfSetPorts'>, id: number, log: Logger) {
    this.#bpf = bpf;
    this.#id = id;
    this.#log = log;
  }

  set(bridge: PodBridge | null): void {
    const want = bridge?.index ?? 0;
    const name = bridge?.name ?? '';
    try {
      // A link the last run pinned takes this program at once, its port map empty until the
      // next line: GSO packets take the bridge meanwhile (slower, never lost).
      if (want !== this.#attached || name !== this.#name) {
        this.#attached = 0;
        this.#name = '';
        this.#table = new Map();
        // By name, in this process's namespace: it must be the one control's netlink reports
        // (ifindexes are per namespace), or the ports' ifindexes would name other devices.
        const got = this.#bpf.bpfAttachBridge(this.#id, want ? name : 0);
        if (got !== want) {
          this.#bpf.bpfAttachBridge(this.#id, 0);
          throw new Error(
            `${name} is ifindex ${got} here, ${want} in the namespace the bridge was reported from`,
          );
        }
        this.#attached = want;
        this.#name = name;
        if (want) this.#log.info({ bridge: name }, 'bpf bridge bypass attached');
      }
      const table = new Map<string, number>();
      if (this.#attached && bridge)
        for (const port of bridge.ports) for (const mac of port.macs) table.set(mac, port.index);
      this.#bpf.bpfSetPorts(this.#id, portRecords(table));
      this.#table = table;
      this.#failed = '';
    } catch (err) {
      const why = errorMessage(err);
      if (why !== this.#failed)
        this.#log.warn({ bridge: name, err: why }, 'bpf bridge bypass unavailable');
      this.#failed = why;
    }
  }

  /** The port map as last written: MAC → the port's ifindex. */
  get ports(): ReadonlyMap<string, number> {
    return this.#table;
  }

  /** The bridge weft_bridge is attached to (null: none). */
  get bridge(): { name: string; index: number } | null {
    return this.#attached ? { name: this.#name, index: this.#attached } : null;
  }
}

/** WEFT_BPF_ATTACH = tcx | clsact forces one attach mode (default: tcx, else clsact). */
function attachModeFromEnv(): 'auto' | BpfAttachMode {
  const m = process.env.WEFT_BPF_ATTACH;
  return m === 'tcx' || m === 'clsact' ? m : 'auto';
}

/** The native engine's stats plus the programs' packets: one more worker row, and the totals. */
export function withBpfCounters(s: DataplaneStats, flat: ArrayLike<number>): DataplaneStats {
  const row = emptyWorkerStats();
  const at = (n: (typeof BPF_COUNTERS)[number]) => flat[BPF_COUNTERS.indexOf(n)] ?? 0;
  for (const slot of BPF_COUNTER_TABLE)
    if ('adds' in slot) row.counters[slot.adds] += at(slot.name);
  const total = emptyWorkerStats();
  for (const c of COUNTERS) total.counters[c] = s.total.counters[c] + row.counters[c];
  Object.assign(total.drops, s.total.drops);
  return {
    ...s,
    engine: 'bpf',
    workers: [...s.workers, row],
    total,
    bpf: Object.fromEntries(BPF_COUNTERS.map((c) => [c, at(c)])) as Record<
      (typeof BPF_COUNTERS)[number],
      number
    >,
  };
}
