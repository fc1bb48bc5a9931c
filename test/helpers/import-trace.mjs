// `node --import ./test/helpers/import-trace.mjs ...` appends the name of every npm package the
// process loads (one line each) to the file named by $WEFT_IMPORT_TRACE: which dependencies a
// command pulls in, read from the module graph, not from a stopwatch.
import { appendFileSync } from 'node:fs';
import { register } from 'node:module';
import { isMainThread } from 'node:worker_threads';

if (isMainThread) register(import.meta.url);

/** The package a resolved URL belongs to (`@scope/name` or `name`), or null for our files. */
function packageOf(url) {
  const m = /\/node_modules\/((?:@[^/]+\/)?[^/]+)\//.exec(url);
  return m ? m[1] : null;
}

export async function resolve(specifier, context, next) {
  const r = await next(specifier, context);
  const pkg = packageOf(r.url);
  const parent = context.parentURL ?? '';
  // a package's own files and tsx's loader are not what the command imported
  if (pkg && process.env.WEFT_IMPORT_TRACE && packageOf(parent) !== pkg && pkg !== 'tsx') {
    appendFileSync(process.env.WEFT_IMPORT_TRACE, `${pkg}\n`);
  }
  return r;
}
