/**
 * wireguard (flannel HEAD pkg/backend/wireguard), in the native engine's `wireguard` framing
 * instead of a kernel `wireguard` link, so it runs without the module. Same net-conf, key file,
 * lease and device names as flanneld, so weft and flanneld nodes share one encrypted cluster:
 *
 *   net-conf  ListenPort 51820, ListenPortV6 51821, MTU (default the interface's), PSK (base64,
 *             cluster-wide), PersistentKeepaliveInterval (s, 0 off), Mode separate|auto|ipv4|ipv6
 *   key       $WIREGUARD_KEY_FILE or /run/flannel/wgkey (wireguard-key.ts)
 *   lease     BackendType "wireguard"; BackendData (IPv4 on) and BackendV6Data (IPv6 on), each
 *             {"PublicKey": <base64>, "Port": <the listen port that answers for that family>}
 *   tunnels   one TUN per tunnel, each its own engine: `separate` (the default) runs flannel-wg
 *             for IPv4 pods on ListenPort over the IPv4 underlay and flannel-wg-v6 for IPv6 pods
 *             on ListenPortV6 over the IPv6 underlay, as flanneld's two links (a one-family
 *             cluster: that family's only); auto/ipv4/ipv6 run flannel-wg alone on ListenPort for
 *             both pod families, each peer reached in the family Mode picks (auto: flannel's
 *             selectMode). TUN MTU = MTU − 80 (FLANNEL_MTU too), address = the subnet's network
 *             address /32 (/128), one route for the whole Network (IPv6Network) through it.
 *   peers     per lease of type wireguard: endpoint PublicIP:Port ([PublicIPv6]:Port), Port
 *             absent (flannel < v0.26.6) = our own listen port; AllowedIPs = its subnet(s)
 *             (the engine's peer table); PSK and keepalive from net-conf. A lease of another
 *             type or with bad data is skipped, logged once and counted.
 *
 *   engine    a new engine handshakes with its first peers at once (wireguard.greet: it may
 *             replace one whose sessions they still hold); each tunnel's engine starts early
 *             after a restart (fast-start.ts: one record per tunnel keeps the keys and the peers).
 *   UAPI      `wg show flannel-wg` works: each tunnel's engine serves wireguard-go's UAPI on
 *             /var/run/wireguard/<dev>.sock (src/dataplane/wireguard-uapi.ts; the directory is
 *             $WEFT_WIREGUARD_UAPI_DIR when set: the testbed gives each node its own), started
 *             again with every new engine of that tunnel. A socket it cannot serve (another
 *             process serves that name, an untrusted directory) is logged and the tunnel runs
 *             without it: `wg show` is for looking, the pods' traffic does not need it.
 *
 * One difference from flanneld: in auto/ipv4/ipv6, flanneld publishes ListenPortV6 in
 * BackendV6Data while its one link listens on ListenPort only; weft publishes ListenPort there
 * (the port that answers). Where the chosen family has no public address (auto), weft tries the
 * other; flanneld would write an endpoint of 0.0.0.0.
 */
import { rm } from 'node:fs/promises';
import { configError, WeftError, errorMessage } from '../../common/errors.js';
import { type Family, parseIP } from '../../common/ip.js';
import { jsonField } from '../../common/json-field.js';
import { LogOnce } from '../../common/log.js';
import {
  type Dataplane,
  type PeerEntry,
  type WireguardPeer,
  type WireguardUapi,
  encodeWireguardPeers,
  registerDataplaneMetrics,
  startWireguardUapi,
  sumStats,
  uapiSocketDir,
} from '../../dataplane/index.js';
import type { NetConfig } from '../config/net-config.js';
import type { Lease, LeaseEvent } from '../lease/types.js';
import type { Backend, BackendContext, BackendSpec, CloseHow, PreparedBackend } from './backend.js';
import { enabledFamilies, kernelMetrics, leasePublicIP, leaseSubnet } from './kernel-common.js';
import { openNetlink } from '../netlink/open-netlink.js';
import { applyAll } from '../netlink/netlink.js';
import { recordPath } from './fast-start.js';
import { sendAddress } from './send-address.js';
import { type PeerSidecar, UserspaceBackend, type UserspaceSpec } from './userspace.js';
import { type WgKeyPair, keyFilePath, loadWgKey, parseWgKey } from './wireguard-key.js';

