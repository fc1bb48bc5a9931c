/**
 * A dataplane on its own, for namespace tests of the engine below the backends: run inside a
 * node namespace (`ip netns exec NS node --import tsx dataplane-node.ts '<json>'`), it starts a
 * Dataplane, addresses its TUN (`ip`, as a test harness may), then serves JSON-line commands on
 * stdin and answers on stdout:
 *   {"cmd":"peers","peers":[{subnet, publicIP, port, vtepMac?}]}  → {"ok":true,"peers":n}
 *   {"cmd":"delta","removed":[...],"upserts":[...]}  updatePeerTable → {"ok":true}
 *   {"cmd":"stats"}                                               → {"ok":true,"stats":{...}}
 *   {"cmd":"wgpeers","wg":[{publicKey (base64), endpoint, port, persistentKeepalive?}]}
 *                           format wireguard: setWireguardPeers    → {"ok":true}
 *   {"cmd":"uapi","dir"?}   format wireguard: serve the UAPI for the TUN's name (wireguard-uapi.ts;
 *                           dir: its socket directory, default /var/run/wireguard) → {"ok":true,"path"}
 *   {"cmd":"cycle","n":N}   close and start the dataplane N times → {"ok":true,"fds":[before,after]}
 *   {"cmd":"close"}                                               → {"ok":true} and exit
 * The first line out is {"ready":true,"tun":NAME} once the TUN is up (format wireguard: with
 * "wgPublicKey", base64; the config's `wireguard` holds base64 `privateKey` and `psk`). With `podBridge` (a name),
 * control's follower (control/netlink/pod-bridge.ts) hands the engine that bridge, as the
 * userspace backend does.
 */
import { execFileSync } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { logger } from '../../src/common/log.js';
import { openNetlink } from '../../src/control/netlink/open-netlink.js';
import { PodBridgeFollower } from '../../src/control/netlink/pod-bridge.js';
import { startDataplane, startWireguardUapi } from '../../src/dataplane/index.js';
import type { Dataplane, DataplaneOptions, WireguardUapi } from '../../src/dataplane/index.js';
import type { PeerEntry } from '../../src/dataplane/peer-table.js';
import {
  applyPeerDelta,
  encodePeerTable,
  parseMac,
  peerEntry,
} from '../../src/dataplane/peer-table.js';

interface Config extends Omit<DataplaneOptions, 'vtepMac' | 'log' | 'wireguard'> {
  readonly vtepMac: string;
  readonly wireguard?: { readonly privateKey: string; readonly psk?: string };
  /** Address for the TUN, e.g. 10.5.1.0/32, and the cluster route, e.g. 10.5.0.0/16. */
  readonly tunAddr: string;
  readonly clusterRoute: string;
  readonly tunAddr6?: string;
  readonly clusterRoute6?: string;
  /** The pods' bridge to follow for the engine (none: not followed). */
  readonly podBridge?: string;
}

interface PeerSpec {
  readonly subnet: string;
  readonly publicIP: string;
  readonly port: number;
  readonly vtepMac?: string;
}

const cfg = JSON.parse(process.argv[2] ?? '{}') as Config;
const out = (o: unknown) => process.stdout.write(JSON.stringify(o) + '\n');

