/**
 * The recording fake used by the unit tests, and the iproute2 implementation used when the addon
 * does not load, must behave like the kernel through the native implementation for the ops the
 * backends send: the same script of ops (IPv4 and IPv6, idempotent repeats, deletes of absent
 * entries, unknown devices) runs against NativeNetlink in one namespace, Iproute2Netlink in a
 * second one and FakeNetlink, and the per-op results and the final entries must agree.
 *
 *   ┌──────── weft-<pid>-0 ────────┐   ┌──────── weft-<pid>-1 ────────┐
 *   │ native netlink (libmnl)       │   │ iproute2 netlink (ip, bridge) │
 *   │ eth0 (veth to peer0)          │   │ the same devices and          │
 *   │   10.250.0.1/24, fd00:250::1  │   │ addresses                     │
 *   │ flannel.1  vxlan local v4     │   │                               │
 *   │ flannel-v6.1  vxlan local v6  │   │                               │
 *   └──────────────────────────────┘   └──────────────────────────────┘
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { FakeNetlink } from '../../src/control/netlink/fake-netlink.js';
import { Iproute2Netlink } from '../../src/control/netlink/iproute2-netlink.js';
import { NativeNetlink } from '../../src/control/netlink/native-netlink.js';
import type { Netlink, Op } from '../../src/control/netlink/netlink.js';
import { NetnsScope, ip, isRoot } from '../../src/testbed/netns.js';

const skip = isRoot() ? false : 'needs root (network namespaces)';

const M1 = '0e:00:00:00:00:01';
const M2 = '0e:00:00:00:00:02';

const SCRIPT: Op[][] = [
  [
    { op: 'replaceNeigh', dst: '10.5.1.0', mac: M1, dev: 'flannel.1' },
    { op: 'appendFdb', mac: M1, dst: '10.250.0.2', dev: 'flannel.1' },
    { op: 'replaceRoute', dst: '10.5.1.0/24', gw: '10.5.1.0', dev: 'flannel.1', onlink: true },
    { op: 'replaceNeigh', dst: 'fd00:5:0:1::', mac: M2, dev: 'flannel-v6.1' },
    { op: 'appendFdb', mac: M2, dst: 'fd00:250::2', dev: 'flannel-v6.1' },
    {
      op: 'replaceRoute',
      dst: 'fd00:5:0:1::/64',
      gw: 'fd00:5:0:1::',
      dev: 'flannel-v6.1',
      onlink: true,
    },
    { op: 'replaceRoute', dst: '10.5.2.0/24', gw: '10.250.0.3', dev: 'eth0' },
    { op: 'replaceAddr', addr: '10.5.9.0/32', dev: 'flannel.1' },
  ],
  // repeats: all idempotent
  [
    { op: 'replaceNeigh', dst: '10.5.1.0', mac: M2, dev: 'flannel.1' },
    { op: 'appendFdb', mac: M1, dst: '10.250.0.2', dev: 'flannel.1' },
    { op: 'replaceRoute', dst: '10.5.1.0/24', gw: '10.5.1.0', dev: 'flannel.1', onlink: true },
    { op: 'replaceAddr', addr: '10.5.9.0/32', dev: 'flannel.1' },
  ],
  // deletes, some of absent entries; ops on a device that does not exist
  [
    { op: 'delRoute', dst: '10.5.2.0/24', gw: '10.250.0.3', dev: 'eth0' },
    { op: 'delRoute', dst: '10.5.2.0/24', gw: '10.250.0.3', dev: 'eth0' },
    { op: 'delNeigh', dst: 'fd00:5:0:1::', dev: 'flannel-v6.1' },
    { op: 'delNeigh', dst: 'fd00:5:0:1::', dev: 'flannel-v6.1' },
    { op: 'delFdb', mac: M2, dst: 'fd00:250::2', dev: 'flannel-v6.1' },
    { op: 'delFdb', mac: M2, dst: 'fd00:250::2', dev: 'flannel-v6.1' },
    { op: 'delAddr', addr: '10.5.9.0/32', dev: 'flannel.1' },
    { op: 'delAddr', addr: '10.5.9.0/32', dev: 'flannel.1' },
    { op: 'replaceNeigh', dst: '10.5.3.0', mac: M1, dev: 'nosuchdev' },
    { op: 'replaceRoute', dst: '10.5.3.0/24', gw: '10.5.3.0', dev: 'nosuchdev', onlink: true },
  ],
];

async function run(nl: Netlink): Promise<{ results: string[]; state: unknown }> {
  const results: string[] = [];
  for (const batch of SCRIPT) {
    for (const r of await nl.apply(batch))
      results.push(r === null ? 'ok' : String(r.details.errno));
  }
  const state = {
    routes4: (await nl.listRoutes({ family: 4 }))
      .filter((r) => r.dst.startsWith('10.5.'))
      .map((r) => `${r.dst} ${r.gw} ${r.dev} ${r.onlink}`)
      .sort(),
    routes6: (await nl.listRoutes({ family: 6 }))
      .filter((r) => r.dst.startsWith('fd00:5:'))
      .map((r) => `${r.dst} ${r.gw} ${r.dev} ${r.onlink}`)
      .sort(),
    neighs: [...(await nl.listNeighs(4, 'flannel.1')), ...(await nl.listNeighs(6, 'flannel-v6.1'))]
      .filter((n) => n.dst.startsWith('10.5.') || n.dst.startsWith('fd00:5:'))
      .map((n) => `${n.dst} ${n.mac} ${n.dev}`)
      .sort(),
    fdb: [...(await nl.listFdb('flannel.1')), ...(await nl.listFdb('flannel-v6.1'))]
      .filter((f) => f.dst !== null)
      .map((f) => `${f.mac} ${f.dst} ${f.dev}`)
      .sort(),
    addrs: (await nl.listAddrs(4, 'flannel.1')).map((a) => a.addr),
  };
  return { results, state };
}

/** A namespace with the underlay device the script's vxlan devices hang off. */
function underlayNs(scope: NetnsScope): string {
  const ns = scope.add();
  ip(ns, 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'peer0');
  ip(ns, 'addr', 'add', '10.250.0.1/24', 'dev', 'eth0');
  ip(ns, 'addr', 'add', 'fd00:250::1/64', 'dev', 'eth0', 'nodad');
  ip(ns, 'link', 'set', 'eth0', 'up');
  ip(ns, 'link', 'set', 'peer0', 'up');
  return ns;
}

