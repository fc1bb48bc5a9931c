/**
 * A dataplane on its own, for namespace tests of the engine below the backends: run inside a
 * node namespace (`ip netns exec NS node --import tsx dataplane-node.ts '<json>'`), it starts a
 * Dataplane, addresses its TUN (`ip`, as a test harness may), then serves JSON-line commands on
 * stdin and answers on stdout:
 *   {"cmd":"peers","peers":[{subnet, publicIP, port, vtepMac?}]}  → {"ok":true,"peers":n}
 *   {"cmd":"stats"}                                               → {"ok":true,"stats":{...}}
 *   {"cmd":"close"}                                               → {"ok":true} and exit
 * The first line out is {"ready":true,"tun":NAME} once the TUN is up.
 */
import { execFileSync } from 'node:child_process';
import { createInterface } from 'node:readline';
import { startDataplane } from '../../src/dataplane/index.js';
import type { DataplaneOptions } from '../../src/dataplane/index.js';
import { parseMac, peerEntry } from '../../src/dataplane/peer-table.js';

interface Config extends Omit<DataplaneOptions, 'vtepMac' | 'log'> {
  readonly vtepMac: string;
  /** Address for the TUN, e.g. 10.5.1.0/32, and the cluster route, e.g. 10.5.0.0/16. */
  readonly tunAddr: string;
  readonly clusterRoute: string;
  readonly tunAddr6?: string;
  readonly clusterRoute6?: string;
}

const cfg = JSON.parse(process.argv[2] ?? '{}') as Config;
const out = (o: unknown) => process.stdout.write(JSON.stringify(o) + '\n');

const dp = await startDataplane({ ...cfg, vtepMac: parseMac(cfg.vtepMac)! });
const ipCmd = (...args: string[]) => execFileSync('ip', args, { stdio: 'pipe' });
ipCmd('link', 'set', dp.tunName, 'mtu', String(cfg.tunMtu), 'up');
ipCmd('addr', 'add', cfg.tunAddr, 'dev', dp.tunName);
ipCmd('route', 'add', cfg.clusterRoute, 'dev', dp.tunName);
if (cfg.tunAddr6 && cfg.clusterRoute6) {
  ipCmd('addr', 'add', cfg.tunAddr6, 'dev', dp.tunName, 'nodad');
  ipCmd('route', 'add', cfg.clusterRoute6, 'dev', dp.tunName);
}
out({ ready: true, tun: dp.tunName });

const rl = createInterface({ input: process.stdin });
for await (const line of rl) {
  if (!line.trim()) continue;
  const m = JSON.parse(line) as {
    cmd: string;
    peers?: { subnet: string; publicIP: string; port: number; vtepMac?: string }[];
  };
  try {
    if (m.cmd === 'peers') {
      const peers = (m.peers ?? []).map((p) => peerEntry(p.subnet, p.publicIP, p.port, p.vtepMac));
      dp.setPeers(peers);
      out({ ok: true, peers: peers.length });
    } else if (m.cmd === 'stats') {
      out({ ok: true, stats: dp.stats() });
    } else if (m.cmd === 'close') {
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
await dp.close();
