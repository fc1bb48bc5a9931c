/**
 * Iproute2Netlink (the `ip`/`bridge` commands, used when the addon does not load) against
 * NativeNetlink (the addon): the same ops in two identical namespaces must give the same per-op
 * results and the same kernel state, field for field (routes with protocol, scope and table,
 * neighbour and FDB states, addresses, links with their vxlan attributes).
 *
 *   ┌──────── weft-<pid>-0 ────────┐   ┌──────── weft-<pid>-1 ────────┐
 *   │ NativeNetlink                 │   │ Iproute2Netlink               │
 *   │ eth0 (veth to peer0)          │   │ eth0 (veth to peer0)          │
 *   │   10.250.0.1/24, fd00:250::1  │   │   10.250.0.1/24, fd00:250::1  │
 *   │ + vxlan4, vxlan6 made by ops  │   │ + vxlan4, vxlan6 made by ops  │
 *   └──────────────────────────────┘   └──────────────────────────────┘
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Iproute2Netlink } from '../../src/control/netlink/iproute2-netlink.js';
import { NativeNetlink } from '../../src/control/netlink/native-netlink.js';
import type { Netlink, Op } from '../../src/control/netlink/netlink.js';
import { NetnsScope, ip, isRoot } from '../../src/testbed/netns.js';

const skip = isRoot() ? false : 'needs root (network namespaces)';

const M1 = '0e:00:00:00:00:01';
const M2 = '0e:00:00:00:00:02';
const M4 = '0e:00:00:00:00:04';
const M6 = '0e:00:00:00:00:06';

const DEVICES: Op[] = [
  {
    op: 'addVxlan',
    name: 'vxlan4',
    vni: 7,
    port: 8472,
    local: '10.250.0.1',
    link: 'eth0',
    learning: false,
    mtu: 1450,
    mac: M4,
  },
  {
    op: 'addVxlan',
    name: 'vxlan6',
    vni: 8,
    port: 4789,
    local: 'fd00:250::1',
    link: 'eth0',
    learning: true,
    gbp: true,
    mac: M6,
  },
  { op: 'setLink', dev: 'vxlan4', up: true },
  { op: 'setLink', dev: 'vxlan6', up: true, mtu: 1400 },
];

/** Batches as the backends send them, plus failures, repeats and deletes. */
const SCRIPT: Op[][] = [
  [
    // (a new MAC flushes the device's neighbours: first)
    { op: 'setLink', dev: 'vxlan4', mtu: 1440, mac: M1 },
    // vxlan backend, per peer: neighbour, FDB, onlink route (v4 and v6)
    { op: 'replaceNeigh', dst: '10.5.1.0', mac: M1, dev: 'vxlan4' },
    { op: 'appendFdb', mac: M1, dst: '10.250.0.2', dev: 'vxlan4' },
    { op: 'replaceRoute', dst: '10.5.1.0/24', gw: '10.5.1.0', dev: 'vxlan4', onlink: true },
    { op: 'replaceNeigh', dst: 'fd00:5:0:1::', mac: M2, dev: 'vxlan6' },
    { op: 'appendFdb', mac: M2, dst: 'fd00:250::2', dev: 'vxlan6' },
    { op: 'replaceRoute', dst: 'fd00:5:0:1::/64', gw: 'fd00:5:0:1::', dev: 'vxlan6', onlink: true },
    // host-gw: via the peer's public address; userspace: the network via the device
    { op: 'replaceRoute', dst: '10.5.2.0/24', gw: '10.250.0.3', dev: 'eth0' },
    { op: 'replaceRoute', dst: 'fd00:5:0:2::/64', gw: 'fd00:250::3', dev: 'eth0' },
    { op: 'replaceRoute', dst: '10.6.0.0/16', dev: 'vxlan4' },
    { op: 'replaceRoute', dst: '10.7.0.0/16', dev: 'vxlan4', table: 100 },
    { op: 'replaceAddr', addr: '10.5.9.0/32', dev: 'vxlan4' },
    { op: 'replaceAddr', addr: 'fd00:5:0:9::/128', dev: 'vxlan6' },
  ],
  // repeats (idempotent) and changes in place
  [
    { op: 'replaceNeigh', dst: '10.5.1.0', mac: M2, dev: 'vxlan4' },
    { op: 'appendFdb', mac: M1, dst: '10.250.0.2', dev: 'vxlan4' },
    { op: 'appendFdb', mac: M1, dst: '10.250.0.4', dev: 'vxlan4' },
    { op: 'replaceRoute', dst: '10.5.1.0/24', gw: '10.5.1.0', dev: 'vxlan4', onlink: true },
    { op: 'replaceRoute', dst: '10.5.2.0/24', gw: '10.250.0.4', dev: 'eth0' },
    { op: 'replaceAddr', addr: '10.5.9.0/32', dev: 'vxlan4' },
  ],
  // failures: unreachable gateway, unknown devices, a vxlan that exists, a bad MTU
  [
    { op: 'replaceRoute', dst: '10.5.3.0/24', gw: '10.99.0.1', dev: 'eth0' },
    { op: 'replaceRoute', dst: '10.5.3.0/24', gw: '10.5.3.0', dev: 'nosuchdev', onlink: true },
    { op: 'replaceNeigh', dst: '10.5.3.0', mac: M1, dev: 'nosuchdev' },
    { op: 'appendFdb', mac: M1, dst: '10.250.0.5', dev: 'nosuchdev' },
    { op: 'replaceAddr', addr: '10.5.3.0/32', dev: 'nosuchdev' },
    { op: 'setLink', dev: 'nosuchdev', up: true },
    { ...(DEVICES[0] as Op & { op: 'addVxlan' }) },
    { op: 'setLink', dev: 'vxlan4', mtu: 100_000 },
  ],
  // deletes, of present and absent entries
  [
    { op: 'delRoute', dst: '10.5.2.0/24', gw: '10.250.0.4', dev: 'eth0' },
    { op: 'delRoute', dst: '10.5.2.0/24', gw: '10.250.0.4', dev: 'eth0' },
    { op: 'delRoute', dst: 'fd00:5:0:2::/64', gw: 'fd00:250::3', dev: 'eth0' },
    { op: 'delRoute', dst: 'fd00:5:0:2::/64', gw: 'fd00:250::3', dev: 'eth0' },
    { op: 'delRoute', dst: '10.7.0.0/16', dev: 'vxlan4', table: 100 },
    { op: 'delNeigh', dst: 'fd00:5:0:1::', dev: 'vxlan6' },
    { op: 'delNeigh', dst: 'fd00:5:0:1::', dev: 'vxlan6' },
    { op: 'delFdb', mac: M1, dst: '10.250.0.4', dev: 'vxlan4' },
    { op: 'delFdb', mac: M1, dst: '10.250.0.4', dev: 'vxlan4' },
    { op: 'delAddr', addr: 'fd00:5:0:9::/128', dev: 'vxlan6' },
    { op: 'delAddr', addr: 'fd00:5:0:9::/128', dev: 'vxlan6' },
    { op: 'delLink', dev: 'nosuchdev' },
  ],
];