describe('FakeNetlink and Iproute2Netlink agree with the kernel', { skip }, () => {
  const scope = new NetnsScope();
  let native: NativeNetlink;
  let iproute2: Iproute2Netlink;

  before(() => {
    native = new NativeNetlink({ netns: underlayNs(scope) });
    iproute2 = new Iproute2Netlink({ netns: underlayNs(scope) });
  });
  after(async () => {
    native?.close();
    iproute2?.close();
    await scope.cleanup();
  });

  test('the same script gives the same results and the same entries', async () => {
    const devices: Op[] = [
      {
        op: 'addVxlan',
        name: 'flannel.1',
        vni: 1,
        port: 8472,
        local: '10.250.0.1',
        link: 'eth0',
        learning: false,
      },
      { op: 'setLink', dev: 'flannel.1', up: true },
      {
        op: 'addVxlan',
        name: 'flannel-v6.1',
        vni: 1,
        port: 8472,
        local: 'fd00:250::1',
        link: 'eth0',
        learning: false,
      },
      { op: 'setLink', dev: 'flannel-v6.1', up: true },
    ];
    const fake = new FakeNetlink();
    fake.addLink('lo');
    fake.addLink('eth0');
    for (const nl of [native, iproute2, fake] as Netlink[]) {
      assert.deepEqual(await nl.apply(devices), [null, null, null, null]);
    }
    const k = await run(native);
    const f = await run(fake);
    const i = await run(iproute2);
    assert.deepEqual(f.results, k.results, 'fake results');
    assert.deepEqual(f.state, k.state, 'fake state');
    assert.deepEqual(i.results, k.results, 'iproute2 results');
    assert.deepEqual(i.state, k.state, 'iproute2 state');
  });
});
