/**
 * The daemon as the newcomer of a VtepMAC clash (issue #12.1): a peer that was in the store
 * before us publishes the MAC our backend came up with, so the daemon rebuilds the backend (which
 * chooses another MAC), re-publishes our lease with it, and feeds the peers again. A memory store
 * and a recording backend registered as `vxlan` stand in for the real ones.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { setLogLevel } from '../../../src/common/log.js';
import { type Backend, type BackendContext } from '../../../src/control/backend/backend.js';
import { registerBackend } from '../../../src/control/backend/registry.js';
import { runDaemon } from '../../../src/control/daemon.js';
import { testDaemonConfig } from './daemon-fixtures.js';
import type { LeaseEvent } from '../../../src/control/lease/types.js';
import { MemoryRegistry } from '../../../src/control/registry/memory.js';

const dir = mkdtempSync(join(tmpdir(), 'weft-daemon-vtep-'));
after(() => rmSync(dir, { recursive: true, force: true }));

const PEER_MAC = '0a:00:00:00:00:01';
const NEW_MAC = '0a:00:00:00:00:02';

test('a daemon whose VtepMAC an older peer holds chooses another and re-publishes', async () => {
  setLogLevel('silent');
  const reg = new MemoryRegistry({
    config: JSON.stringify({ Network: '10.5.0.0/16', Backend: { Type: 'vxlan' } }),
  });
  await reg.createSubnet(
    '10.5.7.0-24',
    JSON.stringify({
      PublicIP: '192.168.1.99',
      PublicIPv6: null,
      BackendType: 'vxlan',
      BackendData: { VNI: 1, VtepMAC: PEER_MAC },
    }),
    60_000,
  );
  // Backend instances: the first comes up with the peer's MAC (as a race at start would give),
  // the next one asks the store which MACs are in use and avoids them.
  const runs: Array<{ mac: string; inUse: string[]; events: LeaseEvent[][] }> = [];
  let fed: () => void;
  const peerFed = new Promise<void>((r) => (fed = r));
  registerBackend('vxlan', (ctx: BackendContext): Backend => {
    const run = { mac: '', inUse: [] as string[], events: [] as LeaseEvent[][] };
    runs.push(run);
    return {
      type: 'vxlan',
      async prepare() {
        run.inUse = [...((await ctx.vtepMACs?.inUse()) ?? [])];
        run.mac = runs.length === 1 ? PEER_MAC : run.inUse.includes(NEW_MAC) ? 'x' : NEW_MAC;
        return {
          attrs: { backendType: 'vxlan', backendData: { VNI: 1, VtepMAC: run.mac } },
          mtu: 1450,
        };
      },
      async start() {},
      async run(events, signal) {
        for await (const b of events) {
          run.events.push(b);
          if (runs.length === 2 && b.some((e) => e.lease.key === '10.5.7.0-24')) fed();
          if (signal.aborted) break;
        }
      },
      async close() {},
    };
  });
  const stop = new AbortController();
  const daemon = runDaemon(testDaemonConfig(dir, reg), stop.signal);
  await Promise.race([peerFed, daemon]);
  const { leases } = await reg.listSubnets();
  stop.abort();
  await daemon;

  assert.equal(runs.length, 2);
  assert.deepEqual(runs[1]!.inUse, [PEER_MAC]);
  // The first backend never got the clashing peer; the second did.
  assert.deepEqual(runs[0]!.events, [[]]);
  assert.deepEqual(
    runs[1]!.events[0]!.map((e) => [e.type, e.lease.key]),
    [['added', '10.5.7.0-24']],
  );
  // Our lease in the store carries the new MAC.
  const ours = leases.find((l) => l.key !== '10.5.7.0-24')!;
  assert.equal(JSON.parse(ours.value).BackendData.VtepMAC, NEW_MAC);
});