async function snapshot(nl: Netlink) {
  const byText = (a: unknown, b: unknown) => JSON.stringify(a).localeCompare(JSON.stringify(b));
  return {
    routes4: (await nl.listRoutes({ family: 4 })).sort(byText),
    routes6: (await nl.listRoutes({ family: 6 })).sort(byText),
    table100: await nl.listRoutes({ family: 4, table: 100 }),
    filtered: await nl.listRoutes({ family: 4, dst: '10.5.1.0/24', dev: 'vxlan4' }),
    neigh4: await nl.listNeighs(4, 'vxlan4'),
    neigh6: (await nl.listNeighs(6, 'vxlan6')).filter((n) => n.dst.startsWith('fd00:5:')),
    fdb4: (await nl.listFdb('vxlan4')).sort(byText),
    fdb6: (await nl.listFdb('vxlan6')).sort(byText),
    addrs4: await nl.listAddrs(4, 'vxlan4'),
    addrs6: (await nl.listAddrs(6, 'vxlan6')).filter((a) => !a.addr.startsWith('fe80:')),
    eth0: await nl.getLink('eth0'),
    lo: await nl.getLink('lo'),
    vxlan4: await nl.getLink('vxlan4'),
    vxlan6: await nl.getLink('vxlan6'),
    missing: await nl.getLink('nosuchdev'),
    neighMissingDev: await nl.listNeighs(4, 'nosuchdev'),
  };
}

