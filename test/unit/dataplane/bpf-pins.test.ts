/**
 * Where the bpf engine pins its links (src/dataplane/bpf-pins.ts): the directory name per TUN and
 * namespace, the off switch, and nothing created where there is no bpffs.
 */
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, test } from 'node:test';
import {
  DEFAULT_PIN_ROOT,
  PIN_DIR_ENV,
  bpfPinDir,
  pinDirName,
  preparePinDir,
  removeBpfPins,
} from '../../../src/dataplane/bpf-pins.js';

const saved = process.env[PIN_DIR_ENV];
afterEach(() => {
  if (saved === undefined) delete process.env[PIN_DIR_ENV];
  else process.env[PIN_DIR_ENV] = saved;
});

test('one directory per TUN and namespace; dots (refused by bpffs) become underscores', () => {
  assert.equal(pinDirName('flannel.1', 4026531840), 'flannel_1-4026531840');
  assert.equal(pinDirName('flannel0', 7), 'flannel0-7');
  delete process.env[PIN_DIR_ENV];
  const ino = statSync('/proc/self/ns/net').ino;
  assert.equal(bpfPinDir('flannel.1'), join(DEFAULT_PIN_ROOT, `flannel_1-${ino}`));
  process.env[PIN_DIR_ENV] = '/x/y';
  assert.equal(bpfPinDir('flannel0'), `/x/y/flannel0-${ino}`);
});

test('off: no directory, and the reason names the switch', () => {
  for (const off of ['off', '']) {
    process.env[PIN_DIR_ENV] = off;
    assert.equal(bpfPinDir('flannel0'), null);
    assert.deepEqual(preparePinDir('flannel0'), { why: `${PIN_DIR_ENV}=off` });
    assert.equal(removeBpfPins('flannel0'), 0);
  }
});

test('no bpffs at the root: nothing is created, and the reason says so', () => {
  const tmp = mkdtempSync(join(tmpdir(), 'weft-pins-'));
  try {
    process.env[PIN_DIR_ENV] = join(tmp, 'weft');
    const got = preparePinDir('flannel0');
    assert.ok('why' in got, JSON.stringify(got));
    assert.match(got.why, new RegExp(`^${tmp} is not on a bpffs`));
    assert.equal(existsSync(join(tmp, 'weft')), false);
    assert.equal(removeBpfPins('flannel0'), 0, 'nothing there to remove');
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
});
