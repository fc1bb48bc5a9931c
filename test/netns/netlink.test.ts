/**
 * NativeNetlink against a real kernel, inside a namespace made for this file. The netlink socket
 * is opened inside the namespace (setns for the socket only), so no op reaches the root one.
 *
 *   ┌──────────────── weft-<pid>-0 ─────────────────┐
 *   │ lo   d0 (veth to d1) 192.168.50.1/24, 2001:db8:50::1/64 │
 *   │ flannel.1  vxlan id 1 port 8472 local 192.168.50.1 dev d0 │
 *   │ flannel-v6.1  vxlan id 1 port 8472 local 2001:db8:50::1 dev d0 │
 *   └───────────────────────────────────────────────┘
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import type { Family } from '../../src/common/ip.js';
import { NativeNetlink } from '../../src/control/netlink/native-netlink.js';
import {
  type ChangeBatch,
  type KernelChange,
  type KernelWatch,
  NUD_PERMANENT,
  type Op,
  applyAll,
} from '../../src/control/netlink/netlink.js';
import { NetnsScope, ip, isRoot } from '../../src/testbed/netns.js';

const skip = isRoot() ? false : 'needs root (network namespaces)';

const FAM = {
  4: {
    dev: 'flannel.1',
    local: '192.168.50.1',
    subnet: '10.5.34.0/24',
    gw: '10.5.34.0',
    remote: '192.168.50.2',
    net: (i: number) => `10.${100 + (i >> 8)}.${i & 255}.0/24`,
  },
  6: {
    dev: 'flannel-v6.1',
    local: '2001:db8:50::1',
    subnet: 'fc00:0:0:5d::/64',
    gw: 'fc00:0:0:5d::',
    remote: '2001:db8:50::2',
    net: (i: number) => `fc00:1:${i.toString(16)}::/64`,
  },
} as const;
const FAMILIES: Family[] = [4, 6];

/** `n` IPv4 onlink routes via flannel.1's peer gateway, and the ops that delete them. */
const onlinkRoutes = (n: number): Op[] =>
  Array.from({ length: n }, (_, i) => ({
    op: 'replaceRoute',
    dst: FAM[4].net(i),
    gw: FAM[4].gw,
    dev: FAM[4].dev,
    onlink: true,
  }));
const removals = (ops: readonly Op[]): Op[] => ops.map((o) => ({ ...o, op: 'delRoute' }) as Op);

