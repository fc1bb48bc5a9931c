/**
 * The ipip kernel backend (flannel's ipip, IPv4 only): pure plans for both DirectRouting cases,
 * the device rules (create, reuse, recreate on other tunnel addresses, refuse a foreign device,
 * a kernel without ipip) and the backend over the recording fake netlink.
 */
import assert from 'node:assert/strict';
import { constants } from 'node:os';
import { describe, test } from 'node:test';
import { isWeftError } from '../../../../src/common/errors.js';
import { parseCIDR } from '../../../../src/common/ip.js';
import { logger } from '../../../../src/common/log.js';
import {
  IPIP_DEV,
  createIpipBackend,
  ensureIpipDevice,
  parseIpipConfig,
  planIpip,
} from '../../../../src/control/backend/ipip.js';
import type { Backend } from '../../../../src/control/backend/backend.js';
import { backendFactory } from '../../../../src/control/backend/registry.js';
import { parseNetConfig } from '../../../../src/control/config/net-config.js';
import { FakeNetlink } from '../../../../src/control/netlink/fake-netlink.js';
import { describeOp } from '../../../../src/control/netlink/netlink.js';
import { EXT, FAM, backendContext, ownLease, peerLease } from './fixtures.js';

const log = logger('test');
log.level = 'silent';

const ipipPeer = (publicIP: string = FAM[4].publicIP) =>
  peerLease({ backendType: 'ipip', publicIP, publicIPv6: null, backendData: undefined });

const v4Context = (backend: Record<string, unknown>) =>
  backendContext(backend, {
    netConfig: parseNetConfig(JSON.stringify({ Network: FAM[4].network, Backend: backend })),
  });

function fakeWithExt(): FakeNetlink {
  const nl = new FakeNetlink();
  nl.addLink('lo');
  nl.addLink('eth0', { mtu: 1500 });
  return nl;
}

describe('planIpip', () => {
  const ctx = { dev: IPIP_DEV, extDev: 'eth0', extNets: [parseCIDR(FAM[4].extNet)!] };

  test('a peer gets `<subnet> via <PublicIP> dev flannel.ipip onlink`; removal deletes it', () => {
    const plan = (type: 'added' | 'removed') =>
      planIpip({ type, lease: ipipPeer() }, { ...ctx, directRouting: false }).map(describeOp);
    assert.deepEqual(plan('added'), [
      `replace route ${FAM[4].subnet} via ${FAM[4].publicIP} dev flannel.ipip onlink`,
    ]);
    assert.deepEqual(plan('removed'), [
      `delete route ${FAM[4].subnet} via ${FAM[4].publicIP} dev flannel.ipip onlink`,
    ]);
  });

  test('DirectRouting: a peer on our L2 segment is routed on the external interface (onlink kept)', () => {
    const ops = planIpip({ type: 'added', lease: ipipPeer() }, { ...ctx, directRouting: true });
    assert.deepEqual(ops.map(describeOp), [
      `replace route ${FAM[4].subnet} via ${FAM[4].publicIP} dev eth0 onlink`,
    ]);
  });

  test('DirectRouting: a peer off our segment still goes through the tunnel', () => {
    const ops = planIpip(
      { type: 'added', lease: ipipPeer(FAM[4].offLinkIP) },
      { ...ctx, directRouting: true },
    );
    assert.deepEqual(ops.map(describeOp), [
      `replace route ${FAM[4].subnet} via ${FAM[4].offLinkIP} dev flannel.ipip onlink`,
    ]);
  });

  test('leases of another backend type are not ours (flannel ignores them)', () => {
    const vx = peerLease();
    assert.deepEqual(planIpip({ type: 'added', lease: vx }, { ...ctx, directRouting: false }), []);
  });

  test('DirectRouting must be a boolean, named in the error', () => {
    assert.equal(parseIpipConfig({ directrouting: true }).directRouting, true);
    assert.throws(
      () => parseIpipConfig({ DirectRouting: 'yes' }),
      (e: unknown) => isWeftError(e, 'WEFT_ERR_CONFIG_INVALID') && /DirectRouting/.test(e.message),
    );
  });
});