async function results(nl: Netlink, batch: readonly Op[]): Promise<string[]> {
  return (await nl.apply(batch)).map((r) => (r === null ? 'ok' : String(r.details.errno)));
}

describe('Iproute2Netlink agrees with NativeNetlink', { skip }, () => {
  const scope = new NetnsScope();
  let native: NativeNetlink;
  let iproute2: Iproute2Netlink;

  before(() => {
    const make = () => {
      const ns = scope.add();
      ip(ns, 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'peer0');
      ip(ns, 'addr', 'add', '10.250.0.1/24', 'dev', 'eth0');
      ip(ns, 'addr', 'add', 'fd00:250::1/64', 'dev', 'eth0', 'nodad');
      ip(ns, 'link', 'set', 'eth0', 'address', '0e:00:00:00:0e:00', 'up');
      ip(ns, 'link', 'set', 'peer0', 'up');
      ip(ns, 'tuntap', 'add', 'dev', 'tun0', 'mode', 'tun', 'multi_queue', 'vnet_hdr');
      return ns;
    };
    native = new NativeNetlink({ netns: make() });
    iproute2 = new Iproute2Netlink({ netns: make() });
  });
  after(async () => {
    native?.close();
    iproute2?.close();
    await scope.cleanup();
  });

  test('vxlan devices are created and set up the same way', async () => {
    assert.deepEqual(await results(native, DEVICES), ['ok', 'ok', 'ok', 'ok']);
    assert.deepEqual(await results(iproute2, DEVICES), ['ok', 'ok', 'ok', 'ok']);
    const link = await iproute2.getLink('vxlan6');
    const eth0 = (await iproute2.getLink('eth0'))!.index;
    assert.deepEqual(link?.vxlan, {
      vni: 8,
      port: 4789,
      local: 'fd00:250::1',
      link: eth0,
      learning: true,
      gbp: true,
    });
    assert.deepEqual(link, await native.getLink('vxlan6'));
  });

  test('a TUN device is read the same way: its flags and attached queues', async () => {
    const link = await native.getLink('tun0');
    assert.equal(link?.kind, 'tun');
    assert.deepEqual(link?.tun, {
      type: 'tun',
      pi: false,
      vnetHdr: true,
      multiQueue: true,
      persist: true,
      queues: 0,
    });
    assert.deepEqual(await iproute2.getLink('tun0'), link);
    assert.equal((await native.getLink('eth0'))?.tun, null);
  });

  for (const [n, batch] of SCRIPT.entries()) {
    test(`batch ${n}: the same per-op results and the same kernel state`, async () => {
      const k = await results(native, batch);
      const i = await results(iproute2, batch);
      assert.deepEqual(i, k);
      const snap = await snapshot(iproute2);
      assert.deepEqual(snap, await snapshot(native));
      // The state compared is not empty: the peer entries batch 0 made are there.
      assert.ok(snap.filtered.length === 1 && snap.filtered[0]!.onlink, 'onlink route');
      assert.equal(snap.neigh4[0]?.state, 0x80, 'permanent neighbour');
      assert.ok(
        snap.fdb4.some((f) => f.dst === '10.250.0.2' && f.state === 0x80),
        'fdb entry',
      );
    });
  }

  test('the failures carry the errno and iproute2 text', async () => {
    const [err] = await iproute2.apply([
      { op: 'replaceRoute', dst: '10.5.3.0/24', gw: '10.5.3.0', dev: 'nosuchdev', onlink: true },
    ]);
    assert.equal(err?.code, 'WEFT_ERR_NETLINK');
    assert.match(
      err!.message,
      /^replace route 10\.5\.3\.0\/24 via 10\.5\.3\.0 dev nosuchdev onlink: ENODEV$/,
    );
    assert.match(String(err!.details.ip), /nosuchdev/);
  });
});
