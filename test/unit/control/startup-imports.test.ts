/**
 * Each command loads only the npm packages it needs (issue 13 §1): the kubeconfig parser only
 * in kube mode (the Kubernetes client library, ~60 MB, is no longer used at all; etcd is spoken
 * to by weft's own HTTP client, no package), the packet engine's worker pool only when a
 * userspace backend starts. Read from the module graph of the
 * real command (a resolve hook lists every package loaded), not timed: `npm run bench:footprint`
 * measures the time and memory this saves.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { after, describe, test } from 'node:test';

const REPO = resolve(import.meta.dirname, '../../..');
const HEAVY = ['js-yaml', 'piscina'];

const tmp = mkdtempSync(join(tmpdir(), 'weft-imports-'));
after(() => rmSync(tmp, { recursive: true, force: true }));
let runs = 0;

/** Runs `weft <argv>` from source; returns the packages it loaded and its exit status. */
function packagesLoaded(argv: string[], env: Record<string, string> = {}, input = '') {
  const trace = join(tmp, `trace-${++runs}`);
  const script = `import(${JSON.stringify(join(REPO, 'src/control/main.ts'))}).then(async (m) => {
    process.exitCode = await m.main(${JSON.stringify(argv)}, { stdout: process.stdout, env: process.env });
  })`;
  const r = spawnSync(
    process.execPath,
    [
      '--import',
      'tsx',
      '--import',
      join(REPO, 'test/helpers/import-trace.mjs'),
      '--input-type=module',
      '-e',
      script,
    ],
    {
      cwd: REPO,
      encoding: 'utf8',
      input,
      env: { ...process.env, ...env, WEFT_IMPORT_TRACE: trace },
    },
  );
  const loaded = existsSync(trace) ? readFileSync(trace, 'utf8').split('\n').filter(Boolean) : [];
  return { status: r.status, stdout: r.stdout, stderr: r.stderr, loaded: new Set(loaded) };
}

describe('startup imports', () => {
  test('the trace sees a package the command loads (the probe works)', () => {
    const r = packagesLoaded(['daemon', '--help']);
    assert.equal(r.status, 0, r.stderr);
    assert.ok(r.loaded.has('pino'), `loaded: ${[...r.loaded].join(', ')}`);
  });

  test('`weft version` loads no npm package at all', () => {
    const r = packagesLoaded(['version']);
    assert.equal(r.status, 0, r.stderr);
    assert.deepEqual([...r.loaded], []);
  });

  test('`weft daemon` (its whole static graph) loads no kubeconfig parser or worker pool', () => {
    const r = packagesLoaded(['daemon', '--help']);
    assert.equal(r.status, 0, r.stderr);
    for (const p of HEAVY) assert.ok(!r.loaded.has(p), `${p} loaded`);
  });

  test('`weft leases` on the embedded store loads no kubeconfig parser or worker pool', () => {
    const store = join(tmp, 'store');
    const r = packagesLoaded(['leases', `--store-dir=${store}`]);
    for (const p of HEAVY) assert.ok(!r.loaded.has(p), `${p} loaded`);
  });

  test('`weft cni` loads no store client and no worker pool', () => {
    const r = packagesLoaded(['cni'], { CNI_COMMAND: 'VERSION' }, '{"cniVersion":"1.0.0"}');
    assert.equal(r.status, 0, r.stdout + r.stderr);
    assert.match(r.stdout, /supportedVersions/);
    for (const p of HEAVY) assert.ok(!r.loaded.has(p), `${p} loaded`);
  });
});
