/**
 * The daemon's registry (src/control/metrics/metrics.ts): prom-client's default process_* and
 * nodejs_* families (event-loop lag included) read at each scrape, weft's families with their
 * known label values at 0, store requests timed by operation, and the whole registry — every
 * family the daemon can register — read back by `promtool check metrics` when it is installed.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { describe, test } from 'node:test';
import { kernelMetrics } from '../../../../src/control/backend/kernel-common.js';
import { leaseConflictCounter } from '../../../../src/control/backend/peer-check.js';
import {
  REGISTRY_OPERATIONS,
  countLeaseEvents,
  createDaemonMetrics,
  timedStore,
} from '../../../../src/control/metrics/metrics.js';
import { registerDataplaneMetrics } from '../../../../src/dataplane/stats-metrics.js';

function value(text: string, series: string): number {
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  assert.ok(line, `${series} missing`);
  return Number(line.slice(series.length + 1));
}

describe("the daemon's registry", () => {
  test('serves the process_* and nodejs_* families of prom-client, read now', async () => {
    const { registry } = createDaemonMetrics();
    const text = await registry.metrics();
    assert.ok(value(text, 'process_resident_memory_bytes') > 10e6);
    assert.ok(value(text, 'process_open_fds') >= 3);
    assert.ok(value(text, 'process_max_fds') >= value(text, 'process_open_fds'));
    assert.ok(value(text, 'process_cpu_seconds_total') > 0);
    assert.ok(value(text, 'nodejs_heap_size_used_bytes') > 0);
    for (const family of [
      'nodejs_eventloop_lag_p99_seconds',
      'nodejs_active_handles',
      'nodejs_gc_duration_seconds',
      'nodejs_heap_space_size_used_bytes',
    ])
      assert.match(text, new RegExp(`^# TYPE ${family} `, 'm'));
    assert.match(text, /^weft_build_info\{version="[^"]+",node="v\d+/m);
  });

  test('renewal results and event types are exported at 0 before the first one', async () => {
    const { registry } = createDaemonMetrics();
    const text = await registry.metrics();
    assert.equal(value(text, 'weft_lease_renewals_total{result="ok"}'), 0);
    assert.equal(value(text, 'weft_lease_renewals_total{result="error"}'), 0);
    assert.equal(value(text, 'weft_lease_events_total{type="removed"}'), 0);
    assert.equal(value(text, 'weft_lease_renew_duration_seconds_count'), 0);
  });

  test('a batch of lease events is counted by type, and the peers known now are set', async () => {
    const { registry, lease } = createDaemonMetrics();
    countLeaseEvents(lease, [{ type: 'added' }, { type: 'removed' }, { type: 'added' }], 7);
    countLeaseEvents(lease, [{ type: 'added' }], 8);
    const text = await registry.metrics();
    assert.equal(value(text, 'weft_lease_events_total{type="added"}'), 3);
    assert.equal(value(text, 'weft_lease_events_total{type="removed"}'), 1);
    assert.equal(value(text, 'weft_lease_peers'), 8);
  });

  test("a timed store's requests are observed by operation, failures included", async () => {
    const { registry, lease } = createDaemonMetrics();
    class Store {
      readonly #n = 1;
      readonly kind = 'etcd';
      async getSubnet(key: string): Promise<string> {
        return `${key}:${this.#n}`;
      }
      async deleteSubnet(): Promise<void> {
        throw new Error('gone');
      }
    }
    const store = timedStore(new Store(), 'etcd', REGISTRY_OPERATIONS, lease);
    // every operation of this store is there at 0 before any request
    let text = await registry.metrics();
    assert.equal(
      value(
        text,
        'weft_store_request_duration_seconds_count{store="etcd",operation="listSubnets"}',
      ),
      0,
    );
    assert.equal(value(text, 'weft_lease_watch_resyncs_total{store="etcd"}'), 0);
    assert.doesNotMatch(text, /store="kube"/);
    assert.equal(store.kind, 'etcd');
    assert.equal(await store.getSubnet('k'), 'k:1'); // #private fields still work
    await assert.rejects(store.deleteSubnet(), /gone/);
    text = await registry.metrics();
    const count = (op: string) =>
      value(text, `weft_store_request_duration_seconds_count{store="etcd",operation="${op}"}`);
    assert.equal(count('getSubnet'), 1);
    assert.equal(count('deleteSubnet'), 1);
  });

  test('promtool check metrics finds nothing to say about every family', async (t) => {
    if (spawnSync('promtool', ['--version']).error) {
      t.skip('promtool is not installed (Debian package prometheus): format not checked');
      return;
    }
    const { registry, lease } = createDaemonMetrics();
    lease.malformed.inc({ store: 'a"b\\c' }); // escaping
    lease.acquireDuration.observe(0.02);
    leaseConflictCounter(registry);
    kernelMetrics(registry).programmed.observe({ target: 'kernel' }, 0.003);
    registerDataplaneMetrics(registry, () => null);
    timedStore({}, 'kube', ['getNode'], lease);
    const r = spawnSync('promtool', ['check', 'metrics'], {
      input: await registry.metrics(),
      encoding: 'utf8',
    });
    assert.equal(r.status, 0, r.stdout + r.stderr);
    assert.equal((r.stdout + r.stderr).trim(), '');
  });
});
