/**
 * The bpf engine's pin directories on a bpffs someone else can write to (src/dataplane/bpf-pins.ts,
 * native/src/bpf_loader.cc UnpinBpfDir / AdoptPin). A bpffs mounted without `mode=` is 1777, as
 * the private one here (src/testbed/bpffs.ts: its own mount namespace, seen by nothing on the
 * host, gone with the test):
 *
 *   <bpffs>/                    1777, as a host's /sys/fs/bpf without mode=
 *   <bpffs>/weft/               the pin root: pre-created hostile (0777, another owner, symlink)
 *   <bpffs>/weft/<tun>-<ino>/   weft's pin directory: tx, rx, bridge only
 *   <bpffs>/foreign             another tool's pinned object (a map), never touched
 *
 * No device or program is attached: only pins, directories and one map.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import {
  chmodSync,
  chownSync,
  existsSync,
  lstatSync,
  mkdirSync,
  readdirSync,
  rmSync,
  symlinkSync,
} from 'node:fs';
import { join } from 'node:path';
import { after, afterEach, before, describe, test } from 'node:test';
import { loadNative } from '../../src/common/native.js';
import {
  PIN_DIR_ENV,
  bpfPinDir,
  preparePinDir,
  removeBpfPins,
} from '../../src/dataplane/bpf-pins.js';
import { PrivateBpffs } from '../../src/testbed/bpffs.js';
import { isRoot } from '../../src/testbed/netns.js';

const skip = isRoot() ? false : 'needs root (a private bpffs, bpf objects)';
const TUN = 'flannel.1';

describe('bpf pin directories a stranger could have made', { skip }, () => {
  let fs: PrivateBpffs;
  /** The pin root and the foreign pin, as this process reaches them. */
  let root: string;
  let foreign: string;
  before(async () => {
    fs = await PrivateBpffs.inTempDir();
    root = fs.view(join(fs.dir, 'weft'));
    foreign = fs.view(join(fs.dir, 'foreign'));
    execFileSync('bpftool', [
      'map',
      'create',
      foreign,
      'type',
      'array',
      'key',
      '4',
      'value',
      '4',
      'entries',
      '1',
      'name',
      'foreign',
    ]);
    process.env[PIN_DIR_ENV] = root;
  });
  afterEach(() => rmSync(root, { recursive: true, force: true }));
  after(async () => {
    delete process.env[PIN_DIR_ENV];
    await fs.close();
  });

  const foreignIntact = () => assert.equal(loadNative().bpfPinInfo(foreign)?.kind, 'map');

  test('a fresh pin root and directory are created root-owned, mode 0700', () => {
    const got = preparePinDir(TUN);
    assert.ok('dir' in got, JSON.stringify(got));
    assert.equal(got.dir, bpfPinDir(TUN));
    for (const d of [root, got.dir]) {
      const st = lstatSync(d);
      assert.equal(st.uid, 0, d);
      assert.equal(st.mode & 0o077, 0, `${d}: mode ${(st.mode & 0o777).toString(8)}`);
    }
  });

  test('a pin root writable by others is refused: nothing is pinned there', () => {
    mkdirSync(root);
    chmodSync(root, 0o777);
    const got = preparePinDir(TUN);
    assert.ok('why' in got && /writable by others/.test(got.why), JSON.stringify(got));
    assert.deepEqual(readdirSync(root), [], 'no pin directory made inside it');
  });

  test('a pin root owned by another user is refused', () => {
    mkdirSync(root, { mode: 0o755 });
    chownSync(root, 65534, 65534);
    const got = preparePinDir(TUN);
    assert.ok('why' in got && /not root/.test(got.why), JSON.stringify(got));
  });

  test('a pin root or pin directory that is a symlink is refused', () => {
    const elsewhere = fs.view(join(fs.dir, 'elsewhere'));
    mkdirSync(elsewhere, { mode: 0o700 });
    try {
      symlinkSync(elsewhere, root);
      let got = preparePinDir(TUN);
      assert.ok('why' in got && /symlink/.test(got.why), JSON.stringify(got));
      rmSync(root);
      mkdirSync(root, { mode: 0o700 });
      symlinkSync(elsewhere, bpfPinDir(TUN)!);
      got = preparePinDir(TUN);
      assert.ok('why' in got && /symlink/.test(got.why), JSON.stringify(got));
      assert.equal(removeBpfPins(TUN), 0, 'nothing removed through it');
      assert.ok(existsSync(elsewhere));
    } finally {
      rmSync(elsewhere, { recursive: true, force: true });
    }
  });

  test('removal takes tx, rx and bridge only: a symlink named tx is not followed, other entries stay', () => {
    const got = preparePinDir(TUN);
    assert.ok('dir' in got, JSON.stringify(got));
    symlinkSync(foreign, join(got.dir, 'tx'));
    mkdirSync(join(got.dir, 'other'));
    assert.equal(removeBpfPins(TUN), 1, 'the symlink itself went');
    foreignIntact();
    assert.deepEqual(readdirSync(got.dir), ['other'], 'the rest stays, and so does the directory');
  });

  test('a pin directory writable by others is never emptied', () => {
    const got = preparePinDir(TUN);
    assert.ok('dir' in got, JSON.stringify(got));
    symlinkSync(foreign, join(got.dir, 'rx'));
    chmodSync(got.dir, 0o777);
    assert.equal(removeBpfPins(TUN), 0);
    assert.deepEqual(readdirSync(got.dir), ['rx']);
    assert.throws(() => loadNative().bpfUnpin(got.dir), /writable by group or others/);
    foreignIntact();
  });
});
