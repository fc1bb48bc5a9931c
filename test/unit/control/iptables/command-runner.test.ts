/**
 * A command that cannot be started (EMFILE under fd pressure, a missing binary) is an ordinary
 * failure: the runner rejects, the process survives, and the iptables keeper retries it on the
 * next resync (#17.5).
 */
import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import { describe, test } from 'node:test';
import { parseCIDR } from '../../../../src/common/ip.js';
import { logger } from '../../../../src/common/log.js';
import {
  type CommandRunner,
  IptablesKeeper,
  type SpawnFn,
  commandRunner,
  isResourceShortage,
} from '../../../../src/control/iptables/iptables.js';
import { forwardRules } from '../../../../src/control/iptables/rules.js';

const log = logger('test');
log.level = 'silent';

function errnoError(code: string): NodeJS.ErrnoException {
  return Object.assign(new Error(`spawn ${code}`), { code, errno: -24, syscall: 'spawn' });
}

/** A spawn that returns a child with no stdio whose 'error' fires on the next tick, as node's. */
const failingSpawn =
  (code: string): SpawnFn =>
  () => {
    const child = new EventEmitter() as EventEmitter & {
      stdin: null;
      stdout: null;
      stderr: null;
    };
    child.stdin = null;
    child.stdout = null;
    child.stderr = null;
    process.nextTick(() => child.emit('error', errnoError(code)));
    return child as unknown as ReturnType<SpawnFn>;
  };

describe('commandRunner', () => {
  test('a spawn whose child reports EMFILE rejects (no crash), naming the command', async () => {
    const run = commandRunner(failingSpawn('EMFILE'));
    await assert.rejects(run('iptables-save', ['-t', 'nat']), (e: unknown) => {
      assert.match((e as Error).message, /iptables-save: cannot run: spawn EMFILE/);
      assert.equal(isResourceShortage(e), true);
      return true;
    });
  });

  test('a spawn that throws at once rejects', async () => {
    const run = commandRunner(() => {
      throw errnoError('EAGAIN');
    });
    await assert.rejects(run('iptables-restore', [], 'x'), (e: unknown) => isResourceShortage(e));
  });

  test('a missing binary rejects with ENOENT (real spawn), not a resource shortage', async () => {
    const run = commandRunner();
    await assert.rejects(run('weft-no-such-binary-xyz', []), (e: unknown) => {
      assert.match((e as Error).message, /ENOENT/);
      assert.equal(isResourceShortage(e), false);
      return true;
    });
  });

  test('a real command still returns its stdout and feeds its stdin', async () => {
    assert.equal(await commandRunner()('cat', [], 'hello'), 'hello');
  });
});

describe('IptablesKeeper with a spawn that fails', () => {
  const want = [{ family: 4 as const, chains: [forwardRules(parseCIDR('10.5.0.0/16')!)] }];

  /** Fails the first `failures` calls with EMFILE, then answers like an empty ruleset. */
  function flakyRunner(failures: number): { run: CommandRunner; calls: string[] } {
    const calls: string[] = [];
    const broken = commandRunner(failingSpawn('EMFILE'));
    return {
      calls,
      run: async (cmd, args, input) => {
        calls.push(cmd);
        if (calls.length <= failures) return broken(cmd, args, input);
        return cmd.endsWith('-save') ? '*filter\nCOMMIT\n' : '';
      },
    };
  }

  test('EMFILE at start is logged and retried on the next resync, then the rules go in', async () => {
    const { run, calls } = flakyRunner(1);
    const k = new IptablesKeeper(want, { run, log });
    const ac = new AbortController();
    const done = k.run(0.001, ac.signal);
    while (k.applied === 0) await new Promise((r) => setImmediate(r));
    ac.abort();
    await done;
    assert.deepEqual(calls.slice(0, 3), ['iptables-save', 'iptables-save', 'iptables-restore']);
  });

  test('EMFILE during a resync does not end the loop', async () => {
    const calls: string[] = [];
    let n = 0;
    const broken = commandRunner(failingSpawn('EMFILE'));
    const run: CommandRunner = async (cmd, args, input) => {
      calls.push(cmd);
      n++;
      // 1st ensure: save + restore work; 2nd: save fails; 3rd: works again (rules missing).
      if (n === 3) return broken(cmd, args, input);
      return cmd.endsWith('-save') ? '*filter\nCOMMIT\n' : '';
    };
    const k = new IptablesKeeper(want, { run, log });
    const ac = new AbortController();
    const done = k.run(0.001, ac.signal);
    while (k.applied < 2) await new Promise((r) => setImmediate(r));
    ac.abort();
    await done;
    assert.deepEqual(calls.slice(0, 5), [
      'iptables-save',
      'iptables-restore',
      'iptables-save',
      'iptables-save',
      'iptables-restore',
    ]);
  });

  test('any other failure at start is still fatal', async () => {
    const k = new IptablesKeeper(want, {
      run: async () => {
        throw new Error('iptables-save: permission denied');
      },
      log,
    });
    await assert.rejects(k.run(1, new AbortController().signal), /permission denied/);
  });
});