export const WIREGUARD = 'wireguard';
export const WG_DEV = 'flannel-wg';
export const WG_DEV_V6 = 'flannel-wg-v6';
/** Outer IPv4/IPv6 header (20/40) + UDP 8 + type 4 + index 4 + counter 8 + tag 16, as flannel. */
export const WG_OVERHEAD = 80;
export const DEFAULT_LISTEN_PORT = 51820;
export const DEFAULT_LISTEN_PORT_V6 = 51821;
export const WG_MODES = ['separate', 'auto', 'ipv4', 'ipv6'] as const;
export type WireguardMode = (typeof WG_MODES)[number];
/** The smallest MTU whose device (MTU − 80) holds an IPv4 packet, and IPv6's 1280. */
export const MIN_WG_MTU = 68 + WG_OVERHEAD;
export const MIN_WG_MTU_V6 = 1280 + WG_OVERHEAD;
export const WIREGUARD_OPTIONS = [
  'ListenPort',
  'ListenPortV6',
  'MTU',
  'PSK',
  'PersistentKeepaliveInterval',
  'Mode',
] as const;

export interface WireguardConfig {
  readonly listenPort: number;
  readonly listenPortV6: number;
  /** null: the interface's MTU. */
  readonly mtu: number | null;
  readonly psk: Buffer | null;
  /** Seconds; 0 = off. */
  readonly keepalive: number;
  readonly mode: WireguardMode;
}

/** The Backend block, flannel's fields and defaults; a broken rule names the field. */
export function parseWireguardConfig(raw: Readonly<Record<string, unknown>>): WireguardConfig {
  const int = (name: string, min: number, max: number, rule: string): number | undefined => {
    const v = jsonField(raw, name);
    if (v === undefined) return undefined;
    if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > max)
      throw configError(`Backend.${name}`, rule);
    return v;
  };
  // 0 is Go's zero value: as unset (the default port, the interface MTU)
  const port = (name: string, dflt: number) =>
    int(name, 0, 65535, 'must be an integer in 1..65535 (0: the default)') || dflt;
  const mtu =
    int('MTU', 0, 65535, `must be an integer: 0 (the interface MTU) or ${MIN_WG_MTU}..65535`) ?? 0;
  if (mtu !== 0 && mtu < MIN_WG_MTU) {
    throw configError(
      'Backend.MTU',
      `must be 0 (the interface MTU) or at least ${MIN_WG_MTU} (the device gets MTU − ${WG_OVERHEAD})`,
    );
  }
  const pskText = jsonField(raw, 'PSK');
  let psk: Buffer | null = null;
  if (pskText !== undefined && pskText !== '') {
    psk = typeof pskText === 'string' ? parseWgKey(pskText) : null;
    if (!psk) throw configError('Backend.PSK', 'must be a base64 key of 32 bytes (`wg genpsk`)');
  }
  const keepalive =
    int(
      'PersistentKeepaliveInterval',
      0,
      65535,
      'must be an integer number of seconds in 0..65535 (0: off)',
    ) ?? 0;
  const mode = jsonField(raw, 'Mode') ?? 'separate';
  if (typeof mode !== 'string' || !(WG_MODES as readonly string[]).includes(mode)) {
    throw configError('Backend.Mode', `must be one of ${WG_MODES.join(', ')}`);
  }
  return Object.freeze({
    listenPort: port('ListenPort', DEFAULT_LISTEN_PORT),
    listenPortV6: port('ListenPortV6', DEFAULT_LISTEN_PORT_V6),
    mtu: mtu === 0 ? null : mtu,
    psk,
    keepalive,
    mode: mode as WireguardMode,
  });
}

/** Our lease's BackendData / BackendV6Data, as flannel writes it. */
export function wireguardLeaseData(
  publicKey: Buffer,
  port: number,
): { PublicKey: string; Port: number } {
  return { PublicKey: publicKey.toString('base64'), Port: port };
}

export interface PeerLeaseData {
  readonly publicKey: Buffer;
  /** null: absent or 0 (flannel before v0.26.6): the reader's own listen port. */
  readonly port: number | null;
}

