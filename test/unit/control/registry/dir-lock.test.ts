import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { sleep } from '../../../../src/common/lifecycle.js';
import {
  acquireDirLock,
  lockHolder,
  ownerAlive,
  processStartTime,
} from '../../../../src/control/registry/dir-lock.js';

const root = mkdtempSync(join(tmpdir(), 'weft-dirlock-'));
after(() => rmSync(root, { recursive: true, force: true }));
let n = 0;

function paths() {
  const base = join(root, String(++n));
  mkdirSync(join(base, 'tmp'), { recursive: true });
  return { lockDir: join(base, 'lock'), tmpDir: join(base, 'tmp') };
}

describe('acquireDirLock', () => {
  it('lets one holder in at a time among concurrent acquirers', async () => {
    const { lockDir, tmpDir } = paths();
    let inside = 0;
    let maxInside = 0;
    let entries = 0;
    await Promise.all(
      Array.from({ length: 6 }, async () => {
        for (let i = 0; i < 10; i++) {
          const lock = await acquireDirLock(lockDir, { tmpDir });
          inside++;
          entries++;
          maxInside = Math.max(maxInside, inside);
          await sleep(1);
          inside--;
          await lock.release();
        }
      }),
    );
    assert.equal(entries, 60);
    assert.equal(maxInside, 1);
  });

  it('keeps the generation files pruned to the newest few', async () => {
    const { lockDir, tmpDir } = paths();
    for (let i = 0; i < 20; i++) await (await acquireDirLock(lockDir, { tmpDir })).release();
    assert.ok(readdirSync(lockDir).length <= 4, readdirSync(lockDir).join(' '));
    assert.deepEqual(readdirSync(tmpDir), []);
  });

  it('reports the live holder, and nobody once released', async () => {
    const { lockDir, tmpDir } = paths();
    const lock = await acquireDirLock(lockDir, { tmpDir });
    assert.equal((await lockHolder(lockDir))?.pid, process.pid);
    await lock.release();
    assert.equal(await lockHolder(lockDir), null);
  });

  it('takes over a generation whose owner is dead and says so', async () => {
    const { lockDir, tmpDir } = paths();
    mkdirSync(lockDir);
    const dead = { pid: 2 ** 22 + 1, start: 7, nonce: 'x' };
    writeFileSync(join(lockDir, 'gen.5'), JSON.stringify(dead));
    const broken: unknown[] = [];
    const lock = await acquireDirLock(lockDir, { tmpDir, onBreak: (o) => broken.push(o) });
    assert.equal(lock.generation, 6);
    assert.deepEqual(broken, [dead]);
    await lock.release();
  });

  it('rejects with WEFT_ERR_ABORTED when the signal fires while waiting', async () => {
    const { lockDir, tmpDir } = paths();
    const held = await acquireDirLock(lockDir, { tmpDir });
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 50);
    await assert.rejects(acquireDirLock(lockDir, { tmpDir, signal: ac.signal }), {
      code: 'WEFT_ERR_ABORTED',
    });
    await held.release();
  });
});

describe('process identity', () => {
  it('reads our own start time and sees us alive, a recycled pid dead', () => {
    const start = processStartTime(process.pid);
    assert.ok(start !== null && start > 0);
    assert.equal(ownerAlive({ pid: process.pid, start, nonce: '' }), true);
    assert.equal(ownerAlive({ pid: process.pid, start: start + 1, nonce: '' }), false);
    assert.equal(ownerAlive({ pid: 2 ** 22 + 1, start: 0, nonce: '' }), false);
  });
});
