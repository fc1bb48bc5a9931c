#!/usr/bin/env node
// Bundles the CNI plugin (src/control/cni/plugin.ts and what it imports) into one
// self-contained CommonJS file, dist/weft-cni.cjs, with Node built-ins as its only imports:
// no node_modules, no package.json needed beside it. A runtime calls the plugin for every pod
// ADD/DEL, so it loads only this file (`npm run bench:footprint` measures it against the
// `bridge` plugin). CommonJS because a copy installed without an extension (/opt/cni/bin/weft)
// sits outside any package.json, where Node reads a file as CommonJS.
//   node scripts/build-cni.mjs [--outfile PATH]
import { chmodSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');

export async function buildCni(outfile = join(root, 'dist', 'weft-cni.cjs')) {
  const { build } = await import('esbuild');
  await build({
    entryPoints: [join(root, 'src', 'control', 'cni', 'plugin.ts')],
    outfile,
    bundle: true,
    platform: 'node',
    target: 'node20',
    format: 'cjs',
    minify: false,
    legalComments: 'none',
    banner: { js: '#!/usr/bin/env node' },
    logLevel: 'warning',
  });
  chmodSync(outfile, 0o755);
  return outfile;
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const i = process.argv.indexOf('--outfile');
  const out = await buildCni(i > 0 ? resolve(process.argv[i + 1]) : undefined);
  console.error(`build-cni: wrote ${out}`);
}
