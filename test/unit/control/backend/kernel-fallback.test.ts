/**
 * The one kernel → userspace handover (kernel-fallback.ts), with fake kernel and userspace
 * backends: which one runs for each `Dataplane`, what the userspace factory is told, and which
 * kernel errors are a missing module.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { pino } from 'pino';
import { WeftError, isWeftError } from '../../../../src/common/errors.js';
import type { Backend, Handover } from '../../../../src/control/backend/backend.js';
import {
  type DataplaneChoice,
  kernelOrUserspace,
} from '../../../../src/control/backend/kernel-fallback.js';
import { backendContext } from './fixtures.js';

/** A backend whose prepare fails with `fails` (when set); records its calls in `calls`. */
function fake(name: string, calls: string[], fails?: Error): Backend {
  return {
    type: 'vxlan',
    // as the real ones: the kernel backend takes a snapshot in parts, the userspace one not
    ...(name === 'kernel' ? { snapshotParts: true } : {}),
    async prepare() {
      calls.push(`${name} prepare`);
      if (fails) throw fails;
      return { attrs: { backendType: 'vxlan' }, mtu: 1450 };
    },
    start: async () => {},
    run: async () => {},
    close: async () => void calls.push(`${name} close`),
  };
}

function setup(dataplane: DataplaneChoice, kernelFails?: Error) {
  const calls: string[] = [];
  const lines: Record<string, unknown>[] = [];
  const log = pino({}, { write: (l: string) => lines.push(JSON.parse(l)) });
  const handovers: (Handover | undefined)[] = [];
  const b = kernelOrUserspace(backendContext({ Type: 'vxlan' }, { log }), {
    type: 'vxlan',
    userspaceType: 'vxlan-userspace',
    dataplane,
    kernel: () => fake('kernel', calls, kernelFails),
    userspace: (_ctx, h) => {
      handovers.push(h);
      return fake('userspace', calls);
    },
  });
  return { b, calls, lines, handovers };
}

const missing = () =>
  new WeftError('WEFT_ERR_NETLINK', 'link add flannel.1 type vxlan: operation not supported', {
    details: { errno: 'EOPNOTSUPP', missing: 'vxlan module' },
  });

describe('kernelOrUserspace', () => {
  test('auto: a missing module hands over to userspace, told to prefer bpf, kernel closed', async () => {
    const { b, calls, lines, handovers } = setup('auto', missing());
    await b.prepare();
    assert.deepEqual(calls, ['kernel prepare', 'kernel close', 'userspace prepare']);
    assert.deepEqual(handovers, [{ autoPrefers: 'bpf' }]);
    assert.deepEqual(
      lines.map((l) => l.msg),
      ['no kernel vxlan; using the userspace dataplane'],
    );
  });

  test('auto: the snapshot is taken in parts as the backend that runs takes it', async () => {
    const kernel = setup('auto');
    await kernel.b.prepare();
    assert.equal(kernel.b.snapshotParts, true);
    const handedOver = setup('auto', missing());
    await handedOver.b.prepare();
    assert.equal(handedOver.b.snapshotParts, false);
  });

  test('auto: a kernel error without the missing-module mark is thrown, no handover', async () => {
    // the same errno, unmarked: only the kernel backend decides what a missing module looks like
    const err = new WeftError('WEFT_ERR_NETLINK', 'operation not supported', {
      details: { errno: 'EOPNOTSUPP' },
    });
    const { b, calls, handovers } = setup('auto', err);
    await assert.rejects(b.prepare(), (e: unknown) => e === err);
    assert.deepEqual(calls, ['kernel prepare']);
    assert.deepEqual(handovers, []);
  });

  test('userspace: the userspace backend at once, with no handover hint', async () => {
    const { b, calls, handovers } = setup('userspace');
    await b.prepare();
    assert.deepEqual(calls, ['userspace prepare']);
    assert.deepEqual(handovers, [undefined]);
  });

  test('kernel: the kernel backend, its missing module thrown as it is', async () => {
    const { b, calls } = setup('kernel', missing());
    await assert.rejects(b.prepare(), /operation not supported/);
    assert.deepEqual(calls, ['kernel prepare']);
  });

  test('userspace without a registered userspace backend names it', () => {
    assert.throws(
      () =>
        kernelOrUserspace(backendContext({ Type: 'ipip' }), {
          type: 'ipip',
          userspaceType: 'ipip-userspace',
          dataplane: 'userspace',
          kernel: () => assert.fail('no kernel backend'),
          userspace: null,
        }),
      (e: unknown) =>
        isWeftError(e, 'WEFT_ERR_BACKEND_UNSUPPORTED') &&
        e.message ===
          'Backend.Dataplane: "userspace" needs the ipip-userspace backend, which is not available in this build',
    );
  });
});
