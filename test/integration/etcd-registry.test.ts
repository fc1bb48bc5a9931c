/**
 * EtcdRegistry against a real etcd (Debian etcd-server) on loopback:
 *
 *   this process ──HTTP/JSON──▶ etcd 127.0.0.1:<random> (temp data dir)   ◀── etcdctl (checks)
 *
 * Plain, TLS (client certificates required) and password-auth members are started as needed.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { after, before, describe, it } from 'node:test';
import { sleep } from '../../src/common/lifecycle.js';
import { EtcdRegistry, type EtcdRegistryOptions } from '../../src/control/registry/etcd.js';
import type { WatchBatch } from '../../src/control/registry/registry.js';
import { orHang } from '../helpers/hang-bound.js';
import { startTcpProxy } from '../helpers/tcp-proxy.js';
import {
  enableAuth,
  etcdSkipReason,
  freePort,
  opensslSkipReason,
  startEtcd,
  type TestEtcd,
} from '../helpers/etcd.js';
import {
  DUAL_KEY,
  DUAL_VALUE,
  V4_KEY,
  V4_VALUE,
  expectCode,
  nextBatch,
  registryConformance,
} from '../helpers/registry-conformance.js';

const skip = etcdSkipReason();
const DAY_MS = 24 * 60 * 60 * 1000;
let etcd: TestEtcd | undefined;
let prefixes = 0;
const registries: EtcdRegistry[] = [];

before(async () => {
  if (!skip) etcd = await startEtcd();
});

after(async () => {
  for (const r of registries) await r.close();
  await etcd?.stop();
});

function freshPrefix(): string {
  return `/weft-test-${process.pid}-${++prefixes}`;
}

function open(options: Partial<EtcdRegistryOptions> = {}): EtcdRegistry {
  const r = new EtcdRegistry({ endpoints: [etcd!.endpoint], prefix: freshPrefix(), ...options });
  registries.push(r);
  return r;
}

/** The etcd lease id (hex, as etcdctl prints it) a key is attached to; '0' for none. */
function leaseOf(e: TestEtcd, key: string, auth?: { username: string; password: string }): string {
  const out = e.ctl(['get', key, '-w', 'json'], auth);
  const m = /"lease":(\d+)/.exec(out);
  return m ? BigInt(m[1]!).toString(16) : '0';
}

function timeToLive(e: TestEtcd, hexId: string): { granted: number; remaining: number } | null {
  const out = e.ctl(['lease', 'timetolive', hexId]);
  const m = /granted with TTL\((\d+)s\), remaining\((-?\d+)s\)/.exec(out);
  return m ? { granted: Number(m[1]), remaining: Number(m[2]) } : null;
}

async function collect(
  it: AsyncIterator<WatchBatch>,
  until: (b: WatchBatch[]) => boolean,
  ms: number,
) {
  const got: WatchBatch[] = [];
  const deadline = Date.now() + ms;
  while (!until(got)) got.push(await nextBatch(it, Math.max(1, deadline - Date.now())));
  return got;
}

registryConformance('etcd', {
  skip,
  open: async () => {
    const prefix = freshPrefix();
    const registry = new EtcdRegistry({ endpoints: [etcd!.endpoint], prefix });
    return {
      registry,
      reserve: async (key, value) => {
        etcd!.ctl(['put', `${prefix}/subnets/${key}`, value]);
      },
    };
  },
  // etcd's minimum lease TTL is 2 s with the default election timeout (1.5 s rounded up).
  shortTtlMs: 2000,
  expirySlackMs: 1500,
  expirationToleranceMs: 1500,
});

