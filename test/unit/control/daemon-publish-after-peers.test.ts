/**
 * A store that gives our lease before it is published (SubnetManager.leaseBeforePublish, kube):
 * the daemon starts the backend on that lease and feeds it the peers of the first list as they
 * come; it publishes our lease (and writes subnet.env) only once that list is checked, so that a
 * VtepMAC a peer holds is never published. A scripted manager and a recording backend registered
 * as `vxlan` stand in for the real ones.
 */
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, beforeEach, test } from 'node:test';
import { parseCIDR } from '../../../src/common/ip.js';
import { setLogLevel } from '../../../src/common/log.js';
import { type Backend, type BackendContext } from '../../../src/control/backend/backend.js';
import { registerBackend } from '../../../src/control/backend/registry.js';
import { parseNetConfig } from '../../../src/control/config/net-config.js';
import { runDaemon } from '../../../src/control/daemon.js';
import type { AcquireOptions, SubnetManager } from '../../../src/control/lease/manager.js';
import { continuesSnapshot, snapshotPart } from '../../../src/control/lease/snapshot-parts.js';
import { makeSubnetKey } from '../../../src/control/lease/subnet-key.js';
import type { Lease, LeaseAttrs, LeaseEvent } from '../../../src/control/lease/types.js';
import { testDaemonConfig } from './daemon-fixtures.js';
import { MemoryRegistry } from '../../../src/control/registry/memory.js';

const dir = mkdtempSync(join(tmpdir(), 'weft-daemon-publish-'));
after(() => rmSync(dir, { recursive: true, force: true }));
beforeEach(() => rmSync(join(dir, 'subnet.env'), { force: true }));

const FIRST_MAC = '0a:00:00:00:00:01';
const NEW_MAC = '0a:00:00:00:00:02';

function lease(subnet: string, attrs: Partial<LeaseAttrs> = {}): Lease {
  const net = parseCIDR(subnet)!;
  return {
    key: makeSubnetKey(net, null),
    subnet: net,
    ipv6Subnet: null,
    attrs: { publicIP: '192.168.1.11', publicIPv6: null, backendType: 'vxlan', ...attrs },
    expiration: null,
  };
}

const peer = (subnet: string, ip: string, mac: string) =>
  lease(subnet, { publicIP: ip, backendData: { VNI: 1, VtepMAC: mac } });

/**
 * Our node's podCIDR is 10.5.1.0/24. The peers' first list comes as `first` (a part) and, once
 * `release()` is called, `rest` (its last part); what the manager was asked is in `calls`.
 */
class ScriptedManager implements SubnetManager {
  readonly kind = 'kube';
  readonly leaseBeforePublish = true;
  readonly calls: string[] = [];
  readonly published: LeaseAttrs[] = [];
  release: () => void = () => undefined;
  readonly #released = new Promise<void>((r) => (this.release = r));

  constructor(
    readonly first: Lease[],
    readonly rest: Lease[],
  ) {}

  async getNetworkConfig() {
    return parseNetConfig(JSON.stringify({ Network: '10.5.0.0/16', Backend: { Type: 'vxlan' } }));
  }

  async acquireLease(attrs: LeaseAttrs, o: AcquireOptions = {}): Promise<Lease> {
    // (a VtepMAC to check against the peers' first list: that list is to be a latest one)
    this.calls.push(o.publish !== false ? 'publish' : o.latestPeers ? 'lease, latest' : 'lease');
    if (o.publish !== false) this.published.push(attrs);
    return lease('10.5.1.0/24', attrs);
  }

  async renewLease(l: Lease) {
    return l;
  }

  async releaseLease() {}

