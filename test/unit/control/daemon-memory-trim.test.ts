/**
 * The daemon hands every lease batch to its MemoryTrimmer: a snapshot of enough peer leases,
 * once quiet, is followed by one trim. A memory store and a recording backend stand in for the
 * real ones; the trim is a spy.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { setLogLevel } from '../../../src/common/log.js';
import { type Backend } from '../../../src/control/backend/backend.js';
import { registerBackend } from '../../../src/control/backend/registry.js';
import { runDaemon } from '../../../src/control/daemon.js';
import { testDaemonConfig } from './daemon-fixtures.js';
import { MemoryRegistry } from '../../../src/control/registry/memory.js';

const dir = mkdtempSync(join(tmpdir(), 'weft-daemon-trim-'));
after(() => rmSync(dir, { recursive: true, force: true }));

test('a snapshot of enough peer leases is followed, once quiet, by one memory trim', async () => {
  setLogLevel('silent');
  const reg = new MemoryRegistry({
    config: JSON.stringify({ Network: '10.5.0.0/16', Backend: { Type: 'host-gw' } }),
  });
  for (let i = 1; i <= 8; i++) {
    await reg.createSubnet(
      `10.5.${i}.0-24`,
      JSON.stringify({ PublicIP: `192.168.1.${i}`, PublicIPv6: null, BackendType: 'host-gw' }),
      60_000,
    );
  }
  let peers = 0;
  registerBackend('host-gw', (): Backend => ({
    type: 'host-gw',
    async prepare() {
      return { attrs: { backendType: 'host-gw', backendData: null }, mtu: 1500 };
    },
    async start() {},
    async run(events) {
      for await (const b of events) peers += b.length;
    },
    async close() {},
  }));
  let trimmed!: () => void;
  const trim = new Promise<void>((r) => (trimmed = r));
  let trims = 0;
  const stop = new AbortController();
  const daemon = runDaemon(
    testDaemonConfig(dir, reg, {
      memoryTrim: {
        trim: () => {
          trims++;
          trimmed();
          return true;
        },
        quietMs: 20,
        minChanges: 8,
      },
    }),
    stop.signal,
  );
  await Promise.race([trim, daemon]);
  stop.abort();
  await daemon;
  assert.equal(peers, 8);
  assert.equal(trims, 1);
});