describe('NativeNetlink in a namespace', { skip }, () => {
  const scope = new NetnsScope();
  let ns = '';
  let nl: NativeNetlink;

  before(() => {
    ns = scope.add();
    ip(ns, 'link', 'add', 'd0', 'type', 'veth', 'peer', 'name', 'd1');
    ip(ns, 'link', 'set', 'd1', 'up');
    ip(ns, 'addr', 'add', '192.168.50.1/24', 'dev', 'd0');
    ip(ns, 'addr', 'add', '2001:db8:50::1/64', 'dev', 'd0', 'nodad');
    ip(ns, 'link', 'set', 'd0', 'up');
    nl = new NativeNetlink({ netns: ns });
  });

  after(async () => {
    nl?.close();
    await scope.cleanup();
  });

  test('getLink reads a device and returns null for an absent one', async () => {
    const lo = await nl.getLink('lo');
    assert.equal(lo?.index, 1);
    assert.equal(lo?.up, true);
    assert.equal(await nl.getLink('nosuchdev'), null);
  });

  test('addVxlan creates flannel.1 with the attributes read back by getLink', async () => {
    for (const f of FAMILIES) {
      const F = FAM[f];
      await applyAll(nl, [
        {
          op: 'addVxlan',
          name: F.dev,
          vni: 1,
          port: 8472,
          local: F.local,
          link: 'd0',
          learning: false,
          mtu: f === 4 ? 1450 : 1430,
          mac: f === 4 ? '0e:11:22:33:44:55' : '0e:11:22:33:44:66',
        },
        { op: 'setLink', dev: F.dev, up: true },
      ]);
      const l = await nl.getLink(F.dev);
      const d0 = await nl.getLink('d0');
      assert.equal(l?.kind, 'vxlan');
      assert.deepEqual(l?.vxlan, {
        vni: 1,
        port: 8472,
        local: F.local,
        link: d0!.index,
        learning: false,
        gbp: false,
      });
      assert.equal(l?.mtu, f === 4 ? 1450 : 1430);
      assert.equal(l?.mac, f === 4 ? '0e:11:22:33:44:55' : '0e:11:22:33:44:66');
      assert.equal(l?.up, true);
    }
    assert.match(
      ip(ns, '-d', 'link', 'show', 'flannel.1'),
      /vxlan id 1 local 192\.168\.50\.1 dev d0 srcport 0 0 dstport 8472 nolearning/,
    );
  });

  test('setLink changes MTU and MAC', async () => {
    await applyAll(nl, [{ op: 'setLink', dev: 'd0', mtu: 1400, mac: '0e:aa:bb:cc:dd:ee' }]);
    const d0 = await nl.getLink('d0');
    assert.equal(d0?.mtu, 1400);
    assert.equal(d0?.mac, '0e:aa:bb:cc:dd:ee');
  });

  for (const f of FAMILIES) {
    const F = FAM[f];
    test(`IPv${f}: replaceAddr / listAddrs / delAddr`, async () => {
      const addr = `${F.gw}/${f === 4 ? 32 : 128}`;
      await applyAll(nl, [{ op: 'replaceAddr', addr, dev: F.dev }]);
      await applyAll(nl, [{ op: 'replaceAddr', addr, dev: F.dev }]);
      assert.ok((await nl.listAddrs(f, F.dev)).some((a) => a.addr === addr));
      await applyAll(nl, [
        { op: 'delAddr', addr, dev: F.dev },
        { op: 'delAddr', addr, dev: F.dev },
      ]);
      assert.ok(!(await nl.listAddrs(f, F.dev)).some((a) => a.addr === addr));
    });

    test(`IPv${f}: neigh → fdb → onlink route, listed, then deleted (idempotent)`, async () => {
      const mac = '0e:00:00:00:00:0' + f;
      const add: Op[] = [
        { op: 'replaceNeigh', dst: F.gw, mac, dev: F.dev },
        { op: 'appendFdb', mac, dst: F.remote, dev: F.dev },
        { op: 'replaceRoute', dst: F.subnet, gw: F.gw, dev: F.dev, onlink: true },
      ];
      await applyAll(nl, add);
      await applyAll(nl, add); // again: still fine
      const neighs = await nl.listNeighs(f, F.dev);
      assert.deepEqual(
        neighs.filter((n) => n.dst === F.gw).map((n) => [n.mac, n.state & NUD_PERMANENT]),
        [[mac, NUD_PERMANENT]],
      );
      const fdb = await nl.listFdb(F.dev);
      assert.deepEqual(
        fdb.filter((e) => e.mac === mac).map((e) => e.dst),
        [F.remote],
      );
      const routes = await nl.listRoutes({ family: f, dev: F.dev, dst: F.subnet });
      assert.equal(routes.length, 1);
      assert.equal(routes[0]!.gw, F.gw);
      assert.equal(routes[0]!.onlink, true);
      const del: Op[] = [
        { op: 'delRoute', dst: F.subnet, gw: F.gw, dev: F.dev },
        { op: 'delFdb', mac, dst: F.remote, dev: F.dev },
        { op: 'delNeigh', dst: F.gw, dev: F.dev },
      ];
      await applyAll(nl, del);
      assert.deepEqual(await nl.apply(del), [null, null, null]);
      assert.equal((await nl.listRoutes({ family: f, dev: F.dev, dst: F.subnet })).length, 0);
      assert.equal((await nl.listNeighs(f, F.dev)).filter((n) => n.dst === F.gw).length, 0);
      assert.equal((await nl.listFdb(F.dev)).filter((e) => e.mac === mac).length, 0);
    });

    test(`IPv${f}: a batch of 5,000 routes is applied and listed in one pass`, async () => {
      const ops: Op[] = [];
      for (let i = 0; i < 5000; i++) {
        ops.push({ op: 'replaceRoute', dst: F.net(i), gw: F.gw, dev: F.dev, onlink: true });
      }
      const res = await nl.apply(ops);
      assert.equal(res.filter((r) => r !== null).length, 0);
      const listed = await nl.listRoutes({ family: f, dev: F.dev });
      assert.equal(listed.filter((r) => r.gw === F.gw).length, 5000);
      const delRes = await nl.apply(ops.map((o) => ({ ...o, op: 'delRoute' }) as Op));
      assert.equal(delRes.filter((r) => r !== null).length, 0);
      assert.equal(
        (await nl.listRoutes({ family: f, dev: F.dev })).filter((r) => r.gw === F.gw).length,
        0,
      );
    });
  }

  test('a batch is answered through the event loop (sent from a pool thread), not within the call', async () => {
    const ops = onlinkRoutes(256);
    let settled = false;
    const applied = nl.apply(ops).then((res) => {
      settled = true;
      return res;
    });
    // Microtasks only: the event loop does not turn, so no pool thread's answer can come in.
    for (let i = 0; i < 100; i++) await Promise.resolve();
    assert.equal(settled, false);
    assert.deepEqual(
      (await applied).filter((r) => r !== null),
      [],
    );
    assert.deepEqual(
      (await nl.apply(removals(ops))).filter((r) => r !== null),
      [],
    );
  });

  test('closing a handle with a batch in flight settles the batch and leaves the process up', async () => {
    const other = new NativeNetlink({ netns: ns });
    const ops = onlinkRoutes(2000);
    const applied = other.apply(ops);
    other.close();
    // The close waited for a batch that had the socket (every op applied), or the batch found
    // the socket closed before its turn (rejected, naming it): either way it settles.
    const outcome = await applied.then(
      (res) => (res.every((r) => r === null) ? 'applied' : 'failed ops'),
      (err: { code?: string; message: string }) =>
        err.code === 'WEFT_ERR_NETLINK' && /closed/.test(err.message) ? 'refused' : err.message,
    );
    assert.ok(outcome === 'applied' || outcome === 'refused', outcome);
    await nl.apply(removals(ops));
  });

  test('errors name the op, the target and the errno, per op in a batch', async () => {
    const res = await nl.apply([
      { op: 'replaceRoute', dst: '10.5.40.0/24', gw: '10.77.0.1', dev: 'd0' },
      { op: 'replaceRoute', dst: '10.5.41.0/24', gw: '10.5.41.0', dev: 'flannel.1', onlink: true },
      { op: 'replaceNeigh', dst: '10.5.42.0', mac: '0e:00:00:00:00:01', dev: 'nosuchdev' },
      { op: 'addVxlan', name: 'flannel.1', vni: 1, port: 8472, learning: false },
    ]);
    assert.equal(res[0]?.message, 'replace route 10.5.40.0/24 via 10.77.0.1 dev d0: ENETUNREACH');
    assert.equal(res[0]?.code, 'WEFT_ERR_NETLINK');
    assert.equal(res[1], null);
    assert.equal(
      res[2]?.message,
      'replace neigh 10.5.42.0 lladdr 0e:00:00:00:00:01 dev nosuchdev: ENODEV',
    );
    assert.equal(res[3]?.message, 'add link flannel.1 type vxlan id 1 dstport 8472: EEXIST');
  });

  test('delLink removes a device and is idempotent', async () => {
    await applyAll(nl, [{ op: 'delLink', dev: 'flannel-v6.1' }]);
    assert.equal(await nl.getLink('flannel-v6.1'), null);
    assert.deepEqual(await nl.apply([{ op: 'delLink', dev: 'flannel-v6.1' }]), [null]);
  });
});

