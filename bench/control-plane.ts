/**
 * Control-plane bench: lease events → kernel state, through the real path the vxlan and host-gw
 * backends use (pure plan → Reconciler → NativeNetlink batch → kernel), inside a namespace the
 * bench makes and removes.
 *
 *   ┌──────────── weft-<pid>-0 ────────────┐
 *   │ eth0 (veth to peer0) 10.250.0.1/24   │
 *   │ flannel.1 vxlan id 1 dstport 8472     │
 *   └──────────────────────────────────────┘
 *
 * Measured, for 1,000 and 5,000 peers:
 *   snapshot  every peer's `added` event in one batch → all entries in the kernel (vxlan: neigh,
 *             FDB, route per peer; host-gw: one route), checked by listing them afterwards
 *   single    one `added` event at a time → applied (p50 / p99 over 500 events)
 *   resync    a full re-check of the programmed state (list + compare, nothing to repair)
 *
 * End to end (`daemon` rows): one `weft daemon` (vxlan, embedded store) in the namespace.
 *   snapshot  N peer leases already in the store → daemon started → all 3·N entries in the
 *             kernel (time from the daemon's `ready` line, polled every 20 ms; its start-up,
 *             run from the TypeScript sources through tsx, is reported apart)
 *   single    one lease written to the store (10 peers present) → its route in the kernel,
 *             p50 / p99 over 100 events (polled every 0.5 ms)
 *
 * Run as root: `node --import tsx bench/control-plane.ts` (writes bench/results/control-plane.json).
 */
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { type Family, parseCIDR } from '../src/common/ip.js';
import { logger } from '../src/common/log.js';
import { planHostGw } from '../src/control/backend/host-gw.js';
import { type Planner, Reconciler } from '../src/control/backend/reconcile.js';
import { planVxlan } from '../src/control/backend/vxlan.js';
import type { Lease, LeaseEvent } from '../src/control/lease/types.js';
import { NativeNetlink } from '../src/control/netlink/native-netlink.js';
import { encodeLeaseAttrs } from '../src/control/lease/lease-json.js';
import { makeSubnetKey } from '../src/control/lease/subnet-key.js';
import { EmbeddedRegistry } from '../src/control/registry/embedded.js';
import { onEarlyEnd } from '../src/testbed/early-end.js';
import { NetnsScope, ip } from '../src/testbed/netns.js';

const WEFT_SRC = fileURLToPath(new URL('../test/helpers/weft-src.ts', import.meta.url));
const ROOT = fileURLToPath(new URL('..', import.meta.url));

const log = logger('bench');
log.level = 'silent';

function peer(i: number, backendType: string): Lease {
  const hex = (n: number) => n.toString(16).padStart(2, '0');
  const mac = `0a:00:00:${hex(i >> 16)}:${hex((i >> 8) & 255)}:${hex(i & 255)}`;
  const subnet = parseCIDR(`10.${100 + (i >> 8)}.${i & 255}.0/24`)!;
  return {
    key: `peer-${i}`,
    subnet,
    ipv6Subnet: null,
    attrs: {
      publicIP: `10.250.${1 + (i >> 8)}.${i & 255}`,
      publicIPv6: null,
      backendType,
      backendData: { VNI: 1, VtepMAC: mac },
    },
    expiration: null,
  };
}

interface Result {
  backend: string;
  peers: number;
  snapshotMs: number;
  /** Of which planning (pure TS). */
  planMs: number;
  /** CPU of this process during the snapshot: user (JS + binding) and system (kernel work). */
  userMs: number;
  sysMs: number;
  entries: number;
  singleP50Ms: number;
  singleP99Ms: number;
  resyncMs: number;
}

function pct(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * p))]!;
}

