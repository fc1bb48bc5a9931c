/**
 * docs/architecture.md stays a true map: every path it names (file or folder) exists, and every
 * folder under src/ at any depth, every engine of src/dataplane and every packet-carrying
 * backend is named in it (a new one must be placed on the map).
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

/** Every directory under `dir`, recursively, as a path from the root. */
function folders(dir: string): string[] {
  return readdirSync(join(ROOT, dir), { withFileTypes: true })
    .filter((e) => e.isDirectory())
    .flatMap((e) => [`${dir}/${e.name}`, ...folders(`${dir}/${e.name}`)]);
}

test('every folder under src/, at any depth, is on the map', () => {
  const all = folders('src');
  assert.ok(all.length > 10, `${all.length} folders`);
  for (const f of all)
    assert.ok(
      paths.some((p) => p === f || p.startsWith(`${f}/`)),
      `${f}/ is not in docs/architecture.md`,
    );
});

test('every src/dataplane engine and every backend file is on the map', () => {
  const named = new Set(paths);
  for (const e of readdirSync(join(ROOT, 'src/dataplane'))) {
    if (!/^(index|engine|native-engine|bpf-engine|js-engine)\.ts$/.test(e)) continue;
    assert.ok(named.has(`src/dataplane/${e}`), `src/dataplane/${e} is not on the map`);
  }
  for (const b of ['host-gw', 'vxlan', 'ipip', 'udp', 'vxlan-userspace', 'ipip-userspace']) {
    assert.ok(named.has(`src/control/backend/${b}.ts`), `backend ${b} is not on the map`);
  }
});
