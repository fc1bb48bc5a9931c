import assert from 'node:assert/strict';
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { constants, tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { isWeftError } from '../../../../src/common/errors.js';
import {
  type Backend,
  type Handover,
  backendOptions,
} from '../../../../src/control/backend/backend.js';
import { createHostGwBackend } from '../../../../src/control/backend/host-gw.js';
import { backendFactory, registerBackend } from '../../../../src/control/backend/registry.js';
import { createVxlanBackend, parseVxlanConfig } from '../../../../src/control/backend/vxlan.js';
import { createVxlanUserspaceBackend } from '../../../../src/control/backend/vxlan-userspace.js';
import { FakeNetlink } from '../../../../src/control/netlink/fake-netlink.js';
import { PIN_DIR_ENV, pinDirName } from '../../../../src/dataplane/bpf-pins.js';
import { EXT, FAM, backendContext, ownLease } from './fixtures.js';

function fakeWithExt(): FakeNetlink {
  const nl = new FakeNetlink();
  nl.addLink('lo');
  nl.addLink('eth0', { mtu: 1500 });
  return nl;
}

const dir = mkdtempSync(join(tmpdir(), 'weft-vxlan-'));
after(() => rmSync(dir, { recursive: true, force: true }));

describe('vxlan backend (kernel) over the fake netlink', () => {
  test('prepare creates flannel.1 and flannel-v6.1 as DESIGN §5 and publishes the VtepMACs', async () => {
    const nl = fakeWithExt();
    const b = createVxlanBackend(backendContext({ Type: 'vxlan' }), { openNetlink: () => nl });
    const p = await b.prepare();
    const v4 = nl.links.get('flannel.1')!;
    const v6 = nl.links.get('flannel-v6.1')!;
    assert.deepEqual(v4.vxlan, {
      vni: 1,
      port: 8472,
      local: EXT.ifaceAddr,
      link: 2,
      learning: false,
      gbp: false,
    });
    assert.equal(v4.mtu, 1450);
    assert.equal(v6.vxlan?.local, EXT.ifaceAddrV6);
    assert.equal(p.mtu, 1450);
    assert.equal(p.attrs.backendType, 'vxlan');
    assert.deepEqual(p.attrs.backendData, { VNI: 1, VtepMAC: v4.mac });
    assert.deepEqual(p.attrs.backendV6Data, { VNI: 1, VtepMAC: v6.mac });
    // locally administered unicast
    assert.equal(parseInt(v4.mac.slice(0, 2), 16) & 3, 2);
  });

  test('a restart reuses the compatible device and its MAC', async () => {
    const nl = fakeWithExt();
    const ctx = backendContext({ Type: 'vxlan' });
    await createVxlanBackend(ctx, { openNetlink: () => nl }).prepare();
    const mac = nl.links.get('flannel.1')!.mac;
    const index = nl.links.get('flannel.1')!.index;
    const p = await createVxlanBackend(ctx, { openNetlink: () => nl }).prepare();
    assert.equal(nl.links.get('flannel.1')!.index, index);
    assert.deepEqual(p.attrs.backendData, { VNI: 1, VtepMAC: mac });
  });

  test('an incompatible device is recreated with the same MAC', async () => {
    const nl = fakeWithExt();
    nl.addLink('flannel.1', {
      kind: 'vxlan',
      mac: '0a:00:00:00:00:07',
      vxlan: { vni: 1, port: 4789, local: EXT.ifaceAddr, link: 2, learning: true },
    });
    await createVxlanBackend(backendContext({ Type: 'vxlan' }), {
      openNetlink: () => nl,
    }).prepare();
    const l = nl.links.get('flannel.1')!;
    assert.equal(l.vxlan?.port, 8472);
    assert.equal(l.vxlan?.learning, false);
    assert.equal(l.mac, '0a:00:00:00:00:07');
  });

  test('a TUN the userspace dataplane left is replaced, with what the bpf engine pinned on it', async () => {
    const nl = fakeWithExt();
    nl.addLink('flannel.1', { kind: 'tun' });
    // A pin directory as bpf-pins.ts names it (a plain directory here: the removal is the
    // same calls; test/netns/bpf-pinned.test.ts runs it on a bpffs).
    const root = join(dir, 'pins');
    const pins = join(root, pinDirName('flannel.1', statSync('/proc/self/ns/net').ino));
    mkdirSync(pins, { recursive: true });
    writeFileSync(join(pins, 'rx'), '');
    const saved = process.env[PIN_DIR_ENV];
    process.env[PIN_DIR_ENV] = root;
    try {
      await createVxlanBackend(backendContext({ Type: 'vxlan' }), {
        openNetlink: () => nl,
      }).prepare();
    } finally {
      if (saved === undefined) delete process.env[PIN_DIR_ENV];
      else process.env[PIN_DIR_ENV] = saved;
    }
    assert.equal(nl.links.get('flannel.1')!.kind, 'vxlan');
    assert.equal(existsSync(pins), false, 'the pins went with the TUN');
  });

  test('the VtepMAC is persisted and reused when the device is gone', async () => {
    const nl = fakeWithExt();
    const ctx = backendContext(
      { Type: 'vxlan' },
      { options: backendOptions({ subnetFile: join(dir, 'subnet.env') }) },
    );
    await createVxlanBackend(ctx, { openNetlink: () => nl }).prepare();
    const mac = nl.links.get('flannel.1')!.mac;
    assert.equal(readFileSync(join(dir, 'subnet.env.flannel.1.vtep-mac'), 'utf8').trim(), mac);
    const fresh = fakeWithExt();
    await createVxlanBackend(ctx, { openNetlink: () => fresh }).prepare();
    assert.equal(fresh.links.get('flannel.1')!.mac, mac);
  });

  test('with no device, the VtepMAC the store still publishes (kube annotation) is reused', async () => {
    const nl = fakeWithExt();
    const ctx = backendContext(
      { Type: 'vxlan' },
      {
        vtepMACs: {
          stored: (f) => (f === 4 ? '0a:11:22:33:44:55' : '0a:11:22:33:44:66'),
          inUse: async () => new Set(),
        },
      },
    );
    const p = await createVxlanBackend(ctx, { openNetlink: () => nl }).prepare();
    assert.equal(nl.links.get('flannel.1')!.mac, '0a:11:22:33:44:55');
    assert.equal(nl.links.get('flannel-v6.1')!.mac, '0a:11:22:33:44:66');
    assert.deepEqual(p.attrs.backendData, { VNI: 1, VtepMAC: '0a:11:22:33:44:55' });
  });

  test('a corrupt MAC file is ignored (a new MAC is made)', async () => {
    const nl = fakeWithExt();
    const sub = mkdtempSync(join(dir, 'c-'));
    writeFileSync(join(sub, 'subnet.env.flannel.1.vtep-mac'), 'garbage\n');
    const ctx = backendContext(
      { Type: 'vxlan' },
      { options: backendOptions({ subnetFile: join(sub, 'subnet.env') }) },
    );
    await createVxlanBackend(ctx, { openNetlink: () => nl }).prepare();
    assert.match(nl.links.get('flannel.1')!.mac, /^[0-9a-f]{2}(:[0-9a-f]{2}){5}$/);
  });

  test('a device whose MAC another node holds gets a new one, published and persisted', async () => {
    const nl = fakeWithExt();
    nl.addLink('flannel.1', {
      kind: 'vxlan',
      mac: '0a:00:00:00:00:07',
      vxlan: { vni: 1, port: 8472, local: EXT.ifaceAddr, link: 2, learning: false },
    });
    const sub = mkdtempSync(join(dir, 'h-'));
    const ctx = backendContext(
      { Type: 'vxlan' },
      {
        options: backendOptions({ subnetFile: join(sub, 'n1.env') }),
        vtepMACs: { stored: () => null, inUse: async () => new Set(['0a:00:00:00:00:07']) },
      },
    );
    const p = await createVxlanBackend(ctx, { openNetlink: () => nl }).prepare();
    const mac = nl.links.get('flannel.1')!.mac;
    assert.notEqual(mac, '0a:00:00:00:00:07');
    assert.deepEqual(p.attrs.backendData, { VNI: 1, VtepMAC: mac });
    assert.equal(readFileSync(join(sub, 'n1.env.flannel.1.vtep-mac'), 'utf8').trim(), mac);
  });

  test('start puts only our subnet address on the device and brings it up', async () => {
    const nl = fakeWithExt();
    const b = createVxlanBackend(backendContext({ Type: 'vxlan' }), { openNetlink: () => nl });
    await b.prepare();
    await nl.apply([{ op: 'replaceAddr', addr: '10.5.99.0/32', dev: 'flannel.1' }]);
    await b.start(ownLease());
    assert.deepEqual(
      (await nl.listAddrs(4, 'flannel.1')).map((a) => a.addr),
      [FAM[4].ownAddr],
    );
    assert.deepEqual(
      (await nl.listAddrs(6, 'flannel-v6.1')).map((a) => a.addr),
      [FAM[6].ownAddr],
    );
    assert.equal(nl.links.get('flannel.1')!.up, true);
  });
});

describe('vxlan backend options', () => {
  test('defaults: VNI 1, port 8472, no DirectRouting, kernel dataplane', () => {
    assert.deepEqual(parseVxlanConfig({ Type: 'vxlan' }), {
      vni: 1,
      port: 8472,
      directRouting: false,
      dataplane: 'kernel',
      mtu: null,
      learning: false,
      gbp: false,
    });
  });

  test('MTU 0 means the interface MTU, as unset', () => {
    assert.equal(parseVxlanConfig({ Type: 'vxlan', MTU: 0 }).mtu, null);
  });

  for (const bad of [117, 1400.5, 65536, -1, '1400']) {
    test(`MTU ${JSON.stringify(bad)} is refused naming Backend.MTU`, () => {
      assert.throws(
        () => parseVxlanConfig({ Type: 'vxlan', MTU: bad }),
        (e: unknown) =>
          isWeftError(e, 'WEFT_ERR_CONFIG_INVALID') && /^Backend\.MTU: /.test(e.message),
      );
    });
  }

  for (const option of ['Learning', 'GBP']) {
    test(`${option} must be true or false`, () => {
      assert.throws(
        () => parseVxlanConfig({ Type: 'vxlan', [option]: 'yes' }),
        (e: unknown) =>
          isWeftError(e, 'WEFT_ERR_CONFIG_INVALID') &&
          e.message === `Backend.${option}: must be true or false`,
      );
    });

    test(`${option} with Dataplane userspace is refused naming the option and the way out`, () => {
      assert.throws(
        () => parseVxlanConfig({ Type: 'vxlan', Dataplane: 'userspace', [option]: true }),
        (e: unknown) =>
          isWeftError(e, 'WEFT_ERR_BACKEND_UNSUPPORTED') &&
          e.exitCode === 2 &&
          e.message.startsWith(`Backend.${option}: the userspace vxlan dataplane`) &&
          e.message.includes('"Dataplane": "kernel"'),
      );
    });

    test(`${option} with Dataplane auto is refused when it would hand over to userspace`, async () => {
      const nl = fakeWithExt();
      nl.failWith((op) => op.op === 'addVxlan', constants.errno.EOPNOTSUPP);
      const b = createVxlanBackend(
        backendContext({ Type: 'vxlan', Dataplane: 'auto', [option]: true }),
        { openNetlink: () => nl, userspace: createVxlanUserspaceBackend },
      );
      await assert.rejects(
        b.prepare(),
        (e: unknown) =>
          isWeftError(e, 'WEFT_ERR_BACKEND_UNSUPPORTED') &&
          e.message.startsWith(`Backend.${option}: `),
      );
    });
  }

  test('MTU 1400: both devices get MTU − 50 and FLANNEL_MTU is MTU − 50 (as flannel)', async () => {
    const nl = fakeWithExt();
    const b = createVxlanBackend(backendContext({ Type: 'vxlan', MTU: 1400 }), {
      openNetlink: () => nl,
    });
    const p = await b.prepare();
    assert.equal(nl.links.get('flannel.1')!.mtu, 1350);
    assert.equal(nl.links.get('flannel-v6.1')!.mtu, 1350);
    assert.equal(p.mtu, 1350);
  });

  test('without MTU the IPv6 device keeps the interface MTU − 70', async () => {
    const nl = fakeWithExt();
    await createVxlanBackend(backendContext({ Type: 'vxlan' }), {
      openNetlink: () => nl,
    }).prepare();
    assert.equal(nl.links.get('flannel-v6.1')!.mtu, 1430);
  });

  test('a reused device gets the new MTU', async () => {
    const nl = fakeWithExt();
    const ctx = (mtu: number) => backendContext({ Type: 'vxlan', MTU: mtu });
    await createVxlanBackend(ctx(1400), { openNetlink: () => nl }).prepare();
    const index = nl.links.get('flannel.1')!.index;
    await createVxlanBackend(ctx(9000), { openNetlink: () => nl }).prepare();
    assert.equal(nl.links.get('flannel.1')!.index, index);
    assert.equal(nl.links.get('flannel.1')!.mtu, 8950);
  });

  test('MTU below 1330 with IPv6 enabled is refused naming Backend.MTU', async () => {
    const b = createVxlanBackend(backendContext({ Type: 'vxlan', MTU: 1300 }), {
      openNetlink: fakeWithExt,
    });
    await assert.rejects(
      b.prepare(),
      (e: unknown) =>
        isWeftError(e, 'WEFT_ERR_CONFIG_INVALID') && /^Backend\.MTU: .*1330/.test(e.message),
    );
  });

  test('Learning and GBP are set on the kernel device as flannel sets them', async () => {
    const nl = fakeWithExt();
    await createVxlanBackend(backendContext({ Type: 'vxlan', Learning: true, GBP: true }), {
      openNetlink: () => nl,
    }).prepare();
    assert.equal(nl.links.get('flannel.1')!.vxlan?.learning, true);
    assert.equal(nl.links.get('flannel.1')!.vxlan?.gbp, true);
    assert.equal(nl.links.get('flannel-v6.1')!.vxlan?.gbp, true);
  });

  test('a device whose learning or gbp differs from the config is recreated', async () => {
    const nl = fakeWithExt();
    await createVxlanBackend(backendContext({ Type: 'vxlan', GBP: true }), {
      openNetlink: () => nl,
    }).prepare();
    const index = nl.links.get('flannel.1')!.index;
    await createVxlanBackend(backendContext({ Type: 'vxlan' }), {
      openNetlink: () => nl,
    }).prepare();
    assert.notEqual(nl.links.get('flannel.1')!.index, index);
    assert.equal(nl.links.get('flannel.1')!.vxlan?.gbp, false);
  });

  test('a bad Dataplane names the field', () => {
    assert.throws(
      () => parseVxlanConfig({ Type: 'vxlan', Dataplane: 'dpdk' }),
      (e: unknown) =>
        isWeftError(e, 'WEFT_ERR_CONFIG_INVALID') && /Backend\.Dataplane/.test(e.message),
    );
  });

  test('Dataplane userspace without a registered implementation is unsupported', () => {
    assert.throws(
      () =>
        createVxlanBackend(backendContext({ Type: 'vxlan', Dataplane: 'userspace' }), {
          userspace: null,
        }),
      (e: unknown) => isWeftError(e, 'WEFT_ERR_BACKEND_UNSUPPORTED'),
    );
  });

  test('Dataplane userspace delegates to the vxlan-userspace factory', () => {
    const marker: Backend = {
      type: 'vxlan',
      prepare: async () => ({ attrs: { backendType: 'vxlan' }, mtu: 1 }),
      start: async () => {},
      run: async () => {},
      close: async () => {},
    };
    registerBackend('vxlan-userspace', () => marker);
    assert.equal(
      backendFactory('vxlan')(backendContext({ Type: 'vxlan', Dataplane: 'userspace' })),
      marker,
    );
  });

  test('Dataplane auto falls back to userspace when the kernel has no vxlan link type', async () => {
    const nl = fakeWithExt();
    nl.failWith((op) => op.op === 'addVxlan', constants.errno.EOPNOTSUPP);
    let used = false;
    const userspace: Backend = {
      type: 'vxlan',
      prepare: async () => {
        used = true;
        return { attrs: { backendType: 'vxlan' }, mtu: 1450 };
      },
      start: async () => {},
      run: async () => {},
      close: async () => {},
    };
    let handover: Handover | undefined;
    const b = createVxlanBackend(backendContext({ Type: 'vxlan', Dataplane: 'auto' }), {
      openNetlink: () => nl,
      userspace: (_ctx, h) => {
        handover = h;
        return userspace;
      },
    });
    await b.prepare();
    assert.equal(used, true);
    assert.equal(nl.closed, true);
    // Next best after kernel vxlan: an `auto` engine becomes bpf (which falls back to native),
    // said to the userspace factory as an argument.
    assert.deepEqual(handover, { autoPrefers: 'bpf' });
  });

  test('Dataplane auto is ready when the implementation it handed over to is', async () => {
    const nl = fakeWithExt();
    nl.failWith((op) => op.op === 'addVxlan', constants.errno.EOPNOTSUPP);
    let tunOk = true;
    const b = createVxlanBackend(backendContext({ Type: 'vxlan', Dataplane: 'auto' }), {
      openNetlink: () => nl,
      userspace: () => ({
        type: 'vxlan',
        isReady: () => tunOk,
        prepare: async () => ({ attrs: { backendType: 'vxlan' }, mtu: 1450 }),
        start: async () => {},
        run: async () => {},
        close: async () => {},
      }),
    });
    await b.prepare();
    assert.equal(b.isReady?.(), true);
    tunOk = false; // its TUN cannot be restored
    assert.equal(b.isReady?.(), false);
  });

  test('Dataplane auto keeps the kernel device when it works', async () => {
    const nl = fakeWithExt();
    const b = createVxlanBackend(backendContext({ Type: 'vxlan', Dataplane: 'auto' }), {
      openNetlink: () => nl,
      userspace: () => {
        throw new Error('userspace must not be used');
      },
    });
    await b.prepare();
    assert.equal(nl.links.get('flannel.1')?.kind, 'vxlan');
  });

  test('vxlan and host-gw are registered by name', () => {
    assert.equal(typeof backendFactory('vxlan'), 'function');
    assert.equal(typeof backendFactory('host-gw'), 'function');
  });
});

describe('host-gw backend', () => {
  test('refuses to start behind NAT (public IP is not the interface address)', async () => {
    const ctx = backendContext(
      { Type: 'host-gw' },
      { extIface: { ...EXT, publicIP: '203.0.113.5' } },
    );
    const b = createHostGwBackend(ctx, { openNetlink: fakeWithExt });
    await assert.rejects(
      b.prepare(),
      (e: unknown) => isWeftError(e, 'WEFT_ERR_BACKEND') && /NAT/.test(e.message),
    );
  });

  test('publishes BackendType host-gw and the interface MTU', async () => {
    const b = createHostGwBackend(backendContext({ Type: 'host-gw' }), {
      openNetlink: fakeWithExt,
    });
    assert.deepEqual(await b.prepare(), { attrs: { backendType: 'host-gw' }, mtu: 1500 });
  });
});

describe('kernel backend run loop', () => {
  test('the first batch is applied and an earlier run’s stale route is removed', async () => {
    const nl = fakeWithExt();
    await nl.apply([{ op: 'replaceRoute', dst: '10.5.77.0/24', gw: '192.168.1.77', dev: 'eth0' }]);
    const ctx = backendContext({ Type: 'host-gw' });
    const b = createHostGwBackend(ctx, { openNetlink: () => nl });
    await b.prepare();
    await b.start(ownLease());
    const ac = new AbortController();
    const peer = { ...ownLease(), key: 'peer' };
    const hg = {
      ...peer,
      attrs: { ...peer.attrs, backendType: 'host-gw', publicIP: '192.168.1.12' },
    };
    async function* events() {
      yield [
        {
          type: 'added' as const,
          lease: { ...hg, subnet: { family: 4 as const, addr: 0x0a052200n, prefix: 24 } },
        },
      ];
      ac.abort();
    }
    await b.run(events(), ac.signal);
    assert.deepEqual(
      [...nl.routes.values()].filter((r) => r.dst.includes('.')).map((r) => `${r.dst} via ${r.gw}`),
      ['10.5.34.0/24 via 192.168.1.12'],
    );
    const metrics = await ctx.metrics.getMetricsAsJSON();
    const value = (name: string) => metrics.find((m) => m.name === name)?.values[0]?.value;
    assert.equal(value('weft_backend_kernel_ops_total'), 2); // the peer's IPv4 and IPv6 routes
    assert.equal(value('weft_backend_kernel_repairs_total'), 1); // the stale route
    await b.close();
  });

  test('the peer lease event is timed to its programming, and the batch that applied it', async () => {
    const ctx = backendContext({ Type: 'host-gw' });
    const b = createHostGwBackend(ctx, { openNetlink: fakeWithExt });
    await b.prepare();
    await b.start(ownLease());
    const ac = new AbortController();
    const peer = { ...ownLease(), key: 'peer' };
    async function* events() {
      yield [
        {
          type: 'added' as const,
          lease: {
            ...peer,
            attrs: { ...peer.attrs, backendType: 'host-gw', publicIP: '192.168.1.12' },
            subnet: { family: 4 as const, addr: 0x0a052200n, prefix: 24 },
          },
        },
      ];
      ac.abort();
    }
    await b.run(events(), ac.signal);
    const text = await ctx.metrics.metrics();
    const count = (series: string) => {
      const line = text.split('\n').find((l) => l.startsWith(`${series} `));
      assert.ok(line, `${series} missing`);
      return Number(line.split(' ')[1]);
    };
    // one event, programmed in the kernel by one flush; nothing handed to an engine
    assert.equal(count('weft_backend_peer_programmed_seconds_count{target="kernel"}'), 1);
    assert.equal(count('weft_backend_peer_programmed_seconds_count{target="engine"}'), 0);
    assert.equal(count('weft_backend_kernel_apply_duration_seconds_count'), 1);
    await b.close();
  });
});