/** A peer lease's BackendData (or BackendV6Data), or why it is unusable. */
export function readWireguardLeaseData(data: unknown): PeerLeaseData | { reason: string } {
  if (typeof data !== 'object' || data === null || Array.isArray(data))
    return { reason: 'BackendData is not an object' };
  const obj = data as Record<string, unknown>;
  const pk = jsonField(obj, 'PublicKey');
  const publicKey = typeof pk === 'string' ? parseWgKey(pk) : null;
  if (!publicKey) return { reason: 'BackendData.PublicKey is not a base64 key of 32 bytes' };
  const port = jsonField(obj, 'Port') ?? 0;
  if (typeof port !== 'number' || !Number.isInteger(port) || port < 0 || port > 65535)
    return { reason: 'BackendData.Port is not an integer in 0..65535' };
  return { publicKey, port: port === 0 ? null : port };
}

/** RFC 1918 (flannel's ip.IP4.IsPrivate). */
function privateV4(addr: string): boolean {
  const [a, b] = addr.split('.').map(Number);
  return a === 10 || (a === 172 && (b! & 0xf0) === 16) || (a === 192 && b === 168);
}

/** RFC 4193 fc00::/7 (flannel's ip.IP6.IsPrivate). */
function privateV6(addr: string): boolean {
  const ip = parseIP(addr);
  return ip !== null && ip.family === 6 && ip.addr >> 121n === 0x7en;
}

/**
 * flannel's selectMode (Mode auto): IPv4 unless the peer has an IPv6 address and either its IPv4
 * address is private or we have none, while its IPv6 one and ours are both public (not ULA).
 */
export function selectEndpointFamily(
  lease: Lease,
  ours: { readonly publicIP: string | null; readonly publicIPv6: string | null },
): Family {
  const v4 = leasePublicIP(lease, 4);
  const v6 = leasePublicIP(lease, 6);
  if (!v6) return 4;
  if (v4 && !privateV4(v4) && ours.publicIP) return 4;
  if (!privateV6(v6) && ours.publicIPv6 && !privateV6(ours.publicIPv6)) return 6;
  return 4;
}

/** One WireGuard tunnel: a TUN and its engine, the pod families it carries, how it reaches peers. */
export interface Tunnel {
  readonly dev: string;
  readonly families: readonly Family[];
  /** Its listen port (a lease without Port means this one). */
  readonly port: number;
  /** The peers' endpoint family: fixed (separate, ipv4, ipv6) or chosen per peer (auto). */
  readonly endpoint: Family | 'auto';
}

/** The tunnels a Mode makes for the enabled families. */
export function wireguardTunnels(cfg: WireguardConfig, families: readonly Family[]): Tunnel[] {
  if (cfg.mode === 'separate') {
    return families.map((f) =>
      f === 4
        ? { dev: WG_DEV, families: [4], port: cfg.listenPort, endpoint: 4 }
        : { dev: WG_DEV_V6, families: [6], port: cfg.listenPortV6, endpoint: 6 },
    );
  }
  const endpoint = cfg.mode === 'auto' ? 'auto' : cfg.mode === 'ipv4' ? 4 : 6;
  return [{ dev: WG_DEV, families, port: cfg.listenPort, endpoint }];
}

/** What a peer lease stands for in one tunnel: its WireGuard peer and its AllowedIPs. */
export interface TunnelPeer {
  readonly peer: WireguardPeer;
  /** One record per carried family the lease has a subnet of (AllowedIPs), to the endpoint. */
  readonly entries: readonly PeerEntry[];
}

