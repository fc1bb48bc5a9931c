import { test } from 'node:test';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import assert from 'node:assert/strict';
import { pino } from 'pino';
import { MemoryRegistry } from '../../../../src/control/registry/memory.js';
import { LocalManager } from '../../../../src/control/lease/local-manager.js';
import { createLeaseMetrics } from '../../../../src/control/metrics/metrics.js';
import { encodeLeaseAttrs } from '../../../../src/control/lease/lease-json.js';
import { parseCIDR } from '../../../../src/common/ip.js';
import type { LeaseAttrs, LeaseEvent } from '../../../../src/control/lease/types.js';
import { Registry } from '../../../../src/common/metrics.js';
import { WeftError } from '../../../../src/common/errors.js';
import type { SharedWatchOptions } from '../../../../src/control/lease/shared-watch.js';

const quiet = pino({ level: 'silent' });
const NET = JSON.stringify({ Network: '10.5.0.0/16', Backend: { Type: 'vxlan' } });

function attrs(publicIP: string): LeaseAttrs {
  return {
    publicIP,
    publicIPv6: null,
    backendType: 'vxlan',
    backendData: { VNI: 1, VtepMAC: 'aa:bb:cc:dd:ee:ff' },
  };
}

function setup(config = NET, random = () => 0, sharedWatch?: SharedWatchOptions) {
  const reg = new MemoryRegistry({ config });
  const prom = new Registry();
  const metrics = createLeaseMetrics(prom);
  const sm = new LocalManager(reg, {
    random,
    log: quiet,
    metrics,
    ...(sharedWatch ? { sharedWatch } : {}),
  });
  return { reg, sm, prom, metrics };
}

test('acquire writes flannel-shaped JSON under the subnet key with the 24 h TTL', async () => {
  const { reg, sm } = setup();
  const before = Date.now();
  const lease = await sm.acquireLease(attrs('192.168.1.10'));
  assert.equal(lease.key, '10.5.1.0-24');
  const stored = await reg.getSubnet('10.5.1.0-24');
  assert.equal(
    stored?.value,
    '{"PublicIP":"192.168.1.10","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"aa:bb:cc:dd:ee:ff"}}',
  );
  const ttl = lease.expiration!.getTime() - before;
  assert.ok(ttl >= 86_400_000 - 1000 && ttl <= 86_400_000 + 1000, `ttl ${ttl}`);
});

test('two nodes get distinct subnets', async () => {
  const { sm } = setup();
  const a = await sm.acquireLease(attrs('192.168.1.10'));
  const b = await sm.acquireLease(attrs('192.168.1.11'));
  assert.notEqual(a.key, b.key);
});

test('a node gets its own lease back by public IP (restart keeps the subnet)', async () => {
  const { sm } = setup(NET, Math.random);
  const a = await sm.acquireLease(attrs('192.168.1.10'));
  await sm.acquireLease(attrs('192.168.1.11'));
  const again = await sm.acquireLease(attrs('192.168.1.10'));
  assert.equal(again.key, a.key);
});

test('the previous subnet from subnet.env is preferred when free', async () => {
  const { sm } = setup();
  const lease = await sm.acquireLease(attrs('192.168.1.10'), {
    previous: { subnet: parseCIDR('10.5.77.0/24'), ipv6Subnet: null },
  });
  assert.equal(lease.key, '10.5.77.0-24');
});

test('a previous subnet outside the network is ignored', async () => {
  const { sm } = setup();
  const lease = await sm.acquireLease(attrs('192.168.1.10'), {
    previous: { subnet: parseCIDR('10.9.77.0/24'), ipv6Subnet: null },
  });
  assert.equal(lease.key, '10.5.1.0-24');
});

test('a reservation for our IP is reused and stays without TTL', async () => {
  const { reg, sm } = setup();
  reg.putRaw('10.5.200.0-24', encodeLeaseAttrs(attrs('192.168.1.10')), null);
  const lease = await sm.acquireLease(attrs('192.168.1.10'));
  assert.equal(lease.key, '10.5.200.0-24');
  assert.equal(lease.expiration, null);
  assert.equal((await reg.getSubnet('10.5.200.0-24'))?.expiration, null);
  const renewed = await sm.renewLease(lease);
  assert.equal(renewed.expiration, null);
});

