/**
 * The lease value, byte-compatible with flannel: fields in the order PublicIP, PublicIPv6
 * (always present, `null` when absent), BackendType, BackendData, BackendV6Data (the last three
 * omitted when empty). Reading matches names case-insensitively (as Go's encoding/json does)
 * and never throws: a malformed value yields a reason the caller logs once and counts.
 */
import { familyOf } from '../../common/ip.js';
import { jsonField } from '../../common/json-field.js';
import type { Lease, LeaseAttrs } from './types.js';
import { parseSubnetKey } from './subnet-key.js';

export function encodeLeaseAttrs(a: LeaseAttrs): string {
  const out: Record<string, unknown> = { PublicIP: a.publicIP, PublicIPv6: a.publicIPv6 ?? null };
  if (a.backendType) out.BackendType = a.backendType;
  if (!isEmptyJSON(a.backendData)) out.BackendData = a.backendData;
  if (!isEmptyJSON(a.backendV6Data)) out.BackendV6Data = a.backendV6Data;
  return JSON.stringify(out);
}

function isEmptyJSON(v: unknown): boolean {
  return v === undefined || v === null;
}

export type DecodeResult<T> = { ok: true; value: T } | { ok: false; reason: string };

export function decodeLeaseAttrs(text: string): DecodeResult<LeaseAttrs> {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (err) {
    return { ok: false, reason: `invalid JSON: ${(err as Error).message}` };
  }
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) {
    return { ok: false, reason: 'lease value is not a JSON object' };
  }
  const obj = raw as Record<string, unknown>;
  const publicIP = jsonField(obj, 'PublicIP');
  const publicIPv6 = jsonField(obj, 'PublicIPv6');
  const backendType = jsonField(obj, 'BackendType');
  if (publicIP !== undefined && publicIP !== null && publicIP !== '') {
    if (typeof publicIP !== 'string' || familyOf(publicIP) !== 4) {
      return { ok: false, reason: `PublicIP ${JSON.stringify(publicIP)} is not an IPv4 address` };
    }
  }
  if (publicIPv6 !== undefined && publicIPv6 !== null && publicIPv6 !== '') {
    if (typeof publicIPv6 !== 'string' || familyOf(publicIPv6) !== 6) {
      return {
        ok: false,
        reason: `PublicIPv6 ${JSON.stringify(publicIPv6)} is not an IPv6 address`,
      };
    }
  }
  if (backendType !== undefined && backendType !== null && typeof backendType !== 'string') {
    return { ok: false, reason: 'BackendType is not a string' };
  }
  const v4 = typeof publicIP === 'string' && publicIP !== '' ? publicIP : '0.0.0.0';
  const v6 = typeof publicIPv6 === 'string' && publicIPv6 !== '' ? publicIPv6 : null;
  if (v4 === '0.0.0.0' && v6 === null) {
    return { ok: false, reason: 'lease has neither PublicIP nor PublicIPv6' };
  }
  const attrs: LeaseAttrs = {
    publicIP: v4,
    publicIPv6: v6,
    backendType: typeof backendType === 'string' ? backendType : '',
    backendData: jsonField(obj, 'BackendData') ?? undefined,
    backendV6Data: jsonField(obj, 'BackendV6Data') ?? undefined,
  };
  return { ok: true, value: attrs };
}

/** A stored key + value as a Lease; a reason instead when either cannot be decoded. */
export function decodeLease(stored: {
  key: string;
  value: string;
  expiration: Date | null | undefined;
}): DecodeResult<Lease> {
  const nets = parseSubnetKey(stored.key);
  if (!nets) return { ok: false, reason: `key ${JSON.stringify(stored.key)} is not a subnet key` };
  const attrs = decodeLeaseAttrs(stored.value);
  if (!attrs.ok) return attrs;
  return {
    ok: true,
    value: {
      key: stored.key,
      subnet: nets.v4,
      ipv6Subnet: nets.v6,
      attrs: attrs.value,
      expiration: stored.expiration,
    },
  };
}
