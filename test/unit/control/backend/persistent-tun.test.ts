import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { logger, setLogLevel } from '../../../../src/common/log.js';
import { inspectTun, staleTunOps } from '../../../../src/control/backend/persistent-tun.js';
import { FakeNetlink } from '../../../../src/control/netlink/fake-netlink.js';
import type { TunLinkInfo } from '../../../../src/control/netlink/netlink.js';

setLogLevel('silent');
const log = logger('test');
const MQ: TunLinkInfo = {
  type: 'tun',
  pi: false,
  vnetHdr: true,
  multiQueue: true,
  persist: true,
  queues: 0,
};

describe('inspectTun', () => {
  test('no device, or one of another kind: the engine creates (or refuses) it', async () => {
    const nl = new FakeNetlink();
    assert.equal(await inspectTun(nl, 'flannel0', 'native', log), 'create');
    nl.addLink('flannel.1', { kind: 'vxlan' });
    assert.equal(await inspectTun(nl, 'flannel.1', 'native', log), 'create');
    assert.equal(nl.ops.length, 0, 'nothing deleted');
  });

  test('a persistent multi-queue TUN with no queue attached is adopted by native/bpf', async () => {
    const nl = new FakeNetlink();
    nl.addLink('flannel0', { kind: 'tun', tun: MQ });
    assert.equal(await inspectTun(nl, 'flannel0', 'native', log), 'adopt');
    assert.equal(await inspectTun(nl, 'flannel0', 'bpf', log), 'adopt');
    assert.equal(nl.ops.length, 0);
  });

  test('one the engine cannot attach to is deleted (js engine, single queue, tap)', async () => {
    for (const [engine, tun] of [
      ['js', MQ],
      ['native', { ...MQ, multiQueue: false }],
      ['native', { ...MQ, type: 'tap' }],
    ] as const) {
      const nl = new FakeNetlink();
      nl.addLink('flannel0', { kind: 'tun', tun });
      assert.equal(await inspectTun(nl, 'flannel0', engine, log), 'create');
      assert.deepEqual(nl.ops, [{ op: 'delLink', dev: 'flannel0' }]);
    }
  });

  test('one a process holds (queues attached, or not persistent) is refused, never deleted', async () => {
    for (const tun of [
      { ...MQ, queues: 2 },
      { ...MQ, multiQueue: false, persist: false },
    ]) {
      const nl = new FakeNetlink();
      nl.addLink('flannel0', { kind: 'tun', tun });
      await assert.rejects(inspectTun(nl, 'flannel0', 'native', log), (err: Error) => {
        assert.match(err.message, /tun flannel0 is in use by another process/);
        return true;
      });
      assert.equal(nl.ops.length, 0);
    }
  });
});

describe('staleTunOps', () => {
  test('addresses and routes on the TUN that start did not apply, link-local ones aside', async () => {
    const nl = new FakeNetlink();
    nl.addLink('flannel0', { kind: 'tun', tun: MQ });
    const ours = [
      { op: 'replaceAddr', addr: '10.5.7.0/32', dev: 'flannel0' },
      { op: 'replaceRoute', dst: '10.5.0.0/16', dev: 'flannel0' },
    ] as const;
    await nl.apply([
      ...ours,
      { op: 'replaceAddr', addr: '10.5.9.0/32', dev: 'flannel0' },
      { op: 'replaceAddr', addr: 'fe80::1/64', dev: 'flannel0' },
      { op: 'replaceRoute', dst: '10.6.0.0/16', dev: 'flannel0' },
    ]);
    assert.deepEqual(await staleTunOps(nl, 'flannel0', ours), [
      { op: 'delAddr', addr: '10.5.9.0/32', dev: 'flannel0' },
      { op: 'delRoute', dst: '10.6.0.0/16', dev: 'flannel0' },
    ]);
  });
});