const ipCmd = (...args: string[]) => execFileSync('ip', args, { stdio: 'pipe' });
async function start(): Promise<Dataplane> {
  const wg = cfg.wireguard;
  const d = await startDataplane({
    ...cfg,
    vtepMac: parseMac(cfg.vtepMac)!,
    wireguard: wg
      ? {
          privateKey: Buffer.from(wg.privateKey, 'base64'),
          ...(wg.psk ? { psk: Buffer.from(wg.psk, 'base64') } : {}),
        }
      : undefined,
  });
  ipCmd('link', 'set', d.tunName, 'mtu', String(cfg.tunMtu), 'up');
  ipCmd('addr', 'add', cfg.tunAddr, 'dev', d.tunName);
  ipCmd('route', 'add', cfg.clusterRoute, 'dev', d.tunName);
  if (cfg.tunAddr6 && cfg.clusterRoute6) {
    ipCmd('addr', 'add', cfg.tunAddr6, 'dev', d.tunName, 'nodad');
    ipCmd('route', 'add', cfg.clusterRoute6, 'dev', d.tunName);
  }
  return d;
}
const fds = () => readdirSync('/proc/self/fd').length;
const nl = cfg.podBridge ? openNetlink() : null;
const podBridge = nl ? new PodBridgeFollower(nl, cfg.podBridge!, logger('pod-bridge')) : null;
let dp = await start();
podBridge?.feed(dp);
let peers: PeerEntry[] = [];
/** The table as deltas left it (what a `cycle` hands the new engine). */
let table: Buffer | null = null;
let uapi: WireguardUapi | null = null;
out({
  ready: true,
  tun: dp.tunName,
  engine: dp.engine,
  ...(dp.wireguardPublicKey ? { wgPublicKey: dp.wireguardPublicKey.toString('base64') } : {}),
});

const rl = createInterface({ input: process.stdin });
for await (const line of rl) {
  if (!line.trim()) continue;
  const m = JSON.parse(line) as {
    cmd: string;
    n?: number;
    peers?: PeerSpec[];
    wg?: { publicKey: string; endpoint: string; port: number; persistentKeepalive?: number }[];
    removed?: PeerSpec[];
    upserts?: PeerSpec[];
    dir?: string;
  };
  const entries = (ps: PeerSpec[] | undefined) =>
    (ps ?? []).map((p) => peerEntry(p.subnet, p.publicIP, p.port, p.vtepMac));
  try {
    if (m.cmd === 'peers') {
      peers = entries(m.peers);
      table = null;
      dp.setPeers(peers);
      out({ ok: true, peers: peers.length });
    } else if (m.cmd === 'delta') {
      const delta = {
        removed: encodePeerTable(entries(m.removed)),
        upserts: encodePeerTable(entries(m.upserts)),
      };
      dp.updatePeerTable(delta);
      table = applyPeerDelta(table ?? encodePeerTable(peers), delta);
      out({ ok: true });
    } else if (m.cmd === 'cycle') {
      const before = fds();
      for (let i = 0; i < (m.n ?? 1); i++) {
        await dp.close();
        dp = await start();
        podBridge?.feed(dp);
        if (table) dp.setPeerTable(table);
        else dp.setPeers(peers);
      }
      out({ ok: true, fds: [before, fds()] });
    } else if (m.cmd === 'wgpeers') {
      if (!dp.setWireguardPeers) throw new Error('not a wireguard dataplane');
      dp.setWireguardPeers(
        (m.wg ?? []).map((p) => ({ ...p, publicKey: Buffer.from(p.publicKey, 'base64') })),
      );
      out({ ok: true });
    } else if (m.cmd === 'uapi') {
      const wg = cfg.wireguard;
      if (!wg || !dp.wireguardState) throw new Error('not a wireguard dataplane');
      const engine = dp;
      uapi = await startWireguardUapi({
        interfaceName: dp.tunName,
        state: () => engine.wireguardState!(),
        secrets: {
          privateKey: Buffer.from(wg.privateKey, 'base64'),
          ...(wg.psk ? { psk: Buffer.from(wg.psk, 'base64') } : {}),
        },
        ...(m.dir ? { dir: m.dir } : {}),
      });
      out({ ok: true, path: uapi.path });
    } else if (m.cmd === 'stats') {
      out({ ok: true, stats: dp.stats() });
    } else if (m.cmd === 'close') {
      await uapi?.close();
      podBridge?.close();
      nl?.close();
      await dp.close();
      out({ ok: true });
      process.exit(0);
    } else {
      out({ ok: false, error: `unknown cmd ${m.cmd}` });
    }
  } catch (err) {
    out({ ok: false, error: (err as Error).message });
  }
}
await uapi?.close();
podBridge?.close();
nl?.close();
await dp.close();
