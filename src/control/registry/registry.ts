/**
 * The Registry seam: a lease store reduced to what flannel's algorithm needs, as raw text.
 * Decoding, validation, allocation, renewal and diffing live once, above this seam, in
 * lease/local-manager.ts; each store (memory, embedded directory, etcd) only implements this.
 *
 * Contract:
 * - Keys are subnet keys (`10.5.34.0-24`); values are lease JSON text, stored byte for byte.
 * - `expiration === null` marks a reservation: a key written without TTL. It never lapses and
 *   updates must keep it TTL-less. `expiration === undefined` marks a key WITH a TTL whose
 *   expiration the store did not look up: etcd pays one RPC per key for it, so its `watch` and
 *   its `list` (unless asked with `{ expirations: true }`) leave it out. `get` always has it.
 * - Lapsed keys are invisible: `get` never returns them, `list` never returns those it knows to
 *   have lapsed (etcd without expirations: a key whose TTL ran out but that etcd has not yet
 *   deleted — it does so within 500 ms — may show), and `watch` reports a delete.
 * - Revisions increase with every change to the subnets; `watch(from)` reports every change
 *   with revision >= from. When the store cannot (compaction, reconnect after a gap) it yields
 *   a `resync` batch holding the full current list instead; the consumer diffs.
 * - Every method rejects with a WeftError: WEFT_ERR_STORE_KEY_EXISTS (create on a taken key),
 *   WEFT_ERR_STORE_NOT_FOUND, WEFT_ERR_CONFIG_NOT_FOUND, WEFT_ERR_STORE_UNAVAILABLE (after the
 *   store's own bounded retries), WEFT_ERR_ABORTED (signal fired).
 * - `close()` ends open watches (their iterators return) and fails later calls.
 */

export interface StoredLease {
  readonly key: string;
  readonly value: string;
  /** When it lapses; null for a reservation; undefined: has a TTL, not looked up (above). */
  readonly expiration: Date | null | undefined;
  /** Store revision at which the key was last modified. */
  readonly revision: number;
}

export type RegistryEvent =
  | { readonly type: 'put'; readonly lease: StoredLease }
  | { readonly type: 'delete'; readonly key: string; readonly revision: number };

export type WatchBatch =
  | {
      readonly kind: 'events';
      readonly events: readonly RegistryEvent[];
      readonly revision: number;
    }
  | { readonly kind: 'resync'; readonly leases: readonly StoredLease[]; readonly revision: number };

export interface SubnetList {
  readonly leases: readonly StoredLease[];
  /** The store revision the list reflects; watch from `revision + 1` to follow it. */
  readonly revision: number;
}

export interface ListOptions {
  /** Look up every key's expiration (what `weft leases` shows); stores that have it anyway
   * ignore this. Default false: the daemon never needs a peer's. */
  readonly expirations?: boolean;
}

export interface Registry {
  /** Short name for logs and metrics labels: `memory`, `embedded`, `etcd`. */
  readonly kind: string;

  getNetworkConfig(signal?: AbortSignal): Promise<string>;
  setNetworkConfig(text: string, signal?: AbortSignal): Promise<void>;

  listSubnets(signal?: AbortSignal, options?: ListOptions): Promise<SubnetList>;
  getSubnet(key: string, signal?: AbortSignal): Promise<StoredLease | null>;
  /** Create-if-absent with a TTL; resolves to the expiration. */
  createSubnet(key: string, value: string, ttlMs: number, signal?: AbortSignal): Promise<Date>;
  /**
   * Overwrite an existing key. `ttlMs === null` writes it without TTL (reservations); otherwise
   * the TTL restarts. Resolves to the new expiration (null for a reservation).
   */
  updateSubnet(
    key: string,
    value: string,
    ttlMs: number | null,
    signal?: AbortSignal,
  ): Promise<Date | null>;
  deleteSubnet(key: string, signal?: AbortSignal): Promise<void>;

  /** Follows the subnets from `fromRevision` until `signal` fires or the registry closes. */
  watchSubnets(fromRevision: number, signal: AbortSignal): AsyncIterable<WatchBatch>;

  close(): Promise<void>;
}
