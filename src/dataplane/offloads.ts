/**
 * Offload names, pure (no addon, no metrics): what `--dataplane-offloads` and the
 * WEFT_DATAPLANE_OFFLOADS kill switch accept and what weft_dataplane_offload_enabled{feature}
 * reports. The control plane validates flags with this module without loading the dataplane.
 */

/** Offloads as `weft_dataplane_offload_enabled{feature}` reports them. */
export const OFFLOAD_FEATURES = [
  'csum',
  'tso4',
  'tso6',
  'uso4',
  'uso6',
  'gro',
  'udp_gso',
  'udp_gro',
] as const;
export type OffloadFeature = (typeof OFFLOAD_FEATURES)[number];

/**
 * The names the kill switch (and --dataplane-offloads) accepts, besides `all` and `none`: the
 * features weft_dataplane_offload_enabled reports.
 */
export const OFFLOAD_NAMES = OFFLOAD_FEATURES;

/** Why an offload list is invalid, or null when it is valid. */
export function offloadListError(value: string): string | null {
  if (value === '' || value === 'all' || value === 'none') return null;
  const bad = value
    .split(',')
    .map((n) => n.trim())
    .filter((n) => !(OFFLOAD_NAMES as readonly string[]).includes(n));
  return bad.length
    ? `unknown offload(s) ${bad.join(', ')} (all, none, or a list of ${OFFLOAD_NAMES.join(', ')})`
    : null;
}
