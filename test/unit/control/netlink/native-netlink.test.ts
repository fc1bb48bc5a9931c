/**
 * NativeNetlink's link cache, over a fake addon binding (no kernel): the name → index map is
 * read once and kept, refreshed when a device is unknown or was recreated (ENODEV).
 */
import assert from 'node:assert/strict';
import { constants } from 'node:os';
import { test } from 'node:test';
import {
  NativeNetlink,
  type NetlinkBinding,
} from '../../../../src/control/netlink/native-netlink.js';
import type { Op } from '../../../../src/control/netlink/netlink.js';

const ENODEV = constants.errno.ENODEV;

/** A kernel of links only: ops succeed on a live ifindex, ENODEV otherwise. */
function fakeBinding() {
  const links = new Map<string, number>([
    ['lo', 1],
    ['eth0', 2],
    ['flannel.1', 3],
  ]);
  let nextIndex = 4;
  const sent: Array<Record<string, unknown>[]> = [];
  const binding = {
    netlinkOpen: () => ({}),
    netlinkClose: () => undefined,
    netlinkApplyAsync: async (_h: unknown, ops: Array<Record<string, unknown>>) => {
      sent.push(ops);
      const live = new Set(links.values());
      return Int32Array.from(ops.map((o) => (live.has(o.ifindex as number) ? 0 : ENODEV)));
    },
    netlinkList: (_h: unknown, what: string) =>
      what === 'link'
        ? [...links].map(([name, index]) => ({
            index,
            name,
            mtu: 1500,
            mac: null,
            flags: 1,
            kind: '',
            vxlan: null,
          }))
        : [],
    netlinkGetLink: () => null,
  } as unknown as NetlinkBinding;
  const recreate = (name: string) => links.set(name, nextIndex++);
  return { binding, sent, recreate, links };
}

const route = (i: number): Op => ({
  op: 'replaceRoute',
  dst: `10.6.${i}.0/24`,
  gw: `10.6.${i}.0`,
  dev: 'flannel.1',
  onlink: true,
});

test('applies dump the links once, not once per apply', async () => {
  const f = fakeBinding();
  const nl = new NativeNetlink({ binding: f.binding });
  for (let i = 0; i < 100; i++) assert.deepEqual(await nl.apply([route(i)]), [null]);
  assert.equal(nl.linkDumps, 1);
  assert.equal(f.sent.length, 100);
});

test('a device recreated behind our back: ENODEV refreshes the cache and retries once', async () => {
  const f = fakeBinding();
  const nl = new NativeNetlink({ binding: f.binding });
  await nl.apply([route(1)]);
  f.recreate('flannel.1');
  assert.deepEqual(await nl.apply([route(2), route(3)]), [null, null]);
  assert.equal(nl.linkDumps, 2);
  assert.deepEqual(
    f.sent.at(-1)!.map((o) => o.ifindex),
    [4, 4],
  );
});

test('an unknown device refreshes the cache once per call, then fails with ENODEV', async () => {
  const f = fakeBinding();
  const nl = new NativeNetlink({ binding: f.binding });
  await nl.apply([route(1)]);
  const ops: Op[] = Array.from({ length: 50 }, (_, i) => ({ ...route(i), dev: 'nope0' }));
  const res = await nl.apply(ops);
  assert.ok(res.every((r) => r !== null && /ENODEV/.test(r.message)));
  assert.equal(nl.linkDumps, 2);
  // A device that appeared since is found by the next call.
  f.links.set('nope0', 9);
  assert.deepEqual(await nl.apply([ops[0]!]), [null]);
  assert.equal(nl.linkDumps, 3);
});

test('the periodic re-check (listRoutes) reads the links afresh', async () => {
  const f = fakeBinding();
  const nl = new NativeNetlink({ binding: f.binding });
  await nl.apply([route(1)]);
  await nl.listRoutes({ family: 4 });
  await nl.listRoutes({ family: 4 });
  assert.equal(nl.linkDumps, 3);
});

test('a batch in flight keeps its own view of the cache: another call reading the links does not stop its ENODEV retry', async () => {
  const f = fakeBinding();
  const nl = new NativeNetlink({ binding: f.binding });
  await nl.apply([route(1)]);
  // The next batch is answered only when the test says so; it is judged by the links then.
  const inner = f.binding.netlinkApplyAsync;
  let release!: () => void;
  const gate = new Promise<void>((r) => (release = r));
  f.binding.netlinkApplyAsync = async (h, ops) => {
    f.binding.netlinkApplyAsync = inner;
    await gate;
    return inner(h, ops);
  };
  const first = nl.apply([route(2)]); // sent with flannel.1's cached index 3
  await new Promise((r) => setImmediate(r));
  f.recreate('flannel.1'); // now index 4
  f.links.set('other0', 9);
  // Another call misses the cache and reads the links while the first batch is in flight.
  const other: Op = { op: 'replaceRoute', dst: '10.6.3.0/24', dev: 'other0' };
  assert.deepEqual(await nl.apply([other]), [null]);
  release();
  assert.deepEqual(await first, [null], 'the first call retried with the new index');
  assert.deepEqual(
    f.sent.at(-1)!.map((o) => o.ifindex),
    [4],
  );
});
