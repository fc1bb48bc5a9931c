/**
 * A crashed daemon always exits (issue 17.4): with the userspace engine running, its worker
 * threads sit in the native packet loop, and Node joins every worker thread on exit, so before
 * the fix an uncaught exception or process.exit() left a process that never ended (healthz dead,
 * fds held, systemd's Restart=on-failure never firing). The daemon here is told to crash after
 * `ready` by a test-only knob (WEFT_TEST_CRASH); it must exit with a non-zero status on its own.
 *
 *   weft-<pid>-N (lo only)
 *   ┌──────────────────────────────────────────────────────────┐
 *   │ weft daemon --iface lo, udp backend, native engine       │
 *   │   flannel0 (TUN) ⇄ worker threads in the C++ loop         │
 *   │   embedded store in a temp dir                           │
 *   └──────────────────────────────────────────────────────────┘
 * No packet is sent anywhere; the test asserts that the process ends, not how fast.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { runWeft, startWeft, stopAll } from '../helpers/daemon.js';
import { orHang } from '../helpers/hang-bound.js';
import { NetnsScope, isRoot } from '../../src/testbed/netns.js';

const skip = isRoot() ? false : 'needs root (network namespaces, a TUN)';

describe('a daemon with a running native engine that crashes exits non-zero', { skip }, () => {
  const scope = new NetnsScope();
  let dir = '';
  before(() => {
    dir = mkdtempSync(join(tmpdir(), 'weft-crash-'));
  });
  after(async () => {
    await stopAll();
    await scope.cleanup();
    rmSync(dir, { recursive: true, force: true });
  });

  for (const [how, code] of [
    ['throw', 1],
    ['reject', 1],
    ['exit', 3],
  ] as const) {
    test(`${how}: ${how === 'exit' ? 'process.exit(3)' : `an ${how === 'throw' ? 'uncaught exception' : 'unhandled rejection'}`} after ready ends the process with ${code}`, async () => {
      const ns = scope.add();
      const store = join(dir, `store-${how}`);
      const conf = join(dir, `conf-${how}.json`);
      writeFileSync(conf, JSON.stringify({ Network: '10.5.0.0/16', Backend: { Type: 'udp' } }));
      assert.equal((await runWeft(['config', 'set', conf, '--store-dir', store])).code, 0);
      const p = startWeft(
        [
          'daemon',
          '--iface',
          'lo',
          '--store-dir',
          store,
          '--subnet-file',
          join(dir, `subnet-${how}.env`),
          '--iptables-forward-rules=false',
        ],
        { netns: ns, env: { WEFT_TEST_CRASH: how } },
      );
      const started = await p.waitForLog((l) => l.msg === 'userspace dataplane started', 30_000);
      assert.equal(started.engine, 'native');
      await p.waitForLog((l) => l.msg === 'ready', 30_000);
      // Bounded only so that a hang fails the test instead of the suite; not a latency check.
      const exited = await orHang(p.exited, 60_000, () => 'still running after 60 s');
      assert.equal(exited, code, p.stderr().slice(-2000));
      if (how !== 'exit') {
        const fatal = p.logs.find((l) => l.msg === 'fatal error; exiting');
        assert.equal(fatal?.level, 'fatal');
        assert.match(String(fatal?.err), /WEFT_TEST_CRASH/);
      }
    });
  }
});
