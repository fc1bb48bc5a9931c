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
 * Run as root: `node --import tsx bench/control-plane.ts` (writes bench/results/control-plane.json).
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { type Family, parseCIDR } from '../src/common/ip.js';
import { logger } from '../src/common/log.js';
import { planHostGw } from '../src/control/backend/host-gw.js';
import { type Planner, Reconciler } from '../src/control/backend/reconcile.js';
import { planVxlan } from '../src/control/backend/vxlan.js';
import type { Lease, LeaseEvent } from '../src/control/lease/types.js';
import { NativeNetlink } from '../src/control/netlink/native-netlink.js';
import { NetnsScope, ip } from '../test/helpers/netns.js';

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

async function main(): Promise<void> {
  if (process.getuid?.() !== 0) {
    console.error('control-plane bench: needs root (it builds a network namespace)');
    process.exit(2);
  }
  const scope = new NetnsScope();
  const onSignal = () => void scope.cleanup().then(() => process.exit(130));
  process.once('SIGINT', onSignal);
  const results: Result[] = [];
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
  } finally {
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
  const dir = join(fileURLToPath(new URL('.', import.meta.url)), 'results');
  mkdirSync(dir, { recursive: true });
  writeFileSync(
    join(dir, 'control-plane.json'),
    JSON.stringify({ date: new Date().toISOString(), results }, null, 2) + '\n',
  );
}

await main();
