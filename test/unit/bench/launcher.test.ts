/** bin/weft: the daemon's V8 heap sizing on its launcher line, and that line works here. */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { launcherNodeFlags } from '../../../bench/launcher.js';

const BIN = fileURLToPath(new URL('../../../bin/weft', import.meta.url));
const DIST = fileURLToPath(new URL('../../../dist/control/main.js', import.meta.url));

test('bin/weft gives node small young-generation semi-spaces on its #! line', () => {
  assert.deepEqual(launcherNodeFlags(BIN), ['--max-semi-space-size=1']);
});

test(
  'bin/weft executed directly starts through `env -S` with those flags',
  { skip: existsSync(DIST) ? false : 'dist/ is not built (npm run build)' },
  () => {
    const r = spawnSync(BIN, ['version'], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /^\d+\.\d+\.\d+/);
  },
);
