// The native exit watchdog (the last resort of a crashing daemon, src/dataplane/native-engine.ts):
// armed in a process that then never ends by itself, a native thread ends it with the given code.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { test } from 'node:test';
import { nativeAddonPath } from '../../src/common/native.js';

test('exitWatchdog ends a process stuck in a blocked main thread with the code given', async () => {
  // The child blocks its only JS thread for good (Atomics.wait with no timeout): no timer, no
  // exit handler can run, as in a process that is joining a worker stuck in a native loop.
  const script = `
    const native = require(${JSON.stringify(nativeAddonPath())});
    native.exitWatchdog(50, 7);
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0);
  `;
  const child = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  // Bounded so that a hang fails the test instead of the suite; not a latency check.
  const timer = setTimeout(() => child.kill('SIGKILL'), 30_000);
  const [code, signal] = await new Promise<[number | null, string | null]>((resolve) =>
    child.on('exit', (c, s) => resolve([c, s])),
  );
  clearTimeout(timer);
  assert.deepEqual([code, signal], [7, null], stderr);
});
