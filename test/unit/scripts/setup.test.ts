/**
 * scripts/setup.mjs (issue 13 §2): it refuses an old Node in one sentence, splits what the
 * daemon needs from what the tests need, and leaves no service a package ships enabled or
 * started: a policy-rc.d holds starts while apt installs, then systemctl's offline mode
 * disables the units (exercised here on a temp root, no systemd needed).
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import {
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
// @ts-expect-error: a plain .mjs script without types
import * as setup from '../../../scripts/setup.mjs';

const tmp = mkdtempSync(join(tmpdir(), 'weft-setup-'));
after(() => rmSync(tmp, { recursive: true, force: true }));

describe('scripts/setup.mjs', () => {
  test('an old Node gets one sentence naming the version needed and the one found', () => {
    const msg: string = setup.nodeVersionProblem('18.19.0');
    assert.match(msg, /needs Node\.js 20 or newer with npm/);
    assert.match(msg, /this is Node 18\.19\.0/);
    assert.equal(msg.split(/\.\s/).length, 1, 'one sentence');
    assert.equal(setup.nodeVersionProblem('20.0.0'), null);
    assert.equal(setup.nodeVersionProblem('22.11.0'), null);
  });

  test("the daemon's packages and the tests' are apart; the toolchain is the daemon's", () => {
    const daemon: string[] = setup.DAEMON_PACKAGES;
    const tests: string[] = setup.TEST_PACKAGES;
    assert.deepEqual(
      daemon.filter((p) => tests.includes(p)),
      [],
    );
    for (const p of ['g++', 'make', 'python3', 'libmnl-dev', 'libssl-dev', 'iproute2', 'iptables'])
      assert.ok(daemon.includes(p), p);
    for (const p of Object.keys(setup.PACKAGE_SERVICES))
      assert.ok(tests.includes(p), `${p} ships a service: the daemon must not need it`);
    assert.deepEqual(setup.DEBIAN_PACKAGES, [...daemon, ...tests]);
  });

  test('the services named are the ones the installed packages ship', (t) => {
    for (const [pkg, units] of Object.entries(setup.PACKAGE_SERVICES as Record<string, string[]>)) {
      const files = spawnSync('dpkg', ['-L', pkg], { encoding: 'utf8' });
      if (files.status !== 0) {
        t.diagnostic(`${pkg} is not installed here: its unit names are not checked`);
        continue;
      }
      for (const u of units) assert.match(files.stdout, new RegExp(`/systemd/system/${u}$`, 'm'));
    }
  });

  test('a policy-rc.d forbids service starts during the install and is removed after', () => {
    const policy = join(tmp, 'policy-rc.d');
    const seen = setup.withServicesHeld(() => {
      const r = spawnSync(policy, ['etcd', 'start']);
      return { exit: r.status, mode: statSync(policy).mode & 0o777 };
    }, policy);
    assert.deepEqual(seen, { exit: 101, mode: 0o755 });
    assert.equal(existsSync(policy), false);
    assert.throws(() =>
      setup.withServicesHeld(() => {
        throw new Error('apt failed');
      }, policy),
    );
    assert.equal(existsSync(policy), false, 'removed when the install fails too');
  });

  test("an administrator's own policy-rc.d is kept as it is", () => {
    const policy = join(tmp, 'own-policy-rc.d');
    writeFileSync(policy, '#!/bin/sh\nexit 0\n');
    setup.withServicesHeld(() => undefined, policy);
    assert.equal(readFileSync(policy, 'utf8'), '#!/bin/sh\nexit 0\n');
  });

  test('the units of the packages just installed are disabled (systemctl offline, temp root)', (t) => {
    if (spawnSync('systemctl', ['--version']).error) {
      t.skip('no systemctl on this machine: setup has nothing to disable either');
      return;
    }
    const root = join(tmp, 'root');
    const unitDir = join(root, 'lib/systemd/system');
    const wants = join(root, 'etc/systemd/system/multi-user.target.wants');
    mkdirSync(unitDir, { recursive: true });
    mkdirSync(wants, { recursive: true });
    for (const u of ['etcd.service', 'prometheus.service']) {
      writeFileSync(
        join(unitDir, u),
        `[Unit]\nDescription=${u}\n[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\n`,
      );
      symlinkSync(`/lib/systemd/system/${u}`, join(wants, u));
    }
    const disabled: string[] = setup.disableServices(['etcd-server', 'iperf3'], root);
    assert.deepEqual(disabled, ['etcd.service']);
    assert.throws(() => lstatSync(join(wants, 'etcd.service')), /ENOENT/);
    assert.ok(lstatSync(join(wants, 'prometheus.service')).isSymbolicLink(), 'not installed now');
  });
});
