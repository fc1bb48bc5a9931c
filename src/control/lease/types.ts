/**
 * Leases as the control plane sees them: decoded, validated, family-aware. The store keeps
 * them as flannel does (see subnet-key.ts and lease-json.ts for the exact text forms).
 */
import type { IPNet } from '../../common/ip.js';

/** What a node publishes about itself in its lease value (flannel's LeaseAttrs). */
export interface LeaseAttrs {
  /** IPv4 public address; "0.0.0.0" when the node has none (IPv6-only), as flannel writes. */
  readonly publicIP: string;
  /** IPv6 public address or null (always written, as `null` when absent). */
  readonly publicIPv6: string | null;
  /** "" when the backend publishes no type (udp, alloc). */
  readonly backendType: string;
  /** Backend-specific JSON (vxlan: {VNI, VtepMAC}); undefined when absent. */
  readonly backendData?: unknown;
  readonly backendV6Data?: unknown;
}

export interface Lease {
  /** The store key, e.g. `10.5.34.0-24` or `10.5.77.0-24&fc00:0:0:5d::-64`. */
  readonly key: string;
  /** IPv4 subnet, or null when the network is IPv6-only. */
  readonly subnet: IPNet | null;
  readonly ipv6Subnet: IPNet | null;
  readonly attrs: LeaseAttrs;
  /**
   * When the lease lapses; null for a reservation (a key with no TTL), which never does;
   * undefined for a peer's lease whose TTL the store did not look up (registry.ts).
   */
  readonly expiration: Date | null | undefined;
}

export type LeaseEvent =
  | { readonly type: 'added'; readonly lease: Lease }
  | { readonly type: 'removed'; readonly lease: Lease };

export function isReservation(lease: Lease): boolean {
  return lease.expiration === null;
}