/** Pure: the peer `lease` is in `tunnel`, or why it is skipped. */
export function wireguardPeerFor(
  lease: Lease,
  tunnel: Tunnel,
  ours: { readonly publicIP: string | null; readonly publicIPv6: string | null },
  keepalive: number,
): TunnelPeer | { skip: string } {
  if (lease.attrs.backendType !== WIREGUARD)
    return { skip: `BackendType "${lease.attrs.backendType}" is not wireguard` };
  const data = (f: Family) => (f === 4 ? lease.attrs.backendData : lease.attrs.backendV6Data);
  let family: Family =
    tunnel.endpoint === 'auto' ? selectEndpointFamily(lease, ours) : tunnel.endpoint;
  if (tunnel.endpoint === 'auto' && !leasePublicIP(lease, family)) family = family === 4 ? 6 : 4;
  const endpoint = leasePublicIP(lease, family);
  if (!endpoint) return { skip: `no public IPv${family} address` };
  const ip = parseIP(endpoint);
  if (!ip || ip.family !== family) return { skip: `bad public IP ${endpoint}` };
  // the endpoint family's data (key and port); the key from the other family's when it has none
  const own = data(family);
  const other = data(family === 4 ? 6 : 4);
  const name = family === 4 ? 'BackendData' : 'BackendV6Data';
  let parsed = own === undefined ? null : readWireguardLeaseData(own);
  if (parsed && 'reason' in parsed) return { skip: parsed.reason.replace('BackendData', name) };
  if (!parsed && other !== undefined) {
    const o = readWireguardLeaseData(other);
    if ('reason' in o) return { skip: o.reason };
    parsed = { publicKey: o.publicKey, port: null };
  }
  if (!parsed) return { skip: `no ${name}` };
  const port = parsed.port ?? tunnel.port;
  const entries: PeerEntry[] = [];
  for (const f of tunnel.families) {
    const subnet = leaseSubnet(lease, f);
    if (subnet) entries.push({ subnet, publicIP: ip, port, vtepMac: null });
  }
  return {
    peer: { publicKey: parsed.publicKey, endpoint, port, persistentKeepalive: keepalive },
    entries,
  };
}

/**
 * The tunnel's WireGuard peers beside its peer table (userspace.ts PeerSidecar): one per lease,
 * planned from the same batches; a lease the table skips is skipped here too (the table's
 * planner logs and counts it). The engine takes the whole list when it changed (or is new).
 * Two leases with one key or one endpoint address cannot both be peers (the engine matches a
 * peer's AllowedIPs by its address): the first by lease key stays, the other is logged once
 * and counted; a lease holding our own key is skipped the same way.
 */
export class WireguardPeers implements PeerSidecar {
  readonly #byLease = new Map<string, WireguardPeer>();
  readonly #skipped = new LogOnce();
  #lastEngine: Dataplane | null = null;
  #lastList = '';

  constructor(
    private readonly tunnel: Tunnel,
    private readonly ctx: BackendContext,
    private readonly keepalive: number,
    private readonly ownPublicKey: () => Buffer,
  ) {}

  update(batch: readonly LeaseEvent[], ownKey: string | null): boolean {
    let changed = false;
    for (const e of batch) {
      const key = e.lease.key;
      if (key === ownKey) continue;
      const before = this.#byLease.get(key);
      const p =
        e.type === 'removed'
          ? null
          : wireguardPeerFor(e.lease, this.tunnel, this.ctx.extIface, this.keepalive);
      if (!p || 'skip' in p) {
        if (before) changed = this.#byLease.delete(key);
        continue;
      }
      if (before && samePeer(before, p.peer)) continue;
      this.#byLease.set(key, p.peer);
      changed = true;
    }
    return changed;
  }

