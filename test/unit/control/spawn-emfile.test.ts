// Out of fds (EMFILE), every child process weft starts fails as an error of its caller, never as
// an unhandled 'error' event that would crash the daemon (issue 17.5). The child process of
// test/helpers/emfile-child.ts uses up its fds and tries each spawn; this test reads its report.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const CHILD = fileURLToPath(new URL('../../helpers/emfile-child.ts', import.meta.url));

test('out of fds, the CNI delegate, iproute2, TUN helper and testbed spawns fail, naming why', () => {
  const r = spawnSync('prlimit', ['--nofile=256:256', process.execPath, '--import', 'tsx', CHILD], {
    encoding: 'utf8',
    timeout: 60_000,
  });
  assert.equal(r.status, 0, `child crashed: ${r.stderr}`);
  const report = JSON.parse(r.stdout) as Record<string, string>;
  assert.match(report.cni!, /^rejected: .*EMFILE/);
  assert.match(report.iproute2!, /^rejected: ip -json -d link show dev lo: cannot run: EMFILE/);
  assert.match(report.tunHelper!, /^rejected: tun weft-emfile0: helper spawn failed: .*EMFILE/);
  assert.match(report.nsSpawn!, /^rejected: \[weft-emfile-none\] true: cannot start/);
});
