/**
 * bin/weft: glibc's arena limit and the daemon's V8 heap sizing on its launcher line, and that
 * line works here.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { launcherEnv, launcherNodeFlags } from '../../../bench/launcher.js';

const BIN = fileURLToPath(new URL('../../../bin/weft', import.meta.url));
const DIST = fileURLToPath(new URL('../../../dist/control/main.js', import.meta.url));

test('bin/weft gives node small semi-spaces, V8 memory-over-speed and gc() on its #! line', () => {
  assert.deepEqual(launcherNodeFlags(BIN), [
    '--max-semi-space-size=1',
    '--optimize-for-size',
    '--expose-gc',
  ]);
});

test('bin/weft limits glibc to two malloc arenas on its #! line', () => {
  assert.deepEqual(launcherEnv(BIN), { MALLOC_ARENA_MAX: '2' });
});

test(
  'bin/weft executed directly has the arena limit in its environment and the V8 flags',
  { skip: existsSync(DIST) ? false : 'dist/ is not built (npm run build)' },
  () => {
    // NODE_OPTIONS reaches the node that `env -S` starts: a preload prints what it sees.
    const dir = mkdtempSync(join(tmpdir(), 'weft-launcher-'));
    const probe = join(dir, 'probe.cjs');
    writeFileSync(
      probe,
      'process.stderr.write(`arenas=${process.env.MALLOC_ARENA_MAX}\\nargs=${process.execArgv}\\n`);\n',
    );
    let r;
    try {
      r = spawnSync(BIN, ['version'], {
        encoding: 'utf8',
        env: { ...process.env, MALLOC_ARENA_MAX: '', NODE_OPTIONS: `--require=${probe}` },
      });
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stderr, /^arenas=2$/m);
    assert.match(r.stderr, /^args=.*--max-semi-space-size=1,--optimize-for-size,--expose-gc/m);
  },
);

test(
  'bin/weft executed directly starts through `env -S` with those flags',
  { skip: existsSync(DIST) ? false : 'dist/ is not built (npm run build)' },
  () => {
    const r = spawnSync(BIN, ['version'], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /^\d+\.\d+\.\d+/);
  },
);