test('our old lease that no longer fits the config is deleted and a new one made', async () => {
  const { reg, sm } = setup();
  reg.putRaw('10.6.3.0-24', encodeLeaseAttrs(attrs('192.168.1.10')), 60_000);
  const lease = await sm.acquireLease(attrs('192.168.1.10'));
  assert.equal(lease.key, '10.5.1.0-24');
  assert.equal(await reg.getSubnet('10.6.3.0-24'), null);
});

test('picks randomly among the lowest 100 free subnets', async () => {
  const { sm } = setup(NET, () => 0.999);
  const lease = await sm.acquireLease(attrs('192.168.1.10'));
  assert.equal(lease.key, '10.5.100.0-24');
});

test('a full network fails with out of subnets', async () => {
  const small = JSON.stringify({ Network: '10.5.0.0/28', SubnetLen: 30 });
  const { sm } = setup(small);
  // /28 with /30 subnets: SubnetMin is the second, so 3 subnets are allocatable.
  for (let i = 0; i < 3; i++) await sm.acquireLease(attrs(`192.168.1.${i + 1}`));
  await assert.rejects(sm.acquireLease(attrs('192.168.1.99')), (err: Error & { code?: string }) => {
    assert.equal(err.code, 'WEFT_ERR_LEASE_OUT_OF_SUBNETS');
    assert.match(err.message, /out of subnets/);
    return true;
  });
});

test('a create lost to another node is retried with another subnet', async () => {
  const { reg, sm } = setup();
  const original = reg.createSubnet.bind(reg);
  let raced = 0;
  reg.createSubnet = async (key, value, ttl, signal) => {
    if (raced < 3) {
      raced++;
      reg.putRaw(key, encodeLeaseAttrs(attrs(`192.168.9.${raced}`)), 60_000);
    }
    return original(key, value, ttl, signal);
  };
  const lease = await sm.acquireLease(attrs('192.168.1.10'));
  assert.equal(raced, 3);
  assert.equal(lease.key, '10.5.4.0-24');
});

test('ten lost races in a row fail with WEFT_ERR_LEASE_RACE', async () => {
  const { reg, sm } = setup();
  let n = 0;
  reg.createSubnet = async (key) => {
    n++;
    throw new WeftError('WEFT_ERR_STORE_KEY_EXISTS', `taken ${key}`);
  };
  await assert.rejects(sm.acquireLease(attrs('192.168.1.10')), { code: 'WEFT_ERR_LEASE_RACE' });
  assert.equal(n, 10);
});

test('dual-stack acquire makes a dual-stack key', async () => {
  const cfg = JSON.stringify({
    Network: '10.5.0.0/16',
    EnableIPv6: true,
    IPv6Network: 'fc00::/48',
  });
  const { sm } = setup(cfg);
  const lease = await sm.acquireLease({ ...attrs('192.168.1.10'), publicIPv6: 'fd00::10' });
  assert.equal(lease.key, '10.5.1.0-24&fc00:0:0:1::-64');
});

test('renew of a deleted lease reports it revoked', async () => {
  const { reg, sm } = setup();
  const lease = await sm.acquireLease(attrs('192.168.1.10'));
  await reg.deleteSubnet(lease.key);
  await assert.rejects(sm.renewLease(lease), { code: 'WEFT_ERR_LEASE_REVOKED' });
});

async function take<T>(it: AsyncIterator<T>): Promise<T> {
  const r = await it.next();
  assert.ok(!r.done);
  return r.value;
}

test('watch starts with every other lease, then follows adds and removes', async () => {
  const { reg, sm } = setup();
  const own = await sm.acquireLease(attrs('192.168.1.10'));
  const peer = await sm.acquireLease(attrs('192.168.1.11'));
  const ac = new AbortController();
  const it = sm.watchLeases(own, ac.signal)[Symbol.asyncIterator]();
  const first = await take(it);
  assert.deepEqual(
    first.map((e: LeaseEvent) => [e.type, e.lease.key]),
    [['added', peer.key]],
  );
  const third = await sm.acquireLease(attrs('192.168.1.12'));
  assert.deepEqual(
    (await take(it)).map((e) => [e.type, e.lease.key]),
    [['added', third.key]],
  );
  await reg.deleteSubnet(peer.key);
  assert.deepEqual(
    (await take(it)).map((e) => [e.type, e.lease.key]),
    [['removed', peer.key]],
  );
  ac.abort();
});

