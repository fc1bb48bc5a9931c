import type { NetConfig } from '../config/net-config.js';
import { backendSpec } from './registry.js';

/**
 * The egress TAP (tap_gso) the userspace engine of this config's backend may send through —
 * udp, or vxlan with Dataplane userspace or auto: each spec's egressTap (registry.ts) — or null:
 * the FORWARD accept for its frames (iptables.ts and nftables mode take it as
 * IptablesOptions.egressTapOf).
 */
export function egressTapOf(cfg: NetConfig): string | null {
  return backendSpec(cfg.backend.type)?.egressTap?.(cfg.backend.raw) ?? null;
}