async function measure(ns: string, backend: 'vxlan' | 'host-gw', peers: number): Promise<Result> {
  const nl = new NativeNetlink({ netns: ns });
  const family: Family = 4;
  const network = parseCIDR('10.0.0.0/8')!;
  const plan: Planner =
    backend === 'vxlan'
      ? (ev, f) =>
          planVxlan(ev, f, { dev: 'flannel.1', extDev: 'eth0', directRouting: false, extNets: [] })
      : (ev, f) => planHostGw(ev, f, { extDev: 'eth0' });
  const ownership =
    backend === 'vxlan'
      ? [
          {
            family,
            routes: [{ dev: 'flannel.1', within: network }],
            neighDev: 'flannel.1',
            fdbDev: 'flannel.1',
          },
        ]
      : [{ family, routes: [{ dev: 'eth0', within: network, viaGateway: true }] }];
  const rec = new Reconciler({ netlink: nl, log, ownership });
  const events: LeaseEvent[] = [];
  for (let i = 0; i < peers; i++) events.push({ type: 'added', lease: peer(i, backend) });

  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  const planned = events.map((ev) => plan(ev, family));
  const planMs = performance.now() - t0;
  events.forEach((ev, i) => rec.update(ev.lease.key, planned[i]!));
  await rec.flush();
  const snapshotMs = performance.now() - t0;
  const cpu = process.cpuUsage(cpu0);

  let entries = 0;
  if (backend === 'vxlan') {
    entries += (await nl.listRoutes({ family, dev: 'flannel.1' })).length;
    entries += (await nl.listNeighs(family, 'flannel.1')).length;
    entries += (await nl.listFdb('flannel.1')).length;
  } else {
    entries += (await nl.listRoutes({ family, dev: 'eth0' })).filter((r) => r.gw !== null).length;
  }
  const perPeer = backend === 'vxlan' ? 3 : 1;
  if (entries !== peers * perPeer)
    throw new Error(`expected ${peers * perPeer} entries, found ${entries}`);

  const r0 = performance.now();
  await rec.resync();
  const resyncMs = performance.now() - r0;

  const lat: number[] = [];
  for (let k = 0; k < 500; k++) {
    const ev: LeaseEvent = { type: 'added', lease: peer(peers + k, backend) };
    const s = performance.now();
    rec.update(ev.lease.key, plan(ev, family));
    await rec.flush();
    lat.push(performance.now() - s);
  }
  lat.sort((a, b) => a - b);

  // Leave the namespace clean for the next run.
  for (const ev of events)
    rec.update(ev.lease.key, plan({ type: 'removed', lease: ev.lease }, family));
  for (let k = 0; k < 500; k++) {
    const l = peer(peers + k, backend);
    rec.update(l.key, plan({ type: 'removed', lease: l }, family));
  }
  await rec.flush();
  nl.close();
  return {
    backend,
    peers,
    snapshotMs,
    planMs,
    userMs: cpu.user / 1000,
    sysMs: cpu.system / 1000,
    entries,
    singleP50Ms: pct(lat, 0.5),
    singleP99Ms: pct(lat, 0.99),
    resyncMs,
  };
}

interface DaemonResult {
  peers: number;
  startToReadyMs: number;
  readyToProgrammedMs: number;
  singleP50Ms: number | null;
  singleP99Ms: number | null;
}

/**
 * Puts N leases in the embedded store: the first through the store (which lays out its
 * directories), the rest straight into its files (its documented layout: a header line, then the
 * value), one revision each, then the revision file. Creating them one by one through the store
 * would cost O(N²) file reads and measure the store, not the backend.
 */
async function seedStore(reg: EmbeddedRegistry, dir: string, n: number): Promise<void> {
  const viaStore = Math.min(n, 20);
  for (let i = 0; i < viaStore; i++) {
    const l = peer(i, 'vxlan');
    await reg.createSubnet(makeSubnetKey(l.subnet, null), encodeLeaseAttrs(l.attrs), 86_400_000);
  }
  const base = Number(readFileSync(join(dir, 'revision'), 'utf8').trim());
  const exp = Date.now() + 86_400_000;
  for (let i = viaStore; i < n; i++) {
    const l = peer(i, 'vxlan');
    const key = makeSubnetKey(l.subnet, null);
    const header = JSON.stringify({ revision: base + i - viaStore + 1, expiration: exp });
    writeFileSync(join(dir, 'subnets', key), `${header}\n${encodeLeaseAttrs(l.attrs)}`);
  }
  if (n > viaStore) writeFileSync(join(dir, 'revision'), String(base + n - viaStore));
}

