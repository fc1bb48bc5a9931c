/**
 * The daemon hands the peer check's startup snapshot to a backend in parts only when the backend
 * takes parts (Backend.snapshotParts); any other gets it whole. A memory store of more leases
 * than a part and a recording backend registered as `host-gw` stand in for the real ones.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { setLogLevel } from '../../../src/common/log.js';
import { type Backend } from '../../../src/control/backend/backend.js';
import { SNAPSHOT_CHUNK } from '../../../src/control/backend/reconcile.js';
import { registerBackend } from '../../../src/control/backend/registry.js';
import { runDaemon } from '../../../src/control/daemon.js';
import { continuesSnapshot } from '../../../src/control/lease/snapshot-parts.js';
import { MemoryRegistry } from '../../../src/control/registry/memory.js';
import { testDaemonConfig } from './daemon-fixtures.js';

const dir = mkdtempSync(join(tmpdir(), 'weft-daemon-parts-'));
after(() => rmSync(dir, { recursive: true, force: true }));

const PEERS = SNAPSHOT_CHUNK + 100;

/** The batches (size, continued) a backend taking parts or not gets from a daemon at start. */
async function firstBatches(
  snapshotParts: boolean,
): Promise<Array<{ size: number; continued: boolean }>> {
  setLogLevel(process.env.DBG ? 'debug' : 'silent');
  const reg = new MemoryRegistry({
    config: JSON.stringify({ Network: '10.0.0.0/8', Backend: { Type: 'host-gw' } }),
  });
  for (let i = 0; i < PEERS; i++) {
    await reg.createSubnet(
      `10.${1 + (i >> 8)}.${i & 255}.0-24`,
      JSON.stringify({ PublicIP: `172.16.${i >> 8}.${i & 255}`, BackendType: 'host-gw' }),
      60_000,
    );
  }
  const got: Array<{ size: number; continued: boolean }> = [];
  let fed: () => void;
  const allFed = new Promise<void>((r) => (fed = r));
  registerBackend('host-gw', (): Backend => ({
    type: 'host-gw',
    snapshotParts,
    async prepare() {
      return { attrs: { backendType: 'host-gw' }, mtu: 1500 };
    },
    async start() {},
    async run(events, signal) {
      let n = 0;
      for await (const b of events) {
        got.push({ size: b.length, continued: continuesSnapshot(b) });
        n += b.length;
        if (n >= PEERS) fed();
        if (signal.aborted) break;
      }
    },
    async close() {},
  }));
  const stop = new AbortController();
  const daemon = runDaemon(testDaemonConfig(dir, reg), stop.signal);
  await Promise.race([allFed, daemon]);
  stop.abort();
  await daemon;
  return got;
}

test('a backend that takes parts gets the startup snapshot in parts', async () => {
  assert.deepEqual(await firstBatches(true), [
    { size: SNAPSHOT_CHUNK, continued: true },
    { size: 100, continued: false },
  ]);
});

test('a backend that does not gets the startup snapshot whole', async () => {
  assert.deepEqual(await firstBatches(false), [{ size: PEERS, continued: false }]);
});
