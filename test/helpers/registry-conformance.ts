/**
 * The Registry contract as tests, run against every store (memory, embedded, etcd). Call
 * `registryConformance(...)` at the top level of a test file; `open()` must return a fresh, empty
 * store for each test.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { isWeftError, type ErrorCode } from '../../src/common/errors.js';
import { sleep } from '../../src/common/lifecycle.js';
import type {
  Registry,
  RegistryEvent,
  StoredLease,
  WatchBatch,
} from '../../src/control/registry/registry.js';

export interface RegistryFixture {
  readonly registry: Registry;
  /** Writes a TTL-less key the way an operator would, outside the Registry API. */
  reserve?(key: string, value: string): Promise<void>;
  /** Frees what open() made (the registry is closed by the suite first). */
  dispose?(): Promise<void>;
}

export interface ConformanceOptions {
  /** A fresh, empty store per call. */
  open(): Promise<RegistryFixture>;
  /** A TTL the store honours exactly enough for expiry tests (etcd's minimum is 2 s). */
  shortTtlMs: number;
  /** Extra time after a TTL before a lapsed key must be gone. */
  expirySlackMs: number;
  /** Tolerance of the reported expiration against call time + ttl (etcd rounds to seconds). */
  expirationToleranceMs: number;
  /** Time a watch has to report a change. */
  watchTimeoutMs?: number;
  /** Set to skip every test with this reason. */
  skip?: string | false;
}

export const V4_KEY = '10.5.34.0-24';
export const DUAL_KEY = '10.5.77.0-24&fc00:0:0:5d::-64';
export const V4_VALUE = '{"PublicIP":"192.168.1.10","PublicIPv6":null,"BackendType":"host-gw"}';
export const DUAL_VALUE =
  '{"PublicIP":"192.168.1.11","PublicIPv6":"fd00::11","BackendType":"vxlan",' +
  '"BackendData":{"VNI":1,"VtepMAC":"aa:bb:cc:dd:ee:ff"},' +
  '"BackendV6Data":{"VNI":1,"VtepMAC":"aa:bb:cc:dd:ee:fe"}}';

export async function expectCode(p: Promise<unknown>, code: ErrorCode): Promise<void> {
  await assert.rejects(p, (err: unknown) => {
    assert.ok(isWeftError(err, code), `expected ${code}, got ${String(err)}`);
    return true;
  });
}

