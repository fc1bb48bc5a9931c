/**
 * The dataplane's engine choice (choose-engine.ts), with fakes for its effects: the addon probe
 * (a function that throws or not) and the engine starters (each records that it ran). Each test
 * is one row of the decision table.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { pino } from 'pino';
import { WeftError, isWeftError } from '../../../src/common/errors.js';
import {
  type EngineStarters,
  chooseEngine,
  startChosen,
} from '../../../src/dataplane/choose-engine.js';
import type {
  Dataplane,
  DataplaneEngine,
  DataplaneFormat,
  DataplaneOptions,
} from '../../../src/dataplane/engine.js';

const addonLoads = { probeAddon: () => undefined };
const noAddon = {
  probeAddon: () => {
    throw new Error('weft.node: cannot open shared object file');
  },
};

describe('chooseEngine', () => {
  test('auto is the native engine, the addon probed', () => {
    let probed = 0;
    const engine = chooseEngine(
      { requested: 'auto', format: 'udp', who: 'udp' },
      { probeAddon: () => void probed++ },
    );
    assert.equal(engine, 'native');
    assert.equal(probed, 1);
  });

  test('auto with the bpf hint (a kernel backend handed over) is the bpf engine', () => {
    assert.equal(
      chooseEngine(
        { requested: 'auto', format: 'vxlan', who: 'vxlan', autoPrefers: 'bpf' },
        addonLoads,
      ),
      'bpf',
    );
  });

  test('auto with the bpf hint is the bpf engine for IPIP too (ipip without its module)', () => {
    assert.equal(
      chooseEngine(
        { requested: 'auto', format: 'ipip', who: 'ipip', autoPrefers: 'bpf' },
        addonLoads,
      ),
      'bpf',
    );
  });

  test('bpf asked for by name for IPIP is the bpf engine (it was native before IPIP framing)', () => {
    assert.equal(
      chooseEngine({ requested: 'bpf', format: 'ipip', who: 'ipip' }, addonLoads),
      'bpf',
    );
  });

  test('an engine asked for by name is that engine, whatever the hint', () => {
    for (const requested of ['native', 'bpf', 'js'] as const) {
      assert.equal(
        chooseEngine({ requested, format: 'vxlan', who: 'vxlan', autoPrefers: 'bpf' }, addonLoads),
        requested,
      );
    }
  });

  test('native, bpf and auto without the addon are refused, naming the js engine as the way out', () => {
    for (const requested of ['native', 'bpf', 'auto'] as const) {
      assert.throws(
        () => chooseEngine({ requested, format: 'udp', who: 'udp' }, noAddon),
        (err: unknown) =>
          isWeftError(err, 'WEFT_ERR_NATIVE_UNAVAILABLE') &&
          err.message.includes('udp: the native dataplane engine cannot run (weft.node:') &&
          err.message.includes('--dataplane-engine=js'),
        requested,
      );
    }
  });

  test('js needs no addon (it is not probed)', () => {
    const engine = chooseEngine(
      { requested: 'js', format: 'udp', who: 'udp' },
      {
        probeAddon: () => assert.fail('the js engine must not probe the addon'),
      },
    );
    assert.equal(engine, 'js');
  });

  test('js is refused for IPIP (Node has no raw sockets), before the addon is probed', () => {
    assert.throws(
      () =>
        chooseEngine(
          { requested: 'js', format: 'ipip', who: 'ipip' },
          { probeAddon: () => assert.fail('not probed') },
        ),
      (err: unknown) =>
        isWeftError(err, 'WEFT_ERR_BACKEND_UNSUPPORTED') &&
        err.message ===
          'ipip: --dataplane-engine=js cannot send IPIP (Node has no raw sockets); use native',
    );
  });
});

/** Starters that record which engine started, the bpf one failing with `bpfFails` when set. */
function fakeStarters(bpfFails?: Error) {
  const calls: string[] = [];
  const start =
    (name: DataplaneEngine) =>
    async (o: DataplaneOptions): Promise<Dataplane> => {
      calls.push(`start ${name} (asked ${o.engine})`);
      if (name === 'bpf' && bpfFails) throw bpfFails;
      return { engine: name, tunName: o.tunName } as unknown as Dataplane;
    };
  const starters: EngineStarters = {
    native: start('native'),
    bpf: start('bpf'),
    js: start('js'),
    removeBpfPins: (tun) => void calls.push(`remove pins ${tun}`),
  };
  return { calls, starters };
}

