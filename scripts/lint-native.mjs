#!/usr/bin/env node
// `npm run lint:native`: every native source (native/src, native/bpf, native/tun-helper,
// native/fuzz; never native/build) must be formatted as native/.clang-format says.
// --fix rewrites them in place instead. clang-format comes from scripts/setup.mjs
// (TEST_PACKAGES); without it this fails, naming the package.
import { spawnSync } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { join, relative } from 'node:path';
import { dirname } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const DIRS = ['src', 'bpf', 'tun-helper', 'fuzz'].map((d) => join(root, 'native', d));

/** The C and C++ sources under native/'s source folders, sorted. */
export function nativeSources() {
  const out = [];
  const walk = (dir) => {
    for (const e of readdirSync(dir, { withFileTypes: true })) {
      const p = join(dir, e.name);
      if (e.isDirectory()) walk(p);
      else if (/\.(c|cc|h)$/.test(e.name)) out.push(p);
    }
  };
  for (const d of DIRS) walk(d);
  return out.sort();
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const fix = process.argv.includes('--fix');
  const files = nativeSources();
  const args = fix ? ['-i', '--style=file'] : ['--dry-run', '--Werror', '--style=file'];
  const r = spawnSync(process.env.CLANG_FORMAT || 'clang-format', [...args, ...files], {
    stdio: ['ignore', 'inherit', 'inherit'],
  });
  if (r.error) {
    console.error(
      `lint:native: cannot run clang-format (${r.error.message}); install it: node scripts/setup.mjs --packages-only`,
    );
    process.exit(1);
  }
  if (r.status !== 0) {
    if (!fix) console.error('lint:native: run `npm run format:native` to format them');
    process.exit(r.status ?? 1);
  }
  if (!fix) console.log(`lint:native: ${files.length} native sources follow native/.clang-format`);
  else
    console.log(
      `format:native: ${files.map((f) => relative(root, f)).length} native sources formatted`,
    );
}