describe('NativeNetlink.watch: the kernel’s change notifications', { skip }, () => {
  const scope = new NetnsScope();
  let ns = '';
  let nl: NativeNetlink;
  const batches: ChangeBatch[] = [];
  let watch: KernelWatch | undefined;
  let arrived: () => void = () => undefined;
  /**
   * Waits for the notifications of what was just done (they come on a later turn): until `n`
   * changes, or until one matches `want`; returns them all.
   */
  const changes = async (
    want: number | ((c: KernelChange) => boolean),
  ): Promise<KernelChange[]> => {
    const deadline = Date.now() + 20_000; // a guard against a hang, not a speed check
    const done = () => {
      const all = batches.flatMap((b) => b.changes);
      return typeof want === 'number' ? all.length >= want : all.some(want);
    };
    while (!done()) {
      if (Date.now() > deadline) assert.fail(`no such change yet: ${JSON.stringify(batches)}`);
      await new Promise<void>((r) => {
        arrived = r;
        setTimeout(r, 1000).unref();
      });
    }
    return batches.splice(0).flatMap((b) => b.changes);
  };

  before(() => {
    ns = scope.add();
    ip(ns, 'link', 'add', 'd0', 'type', 'veth', 'peer', 'name', 'd1');
    ip(ns, 'link', 'set', 'd1', 'up');
    ip(ns, 'addr', 'add', '192.168.60.1/24', 'dev', 'd0');
    ip(ns, 'link', 'set', 'd0', 'up');
    nl = new NativeNetlink({ netns: ns });
    watch = nl.watch(
      (b) => {
        batches.push(b);
        arrived();
      },
      (err) => assert.fail(err),
    );
  });

  after(async () => {
    watch?.close();
    nl?.close();
    await scope.cleanup();
  });

  test('a route added and deleted by hand, with its device named', async () => {
    ip(ns, 'route', 'add', '10.20.0.0/24', 'via', '192.168.60.2', 'dev', 'd0');
    ip(ns, 'route', 'del', '10.20.0.0/24');
    const got = (await changes((c) => c.kind === 'route' && c.deleted)).filter(
      (c) => c.kind === 'route' && c.dst === '10.20.0.0/24',
    );
    assert.deepEqual(got, [
      {
        kind: 'route',
        deleted: false,
        family: 4,
        dst: '10.20.0.0/24',
        gw: '192.168.60.2',
        dev: 'd0',
        table: 254,
        unicast: true,
      },
      {
        kind: 'route',
        deleted: true,
        family: 4,
        dst: '10.20.0.0/24',
        gw: '192.168.60.2',
        dev: 'd0',
        table: 254,
        unicast: true,
      },
    ]);
  });

  test('its own neighbour is left out (the kernel stamps it with its port); one by hand is not', async () => {
    await applyAll(nl, [
      {
        op: 'addVxlan',
        name: 'vx0',
        vni: 7,
        port: 8472,
        local: '192.168.60.1',
        link: 'd0',
        learning: false,
      },
    ]);
    await changes(1);
    await applyAll(nl, [
      { op: 'replaceNeigh', dst: '10.21.0.0', mac: 'aa:bb:cc:00:00:01', dev: 'vx0' },
      { op: 'appendFdb', mac: 'aa:bb:cc:00:00:01', dst: '192.168.60.2', dev: 'vx0' },
    ]);
    ip(
      ns,
      'neigh',
      'add',
      '10.21.0.9',
      'lladdr',
      'aa:bb:cc:00:00:09',
      'dev',
      'vx0',
      'nud',
      'permanent',
    );
    const byHand = (c: KernelChange) => c.kind === 'neigh' && c.dst === '10.21.0.9';
    const neighs = (await changes(byHand)).filter((c) => c.kind === 'neigh');
    assert.deepEqual(neighs, [
      {
        kind: 'neigh',
        deleted: false,
        family: 4,
        dst: '10.21.0.9',
        dev: 'vx0',
        mac: 'aa:bb:cc:00:00:09',
        state: NUD_PERMANENT,
      },
    ]);
  });

  test('a device renamed is reported gone under its old name', async () => {
    ip(ns, 'link', 'add', 'rn0', 'type', 'veth', 'peer', 'name', 'rn1');
    await changes((c) => c.kind === 'link' && c.dev === 'rn1');
    ip(ns, 'link', 'set', 'rn0', 'name', 'rn2');
    const got = await changes((c) => c.kind === 'link' && c.dev === 'rn2');
    assert.ok(got.some((c) => c.kind === 'link' && c.deleted && c.dev === 'rn0'));
    ip(ns, 'link', 'del', 'rn2');
    await changes((c) => c.kind === 'link' && c.deleted && c.dev === 'rn2');
  });

  test('an address removed and a device set down and deleted', async () => {
    ip(ns, 'addr', 'add', '10.21.0.0/32', 'dev', 'vx0');
    ip(ns, 'link', 'set', 'vx0', 'up');
    await changes((c) => c.kind === 'link' && c.dev === 'vx0');
    ip(ns, 'addr', 'del', '10.21.0.0/32', 'dev', 'vx0');
    ip(ns, 'link', 'set', 'vx0', 'down');
    ip(ns, 'link', 'del', 'vx0');
    const got = await changes((c) => c.kind === 'link' && c.deleted);
    assert.ok(got.some((c) => c.kind === 'addr' && c.deleted && c.dev === 'vx0' && c.family === 4));
    assert.ok(got.some((c) => c.kind === 'link' && !c.deleted && !c.up && c.dev === 'vx0'));
    assert.ok(got.some((c) => c.kind === 'link' && c.deleted && c.dev === 'vx0'));
    assert.ok(batches.every((b) => !b.overflowed));
  });
});