function capture() {
  const lines: Record<string, unknown>[] = [];
  const log = pino({}, { write: (l: string) => lines.push(JSON.parse(l)) });
  return { lines, log };
}

function options(engine: DataplaneEngine, format: DataplaneFormat, log: pino.Logger) {
  return { engine, format, tunName: 'flannel.1', log } as unknown as DataplaneOptions;
}

describe('startChosen', () => {
  test('bpf runs when its programs load', async () => {
    const { calls, starters } = fakeStarters();
    const { lines, log } = capture();
    const dp = await startChosen(options('bpf', 'vxlan', log), starters);
    assert.equal(dp.engine, 'bpf');
    assert.deepEqual(calls, ['start bpf (asked bpf)']);
    assert.deepEqual(lines, []);
  });

  test('bpf refused by a host check: native runs, pins removed, one warn line with the reason', async () => {
    const { calls, starters } = fakeStarters(
      new WeftError('WEFT_ERR_BPF_UNAVAILABLE', 'bpf engine unavailable (attach: EPERM)'),
    );
    const { lines, log } = capture();
    const dp = await startChosen(options('bpf', 'vxlan', log), starters);
    assert.equal(dp.engine, 'native');
    assert.deepEqual(calls, [
      'start bpf (asked bpf)',
      'remove pins flannel.1',
      'start native (asked native)',
    ]);
    assert.equal(lines.length, 1);
    assert.equal(lines[0]!.msg, 'bpf engine unavailable; the native engine runs instead');
    assert.equal(lines[0]!.err, 'bpf engine unavailable (attach: EPERM)');
    assert.equal(lines[0]!.code, 'WEFT_ERR_BPF_UNAVAILABLE');
  });

  test('bpf failing otherwise is not hidden by the fallback', async () => {
    const { calls, starters } = fakeStarters(new Error('peer table refused'));
    const { log } = capture();
    await assert.rejects(startChosen(options('bpf', 'udp', log), starters), /peer table refused/);
    assert.deepEqual(calls, ['start bpf (asked bpf)']);
  });

  test('bpf asked for IPIP: the bpf engine starts', async () => {
    const { calls, starters } = fakeStarters();
    const { lines, log } = capture();
    const dp = await startChosen(options('bpf', 'ipip', log), starters);
    assert.equal(dp.engine, 'bpf');
    assert.deepEqual(calls, ['start bpf (asked bpf)']);
    assert.deepEqual(lines, []);
  });

  test('bpf for IPIP refused by a host check: native runs, one warn line with the reason', async () => {
    const { calls, starters } = fakeStarters(
      new WeftError('WEFT_ERR_BPF_UNAVAILABLE', 'bpf engine unavailable (load: EPERM)'),
    );
    const { lines, log } = capture();
    const dp = await startChosen(options('bpf', 'ipip', log), starters);
    assert.equal(dp.engine, 'native');
    assert.deepEqual(calls, [
      'start bpf (asked bpf)',
      'remove pins flannel.1',
      'start native (asked native)',
    ]);
    assert.equal(lines.length, 1);
    assert.equal(lines[0]!.err, 'bpf engine unavailable (load: EPERM)');
  });

  test('native and js first remove what a bpf engine left pinned on the TUN', async () => {
    for (const engine of ['native', 'js'] as const) {
      const { calls, starters } = fakeStarters();
      const { log } = capture();
      const dp = await startChosen(options(engine, 'udp', log), starters);
      assert.equal(dp.engine, engine);
      assert.deepEqual(calls, ['remove pins flannel.1', `start ${engine} (asked ${engine})`]);
    }
  });
});
