/**
 * The program and its benches stand on their own (issue #30): nothing under src/ or bench/
 * imports a module under test/. Code the tests, the benches and `weft demo` share lives in
 * src/testbed/. Type-only imports count too: tsc would follow them into test/.
 */
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { test } from 'node:test';

const ROOT = resolve(import.meta.dirname, '../../..');
const TEST = join(ROOT, 'test');

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = join(dir, e.name);
    if (e.isDirectory()) return e.name === 'results' ? [] : sourceFiles(p);
    return /\.(ts|mts|mjs|js)$/.test(e.name) ? [p] : [];
  });
}

/** Every relative import specifier of a source text (static, re-export and dynamic import). */
export function relativeImports(text: string): string[] {
  return [
    ...text.matchAll(/^\s*(?:import|export)\b[^;]*?\bfrom\s+['"]([^'"]+)['"]/gms),
    ...text.matchAll(/^\s*import\s+['"]([^'"]+)['"]/gm),
    ...text.matchAll(/\bimport\(\s*['"]([^'"]+)['"]\s*\)/g),
  ]
    .map((m) => m[1]!)
    .filter((s) => s.startsWith('.'));
}

/** `file -> specifier` for each import, of files given as [path, text], that resolves into test/. */
export function importsOfTest(files: ReadonlyArray<readonly [string, string]>): string[] {
  return files.flatMap(([f, text]) =>
    relativeImports(text)
      .filter((s) => !relative(TEST, resolve(dirname(f), s)).startsWith('..'))
      .map((s) => `${relative(ROOT, f)} -> ${s}`),
  );
}

test('no file under src/ or bench/ imports a module under test/', () => {
  const files = ['src', 'bench'].flatMap((d) => sourceFiles(join(ROOT, d)));
  assert.ok(files.length > 100, `${files.length} files`);
  assert.deepEqual(importsOfTest(files.map((f) => [f, readFileSync(f, 'utf8')] as const)), []);
});

test('the check flags static, type-only, re-export, bare and dynamic imports of test/', () => {
  const text = [
    "import { a } from '../test/helpers/a.js';",
    "import type { B } from '../test/fakes/b.js';",
    "export { c } from '../test/c.js';",
    "import '../test/side-effect.js';",
    "const d = await import('../test/d.js');",
    "import { e } from '../src/testbed/e.js';",
  ].join('\n');
  assert.deepEqual(importsOfTest([[join(ROOT, 'bench/x.ts'), text]]), [
    'bench/x.ts -> ../test/helpers/a.js',
    'bench/x.ts -> ../test/fakes/b.js',
    'bench/x.ts -> ../test/c.js',
    'bench/x.ts -> ../test/side-effect.js',
    'bench/x.ts -> ../test/d.js',
  ]);
});