test('a malformed lease is skipped, counted once and does not stop the watch', async () => {
  const { reg, sm, prom } = setup();
  const own = await sm.acquireLease(attrs('192.168.1.10'));
  reg.putRaw('10.5.50.0-24', '{"PublicIP":', 60_000);
  reg.putRaw('not-a-key', '{}', 60_000);
  const ac = new AbortController();
  const it = sm.watchLeases(own, ac.signal)[Symbol.asyncIterator]();
  assert.deepEqual(await take(it), []);
  const good = await sm.acquireLease(attrs('192.168.1.11'));
  assert.deepEqual(
    (await take(it)).map((e) => e.lease.key),
    [good.key],
  );
  const text = await prom.metrics();
  assert.match(text, /weft_lease_malformed_total\{store="memory"\} 2/);
  ac.abort();
});

test('a malformed lease still holds its subnet against allocation', async () => {
  const { reg, sm } = setup();
  reg.putRaw('10.5.1.0-24', 'garbage', 60_000);
  const lease = await sm.acquireLease(attrs('192.168.1.10'));
  assert.equal(lease.key, '10.5.2.0-24');
});

test('after compaction the watch re-lists and reports only the difference', async () => {
  const { reg, sm } = setup();
  const own = await sm.acquireLease(attrs('192.168.1.10'));
  const a = await sm.acquireLease(attrs('192.168.1.11'));
  const ac = new AbortController();
  const it = sm.watchLeases(own, ac.signal)[Symbol.asyncIterator]();
  await take(it);
  // Changes happen, then history is compacted before the store watch reads it (no await
  // between them: the memory store applies each change synchronously).
  const removed = reg.deleteSubnet(a.key);
  reg.putRaw('10.5.99.0-24', encodeLeaseAttrs(attrs('192.168.1.12')), 60_000);
  reg.compact();
  await removed;
  const events = await take(it);
  assert.deepEqual(
    events.map((e) => [e.type, e.lease.key]).sort(),
    [
      ['added', '10.5.99.0-24'],
      ['removed', a.key],
    ].sort(),
  );
  ac.abort();
});

/** A registry that counts the store watches and lists it serves. */
function counting(reg: MemoryRegistry) {
  const n = { watches: 0, lists: 0 };
  const watch = reg.watchSubnets.bind(reg);
  const list = reg.listSubnets.bind(reg);
  reg.watchSubnets = (from, signal) => {
    n.watches++;
    return watch(from, signal);
  };
  reg.listSubnets = (signal) => {
    n.lists++;
    return list(signal);
  };
  return n;
}

/**
 * A daemon's two watchers on one manager: watchOwnLease first (as the daemon starts it), then
 * watchLeases once `between` ran (it returns the peers the first batch must hold). Returns the
 * store calls the peer watch's start cost; checks that both follow on (a new peer, then our own
 * lease deleted).
 */
async function twoWatchers(
  sm: LocalManager,
  reg: MemoryRegistry,
  between: () => Promise<string[]>,
): Promise<{ watches: number; lists: number }> {
  const own = await sm.acquireLease(attrs('192.168.1.10'));
  const ac = new AbortController();
  const ownNext = sm.watchOwnLease(own, ac.signal)[Symbol.asyncIterator]().next();
  const peers = await between();
  const n = counting(reg);
  const it = sm.watchLeases(own, ac.signal)[Symbol.asyncIterator]();
  assert.deepEqual(
    (await take(it)).map((e) => [e.type, e.lease.key]),
    peers.map((key) => ['added', key]),
  );
  const cost = { ...n };
  const third = await sm.acquireLease(attrs('192.168.1.12'));
  assert.deepEqual(
    (await take(it)).map((e) => [e.type, e.lease.key]),
    [['added', third.key]],
  );
  await reg.deleteSubnet(own.key);
  await assert.rejects(ownNext, { code: 'WEFT_ERR_LEASE_REVOKED' });
  ac.abort();
  assert.equal((await it.next()).done, true);
  return cost;
}

test("a daemon's two watchers (peers and its own lease) share one store watch and one list", async () => {
  const { reg, sm } = setup();
  const all = counting(reg);
  const cost = await twoWatchers(sm, reg, async () => []);
  assert.deepEqual(cost, { watches: 0, lists: 0 }, 'the peer watch joined the running one');
  assert.equal(all.watches, 1);
});

