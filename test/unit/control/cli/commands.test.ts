/**
 * The CLI's answers to mistakes and failures (issue 13 §3), run as a user runs them: `weft`
 * as a child process (bin/weft under `npm test`, which has just built dist/; else the sources
 * through tsx: src/testbed/cluster.ts launchArgv), against an embedded store in a
 * temp dir. Usage and config mistakes exit 2 naming the file, flag or field; runtime failures
 * exit 1; both say it plainly on stderr (besides the JSON log line). Read-only commands create
 * nothing. No root, no network.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { after, describe, test } from 'node:test';
import { DEFAULT_BACKEND_OPTIONS } from '../../../../src/control/backend/backend.js';
import { checkBackendConfig, backendFactory } from '../../../../src/control/backend/registry.js';
import { parseNetConfig } from '../../../../src/control/config/net-config.js';
import { logger } from '../../../../src/common/log.js';
import { Registry as PromRegistry } from '../../../../src/common/metrics.js';
import { launchArgv } from '../../../../src/testbed/cluster.js';

const REPO = resolve(import.meta.dirname, '../../../..');
const tmp = mkdtempSync(join(tmpdir(), 'weft-cli-'));
after(() => rmSync(tmp, { recursive: true, force: true }));

function weft(...argv: string[]) {
  const r = spawnSync(process.execPath, [...launchArgv('weft'), ...argv], {
    cwd: REPO,
    encoding: 'utf8',
    env: { ...process.env, WEFT_LOG_LEVEL: 'error' },
  });
  /** stderr without the JSON log lines: what a person reads. */
  const plain = r.stderr
    .split('\n')
    .filter((l) => l && !l.startsWith('{'))
    .join('\n');
  return { status: r.status, stdout: r.stdout, stderr: r.stderr, plain };
}

/** Every path under `dir` (relative), to show a command created nothing. */
function tree(dir: string): string[] {
  if (!existsSync(dir)) return [];
  return readdirSync(dir, { recursive: true, encoding: 'utf8' }).sort();
}

const BAD_BACKENDS: Array<[string, object, RegExp]> = [
  ['an unknown backend type', { Type: 'vxlann' }, /Backend\.Type: unknown backend "vxlann"/],
  ['a VNI out of range', { Type: 'vxlan', VNI: 99999999 }, /Backend\.VNI: must be an integer/],
  ['a udp Port that is not a port', { Type: 'udp', Port: 'x' }, /Backend\.Port/],
];

describe('weft CLI errors', () => {
  test('`weft` with no arguments prints the usage and exits 2', () => {
    const r = weft();
    assert.equal(r.status, 2);
    assert.match(r.stderr, /^usage: weft <command> \[flags\]$/m);
    assert.match(r.stderr, /^ {2}daemon /m);
    assert.doesNotMatch(r.stderr, /missing command/);
  });

  test('`config set missing.json` exits 2 naming the file, without a stack', () => {
    const store = join(tmp, 'store-missing-file');
    const r = weft('config', 'set', join(tmp, 'missing.json'), `--store-dir=${store}`);
    assert.equal(r.status, 2, r.stderr);
    assert.match(r.plain, /cannot read .*missing\.json: no such file/);
    assert.doesNotMatch(r.stderr, /\bat .*\.ts:\d+/, 'no stack trace');
    assert.deepEqual(tree(store), [], 'nothing created');
  });

  for (const [what, backend, message] of BAD_BACKENDS) {
    test(`\`config set\` refuses ${what} as the daemon does, and stores nothing`, () => {
      const text = JSON.stringify({ Network: '10.5.0.0/16', Backend: backend });
      const file = join(tmp, `bad-${what.replace(/\W+/g, '-')}.json`);
      writeFileSync(file, text);
      const store = join(tmp, `store-${what.replace(/\W+/g, '-')}`);
      const r = weft('config', 'set', file, `--store-dir=${store}`);
      assert.equal(r.status, 2, r.stderr);
      assert.match(r.plain, message);
      assert.equal(existsSync(join(store, 'config')), false, 'no config stored');
      // the daemon's factory refuses the same block with the same words
      const cfg = parseNetConfig(text);
      assert.throws(() => checkBackendConfig(cfg.backend), message);
      assert.throws(
        () =>
          backendFactory(cfg.backend.type)({
            netConfig: cfg,
            extIface: { name: 'eth0', index: 1, mtu: 1500 } as never,
            log: logger('test'),
            metrics: new PromRegistry(),
            options: DEFAULT_BACKEND_OPTIONS,
            signal: new AbortController().signal,
          }),
        message,
      );
    });
  }

  test('`config set` stores a good config, `config get` reads it back', () => {
    const file = join(tmp, 'good.json');
    writeFileSync(file, '{"Network":"10.5.0.0/16","Backend":{"Type":"vxlan","VNI":4096}}');
    const store = join(tmp, 'store-good');
    assert.equal(weft('config', 'set', file, `--store-dir=${store}`).status, 0);
    const r = weft('config', 'get', `--store-dir=${store}`);
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /"VNI":4096/);
  });

  test('`leases` and `config get` on a store that does not exist exit 2 naming --store-dir and create nothing', () => {
    const store = join(tmp, 'no-such-store');
    for (const argv of [['leases'], ['config', 'get']]) {
      const r = weft(...argv, `--store-dir=${store}`);
      assert.equal(r.status, 2, `${argv.join(' ')}: ${r.stderr}`);
      assert.match(r.plain, /--store-dir: .*no-such-store holds no embedded store/);
      assert.equal(existsSync(store), false, `${argv.join(' ')} created ${store}`);
    }
  });

  test('`leases` and `config get` leave an existing store exactly as it was', () => {
    const file = join(tmp, 'ro.json');
    writeFileSync(file, '{"Network":"10.5.0.0/16"}');
    const store = join(tmp, 'store-ro');
    assert.equal(weft('config', 'set', file, `--store-dir=${store}`).status, 0);
    rmSync(join(store, 'tmp'), { recursive: true }); // what the writer would recreate
    const before = tree(store).map((p) => `${p} ${statSync(join(store, p)).mtimeMs}`);
    assert.equal(weft('leases', `--store-dir=${store}`).status, 0);
    assert.equal(weft('config', 'get', `--store-dir=${store}`).status, 0);
    assert.deepEqual(
      tree(store).map((p) => `${p} ${statSync(join(store, p)).mtimeMs}`),
      before,
    );
  });

  test('a runtime failure (exit 1) is said plainly on stderr too, not only as JSON', () => {
    const store = join(tmp, 'store-no-config');
    const file = join(tmp, 'x.json');
    writeFileSync(file, '{"Network":"10.5.0.0/16"}');
    assert.equal(weft('config', 'set', file, `--store-dir=${store}`).status, 0);
    rmSync(join(store, 'config'));
    const r = weft('config', 'get', `--store-dir=${store}`);
    assert.equal(r.status, 1, r.stderr);
    assert.match(r.plain, /^weft config: no network config at .*store-no-config\/config$/m);
  });
});
