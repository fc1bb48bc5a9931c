/**
 * docs/architecture.md stays a true map: every path it names exists, and every folder of src/
 * and src/control and every engine of src/dataplane is named in it (a new one must be placed).
 */
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { test } from 'node:test';

const ROOT = resolve(import.meta.dirname, '../../..');
const doc = readFileSync(join(ROOT, 'docs/architecture.md'), 'utf8');
const paths = [...doc.matchAll(/`((?:src|native|bench|scripts|test|deploy|docs)\/[\w./-]+)`/g)].map(
  (m) => m[1]!,
);

test('every path docs/architecture.md names exists', () => {
  assert.ok(paths.length > 30, `${paths.length} paths`);
  for (const p of paths) assert.ok(existsSync(join(ROOT, p)), `${p} does not exist`);
});

test('every folder of src/ and src/control, and every src/dataplane engine, is on the map', () => {
  const named = new Set(paths);
  const folders = ['src', 'src/control'].flatMap((dir) =>
    readdirSync(join(ROOT, dir), { withFileTypes: true })
      .filter((e) => e.isDirectory())
      .map((e) => `${dir}/${e.name}/`),
  );
  for (const f of folders)
    assert.ok(
      [...named].some((p) => p.startsWith(f)),
      `${f} is not in docs/architecture.md`,
    );
  for (const e of readdirSync(join(ROOT, 'src/dataplane'))) {
    if (!/^(index|engine|native-engine|bpf-engine|js-engine)\.ts$/.test(e)) continue;
    assert.ok(named.has(`src/dataplane/${e}`), `src/dataplane/${e} is not on the map`);
  }
});