async function measureDaemon(
  scope: NetnsScope,
  ns: string,
  peers: number,
  singles: number,
): Promise<DaemonResult> {
  const dir = mkdtempSync(join(tmpdir(), 'weft-cp-bench-'));
  const store = join(dir, 'store');
  const reg = new EmbeddedRegistry(store);
  const nl = new NativeNetlink({ netns: ns });
  try {
    const conf = { Network: '10.0.0.0/8', SubnetLen: 24, Backend: { Type: 'vxlan' } };
    await reg.setNetworkConfig(JSON.stringify(conf));
    await seedStore(reg, store, peers);
    const args = ['daemon', '--store-dir', store, '--iface', 'eth0'];
    args.push('--subnet-file', join(dir, 'subnet.env'), '--iptables-forward-rules=false');
    const t0 = performance.now();
    const p = scope.spawn(ns, process.execPath, ['--import', 'tsx', WEFT_SRC, ...args], {
      cwd: ROOT,
    });
    let ready = 0;
    let errText = '';
    p.stderr!.on('data', (d: Buffer) => {
      const t = d.toString();
      errText += t;
      if (!ready && t.includes('"msg":"ready"')) ready = performance.now();
    });
    // Routes go in last (neigh → FDB → route per peer): count them first, the rest once they
    // are all there. Polled every 20 ms so the dumps do not steal much CPU from the daemon.
    const count = async () => {
      const routes = (await nl.listRoutes({ family: 4, dev: 'flannel.1' })).length;
      if (routes < peers) return routes;
      return (
        routes +
        (await nl.listNeighs(4, 'flannel.1')).length +
        (await nl.listFdb('flannel.1')).length
      );
    };
    const deadline = Date.now() + 60_000;
    while (!ready || (await count()) < 3 * peers) {
      if (Date.now() > deadline || p.exitCode !== null) {
        throw new Error(`daemon did not program ${peers} peers: ${errText.slice(-2000)}`);
      }
      await new Promise((r) => setTimeout(r, 20));
    }
    const done = performance.now();
    const lat: number[] = [];
    for (let k = 0; k < singles; k++) {
      const l = peer(30_000 + k, 'vxlan');
      const key = makeSubnetKey(l.subnet, null);
      const dst = key.replace('-', '/');
      const s = performance.now();
      await reg.createSubnet(key, encodeLeaseAttrs(l.attrs), 86_400_000);
      while ((await nl.listRoutes({ family: 4, dev: 'flannel.1', dst })).length === 0) {
        if (performance.now() - s > 10_000) {
          throw new Error(
            `single event not applied in 10 s: ${errText
              .split('\n')
              .filter((l) => !l.includes('peer lease added'))
              .join('\n')
              .slice(-3000)}`,
          );
        }
        await new Promise((r) => setTimeout(r, 0.5));
      }
      lat.push(performance.now() - s);
    }
    lat.sort((a, b) => a - b);
    p.kill('SIGTERM');
    if (p.exitCode === null) await new Promise((r) => p.once('exit', r));
    // The daemon leaves its entries (as flannel does): remove the device for the next run.
    ip(ns, 'link', 'del', 'flannel.1');
    return {
      peers,
      startToReadyMs: ready - t0,
      readyToProgrammedMs: done - ready,
      singleP50Ms: lat.length ? pct(lat, 0.5) : null,
      singleP99Ms: lat.length ? pct(lat, 0.99) : null,
    };
  } finally {
    nl.close();
    await reg.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

async function main(): Promise<void> {
  if (process.getuid?.() !== 0) {
    console.error('control-plane bench: needs root (it builds a network namespace)');
    process.exit(2);
  }
  const scope = new NetnsScope();
  const early = onEarlyEnd('bench:control-plane', () => scope.cleanup());
  const results: Result[] = [];
  const daemon: DaemonResult[] = [];
  try {
    const ns = scope.add();
    ip(ns, 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'peer0');
    ip(ns, 'addr', 'add', '10.250.0.1/16', 'dev', 'eth0');
    ip(ns, 'link', 'set', 'eth0', 'up');
    ip(ns, 'link', 'set', 'peer0', 'up');
    ip(
      ns,
      'link',
      'add',
      'flannel.1',
      'type',
      'vxlan',
      'id',
      '1',
      'dstport',
      '8472',
      'local',
      '10.250.0.1',
      'dev',
      'eth0',
      'nolearning',
    );
    ip(ns, 'link', 'set', 'flannel.1', 'up');
    for (const backend of ['vxlan', 'host-gw'] as const) {
      for (const peers of [1000, 5000]) {
        process.stderr.write(`control-plane: ${backend} ${peers} peers ... `);
        const r = await measure(ns, backend, peers);
        process.stderr.write(`${r.snapshotMs.toFixed(0)} ms\n`);
        results.push(r);
      }
    }
    ip(ns, 'link', 'del', 'flannel.1');
    for (const [peers, singles] of [
      [10, 100],
      [1000, 0],
      [5000, 0],
    ] as const) {
      process.stderr.write(`control-plane: daemon (vxlan, embedded store) ${peers} peers ... `);
      const r = await measureDaemon(scope, ns, peers, singles);
      process.stderr.write(`${r.readyToProgrammedMs.toFixed(0)} ms\n`);
      daemon.push(r);
    }
  } finally {
    early.off();
    await scope.cleanup();
  }
  console.log(
    'backend  peers  snapshot→kernel (plan, user/sys CPU)  entries  single p50  single p99  resync',
  );
  for (const r of results) {
    console.log(
      `${r.backend.padEnd(8)} ${String(r.peers).padStart(5)}  ${r.snapshotMs.toFixed(0).padStart(12)} ms (${r.planMs.toFixed(0)}, ${r.userMs.toFixed(0)}/${r.sysMs.toFixed(0)} ms)  ${String(r.entries).padStart(7)}  ${r.singleP50Ms.toFixed(2).padStart(7)} ms  ${r.singleP99Ms.toFixed(2).padStart(7)} ms  ${r.resyncMs.toFixed(0).padStart(4)} ms`,
    );
  }
  console.log(
    '\ndaemon (vxlan, embedded)  peers  start→ready  ready→programmed  single p50  single p99',
  );
  const ms = (v: number | null) => (v === null ? '       -  ' : `${v.toFixed(1).padStart(7)} ms`);
  for (const r of daemon) {
    console.log(
      `${''.padEnd(24)} ${String(r.peers).padStart(6)}  ${r.startToReadyMs.toFixed(0).padStart(8)} ms  ${r.readyToProgrammedMs.toFixed(0).padStart(13)} ms  ${ms(r.singleP50Ms)}  ${ms(r.singleP99Ms)}`,
    );
  }
  const dir = join(fileURLToPath(new URL('.', import.meta.url)), 'results');
  mkdirSync(dir, { recursive: true });
  writeFileSync(
    join(dir, 'control-plane.json'),
    JSON.stringify({ date: new Date().toISOString(), results, daemon }, null, 2) + '\n',
  );
}

await main();