describe('flannel.ipip device', () => {
  const w = { local: EXT.ifaceAddr!, mtu: 1480 };

  test('created with local = interface address, no remote, MTU = ext − 20', async () => {
    const nl = fakeWithExt();
    await ensureIpipDevice(nl, w, log);
    const l = nl.links.get(IPIP_DEV)!;
    assert.equal(l.kind, 'ipip');
    assert.deepEqual(l.ipip, { local: w.local, remote: null, ttl: 0, tos: 0, pmtudisc: false });
    assert.equal(l.mtu, 1480);
  });

  test('an existing device of ours is kept (same index); its MTU is set again', async () => {
    const nl = fakeWithExt();
    await ensureIpipDevice(nl, w, log);
    const index = nl.links.get(IPIP_DEV)!.index;
    nl.links.get(IPIP_DEV)!.mtu = 1400;
    await ensureIpipDevice(nl, w, log);
    assert.equal(nl.links.get(IPIP_DEV)!.index, index);
    assert.equal(nl.links.get(IPIP_DEV)!.mtu, 1480);
  });

  test('a device with another local or a remote is deleted and recreated', async () => {
    for (const ipip of [
      { local: '192.168.1.99', remote: null, ttl: 0, tos: 0, pmtudisc: false },
      { local: w.local, remote: '192.168.1.50', ttl: 0, tos: 0, pmtudisc: false },
    ]) {
      const nl = fakeWithExt();
      const old = nl.addLink(IPIP_DEV, { kind: 'ipip', ipip });
      await ensureIpipDevice(nl, w, log);
      const l = nl.links.get(IPIP_DEV)!;
      assert.notEqual(l.index, old.index);
      assert.equal(l.ipip?.local, w.local);
      assert.equal(l.ipip?.remote, null);
    }
  });

  test('a device of that name that is not ipip is refused, not deleted', async () => {
    const nl = fakeWithExt();
    nl.addLink(IPIP_DEV, { kind: 'dummy' });
    await assert.rejects(
      ensureIpipDevice(nl, w, log),
      (e: unknown) => isWeftError(e, 'WEFT_ERR_BACKEND') && /not ipip/.test(e.message),
    );
    assert.equal(nl.links.get(IPIP_DEV)!.kind, 'dummy');
  });

  test('a kernel without the ipip module: WEFT_ERR_BACKEND_UNSUPPORTED saying so', async () => {
    const nl = fakeWithExt();
    nl.failWith((op) => op.op === 'addIpip', constants.errno.EOPNOTSUPP);
    await assert.rejects(
      ensureIpipDevice(nl, w, log),
      (e: unknown) =>
        isWeftError(e, 'WEFT_ERR_BACKEND_UNSUPPORTED') && /ipip module/.test(e.message),
    );
  });
});

describe('ipip backend over the fake netlink', () => {
  test('is registered; IPv4 only (an IPv6 network is refused naming the rule)', async () => {
    assert.equal(typeof backendFactory('ipip'), 'function');
    const b = createIpipBackend(backendContext({ Type: 'ipip' }), { openNetlink: fakeWithExt });
    await assert.rejects(
      b.prepare(),
      (e: unknown) => isWeftError(e, 'WEFT_ERR_BACKEND_UNSUPPORTED') && /IPv4 only/.test(e.message),
    );
  });

  test('prepare publishes BackendType ipip and MTU ext − 20; start puts our /32 on the device', async () => {
    const nl = fakeWithExt();
    const b = createIpipBackend(v4Context({ Type: 'ipip' }), { openNetlink: () => nl });
    assert.deepEqual(await b.prepare(), { attrs: { backendType: 'ipip' }, mtu: 1480 });
    await nl.apply([{ op: 'replaceAddr', addr: '10.5.77.0/32', dev: IPIP_DEV }]); // an earlier subnet
    await b.start(ownLease());
    assert.deepEqual(
      (await nl.listAddrs(4, IPIP_DEV)).map((a) => a.addr),
      [FAM[4].ownAddr],
    );
    assert.equal(nl.links.get(IPIP_DEV)!.up, true);
    await b.close();
  });

  for (const directRouting of [false, true]) {
    test(`run programs peers (DirectRouting ${directRouting}) and removes them`, async () => {
      const nl = fakeWithExt();
      await nl.apply([{ op: 'replaceAddr', addr: `${EXT.ifaceAddr}/24`, dev: 'eth0' }]);
      const b = createIpipBackend(v4Context({ Type: 'ipip', DirectRouting: directRouting }), {
        openNetlink: () => nl,
      });
      await b.prepare();
      await b.start(ownLease());
      const near = ipipPeer();
      const far = {
        ...ipipPeer(FAM[4].offLinkIP),
        key: 'far',
        subnet: parseCIDR('10.5.35.0/24')!,
      };
      const ac = new AbortController();
      let step: () => void = () => undefined;
      const stepped = new Promise<void>((r) => (step = r));
      async function* events() {
        yield [
          { type: 'added' as const, lease: near },
          { type: 'added' as const, lease: far },
        ];
        await stepped;
        yield [{ type: 'removed' as const, lease: near }];
        await new Promise((r) => ac.signal.addEventListener('abort', r));
      }
      const running = b.run(events(), ac.signal);
      const routes = async () =>
        (await nl.listRoutes({ family: 4 }))
          .map((r) => `${r.dst} via ${r.gw} dev ${r.dev}${r.onlink ? ' onlink' : ''}`)
          .sort();
      while ((await routes()).length < 2) await new Promise((r) => setImmediate(r));
      assert.deepEqual(await routes(), [
        `${FAM[4].subnet} via ${FAM[4].publicIP} dev ${directRouting ? 'eth0' : IPIP_DEV} onlink`,
        `10.5.35.0/24 via ${FAM[4].offLinkIP} dev ${IPIP_DEV} onlink`,
      ]);
      step();
      while ((await routes()).length > 1) await new Promise((r) => setImmediate(r));
      assert.deepEqual(await routes(), [
        `10.5.35.0/24 via ${FAM[4].offLinkIP} dev ${IPIP_DEV} onlink`,
      ]);
      ac.abort();
      await running;
      await b.close();
    });
  }
});