/** Pulls the next batch from a watch iterator, failing after `ms`. */
export async function nextBatch(it: AsyncIterator<WatchBatch>, ms: number): Promise<WatchBatch> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no watch batch within ${ms} ms`)), ms);
  });
  try {
    const r = await Promise.race([it.next(), timeout]);
    assert.equal(r.done, false, 'the watch ended early');
    return r.value as WatchBatch;
  } finally {
    clearTimeout(timer);
  }
}

export function eventRevision(e: RegistryEvent): number {
  return e.type === 'put' ? e.lease.revision : e.revision;
}

/** Applies a batch to a key → value map, as a consumer of the contract does. */
export function fold(state: Map<string, string>, b: WatchBatch): void {
  if (b.kind === 'resync') {
    state.clear();
    for (const l of b.leases) state.set(l.key, l.value);
    return;
  }
  for (const e of b.events) {
    if (e.type === 'put') state.set(e.lease.key, e.lease.value);
    else state.delete(e.key);
  }
}

/** Reads batches until `pred(state)` holds; returns every event seen on the way. */
async function watchUntil(
  it: AsyncIterator<WatchBatch>,
  state: Map<string, string>,
  pred: (s: Map<string, string>) => boolean,
  ms: number,
): Promise<WatchBatch[]> {
  const seen: WatchBatch[] = [];
  const deadline = Date.now() + ms;
  while (!pred(state)) {
    const b = await nextBatch(it, Math.max(1, deadline - Date.now()));
    seen.push(b);
    fold(state, b);
  }
  return seen;
}

export function registryConformance(name: string, o: ConformanceOptions): void {
  const watchMs = o.watchTimeoutMs ?? 5000;
  const skip = o.skip || undefined;

  /**
   * `exp` is `ttl` after a moment inside the call that returned it (taken between `before` and
   * `after`), give or take the store's rounding: a call the machine stalls in widens the window
   * instead of failing the test.
   */
  function expiresTtlAfter(exp: Date, ttl: number, before: number, after: number): void {
    const t = exp.getTime();
    const tol = o.expirationToleranceMs;
    assert.ok(
      t >= before + ttl - tol && t <= after + ttl + tol,
      `expiration ${t} outside [${before + ttl - tol}, ${after + ttl + tol}]`,
    );
  }

  async function withStore(fn: (r: Registry, f: RegistryFixture) => Promise<void>): Promise<void> {
    const f = await o.open();
    try {
      await fn(f.registry, f);
    } finally {
      await f.registry.close();
      await f.dispose?.();
    }
  }

  describe(`Registry conformance: ${name}`, { skip }, () => {
    it('reports a missing network config as WEFT_ERR_CONFIG_NOT_FOUND', () =>
      withStore(async (r) => {
        await expectCode(r.getNetworkConfig(), 'WEFT_ERR_CONFIG_NOT_FOUND');
      }));

    it('returns the network config byte for byte', () =>
      withStore(async (r) => {
        const text = '{ "Network": "10.5.0.0/16",\n  "Backend": {"Type": "vxlan"}, "x": "é✓" }\n';
        await r.setNetworkConfig(text);
        assert.equal(await r.getNetworkConfig(), text);
      }));

    it('creates a key and reads it back with its expiration and revision', () =>
      withStore(async (r) => {
        const before = Date.now();
        const exp = await r.createSubnet(V4_KEY, V4_VALUE, 60_000);
        expiresTtlAfter(exp, 60_000, before, Date.now());
        const got = await r.getSubnet(V4_KEY);
        assert.ok(got);
        assert.equal(got.key, V4_KEY);
        assert.equal(got.value, V4_VALUE);
        assert.ok(got.expiration);
        assert.ok(Math.abs(got.expiration.getTime() - exp.getTime()) <= o.expirationToleranceMs);
        assert.ok(got.revision > 0);
      }));

    it('returns null for a key that is not there', () =>
      withStore(async (r) => {
        assert.equal(await r.getSubnet(V4_KEY), null);
      }));

    it('lists every key with a revision at least that of each lease', () =>
      withStore(async (r) => {
        await r.createSubnet(V4_KEY, V4_VALUE, 60_000);
        await r.createSubnet(DUAL_KEY, DUAL_VALUE, 60_000);
        const list = await r.listSubnets();
        const byKey = new Map(list.leases.map((l) => [l.key, l.value]));
        assert.deepEqual(
          byKey,
          new Map([
            [V4_KEY, V4_VALUE],
            [DUAL_KEY, DUAL_VALUE],
          ]),
        );
        for (const l of list.leases) assert.ok(list.revision >= l.revision);
      }));

    it('rejects a second create of one key with WEFT_ERR_STORE_KEY_EXISTS', () =>
      withStore(async (r) => {
        await r.createSubnet(V4_KEY, V4_VALUE, 60_000);
        await expectCode(r.createSubnet(V4_KEY, DUAL_VALUE, 60_000), 'WEFT_ERR_STORE_KEY_EXISTS');
        assert.equal((await r.getSubnet(V4_KEY))?.value, V4_VALUE);
      }));

    it('updates a key with a new value, a restarted TTL and a higher revision', () =>
      withStore(async (r) => {
        await r.createSubnet(V4_KEY, V4_VALUE, 60_000);
        const first = (await r.getSubnet(V4_KEY))!;
        const before = Date.now();
        const exp = await r.updateSubnet(V4_KEY, DUAL_VALUE, 120_000);
        assert.ok(exp);
        expiresTtlAfter(exp, 120_000, before, Date.now());
        const got = (await r.getSubnet(V4_KEY))!;
        assert.equal(got.value, DUAL_VALUE);
        assert.ok(got.revision > first.revision);
      }));

    it('rejects an update of a missing key with WEFT_ERR_STORE_NOT_FOUND', () =>
      withStore(async (r) => {
        await expectCode(r.updateSubnet(V4_KEY, V4_VALUE, 60_000), 'WEFT_ERR_STORE_NOT_FOUND');
        assert.equal(await r.getSubnet(V4_KEY), null);
      }));

    it('deletes a key, and rejects deleting it again with WEFT_ERR_STORE_NOT_FOUND', () =>
      withStore(async (r) => {
        await r.createSubnet(V4_KEY, V4_VALUE, 60_000);
        await r.deleteSubnet(V4_KEY);
        assert.equal(await r.getSubnet(V4_KEY), null);
        assert.deepEqual((await r.listSubnets()).leases, []);
        await expectCode(r.deleteSubnet(V4_KEY), 'WEFT_ERR_STORE_NOT_FOUND');
      }));

    it('keeps a reservation TTL-less across updates and past the old TTL', () =>
      withStore(async (r) => {
        await r.createSubnet(V4_KEY, V4_VALUE, o.shortTtlMs);
        assert.equal(await r.updateSubnet(V4_KEY, V4_VALUE, null), null);
        assert.equal(await r.updateSubnet(V4_KEY, DUAL_VALUE, null), null);
        await sleep(o.shortTtlMs + o.expirySlackMs);
        const got = await r.getSubnet(V4_KEY);
        assert.ok(got, 'the reservation lapsed');
        assert.equal(got.expiration, null);
        assert.equal(got.value, DUAL_VALUE);
      }));

    it('reads an operator-written reservation as TTL-less and keeps it so on update', async (t) => {
      await withStore(async (r, f) => {
        if (!f.reserve) {
          t.skip('this store has no out-of-band writer');
          return;
        }
        await f.reserve(DUAL_KEY, DUAL_VALUE);
        const got = await r.getSubnet(DUAL_KEY);
        assert.equal(got?.value, DUAL_VALUE);
        assert.equal(got?.expiration, null);
        assert.equal(await r.updateSubnet(DUAL_KEY, V4_VALUE, null), null);
        assert.equal((await r.getSubnet(DUAL_KEY))?.expiration, null);
      });
    });

    it('hides a lapsed key from get and list', () =>
      withStore(async (r) => {
        await r.createSubnet(V4_KEY, V4_VALUE, o.shortTtlMs);
        await r.createSubnet(DUAL_KEY, DUAL_VALUE, 600_000);
        await sleep(o.shortTtlMs + o.expirySlackMs);
        assert.equal(await r.getSubnet(V4_KEY), null);
        assert.deepEqual(
          (await r.listSubnets()).leases.map((l) => l.key),
          [DUAL_KEY],
        );
      }));

    it('lets a lapsed key be created again', () =>
      withStore(async (r) => {
        await r.createSubnet(V4_KEY, V4_VALUE, o.shortTtlMs);
        await sleep(o.shortTtlMs + o.expirySlackMs);
        await r.createSubnet(V4_KEY, DUAL_VALUE, 60_000);
        assert.equal((await r.getSubnet(V4_KEY))?.value, DUAL_VALUE);
      }));

    it('reports the expiry of a key as a delete to a watch', () =>
      withStore(async (r) => {
        await r.createSubnet(V4_KEY, V4_VALUE, o.shortTtlMs);
        const list = await r.listSubnets();
        const ac = new AbortController();
        const it = r.watchSubnets(list.revision + 1, ac.signal)[Symbol.asyncIterator]();
        try {
          await sleep(o.shortTtlMs + o.expirySlackMs);
          await r.listSubnets();
          const state = new Map(list.leases.map((l) => [l.key, l.value]));
          const seen = await watchUntil(it, state, (s) => !s.has(V4_KEY), watchMs);
          const del = seen.flatMap((b) => (b.kind === 'events' ? b.events : []));
          assert.ok(
            del.some((e) => e.type === 'delete' && e.key === V4_KEY) ||
              seen.some((b) => b.kind === 'resync'),
          );
        } finally {
          ac.abort();
          await it.return?.();
        }
      }));

    it('watches puts and deletes in revision order as they happen', () =>
      withStore(async (r) => {
        const { revision } = await r.listSubnets();
        const ac = new AbortController();
        const it = r.watchSubnets(revision + 1, ac.signal)[Symbol.asyncIterator]();
        const events: RegistryEvent[] = [];
        const take = async (): Promise<RegistryEvent> => {
          while (events.length === 0) {
            const b = await nextBatch(it, watchMs);
            assert.equal(b.kind, 'events', 'no resync expected without compaction');
            if (b.kind === 'events') events.push(...b.events);
          }
          return events.shift()!;
        };
        try {
          let last = revision;
          const expect = async (type: 'put' | 'delete', key: string, value?: string) => {
            const e = await take();
            assert.equal(e.type, type);
            if (e.type === 'put') {
              assert.equal(e.lease.key, key);
              assert.equal(e.lease.value, value);
            } else {
              assert.equal(e.key, key);
            }
            assert.ok(eventRevision(e) > last, 'revisions must increase');
            last = eventRevision(e);
          };
          await r.createSubnet(V4_KEY, V4_VALUE, 60_000);
          await expect('put', V4_KEY, V4_VALUE);
          await r.createSubnet(DUAL_KEY, DUAL_VALUE, 60_000);
          await expect('put', DUAL_KEY, DUAL_VALUE);
          await r.updateSubnet(V4_KEY, DUAL_VALUE, 60_000);
          await expect('put', V4_KEY, DUAL_VALUE);
          await r.deleteSubnet(DUAL_KEY);
          await expect('delete', DUAL_KEY);
          await r.deleteSubnet(V4_KEY);
          await expect('delete', V4_KEY);
        } finally {
          ac.abort();
          await it.return?.();
        }
      }));

    it('replays the changes since an older revision, ending in the current state', () =>
      withStore(async (r) => {
        const start = (await r.listSubnets()).revision + 1;
        await r.createSubnet(V4_KEY, V4_VALUE, 60_000);
        await r.createSubnet(DUAL_KEY, DUAL_VALUE, 60_000);
        await r.deleteSubnet(V4_KEY);
        const ac = new AbortController();
        const it = r.watchSubnets(start, ac.signal)[Symbol.asyncIterator]();
        try {
          const state = new Map<string, string>([[V4_KEY, 'stale value from before']]);
          const seen = await watchUntil(
            it,
            state,
            (s) => !s.has(V4_KEY) && s.get(DUAL_KEY) === DUAL_VALUE,
            watchMs,
          );
          let last = 0;
          for (const b of seen) {
            if (b.kind !== 'events') continue;
            for (const e of b.events) {
              assert.ok(eventRevision(e) >= start);
              assert.ok(eventRevision(e) > last);
              last = eventRevision(e);
            }
          }
        } finally {
          ac.abort();
          await it.return?.();
        }
      }));

    it('ends a watch when its signal fires', () =>
      withStore(async (r) => {
        const ac = new AbortController();
        const { revision } = await r.listSubnets();
        const done = (async () => {
          const got: WatchBatch[] = [];
          for await (const b of r.watchSubnets(revision + 1, ac.signal)) got.push(b);
          return got;
        })();
        await sleep(200);
        ac.abort();
        const got = await Promise.race([
          done,
          sleep(2000).then(() => assert.fail('the watch did not end within 2 s of the abort')),
        ]);
        assert.deepEqual(got, []);
      }));

    it('ends a watch when the registry closes, and fails later calls', async () => {
      const f = await o.open();
      try {
        const r = f.registry;
        const { revision } = await r.listSubnets();
        const done = (async () => {
          for await (const _ of r.watchSubnets(revision + 1, new AbortController().signal)) {
            // nothing is written: no batch expected
          }
        })();
        await sleep(200);
        await r.close();
        await Promise.race([
          done,
          sleep(2000).then(() => assert.fail('the watch did not end within 2 s of close()')),
        ]);
        await expectCode(r.listSubnets(), 'WEFT_ERR_STORE_UNAVAILABLE');
      } finally {
        await f.registry.close();
        await f.dispose?.();
      }
    });

    it('stores values byte for byte under v4 and dual-stack keys', () =>
      withStore(async (r) => {
        const odd = ' {"PublicIP" : "10.0.0.1",\n\t"PublicIPv6":null, "note":"é✓ \\u0000 🙂"} ';
        await r.createSubnet(DUAL_KEY, odd, 60_000);
        await r.createSubnet(V4_KEY, '', 60_000);
        assert.equal((await r.getSubnet(DUAL_KEY))?.value, odd);
        assert.equal((await r.getSubnet(V4_KEY))?.value, '');
        const list = await r.listSubnets();
        const byKey = new Map(list.leases.map((l: StoredLease) => [l.key, l.value]));
        assert.equal(byKey.get(DUAL_KEY), odd);
        assert.equal(byKey.get(V4_KEY), '');
      }));
  });
}
