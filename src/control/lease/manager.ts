/**
 * The SubnetManager seam: how a node gets, keeps and follows leases. Implementations:
 * `LocalManager` (lease/local-manager.ts) over any Registry (memory, embedded, etcd), and the
 * Kubernetes manager (kube/kube-manager.ts), where the node's podCIDR is the lease.
 *
 * Contract:
 * - `acquireLease` returns this node's lease, creating or reusing one as flannel does; it
 *   rejects with WEFT_ERR_LEASE_OUT_OF_SUBNETS, WEFT_ERR_LEASE_RACE or a store error.
 * - `renewLease` extends it (a reservation stays TTL-less) and returns the lease with its new
 *   expiration; WEFT_ERR_LEASE_REVOKED when the key is gone.
 * - `watchLeases` yields batches of events about OTHER nodes' leases (own lease excluded),
 *   starting with an `added` batch for every lease present. Malformed entries are skipped,
 *   logged once and counted, never thrown. The iterator ends when `signal` fires.
 * - `otherLeases` lists the leases of every other node now (before ours is acquired: "other"
 *   is decided by `attrs`' public address, flannel's ownership rule; kube: every node but ours).
 *   Malformed entries are skipped as in a watch.
 * - `watchOwnLease` yields each new version of our own lease (renewals by us or others) and
 *   throws WEFT_ERR_LEASE_REVOKED when it is deleted or lapses.
 * - `leaseBeforePublish` (kube: the lease is the node's podCIDR): `acquireLease` with
 *   `publish: false` returns the lease it would publish and writes nothing; a later call
 *   without it publishes. The daemon starts the backend on it and publishes once the peers'
 *   first list is checked (daemon.ts). `watchLeases` may then hand the startup snapshot on in
 *   parts (snapshot-parts.ts) while that list is read.
 */
import type { NetConfig } from '../config/net-config.js';
import type { Lease, LeaseAttrs, LeaseEvent } from './types.js';
import type { IPNet } from '../../common/ip.js';

export interface AcquireOptions {
  /** Subnets from the previous run (subnet.env), tried first when free and fitting. */
  previous?: { subnet: IPNet | null; ipv6Subnet: IPNet | null };
  signal?: AbortSignal;
  /** false: the lease as it would be published, nothing written (`leaseBeforePublish` only). */
  publish?: boolean;
  /**
   * With `publish: false`: a VtepMAC is to be checked against the peers' first list, so it is
   * begun now and reads the latest state (kube: rv="", not the API server's watch cache).
   */
  latestPeers?: boolean;
}

export interface SubnetManager {
  /** `etcd`, `embedded`, `memory`, `kube`. */
  readonly kind: string;
  /** Whether acquireLease can give the lease before publishing it (see the contract above). */
  readonly leaseBeforePublish?: boolean;
  getNetworkConfig(signal?: AbortSignal): Promise<NetConfig>;
  acquireLease(attrs: LeaseAttrs, options?: AcquireOptions): Promise<Lease>;
  renewLease(lease: Lease, signal?: AbortSignal): Promise<Lease>;
  /** Deletes our lease (used with --release-lease-on-exit). */
  releaseLease(lease: Lease, signal?: AbortSignal): Promise<void>;
  watchLeases(own: Lease, signal: AbortSignal): AsyncIterable<LeaseEvent[]>;
  otherLeases(
    attrs: Pick<LeaseAttrs, 'publicIP' | 'publicIPv6'>,
    signal?: AbortSignal,
  ): Promise<Lease[]>;
  watchOwnLease(own: Lease, signal: AbortSignal): AsyncIterable<Lease>;
  close(): Promise<void>;
}