describe('EtcdRegistry on a real etcd', { skip }, () => {
  it('uses the flannel layout under the default prefix', async () => {
    const r = new EtcdRegistry({ endpoints: [etcd!.endpoint] });
    registries.push(r);
    try {
      await r.setNetworkConfig('{"Network":"10.5.0.0/16"}');
      await r.createSubnet(DUAL_KEY, DUAL_VALUE, 60_000);
      assert.equal(
        etcd!.ctl(['get', '/coreos.com/network/config', '--print-value-only']),
        '{"Network":"10.5.0.0/16"}\n',
      );
      assert.equal(
        etcd!.ctl(['get', `/coreos.com/network/subnets/${DUAL_KEY}`, '--print-value-only']),
        `${DUAL_VALUE}\n`,
      );
    } finally {
      etcd!.ctl(['del', '/coreos.com/network/', '--prefix']);
    }
  });

  it('attaches a 24 h lease to the key with an etcd lease of TTL 86400 s', async () => {
    const prefix = freshPrefix();
    const r = open({ prefix });
    const before = Date.now();
    const exp = await r.createSubnet(V4_KEY, V4_VALUE, DAY_MS);
    assert.ok(Math.abs(exp.getTime() - before - DAY_MS) < 2000);
    const ttl = timeToLive(etcd!, leaseOf(etcd!, `${prefix}/subnets/${V4_KEY}`));
    assert.ok(ttl, 'the key has an etcd lease');
    assert.equal(ttl.granted, 86400);
    assert.ok(ttl.remaining >= 86390, `remaining ${ttl.remaining}`);
  });

  it('renews on a new etcd lease and revokes the old one', async () => {
    const prefix = freshPrefix();
    const r = open({ prefix });
    await r.createSubnet(V4_KEY, V4_VALUE, DAY_MS);
    const first = leaseOf(etcd!, `${prefix}/subnets/${V4_KEY}`);
    await r.updateSubnet(V4_KEY, DUAL_VALUE, DAY_MS);
    const second = leaseOf(etcd!, `${prefix}/subnets/${V4_KEY}`);
    assert.notEqual(second, first);
    assert.equal(timeToLive(etcd!, second)?.granted, 86400);
    assert.match(etcd!.ctl(['lease', 'timetolive', first]), /already expired/);
  });

  it('writes a reservation update without any etcd lease', async () => {
    const prefix = freshPrefix();
    const r = open({ prefix });
    await r.createSubnet(V4_KEY, V4_VALUE, DAY_MS);
    const first = leaseOf(etcd!, `${prefix}/subnets/${V4_KEY}`);
    assert.equal(await r.updateSubnet(V4_KEY, V4_VALUE, null), null);
    assert.equal(leaseOf(etcd!, `${prefix}/subnets/${V4_KEY}`), '0');
    assert.match(etcd!.ctl(['lease', 'timetolive', first]), /already expired/);
  });

  it('revokes the etcd lease of a lost create', async () => {
    const prefix = freshPrefix();
    const r = open({ prefix });
    const leasesBefore = etcd!.ctl(['lease', 'list']);
    await r.createSubnet(V4_KEY, V4_VALUE, DAY_MS);
    await expectCode(r.createSubnet(V4_KEY, DUAL_VALUE, DAY_MS), 'WEFT_ERR_STORE_KEY_EXISTS');
    const count = (s: string) => Number(/found (\d+) leases/.exec(s)?.[1] ?? 0);
    assert.equal(count(etcd!.ctl(['lease', 'list'])), count(leasesBefore) + 1);
  });

  it('lists and watches without a TimeToLive RPC per key; get and `expirations` look them up', async () => {
    // etcd counts the RPCs it serves on its own /metrics; the writes below go through etcdctl
    // (LeaseGrant and Put, never TimeToLive), so every TimeToLive counted is the registry's.
    const ttlCalls = async (): Promise<number> => {
      const text = await (await fetch(`${etcd!.endpoint}/metrics`)).text();
      const line = text
        .split('\n')
        .find((l) => l.startsWith('grpc_server_started_total{') && l.includes('LeaseTimeToLive'));
      return line ? Number(line.split(' ').pop()) : 0;
    };
    const prefix = freshPrefix();
    const put = (key: string, value: string, withTtl: boolean) => {
      const args = ['put', `${prefix}/subnets/${key}`, value];
      if (withTtl) {
        const id = /lease ([0-9a-f]+) granted/.exec(etcd!.ctl(['lease', 'grant', '600']))![1]!;
        args.push(`--lease=${id}`);
      }
      etcd!.ctl(args);
    };
    const r = open({ prefix });
    const ac = new AbortController();
    try {
      put(V4_KEY, V4_VALUE, true);
      put(DUAL_KEY, DUAL_VALUE, false);
      const before = await ttlCalls();
      const list = await r.listSubnets();
      const it = r.watchSubnets(list.revision + 1, ac.signal)[Symbol.asyncIterator]();
      put(DUAL_KEY, DUAL_VALUE, true);
      put(V4_KEY, V4_VALUE, false);
      const got = await collect(
        it,
        (b) => b.flatMap((x) => (x.kind === 'events' ? x.events : [])).length >= 2,
        5000,
      );
      assert.equal(await ttlCalls(), before, 'list or watch asked etcd for a TTL');
      const byKey = (ls: readonly { key: string; expiration: unknown }[]) =>
        Object.fromEntries(ls.map((l) => [l.key, l.expiration]));
      // undefined: has a TTL, not looked up; null: a reservation, known without asking.
      assert.deepEqual(byKey(list.leases), { [V4_KEY]: undefined, [DUAL_KEY]: null });
      const puts = got.flatMap((b) => (b.kind === 'events' ? b.events : []));
      assert.deepEqual(
        byKey(
          puts.map((e) => (e.type === 'put' ? e.lease : { key: e.key, expiration: 'deleted' })),
        ),
        { [DUAL_KEY]: undefined, [V4_KEY]: null },
      );
      const full = await r.listSubnets(undefined, { expirations: true });
      assert.ok(full.leases.find((l) => l.key === DUAL_KEY)?.expiration instanceof Date);
      assert.ok((await r.getSubnet(DUAL_KEY))?.expiration instanceof Date);
      assert.ok((await ttlCalls()) > before, 'a user-facing read looks the TTLs up');
    } finally {
      ac.abort();
      await r.close();
    }
  });

  it('resyncs a watch whose start revision was compacted, then follows from the list', async () => {
    const r = open();
    const start = (await r.listSubnets()).revision + 1;
    await r.createSubnet(V4_KEY, V4_VALUE, 60_000);
    await r.createSubnet(DUAL_KEY, DUAL_VALUE, 60_000);
    await r.deleteSubnet(V4_KEY);
    const rev = (await r.listSubnets()).revision;
    etcd!.ctl(['compact', String(rev)]);
    const ac = new AbortController();
    const it = r.watchSubnets(start, ac.signal)[Symbol.asyncIterator]();
    try {
      const b = await nextBatch(it, 30_000);
      assert.equal(b.kind, 'resync');
      if (b.kind === 'resync') {
        assert.deepEqual(
          b.leases.map((l) => [l.key, l.value]),
          [[DUAL_KEY, DUAL_VALUE]],
        );
        assert.ok(b.revision >= rev);
      }
      await r.createSubnet(V4_KEY, V4_VALUE, 60_000);
      const next = await nextBatch(it, 30_000);
      assert.equal(next.kind, 'events');
      if (next.kind === 'events') {
        assert.deepEqual(
          next.events.map((e) => (e.type === 'put' ? ['put', e.lease.key] : ['delete', e.key])),
          [['put', V4_KEY]],
        );
      }
    } finally {
      ac.abort();
      await it.return?.();
    }
  });

  it('resumes a watch across an etcd restart without losing a change', async () => {
    const prefix = freshPrefix();
    const r = open({ prefix });
    const ac = new AbortController();
    const it = r
      .watchSubnets((await r.listSubnets()).revision + 1, ac.signal)
      [Symbol.asyncIterator]();
    try {
      await r.createSubnet(V4_KEY, V4_VALUE, 600_000);
      const first = await nextBatch(it, 30_000);
      assert.equal(first.kind, 'events');
      await etcd!.restart();
      // Written by etcdctl right after the restart, while our watch is still reconnecting.
      etcd!.ctl(['put', `${prefix}/subnets/${DUAL_KEY}`, DUAL_VALUE]);
      const got = await collect(
        it,
        (bs) =>
          bs.some(
            (b) =>
              b.kind === 'events' &&
              b.events.some((e) => e.type === 'put' && e.lease.key === DUAL_KEY),
          ),
        15_000,
      );
      assert.ok(
        got.every((b) => b.kind === 'events'),
        'no resync: the revision was still available',
      );
      // Unary calls work again too.
      assert.equal((await r.getSubnet(V4_KEY))?.value, V4_VALUE);
    } finally {
      ac.abort();
      await it.return?.();
    }
  });

  it('a watch stream gone silent (a frozen proxy) is replaced at its idle deadline; no event is lost or repeated', async () => {
    //   EtcdRegistry ──▶ tcp proxy (frozen: open, silent) ──▶ etcd ◀── etcdctl (writes)
    const proxy = await startTcpProxy(Number(new URL(etcd!.endpoint).port));
    const prefix = freshPrefix();
    // A short idle deadline (and call deadline) so the test does not wait a minute.
    const r = open({ prefix, endpoints: [proxy.url], watchIdleMs: 300, callTimeoutMs: 1000 });
    const ac = new AbortController();
    const it = r
      .watchSubnets((await r.listSubnets()).revision + 1, ac.signal)
      [Symbol.asyncIterator]();
    const keyOf = (b: WatchBatch) =>
      b.kind === 'events' ? b.events.map((e) => (e.type === 'put' ? e.lease.key : e.key)) : [];
    try {
      etcd!.ctl(['put', `${prefix}/subnets/${V4_KEY}`, V4_VALUE]);
      assert.deepEqual(keyOf(await nextBatch(it, 30_000)), [V4_KEY], 'the stream is open');
      proxy.freeze();
      // Written straight to etcd while the stream is frozen: the old stream cannot carry it.
      etcd!.ctl(['put', `${prefix}/subnets/${DUAL_KEY}`, DUAL_VALUE]);
      const got = await collect(it, (bs) => bs.some((b) => keyOf(b).includes(DUAL_KEY)), 30_000);
      // A marker written after it: everything before the marker was delivered by then.
      etcd!.ctl(['put', `${prefix}/subnets/${DUAL_KEY}`, 'marker']);
      got.push(
        ...(await collect(
          it,
          (bs) =>
            bs.some(
              (b) =>
                b.kind === 'events' &&
                b.events.some((e) => e.type === 'put' && e.lease.value === 'marker'),
            ),
          30_000,
        )),
      );
      assert.ok(
        got.every((b) => b.kind === 'events'),
        'resumed from its revision, no resync',
      );
      const values = got.flatMap((b) =>
        b.kind === 'events' ? b.events.map((e) => (e.type === 'put' ? e.lease.value : '')) : [],
      );
      assert.deepEqual(values, [DUAL_VALUE, 'marker'], 'the frozen write once, then the marker');
    } finally {
      ac.abort();
      await it.return?.();
      await proxy.close();
    }
  });

  it('a closed registry whose watch its consumer left suspended lets the process exit', async () => {
    // A child opens a registry, takes one batch of a watch and closes the registry without
    // resuming or returning the watch. Its idle deadline (an hour here) must not hold the
    // process: the child exits by itself. Bounded only so that a hang fails the test.
    const prefix = freshPrefix();
    etcd!.ctl(['put', `${prefix}/subnets/${V4_KEY}`, V4_VALUE]);
    const registryUrl = new URL('../../src/control/registry/etcd.ts', import.meta.url).href;
    const child = spawn(
      process.execPath,
      [
        '--import',
        'tsx',
        '--input-type=module',
        '-e',
        `const { EtcdRegistry } = await import(${JSON.stringify(registryUrl)});
         const r = new EtcdRegistry({ endpoints: [${JSON.stringify(etcd!.endpoint)}],
           prefix: ${JSON.stringify(prefix)}, watchIdleMs: 3600000 });
         const it = r.watchSubnets(1, new AbortController().signal)[Symbol.asyncIterator]();
         await it.next();
         await r.close();
         console.log('closed');`,
      ],
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    let out = '';
    child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    const exited = await orHang(
      once(child, 'exit').then(([code]) => code as number | null),
      30_000,
      () => 'still running 30 s after close()',
    );
    child.kill('SIGKILL');
    assert.equal(out.trim(), 'closed');
    assert.equal(exited, 0);
  });

  it('fails over to the live endpoint when another is down', async () => {
    const dead = `http://127.0.0.1:${await freePort()}`;
    const r = open({ endpoints: [dead, etcd!.endpoint] });
    for (let i = 0; i < 8; i++) await r.listSubnets();
  });

  it('gives up on an unreachable store with WEFT_ERR_STORE_UNAVAILABLE', async () => {
    const dead = `http://127.0.0.1:${await freePort()}`;
    const r = open({ endpoints: [dead], attempts: 3, retryInitialMs: 50, retryMaxMs: 100 });
    const t0 = Date.now();
    await expectCode(r.listSubnets(), 'WEFT_ERR_STORE_UNAVAILABLE');
    await expectCode(r.createSubnet(V4_KEY, V4_VALUE, 60_000), 'WEFT_ERR_STORE_UNAVAILABLE');
    assert.ok(Date.now() - t0 < 10_000, `took ${Date.now() - t0} ms`);
  });

  it('keeps a watch on an unreachable store retrying until its signal fires', async () => {
    const dead = `http://127.0.0.1:${await freePort()}`;
    const r = open({ endpoints: [dead] });
    const ac = new AbortController();
    const done = (async () => {
      const got: WatchBatch[] = [];
      for await (const b of r.watchSubnets(1, ac.signal)) got.push(b);
      return got;
    })();
    await sleep(700); // several reconnect attempts (100 ms, 200 ms, 400 ms)
    ac.abort();
    // Left alone it retries forever: the bound only turns a watch that ignores its signal into
    // a failure instead of a hang (not a latency check).
    const got = await orHang(done, 30_000, () =>
      assert.fail('the watch still running 30 s after the abort'),
    );
    assert.deepEqual(got, []);
  });

  it('fails a call in its retries at once when the registry closes', async () => {
    const dead = `http://127.0.0.1:${await freePort()}`;
    const r = open({ endpoints: [dead], attempts: 50, retryInitialMs: 200 });
    const pending = r.listSubnets();
    await sleep(300);
    await r.close();
    // Its 50 backed-off retries would take minutes; only the close can end it this soon.
    await orHang(expectCode(pending, 'WEFT_ERR_STORE_UNAVAILABLE'), 30_000, () =>
      assert.fail('still retrying 30 s after close()'),
    );
  });

  it('rejects a call whose signal fires with WEFT_ERR_ABORTED', async () => {
    const r = open();
    const ac = new AbortController();
    ac.abort();
    await expectCode(r.listSubnets(ac.signal), 'WEFT_ERR_ABORTED');
  });
});

describe(
  'EtcdRegistry over TLS with client certificates',
  { skip: skip ?? opensslSkipReason() },
  () => {
    let tlsEtcd: TestEtcd | undefined;
    before(async () => {
      tlsEtcd = await startEtcd({ tls: true });
    });
    after(async () => {
      await tlsEtcd?.stop();
    });

    it('connects with the CA, certificate and key files and watches', async () => {
      const { caFile, certFile, keyFile } = tlsEtcd!.tls!;
      const r = new EtcdRegistry({
        endpoints: [tlsEtcd!.endpoint],
        caFile,
        certFile,
        keyFile,
        prefix: freshPrefix(),
      });
      const ac = new AbortController();
      try {
        const it = r
          .watchSubnets((await r.listSubnets()).revision + 1, ac.signal)
          [Symbol.asyncIterator]();
        await r.createSubnet(V4_KEY, V4_VALUE, 60_000);
        assert.equal((await r.getSubnet(V4_KEY))?.value, V4_VALUE);
        const b = await nextBatch(it, 30_000);
        assert.equal(b.kind, 'events');
        ac.abort();
        await it.return?.();
      } finally {
        ac.abort();
        await r.close();
      }
    });

    it('is refused without a client certificate', async () => {
      const r = new EtcdRegistry({
        endpoints: [tlsEtcd!.endpoint],
        caFile: tlsEtcd!.tls!.caFile,
        attempts: 2,
        retryInitialMs: 50,
      });
      try {
        await expectCode(r.listSubnets(), 'WEFT_ERR_STORE_UNAVAILABLE');
      } finally {
        await r.close();
      }
    });
  },
);

describe('EtcdRegistry with username and password', { skip }, () => {
  let authEtcd: TestEtcd | undefined;
  let creds: { username: string; password: string };
  before(async () => {
    authEtcd = await startEtcd();
    creds = enableAuth(authEtcd, 'weft-secret');
  });
  after(async () => {
    await authEtcd?.stop();
  });

  it('reads and writes with the right password', async () => {
    const prefix = freshPrefix();
    const r = new EtcdRegistry({ endpoints: [authEtcd!.endpoint], prefix, ...creds });
    const ac = new AbortController();
    try {
      const it = r
        .watchSubnets((await r.listSubnets()).revision + 1, ac.signal)
        [Symbol.asyncIterator]();
      await r.createSubnet(V4_KEY, V4_VALUE, 60_000);
      assert.equal(
        authEtcd!.ctl(['get', `${prefix}/subnets/${V4_KEY}`, '--print-value-only'], creds),
        `${V4_VALUE}\n`,
      );
      const b = await nextBatch(it, 30_000);
      assert.equal(b.kind, 'events');
      ac.abort();
      await it.return?.();
    } finally {
      ac.abort();
      await r.close();
    }
  });

  it('is refused with a wrong password or none', async () => {
    for (const extra of [{ username: 'root', password: 'wrong' }, {}]) {
      const r = new EtcdRegistry({
        endpoints: [authEtcd!.endpoint],
        attempts: 2,
        retryInitialMs: 50,
        ...extra,
      });
      try {
        await expectCode(r.listSubnets(), 'WEFT_ERR_STORE_UNAVAILABLE');
      } finally {
        await r.close();
      }
    }
  });

  it('calls refused together for a forgotten token authenticate once, and all retry with the new one', async () => {
    //   EtcdRegistry ──▶ tcp proxy (counts POST /v3/auth/authenticate) ──▶ etcd (auth on)
    const proxy = await startTcpProxy(Number(new URL(authEtcd!.endpoint).port));
    const authenticate = () => proxy.count('POST /v3/auth/authenticate ');
    const prefix = freshPrefix();
    const r = new EtcdRegistry({ endpoints: [proxy.url], prefix, ...creds });
    try {
      await r.setNetworkConfig('{"Network":"10.5.0.0/16"}');
      assert.equal(authenticate(), 1);
      // Turning auth off and on makes etcd forget every token it handed out.
      authEtcd!.ctl(['auth', 'disable']);
      authEtcd!.ctl(['auth', 'enable']);
      const got = await Promise.all(Array.from({ length: 12 }, () => r.getNetworkConfig()));
      assert.deepEqual(new Set(got), new Set(['{"Network":"10.5.0.0/16"}']));
      assert.equal(authenticate(), 2, 'one authentication for the twelve refused calls');
    } finally {
      await r.close();
      await proxy.close();
    }
  });

  it('keeps a watch working across a restart, when etcd forgets the auth token', async () => {
    const prefix = freshPrefix();
    const r = new EtcdRegistry({ endpoints: [authEtcd!.endpoint], prefix, ...creds });
    const ac = new AbortController();
    try {
      const it = r
        .watchSubnets((await r.listSubnets()).revision + 1, ac.signal)
        [Symbol.asyncIterator]();
      await authEtcd!.restart();
      await sleep(200);
      await r.createSubnet(V4_KEY, V4_VALUE, 60_000);
      const b = await nextBatch(it, 15_000);
      assert.equal(b.kind, 'events');
      ac.abort();
      await it.return?.();
    } finally {
      ac.abort();
      await r.close();
    }
  });
});
