/**
 * The one loader of the native addon (native/build/Release/weft.node). Every module that needs
 * the addon calls `loadNative()`; the first call loads it (resolved from the package root, so it
 * works from src/ under tsx and from dist/), later calls return the cached module or rethrow the
 * cached failure. A missing or broken build throws WEFT_ERR_NATIVE_UNAVAILABLE with the reason.
 *
 * The addon's exports are typed once, in native-addon.ts (NativeAddon).
 */
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { WeftError, errorMessage } from './errors.js';
import type { NativeAddon } from './native-addon.js';

let cached: { ok: true; mod: unknown } | { ok: false; err: WeftError } | undefined;

/** The package root: the nearest directory above this file holding package.json. */
export function packageRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    if (existsSync(join(dir, 'package.json'))) return dir;
    const up = dirname(dir);
    if (up === dir) throw new Error('package.json not found above ' + import.meta.url);
    dir = up;
  }
}

export function nativeAddonPath(): string {
  return (
    process.env.WEFT_NATIVE_ADDON ?? join(packageRoot(), 'native', 'build', 'Release', 'weft.node')
  );
}

/** Loads (once) and returns the addon. */
export function loadNative(): NativeAddon {
  if (!cached) {
    let path = '(unresolved)';
    try {
      path = nativeAddonPath();
      if (!existsSync(path)) {
        throw new Error(`${path} does not exist (build it: node scripts/build-native.mjs)`);
      }
      cached = { ok: true, mod: createRequire(import.meta.url)(path) };
    } catch (err) {
      cached = {
        ok: false,
        err: new WeftError(
          'WEFT_ERR_NATIVE_UNAVAILABLE',
          `native addon unavailable: ${errorMessage(err)}`,
          { cause: err, details: { path } },
        ),
      };
    }
  }
  if (!cached.ok) throw cached.err;
  return cached.mod as NativeAddon;
}

/** Whether the addon loads (never throws). */
export function nativeAvailable(): boolean {
  try {
    loadNative();
    return true;
  } catch {
    return false;
  }
}