test('a watcher joining after the replay window lists again and gets only newer events', async () => {
  // the replay window closes with the first batch
  const { reg, sm } = setup(NET, () => 0, { replayBatches: 0 });
  const cost = await twoWatchers(sm, reg, async () => {
    const peer = await sm.acquireLease(attrs('192.168.1.11')); // closes the replay window
    await new Promise((r) => setImmediate(r));
    return [peer.key];
  });
  assert.deepEqual(cost, { watches: 0, lists: 1 });
});

test('a running watch keeps none of the lists it started from', async () => {
  // Each list holds every lease record as the store sent it (5,000 in a large cluster); the
  // watchers need them only to build their first snapshot, and the shared watch only while its
  // replay window is open.
  setFlagsFromString('--expose-gc');
  const gc = runInNewContext('gc') as () => void;
  // the replay window closes with the first batch
  const { reg, sm } = setup(NET, () => 0, { replayBatches: 0 });
  const own = await sm.acquireLease(attrs('192.168.1.10'));
  await sm.acquireLease(attrs('192.168.1.11'));
  const lists: Array<WeakRef<object>> = [];
  const list = reg.listSubnets.bind(reg);
  reg.listSubnets = async (signal) => {
    const l = await list(signal);
    lists.push(new WeakRef(l), new WeakRef(l.leases));
    reg.listSubnets = list; // only the watch's list (acquiring lists too)
    return l;
  };
  const ac = new AbortController();
  const ownNext = sm.watchOwnLease(own, ac.signal)[Symbol.asyncIterator]().next();
  const it = sm.watchLeases(own, ac.signal)[Symbol.asyncIterator]();
  assert.equal((await take(it)).length, 1);
  const third = await sm.acquireLease(attrs('192.168.1.12')); // closes the replay window
  assert.deepEqual(
    (await take(it)).map((e) => e.lease.key),
    [third.key],
  );
  assert.equal(lists.length, 2, 'one list, shared by both watchers');
  // (WeakRef targets are kept until the current job ends)
  await new Promise((r) => setImmediate(r));
  gc();
  assert.deepEqual(
    lists.map((r) => r.deref() === undefined),
    [true, true],
    'the list is let go while both watchers run',
  );
  ac.abort();
  assert.equal((await ownNext).done, true);
});

test('watching our own lease throws revoked when it is deleted', async () => {
  const { reg, sm } = setup();
  const own = await sm.acquireLease(attrs('192.168.1.10'));
  const ac = new AbortController();
  const it = sm.watchOwnLease(own, ac.signal)[Symbol.asyncIterator]();
  const next = it.next();
  await reg.deleteSubnet(own.key);
  await assert.rejects(next, { code: 'WEFT_ERR_LEASE_REVOKED' });
  ac.abort();
});

test('a dual-stack node that picked an IPv4 subnet another key already holds backs off and retries', async () => {
  const cfg = JSON.stringify({
    Network: '10.5.0.0/16',
    EnableIPv6: true,
    IPv6Network: 'fc00::/48',
  });
  const { reg, sm } = setup(cfg);
  const original = reg.createSubnet.bind(reg);
  let raced = false;
  reg.createSubnet = async (key, value, ttl, signal) => {
    if (!raced) {
      raced = true;
      // Another node creates the same IPv4 subnet with a different IPv6 one, just before us.
      reg.putRaw('10.5.1.0-24&fc00:0:0:77::-64', encodeLeaseAttrs(attrs('192.168.9.9')), 60_000);
    }
    return original(key, value, ttl, signal);
  };
  const lease = await sm.acquireLease({ ...attrs('192.168.1.10'), publicIPv6: 'fd00::10' });
  assert.equal(lease.key, '10.5.2.0-24&fc00:0:0:1::-64');
  const keys = (await reg.listSubnets()).leases.map((l) => l.key).sort();
  assert.deepEqual(keys, ['10.5.1.0-24&fc00:0:0:77::-64', '10.5.2.0-24&fc00:0:0:1::-64']);
});

test('a subnet of another size that overlaps a candidate (SubnetLen changed) keeps it taken', async () => {
  const { reg, sm } = setup();
  reg.putRaw('10.5.0.0-23', encodeLeaseAttrs(attrs('192.168.9.9')), 60_000);
  const lease = await sm.acquireLease(attrs('192.168.1.10'));
  assert.equal(lease.key, '10.5.2.0-24');
});