  async *watchLeases(_own: Lease, signal: AbortSignal): AsyncIterable<LeaseEvent[]> {
    const add = (l: Lease): LeaseEvent => ({ type: 'added', lease: l });
    const aborted = new Promise<void>((r) =>
      signal.addEventListener('abort', () => r(), { once: true }),
    );
    yield snapshotPart(this.first.map(add));
    await Promise.race([this.#released, aborted]);
    if (signal.aborted) return;
    yield this.rest.map(add);
    await aborted;
  }

  async otherLeases(): Promise<Lease[]> {
    this.calls.push('otherLeases');
    return [...this.first, ...this.rest];
  }

  async *watchOwnLease(_own: Lease, signal: AbortSignal): AsyncIterable<Lease> {
    await new Promise((r) => signal.addEventListener('abort', r, { once: true }));
  }

  async close() {}
}

interface Run {
  inUse: string[];
  started: string | null;
  batches: Array<{ keys: string[]; continued: boolean; callsThen: string[]; envThen: boolean }>;
}

/** Registers a `vxlan` backend whose first instance takes FIRST_MAC, later ones NEW_MAC. */
function recordingBackend(m: ScriptedManager, onBatch: (runs: Run[]) => void): Run[] {
  const runs: Run[] = [];
  registerBackend('vxlan', (ctx: BackendContext): Backend => {
    const run: Run = { inUse: [], started: null, batches: [] };
    runs.push(run);
    return {
      type: 'vxlan',
      snapshotParts: true,
      async prepare() {
        run.inUse = [...((await ctx.vtepMACs?.inUse()) ?? [])];
        const mac = runs.length === 1 ? FIRST_MAC : NEW_MAC;
        return {
          attrs: { backendType: 'vxlan', backendData: { VNI: 1, VtepMAC: mac } },
          mtu: 1450,
        };
      },
      async start(l) {
        run.started = l.key;
      },
      async run(events, signal) {
        for await (const b of events) {
          run.batches.push({
            keys: b.map((e) => e.lease.key),
            continued: continuesSnapshot(b),
            callsThen: [...m.calls],
            envThen: existsSync(join(dir, 'subnet.env')),
          });
          onBatch(runs);
          if (signal.aborted) break;
        }
      },
      async close() {},
    };
  });
  return runs;
}

/** The memory registry is only there to satisfy the fixture's type: openManager is replaced. */
const config = (m: ScriptedManager, onReady: () => void) =>
  testDaemonConfig(dir, new MemoryRegistry(), { openManager: async () => m, onReady });

test('the backend gets the first peers before our lease is published; publishing waits for the list', async () => {
  setLogLevel('silent');
  const m = new ScriptedManager(
    [peer('10.5.2.0/24', '192.168.1.12', '0a:00:00:00:00:12')],
    [peer('10.5.3.0/24', '192.168.1.13', '0a:00:00:00:00:13')],
  );
  let readyCalls: string[] | null = null;
  const runs = recordingBackend(m, (rs) => {
    if (rs[0]!.batches.length === 1) m.release();
  });
  const stop = new AbortController();
  let readyResolve!: () => void;
  const ready = new Promise<void>((r) => (readyResolve = r));
  const daemon = runDaemon(
    config(m, () => {
      readyCalls = [...m.calls];
      readyResolve();
    }),
    stop.signal,
  );
  await Promise.race([ready, daemon]);
  stop.abort();
  await daemon;
  assert.equal(runs.length, 1);
  assert.equal(runs[0]!.started, '10.5.1.0-24');
  assert.deepEqual(runs[0]!.inUse, [], 'the store is not asked which MACs are in use');
  assert.deepEqual(runs[0]!.batches[0], {
    keys: ['10.5.2.0-24'],
    continued: true,
    callsThen: ['lease, latest'],
    envThen: false,
  });
  // (the last part goes on while our lease is published: the list is checked by then)
  assert.deepEqual(
    runs[0]!.batches.slice(1).map((b) => [b.keys, b.continued]),
    [[['10.5.3.0-24'], false]],
  );
  assert.deepEqual(readyCalls, ['lease, latest', 'publish']);
  assert.equal(m.published.length, 1);
  assert.ok(existsSync(join(dir, 'subnet.env')), 'subnet.env written once published');
});

test('a peer of the first list holding our VtepMAC: another is chosen and only that one is published', async () => {
  setLogLevel('silent');
  const m = new ScriptedManager(
    [peer('10.5.2.0/24', '192.168.1.12', FIRST_MAC)],
    [peer('10.5.3.0/24', '192.168.1.13', '0a:00:00:00:00:13')],
  );
  const runs = recordingBackend(m, () => m.release());
  const stop = new AbortController();
  let readyResolve!: () => void;
  const ready = new Promise<void>((r) => (readyResolve = r));
  const daemon = runDaemon(config(m, readyResolve), stop.signal);
  await Promise.race([ready, daemon]);
  stop.abort();
  await daemon;

  assert.equal(runs.length, 2, 'the backend was rebuilt');
  assert.deepEqual(runs[0]!.batches, [], 'the first backend got no peer (its round was ended)');
  assert.deepEqual(runs[1]!.inUse, [FIRST_MAC, '0a:00:00:00:00:13'], 'the rebuilt one asked');
  assert.deepEqual(
    m.published.map((a) => (a.backendData as { VtepMAC: string }).VtepMAC),
    [NEW_MAC, NEW_MAC], // (the rebuild publishes; the daemon's own publish repeats it)
  );
});