describe('ipip Dataplane option (kernel | userspace | auto)', () => {
  const stub = (used: { n: number }): Backend => ({
    type: 'ipip',
    prepare: async () => {
      used.n++;
      return { attrs: { backendType: 'ipip' }, mtu: 1480 };
    },
    start: async () => {},
    run: async () => {},
    close: async () => {},
  });

  test('parsed and checked, naming the field; kernel by default', () => {
    assert.equal(parseIpipConfig({}).dataplane, 'kernel');
    assert.equal(parseIpipConfig({ dataplane: 'auto' }).dataplane, 'auto');
    assert.throws(
      () => parseIpipConfig({ Dataplane: 'fast' }),
      (e: unknown) => isWeftError(e, 'WEFT_ERR_CONFIG_INVALID') && /Dataplane/.test(e.message),
    );
  });

  test('auto falls back to userspace when the kernel has no ipip module', async () => {
    const nl = fakeWithExt();
    nl.failWith((op) => op.op === 'addIpip', constants.errno.EOPNOTSUPP);
    const used = { n: 0 };
    const b = createIpipBackend(v4Context({ Type: 'ipip', Dataplane: 'auto' }), {
      openNetlink: () => nl,
      userspace: () => stub(used),
    });
    assert.deepEqual(await b.prepare(), { attrs: { backendType: 'ipip' }, mtu: 1480 });
    assert.equal(used.n, 1);
    assert.equal(nl.closed, true);
  });

  test('auto keeps the kernel device when it works; other errors are not a reason to fall back', async () => {
    const nl = fakeWithExt();
    const never = () => {
      throw new Error('userspace must not be used');
    };
    const b = createIpipBackend(v4Context({ Type: 'ipip', Dataplane: 'auto' }), {
      openNetlink: () => nl,
      userspace: never,
    });
    await b.prepare();
    assert.equal(nl.links.get(IPIP_DEV)?.kind, 'ipip');
    const v6 = createIpipBackend(backendContext({ Type: 'ipip', Dataplane: 'auto' }), {
      openNetlink: fakeWithExt,
      userspace: never,
    });
    await assert.rejects(v6.prepare(), /IPv4 only/);
  });

  test('userspace hands over at once; the registry knows ipip-userspace', async () => {
    const used = { n: 0 };
    const b = createIpipBackend(v4Context({ Type: 'ipip', Dataplane: 'userspace' }), {
      openNetlink: () => {
        throw new Error('no netlink for the kernel device');
      },
      userspace: () => stub(used),
    });
    await b.prepare();
    assert.equal(used.n, 1);
    assert.equal(typeof backendFactory('ipip-userspace'), 'function');
  });
});
