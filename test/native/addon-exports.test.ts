/**
 * The native boundary's vocabulary: the addon exports exactly what NativeAddon
 * (src/common/native-addon.ts) types, and the names it exports (counters, drop reasons,
 * offloads) are the ones the TypeScript side lists.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { loadNative } from '../../src/common/native.js';
import { NATIVE_EXPORTS } from '../../src/common/native-addon.js';
import { OFFLOAD_NAMES, offloadListError, offloadsFromEnv } from '../../src/dataplane/offloads.js';
import { BPF_COUNTERS, COUNTERS, DROP_REASONS } from '../../src/dataplane/stats.js';

const native = loadNative();

describe('native addon exports', () => {
  it('are exactly the NativeAddon interface, each a function', () => {
    const real = Object.getOwnPropertyNames(native).sort();
    assert.deepEqual(real, Object.keys(NATIVE_EXPORTS).sort());
    for (const k of real) {
      assert.equal(typeof (native as unknown as Record<string, unknown>)[k], 'function', k);
    }
  });

  it('name counters, drop reasons and offloads as the TypeScript side does', () => {
    assert.deepEqual(native.counterNames(), [...COUNTERS, ...DROP_REASONS.map((r) => `drop_${r}`)]);
    assert.deepEqual(native.dropReasons(), [...DROP_REASONS]);
    assert.deepEqual(native.offloadNames(), [...OFFLOAD_NAMES]);
    assert.deepEqual(native.bpfCounterNames(), [...BPF_COUNTERS]);
  });

  /** An engine config that is whole but for what each test breaks (refused before any TUN). */
  const config = (extra: Record<string, unknown>) => ({
    format: 'udp' as const,
    tunName: 'weft-never',
    workers: 1,
    bindIp: '127.0.0.1',
    port: 0,
    vni: 1,
    vtepMac: Buffer.alloc(6),
    tunMtu: 1400,
    ...extra,
  });

  it('refuse an unknown offload name at engine creation', () => {
    assert.throws(
      () => native.engineCreate(config({ offloads: ['tso9'] })),
      /unknown offload tso9/,
    );
  });

  it('refuse a negative steering pause at engine creation', () => {
    assert.throws(
      () => native.engineCreate(config({ steeringGapUs: -1 })),
      /steeringGapUs must be >= 0/,
    );
  });
});

describe('offload kill switch', () => {
  it('maps all, none and lists to names; the flag rule refuses unknown names', () => {
    assert.deepEqual(offloadsFromEnv(undefined), OFFLOAD_NAMES);
    assert.deepEqual(offloadsFromEnv('all'), OFFLOAD_NAMES);
    assert.deepEqual(offloadsFromEnv('none'), []);
    assert.deepEqual(offloadsFromEnv('gro, csum,bogus'), ['csum', 'gro']);
    assert.equal(offloadListError('csum,tso4'), null);
    assert.match(offloadListError('csum,tso9') ?? '', /unknown offload\(s\) tso9/);
  });
});
