/**
 * The daemon's own metrics (daemon.ts over metrics/metrics.ts): acquiring the lease is timed into
 * weft_lease_acquire_duration_seconds once, weft_ready turns 1, and the renewal series are there
 * at 0 before the first renewal. A memory store and a backend registered as `host-gw` that does
 * nothing stand in for the real ones.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { setLogLevel } from '../../../src/common/log.js';
import type { Backend } from '../../../src/control/backend/backend.js';
import { registerBackend } from '../../../src/control/backend/registry.js';
import { runDaemon } from '../../../src/control/daemon.js';
import type { DaemonMetrics } from '../../../src/control/metrics/metrics.js';
import { MemoryRegistry } from '../../../src/control/registry/memory.js';
import { testDaemonConfig } from './daemon-fixtures.js';

const dir = mkdtempSync(join(tmpdir(), 'weft-daemon-metrics-'));
after(() => rmSync(dir, { recursive: true, force: true }));

function sample(text: string, series: string): number {
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  assert.ok(line, `${series} missing`);
  return Number(line.slice(series.length + 1));
}

test('a ready daemon has timed its lease acquisition once; renewals are at 0', async () => {
  setLogLevel('silent');
  registerBackend('host-gw', (): Backend => ({
    type: 'host-gw',
    prepare: async () => ({ attrs: { backendType: 'host-gw' }, mtu: 1500 }),
    async start() {},
    async run(events, signal) {
      for await (const _b of events) if (signal.aborted) break;
    },
    async close() {},
  }));
  const reg = new MemoryRegistry({
    config: JSON.stringify({ Network: '10.5.0.0/16', Backend: { Type: 'host-gw' } }),
  });
  let metrics: DaemonMetrics | null = null;
  let ready: () => void;
  const isReady = new Promise<void>((r) => (ready = r));
  const stop = new AbortController();
  const daemon = runDaemon(
    testDaemonConfig(dir, reg, {
      tasks: [
        async (t) => {
          metrics = t.metrics;
          // a task runs until the daemon stops
          await new Promise((r) => t.signal.addEventListener('abort', r, { once: true }));
        },
      ],
      onReady: () => ready(),
    }),
    stop.signal,
  );
  await Promise.race([isReady, daemon]);
  const text = await metrics!.registry.metrics();
  stop.abort();
  await daemon;
  assert.equal(sample(text, 'weft_ready'), 1);
  assert.equal(sample(text, 'weft_lease_acquire_duration_seconds_count'), 1);
  assert.equal(sample(text, 'weft_lease_renew_duration_seconds_count'), 0);
  assert.equal(sample(text, 'weft_lease_renewals_total{result="error"}'), 0);
});
