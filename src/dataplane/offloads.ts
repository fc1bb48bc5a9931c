/**
 * The offload vocabulary, a pure module (no addon): the names the kill switch
 * (WEFT_DATAPLANE_OFFLOADS), `--dataplane-offloads` and weft_dataplane_offload_enabled{feature}
 * use. Names, never bits, cross the native boundary: native/src/offloads.h maps each to its
 * TUN_F_* or engine bit, and the addon's offloadNames() lists the same names in the same order
 * (checked when an engine starts and by test/native/addon-exports.test.ts).
 *
 *   csum, tso4, tso6   the TUN hands over partial checksums and TCP super-packets (split here)
 *   uso4, uso6         the same for UDP (kernel >= 6.2; the kernel takes them only as a pair)
 *   gro                received TCP (and UDP, with USO) coalesced into GSO TUN writes
 *   udp_gso, udp_gro   UDP_SEGMENT on send, UDP_GRO on receive
 *   tap_gso            TCP sent through the egress TAP, a TSO super-packet whole per write
 *                      (tunnel GSO, kernel >= 6.17; probed, else split + UDP_SEGMENT)
 */
export const OFFLOAD_NAMES = [
  'csum',
  'tso4',
  'tso6',
  'uso4',
  'uso6',
  'gro',
  'udp_gso',
  'udp_gro',
  'tap_gso',
] as const;
export type OffloadName = (typeof OFFLOAD_NAMES)[number];

/** Why an offload list (`all`, `none` or a comma list of names) is invalid, or null. */
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

/**
 * The kill switch: WEFT_DATAPLANE_OFFLOADS = "none" | "all" (default) | a comma list of names.
 * Unknown names are ignored here (the flag refuses them: offloadListError).
 */
export function offloadsFromEnv(
  value = process.env.WEFT_DATAPLANE_OFFLOADS,
): readonly OffloadName[] {
  if (value === undefined || value === '' || value === 'all') return OFFLOAD_NAMES;
  if (value === 'none') return [];
  const want = new Set(value.split(',').map((n) => n.trim()));
  return OFFLOAD_NAMES.filter((n) => want.has(n));
}

/**
 * The egress TAP of the engine whose TUN is `tun` (tap_gso): `<tun>-tx`, the TUN's name cut so
 * the whole fits IFNAMSIZ (15 characters); '' (the kernel picks) for an unnamed TUN.
 */
export function egressTapName(tun: string): string {
  return tun === '' ? '' : `${tun.slice(0, 12)}-tx`;
}
