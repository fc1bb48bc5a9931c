/**
 * The Backend options each backend type reads, besides `Type` (names as flannel spells them,
 * matched case-insensitively as Go's JSON does). Anything else in the Backend block is not
 * supported: the daemon logs it once as a WEFT_ERR_BACKEND_UNSUPPORTED warning and ignores it
 * (flannel's vxlan `MacPrefix`; a misspelt `VIN`). The test beside it checks
 * that every registered backend has a list and that each listed option is really parsed.
 */
import type { BackendConfig } from '../config/net-config.js';
import { EXTENSION_COMMANDS } from './extension.js';

const VXLAN = ['VNI', 'Port', 'MTU', 'GBP', 'Learning', 'DirectRouting', 'Dataplane'] as const;
const IPIP = ['DirectRouting', 'Dataplane'] as const;

export const BACKEND_OPTIONS: Readonly<Record<string, readonly string[]>> = Object.freeze({
  alloc: [],
  extension: EXTENSION_COMMANDS,
  'host-gw': [],
  ipip: IPIP,
  'ipip-userspace': IPIP,
  udp: ['Port'],
  vxlan: VXLAN,
  'vxlan-userspace': VXLAN,
});

/**
 * The option names in `backend.raw` (as written) that its type does not read; [] for a type
 * this table does not know (a backend registered by a test).
 */
export function unsupportedBackendOptions(backend: BackendConfig): string[] {
  const known = BACKEND_OPTIONS[backend.type];
  if (!known) return [];
  const lower = new Set(['type', ...known.map((o) => o.toLowerCase())]);
  return Object.keys(backend.raw).filter((k) => !lower.has(k.toLowerCase()));
}