  /** The peers the engine gets: one per key and per endpoint address, never our own key. */
  list(): WireguardPeer[] {
    const out: WireguardPeer[] = [];
    const keys = new Set<string>([this.ownPublicKey().toString('base64')]);
    const addrs = new Set<string>();
    for (const lease of [...this.#byLease.keys()].sort()) {
      const p = this.#byLease.get(lease)!;
      const k = p.publicKey.toString('base64');
      const reason = keys.has(k)
        ? k === this.ownPublicKey().toString('base64')
          ? 'its PublicKey is ours'
          : 'its PublicKey is another lease’s'
        : addrs.has(p.endpoint)
          ? `its endpoint address ${p.endpoint} is another lease’s`
          : null;
      if (reason) {
        if (this.#skipped.first(`${lease}/${reason}`)) {
          kernelMetrics(this.ctx.metrics).skipped.inc();
          this.ctx.log.warn({ lease, reason, tun: this.tunnel.dev }, 'peer lease skipped');
        }
        continue;
      }
      keys.add(k);
      addrs.add(p.endpoint);
      out.push(p);
    }
    return out;
  }

  /** The peers as the engine takes them (the fast-start record keeps them). */
  encoded(): Buffer {
    return encodeWireguardPeers(this.list());
  }

  handOver(dp: Dataplane): void {
    const list = this.list();
    const text = JSON.stringify(
      list.map((p) => [p.publicKey.toString('base64'), p.endpoint, p.port]),
    );
    if (dp === this.#lastEngine && text === this.#lastList) return;
    try {
      dp.setWireguardPeers!(list);
      this.#lastEngine = dp;
      this.#lastList = text;
      this.ctx.log.debug({ tun: this.tunnel.dev, peers: list.length }, 'wireguard peers set');
    } catch (err) {
      // the engine keeps its peers; the next handover tries again
      this.#lastEngine = null;
      this.ctx.log.error(
        { tun: this.tunnel.dev, err: errorMessage(err) },
        'wireguard peers refused',
      );
    }
  }
}

function samePeer(a: WireguardPeer, b: WireguardPeer): boolean {
  return (
    a.publicKey.equals(b.publicKey) &&
    a.endpoint === b.endpoint &&
    a.port === b.port &&
    a.persistentKeepalive === b.persistentKeepalive
  );
}

/** netConfig with only `families` enabled (a separate-mode tunnel sees its own family). */
function onlyFamilies(cfg: NetConfig, families: readonly Family[]): NetConfig {
  return { ...cfg, enableIPv4: families.includes(4), enableIPv6: families.includes(6) };
}

/** The underlay addresses a tunnel binds: its endpoint family's, both for auto when present. */
function tunnelBinds(ctx: BackendContext, t: Tunnel): { bindIp: string | null; bindIp6?: string } {
  const v4 = sendAddress(ctx.extIface, 4);
  const v6 = sendAddress(ctx.extIface, 6);
  if (t.endpoint === 4) return { bindIp: v4 };
  if (t.endpoint === 6) return { bindIp: v6 };
  return v4 && v6 ? { bindIp: v4, bindIp6: v6 } : { bindIp: v4 ?? v6 };
}

/**
 * The backend: one UserspaceBackend per tunnel (separate mode on a dual-stack cluster: two, each
 * its own engine, TUN, port and underlay family), sharing the key, one lease and one sum of
 * counters on /metrics.
 */
export class WireguardBackend implements Backend {
  readonly type = WIREGUARD;
  readonly #ctx: BackendContext;
  readonly #cfg: WireguardConfig;
  readonly #tunnels: readonly Tunnel[];
  readonly #inner: UserspaceBackend[];
  #key: WgKeyPair | null = null;
  /** Per tunnel device, its UAPI server (null: it could not start), newest engine's. */
  readonly #uapi = new Map<string, Promise<WireguardUapi | null>>();

  constructor(ctx: BackendContext) {
    this.#ctx = ctx;
    const cfg = parseWireguardConfig(ctx.netConfig.backend.raw);
    this.#cfg = cfg;
    const families = enabledFamilies(ctx.netConfig);
    if (cfg.mtu !== null && families.includes(6) && cfg.mtu < MIN_WG_MTU_V6) {
      throw configError(
        'Backend.MTU',
        `must be at least ${MIN_WG_MTU_V6} with EnableIPv6 (the device's MTU − ${WG_OVERHEAD} must hold IPv6's 1280)`,
      );
    }
    this.#tunnels = wireguardTunnels(cfg, families);
    const several = this.#tunnels.length > 1;
    this.#inner = this.#tunnels.map((t, i) => {
      const tctx = several ? { ...ctx, netConfig: onlyFamilies(ctx.netConfig, t.families) } : ctx;
      const sidecar = new WireguardPeers(t, ctx, cfg.keepalive, () => this.#key!.publicKey);
      return new UserspaceBackend(
        tctx,
        {
          type: WIREGUARD,
          resolve: async () => this.#spec(t, sidecar),
        },
        // fast start (fast-start.ts: the record keeps the key and the peers): the first
        // tunnel's record is the node's, a second one's is named by its TUN
        { registerMetrics: false, ...(i > 0 ? { recordTun: t.dev } : {}) },
      );
    });
  }

  #spec(t: Tunnel, sidecar: WireguardPeers): UserspaceSpec {
    const ctx = this.#ctx;
    const key = this.#key!;
    const mtu = (this.#cfg.mtu ?? ctx.extIface.mtu) - WG_OVERHEAD;
    const bind = tunnelBinds(ctx, t);
    if (!bind.bindIp) {
      const fam = t.endpoint === 'auto' ? 'any' : `an IPv${t.endpoint}`;
      throw new WeftError(
        'WEFT_ERR_BACKEND',
        `wireguard: ${ctx.extIface.name} has no ${fam} address for ${t.dev} to send from`,
      );
    }
    return {
      type: WIREGUARD,
      format: 'wireguard',
      tunName: t.dev,
      port: t.port,
      overhead: WG_OVERHEAD,
      mtu,
      bind,
      // a separate-mode tunnel's peers are reached in its own family
      underlayPerFamily: t.endpoint !== 'auto' && this.#cfg.mode === 'separate',
      vni: 0,
      vtepMac: null,
      attrs: { backendType: WIREGUARD },
      // greet: a new engine handshakes with its peers at once (a restarted daemon or a TUN made
      // again: they may hold sessions with the engine it replaces, until their 15 s timeout)
      wireguard: {
        privateKey: key.privateKey,
        greet: true,
        ...(this.#cfg.psk ? { psk: this.#cfg.psk } : {}),
      },
      sidecar,
      peerFor: (lease, family) => {
        const p = wireguardPeerFor(lease, t, ctx.extIface, this.#cfg.keepalive);
        if ('skip' in p) return p;
        return (
          p.entries.find((e) => e.subnet.family === family) ?? { skip: `no IPv${family} subnet` }
        );
      },
      prepared: (dp) => {
        if (!dp.wireguardPublicKey?.equals(key.publicKey)) {
          throw new WeftError(
            'WEFT_ERR_BACKEND',
            `wireguard: ${t.dev}'s engine derived another public key than the key file's`,
          );
        }
        this.#serveUapi(t.dev, dp, key);
      },
    };
  }

  /** Serves `wg show <dev>` from `dp`, after the server of the engine it replaces closes. */
  #serveUapi(dev: string, dp: Dataplane, key: WgKeyPair): void {
    const log = this.#ctx.log;
    const before = this.#uapi.get(dev);
    const dir = uapiSocketDir();
    const psk = this.#cfg.psk;
    this.#uapi.set(
      dev,
      (async () => {
        await (await before)?.close();
        try {
          return await startWireguardUapi({
            interfaceName: dev,
            state: () => dp.wireguardState!(),
            secrets: { privateKey: key.privateKey, ...(psk ? { psk } : {}) },
            ...(dir ? { dir } : {}),
            log,
          });
        } catch (err) {
          log.warn({ tun: dev, err: errorMessage(err) }, 'wg show will not work for this tunnel');
          return null;
        }
      })(),
    );
  }

  async prepare(): Promise<PreparedBackend> {
    const ctx = this.#ctx;
    const key = loadWgKey(keyFilePath());
    this.#key = key;
    ctx.log.info(
      { path: key.path, created: key.created, publicKey: key.publicKey.toString('base64') },
      key.created ? 'wireguard key created' : 'wireguard key loaded',
    );
    await this.#removeUnusedTun();
    let mtu = 0;
    for (const b of this.#inner) mtu = (await b.prepare()).mtu;
    registerDataplaneMetrics(ctx.metrics, () =>
      sumStats(this.#inner.map((b) => b.dataplane?.stats()).filter((s) => s !== undefined)),
    );
    const families = enabledFamilies(ctx.netConfig);
    // each family's port: the tunnel that carries it (separate v6: ListenPortV6)
    const portOf = (f: Family) => this.#tunnels.find((t) => t.families.includes(f))!.port;
    return {
      attrs: {
        backendType: WIREGUARD,
        ...(families.includes(4)
          ? { backendData: wireguardLeaseData(key.publicKey, portOf(4)) }
          : {}),
        ...(families.includes(6)
          ? { backendV6Data: wireguardLeaseData(key.publicKey, portOf(6)) }
          : {}),
      },
      mtu,
    };
  }

  /**
   * A persistent TUN of the other name (flannel-wg-v6 after a change to a one-tunnel Mode or to
   * IPv4 only; flannel-wg after one to IPv6 only), left by an earlier run, would keep its
   * address and route: it goes, as flanneld removes a link it no longer makes, with the
   * fast-start record a second tunnel kept of it (the engine the record started early on it
   * stops first). Only a TUN that no other process holds (weft's own, from before) is removed.
   */
  async #removeUnusedTun(): Promise<void> {
    const unused = [WG_DEV, WG_DEV_V6].filter((d) => !this.#tunnels.some((t) => t.dev === d));
    if (unused.length === 0) return;
    const subnetFile = this.#ctx.options.subnetFile;
    const nl = openNetlink();
    try {
      for (const dev of unused) {
        await this.#ctx.early?.release(dev);
        if (subnetFile) await rm(recordPath(subnetFile, dev), { force: true });
        const link = await nl.getLink(dev);
        if (link?.kind !== 'tun' || !link.tun?.persist || link.tun.queues > 0) continue;
        this.#ctx.log.info({ tun: dev }, 'removing the wireguard tun an earlier Mode left');
        await applyAll(nl, [{ op: 'delLink', dev }]);
      }
    } finally {
      nl.close();
    }
  }

  async start(lease: Lease): Promise<void> {
    for (const b of this.#inner) await b.start(lease);
  }

  async run(events: AsyncIterable<LeaseEvent[]>, signal: AbortSignal): Promise<void> {
    if (this.#inner.length === 1) return this.#inner[0]!.run(events, signal);
    const streams = fanOut(events, this.#inner.length);
    await Promise.all(this.#inner.map((b, i) => b.run(streams[i]!, signal)));
  }

  isReady(): boolean {
    return this.#inner.every((b) => b.isReady());
  }

  async close(how: CloseHow = {}): Promise<void> {
    for (const b of this.#inner) await b.close(how);
    for (const u of this.#uapi.values()) await (await u)?.close();
    this.#uapi.clear();
  }
}

/**
 * One async iterable read by `n` consumers, each seeing every item; it is read as the first
 * consumer starts, and ends (for all) when it ends. A consumer that returns early stops seeing
 * items; the source stops when every consumer returned.
 */
export function fanOut<T>(src: AsyncIterable<T>, n: number): AsyncIterable<T>[] {
  interface Q {
    items: T[];
    done: boolean;
    wake: (() => void) | null;
  }
  const qs: Q[] = Array.from({ length: n }, () => ({ items: [], done: false, wake: null }));
  const it = src[Symbol.asyncIterator]();
  let pumping = false;
  const pump = async () => {
    try {
      for (;;) {
        const r = await it.next();
        if (r.done || qs.every((q) => q.done)) break;
        for (const q of qs) {
          if (q.done) continue;
          q.items.push(r.value);
          q.wake?.();
        }
      }
    } catch {
      // the source failed: every consumer ends (the daemon sees the failure itself)
    } finally {
      for (const q of qs) {
        q.done = true;
        q.wake?.();
      }
      await it.return?.()?.catch(() => undefined);
    }
  };
  return qs.map((q) => ({
    [Symbol.asyncIterator](): AsyncIterator<T> {
      if (!pumping) {
        pumping = true;
        void pump();
      }
      return {
        async next(): Promise<IteratorResult<T>> {
          while (q.items.length === 0 && !q.done) await new Promise<void>((r) => (q.wake = r));
          q.wake = null;
          if (q.items.length > 0) return { value: q.items.shift()!, done: false };
          return { value: undefined, done: true };
        },
        async return(): Promise<IteratorResult<T>> {
          q.done = true;
          q.items = [];
          q.wake?.();
          return { value: undefined, done: true };
        },
      };
    },
  }));
}

/** wireguard's one registration (registry.ts). */
export const WIREGUARD_SPEC: BackendSpec = {
  type: WIREGUARD,
  create: (ctx) => new WireguardBackend(ctx),
  parseConfig: parseWireguardConfig,
  options: WIREGUARD_OPTIONS,
};
