/**
 * The Backend options each backend type reads, besides `Type` (names as flannel spells them,
 * matched case-insensitively as Go's JSON does): each backend's spec says (BackendSpec.options,
 * registry.ts). Anything else in the Backend block is not supported: the daemon logs it once as
 * a WEFT_ERR_BACKEND_UNSUPPORTED warning and ignores it (flannel's vxlan `MacPrefix`; a misspelt
 * `VIN`). The test beside it checks that each listed option is really parsed.
 */
import type { BackendConfig } from '../config/net-config.js';
import { backendSpec, backendSpecs } from './registry.js';

/** Each registered type's options (read from the specs). */
export const BACKEND_OPTIONS: Readonly<Record<string, readonly string[]>> = Object.freeze(
  Object.fromEntries(backendSpecs().map((s) => [s.type, s.options])),
);

/**
 * The option names in `backend.raw` (as written) that its type does not read; [] for a type
 * without a spec (a backend registered by a test).
 */
export function unsupportedBackendOptions(backend: BackendConfig): string[] {
  const known = backendSpec(backend.type)?.options;
  if (!known) return [];
  const lower = new Set(['type', ...known.map((o) => o.toLowerCase())]);
  return Object.keys(backend.raw).filter((k) => !lower.has(k.toLowerCase()));
}
