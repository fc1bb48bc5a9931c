import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, readdir, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  cachePath,
  loadDelegate,
  removeDelegate,
  saveDelegate,
} from '../../../../src/control/cni/cache.js';

let root = '';
before(async () => {
  root = await mkdtemp(join(tmpdir(), 'weft-cni-cache-'));
});
after(async () => {
  await rm(root, { recursive: true, force: true });
});

test('save creates the dir 0700 and the file 0600, and load reads it back', async () => {
  const dir = join(root, 'a', 'flannel');
  await saveDelegate(dir, 'c1', '{"type":"bridge"}');
  assert.equal((await stat(dir)).mode & 0o777, 0o700);
  assert.equal((await stat(cachePath(dir, 'c1'))).mode & 0o777, 0o600);
  assert.equal(await loadDelegate(dir, 'c1'), '{"type":"bridge"}');
});

test('save replaces an earlier entry and leaves no temp file behind', async () => {
  const dir = join(root, 'b');
  await saveDelegate(dir, 'c1', 'old');
  await saveDelegate(dir, 'c1', 'new');
  assert.equal(await loadDelegate(dir, 'c1'), 'new');
  assert.deepEqual(await readdir(dir), ['c1']);
});

test('load of a missing entry (or dir) is null', async () => {
  assert.equal(await loadDelegate(join(root, 'nope'), 'c1'), null);
});

test('remove deletes the entry and a second remove succeeds', async () => {
  const dir = join(root, 'c');
  await saveDelegate(dir, 'c1', 'x');
  await removeDelegate(dir, 'c1');
  assert.equal(await loadDelegate(dir, 'c1'), null);
  await removeDelegate(dir, 'c1');
  assert.equal(await loadDelegate(dir, 'c1'), null);
});
