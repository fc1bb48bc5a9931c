/**
 * Child process for the embedded store's multi-process tests (run with `node --import tsx`).
 *   race <dir> <id> <rounds> <barrierDir> [lapsed]
 *       create key i in lockstep with the other child; print one JSON line: the rounds this child
 *       won. With `lapsed`, child a first writes key i as an already expired lease, so both race
 *       to replace it.
 *   hold-lock <dir>                          take the store lock, print "locked", never release
 */
import { existsSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { isWeftError } from '../../src/common/errors.js';
import { sleep } from '../../src/common/lifecycle.js';
import { acquireDirLock } from '../../src/control/registry/dir-lock.js';
import { EmbeddedRegistry } from '../../src/control/registry/embedded.js';

const [mode, dir, ...rest] = process.argv.slice(2);
if (!dir) throw new Error('usage: embedded-child <race|hold-lock> <dir> ...');

if (mode === 'race') {
  const [id, roundsText, barrier, lapsed] = rest as [string, string, string, string?];
  const other = id === 'a' ? 'b' : 'a';
  const registry = new EmbeddedRegistry(dir);
  const won: number[] = [];
  for (let i = 0; i < Number(roundsText); i++) {
    if (lapsed === 'lapsed' && id === 'a') {
      writeFileSync(
        join(dir, 'subnets', `10.5.${i}.0-24`),
        '{"revision":0,"expiration":1}\n{"PublicIP":"gone"}',
      );
    }
    writeFileSync(join(barrier, `${i}-${id}`), '');
    while (!existsSync(join(barrier, `${i}-${other}`))) await sleep(1);
    try {
      await registry.createSubnet(`10.5.${i}.0-24`, `{"PublicIP":"child-${id}"}`, 60_000);
      won.push(i);
    } catch (err) {
      if (!isWeftError(err, 'WEFT_ERR_STORE_KEY_EXISTS')) throw err;
    }
  }
  await registry.close();
  process.stdout.write(`${JSON.stringify({ id, won })}\n`);
} else if (mode === 'hold-lock') {
  await acquireDirLock(join(dir, 'lock'), { tmpDir: join(dir, 'tmp') });
  process.stdout.write('locked\n');
  setInterval(() => {}, 1 << 30);
} else {
  throw new Error(`unknown mode ${mode}`);
}
