/**
 * The network config (flannel's net-conf JSON), parsed and validated once, then frozen.
 * The parser (parseNetConfig) is below the types.
 */
import { configError } from '../../common/errors.js';
import { jsonField } from '../../common/json-field.js';
import {
  bits,
  canonical,
  containsIP,
  containsNet,
  formatCIDR,
  formatIP,
  isAligned,
  maskOf,
  parseCIDR,
  parseIP,
  sizeOf,
  type Family,
  type IPNet,
} from '../../common/ip.js';

/** One address family's allocation space. */
export interface FamilyConfig {
  readonly network: IPNet;
  readonly subnetLen: number;
  /** First and last allocatable subnet network addresses (aligned to subnetLen). */
  readonly subnetMin: bigint;
  readonly subnetMax: bigint;
}

export interface BackendConfig {
  /** Lower-case backend type; `udp` when the config has no Backend block (as flannel). */
  readonly type: string;
  /** The Backend object as written (each backend parses its own options from it). */
  readonly raw: Readonly<Record<string, unknown>>;
}

export interface NetConfig {
  readonly enableIPv4: boolean;
  readonly enableIPv6: boolean;
  /** Present when enableIPv4. */
  readonly ipv4: FamilyConfig | null;
  /** Present when enableIPv6. */
  readonly ipv6: FamilyConfig | null;
  readonly backend: BackendConfig;
  /** Masquerade and forward rules through nftables instead of iptables (flannel's EnableNFTables). */
  readonly enableNFTables: boolean;
  /** The JSON text it was parsed from. */
  readonly text: string;
}

/** Field names as flannel spells them (Go's encoding/json matches them case-insensitively). */
const FIELDS = [
  'Network',
  'SubnetLen',
  'SubnetMin',
  'SubnetMax',
  'EnableIPv4',
  'EnableIPv6',
  'IPv6Network',
  'IPv6SubnetLen',
  'IPv6SubnetMin',
  'IPv6SubnetMax',
  'EnableNFTables',
  'Backend',
] as const;
type Field = (typeof FIELDS)[number];

/** The per-family rules (flannel's CheckNetworkConfig, once for both families). */
interface FamilyRules {
  readonly family: Family;
  readonly networkField: Field;
  readonly lenField: Field;
  readonly minField: Field;
  readonly maxField: Field;
  /** SubnetLen must leave room for a tunnel and a bridge address: ≤ 30 (v4), ≤ 126 (v6). */
  readonly maxSubnetLen: number;
  /** Default SubnetLen when the network is large enough for it (v4 /24, v6 /64). */
  readonly defaultSubnetLen: number;
  readonly example: string;
}

const RULES: Readonly<Record<Family, FamilyRules>> = {
  4: {
    family: 4,
    networkField: 'Network',
    lenField: 'SubnetLen',
    minField: 'SubnetMin',
    maxField: 'SubnetMax',
    maxSubnetLen: 30,
    defaultSubnetLen: 24,
    example: '10.244.0.0/16',
  },
  6: {
    family: 6,
    networkField: 'IPv6Network',
    lenField: 'IPv6SubnetLen',
    minField: 'IPv6SubnetMin',
    maxField: 'IPv6SubnetMax',
    maxSubnetLen: 126,
    defaultSubnetLen: 64,
    example: 'fc00::/48',
  },
};

/** A network must hold at least four subnets (the first is never handed out). */
const MIN_SUBNETS_LOG2 = 2;

/**
 * Parses and validates net-conf JSON exactly as flannel's ParseConfig + CheckNetworkConfig do
 * (defaults filled in, every rule checked), and returns a frozen NetConfig. Unknown fields are
 * ignored; `null` counts as absent (Go leaves the field unset). Throws WEFT_ERR_CONFIG_INVALID
 * naming the field and the rule.
 */
export function parseNetConfig(text: string): NetConfig {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (err) {
    throw configError(
      'net-conf',
      `invalid JSON (${err instanceof Error ? err.message : String(err)})`,
    );
  }
  if (!isPlainObject(doc)) throw configError('net-conf', 'must be a JSON object');
  const fields = pickFields(doc);

  const enableIPv4 = readBool(fields, 'EnableIPv4', true);
  const enableIPv6 = readBool(fields, 'EnableIPv6', false);
  if (!enableIPv4 && !enableIPv6) {
    throw configError('EnableIPv4', 'EnableIPv4 or EnableIPv6 must be true');
  }
  // Like Go's json.Unmarshal, malformed values fail even for a disabled family.
  const raw4 = readFamilyFields(fields, RULES[4]);
  const raw6 = readFamilyFields(fields, RULES[6]);
  const backend = readBackend(fields.get('Backend'));
  const ipv4 = enableIPv4 ? checkFamily(raw4, RULES[4]) : null;
  const ipv6 = enableIPv6 ? checkFamily(raw6, RULES[6]) : null;
  const enableNFTables = readBool(fields, 'EnableNFTables', false);
  return Object.freeze({ enableIPv4, enableIPv6, ipv4, ipv6, backend, enableNFTables, text });
}

/** The enabled families' configs, IPv4 first. */
export function familyConfigs(cfg: NetConfig): FamilyConfig[] {
  return [cfg.ipv4, cfg.ipv6].filter((f): f is FamilyConfig => f !== null);
}

/**
 * Whether `subnet` is one this config can hand out: same family, inside Network, prefix ==
 * SubnetLen, aligned, and between SubnetMin and SubnetMax (inclusive).
 */
export function subnetFits(cfg: FamilyConfig, subnet: IPNet): boolean {
  return (
    subnet.family === cfg.network.family &&
    subnet.prefix === cfg.subnetLen &&
    isAligned(subnet) &&
    containsNet(cfg.network, subnet) &&
    subnet.addr >= cfg.subnetMin &&
    subnet.addr <= cfg.subnetMax
  );
}

function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** Known fields by canonical name, read as Go does (jsonField). */
function pickFields(doc: Record<string, unknown>): Map<Field, unknown> {
  const out = new Map<Field, unknown>();
  for (const field of FIELDS) {
    const value = jsonField(doc, field);
    if (value !== undefined) out.set(field, value);
  }
  return out;
}

function readBool(fields: Map<Field, unknown>, field: Field, dflt: boolean): boolean {
  const v = fields.get(field);
  if (v === undefined) return dflt;
  if (typeof v !== 'boolean') throw configError(field, 'must be true or false');
  return v;
}

/** A family's fields as written (format-checked only); 0 / null mean "not set", as in flannel. */
interface RawFamily {
  readonly network: IPNet | null;
  readonly subnetLen: number;
  readonly subnetMin: bigint;
  readonly subnetMax: bigint;
}

function readFamilyFields(fields: Map<Field, unknown>, r: FamilyRules): RawFamily {
  return {
    network: readNetwork(fields, r),
    subnetLen: readSubnetLen(fields, r),
    subnetMin: readAddress(fields, r.minField, r.family),
    subnetMax: readAddress(fields, r.maxField, r.family),
  };
}

function readNetwork(fields: Map<Field, unknown>, r: FamilyRules): IPNet | null {
  const v = fields.get(r.networkField);
  if (v === undefined) return null;
  const net = typeof v === 'string' ? parseCIDR(v) : null;
  if (net === null || net.family !== r.family) {
    throw configError(r.networkField, `must be an IPv${r.family} CIDR such as "${r.example}"`);
  }
  // Go's net.ParseCIDR keeps the network, not the address as written: 10.3.5.0/16 is 10.3.0.0/16.
  return Object.freeze(canonical(net));
}

function readSubnetLen(fields: Map<Field, unknown>, r: FamilyRules): number {
  const v = fields.get(r.lenField);
  if (v === undefined) return 0;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < 0) {
    throw configError(r.lenField, 'must be a whole number');
  }
  return v;
}

/** An address field; 0 (absent, or the zero address) means "use the default", as flannel. */
function readAddress(fields: Map<Field, unknown>, field: Field, family: Family): bigint {
  const v = fields.get(field);
  if (v === undefined) return 0n;
  const ip = typeof v === 'string' ? parseIP(v) : null;
  if (ip === null || ip.family !== family) {
    throw configError(field, `must be an IPv${family} address`);
  }
  return ip.addr;
}

function checkFamily(raw: RawFamily, r: FamilyRules): FamilyConfig {
  const { network } = raw;
  if (network === null) {
    throw configError(r.networkField, `is required (e.g. "${r.example}")`);
  }
  if (network.addr === 0n && network.prefix === 0) {
    // flannel treats the zero network as unset ("please define a correct Network parameter").
    throw configError(r.networkField, `must not be the zero network (e.g. "${r.example}")`);
  }
  const total = bits(r.family);
  let subnetLen = raw.subnetLen;
  if (subnetLen > 0) {
    if (subnetLen > r.maxSubnetLen) throw configError(r.lenField, `must be <= ${r.maxSubnetLen}`);
    const least = network.prefix + MIN_SUBNETS_LOG2;
    if (subnetLen < least) {
      throw configError(
        r.lenField,
        `must be >= ${least} so that ${r.networkField} ${formatCIDR(network)} holds at least 4 subnets`,
      );
    }
  } else {
    const smallest = r.maxSubnetLen - MIN_SUBNETS_LOG2;
    if (network.prefix > smallest) {
      throw configError(
        r.networkField,
        `is too small: the prefix must be /${smallest} or shorter (got /${network.prefix})`,
      );
    }
    subnetLen =
      network.prefix <= r.defaultSubnetLen - MIN_SUBNETS_LOG2
        ? r.defaultSubnetLen
        : network.prefix + MIN_SUBNETS_LOG2;
  }

  const subnetSize = 1n << BigInt(total - subnetLen);
  const networkEnd = network.addr + sizeOf(network);
  const inNetwork = (addr: bigint) => containsIP(network, { family: r.family, addr });
  const mask = maskOf(r.family, subnetLen);

  let subnetMin = raw.subnetMin;
  if (subnetMin === 0n) subnetMin = network.addr + subnetSize;
  else if (!inNetwork(subnetMin)) {
    throw configError(r.minField, `must be inside ${r.networkField} ${formatCIDR(network)}`);
  }
  let subnetMax = raw.subnetMax;
  if (subnetMax === 0n) subnetMax = networkEnd - subnetSize;
  else if (!inNetwork(subnetMax)) {
    throw configError(r.maxField, `must be inside ${r.networkField} ${formatCIDR(network)}`);
  }
  for (const [field, addr] of [
    [r.minField, subnetMin],
    [r.maxField, subnetMax],
  ] as const) {
    if ((addr & mask) !== addr) {
      throw configError(
        field,
        `must be on a ${r.lenField} /${subnetLen} boundary (got ${formatIP(r.family, addr)})`,
      );
    }
  }
  if (subnetMin > subnetMax) {
    throw configError(
      r.minField,
      `must not be above ${r.maxField} (${formatIP(r.family, subnetMin)} > ${formatIP(r.family, subnetMax)})`,
    );
  }
  return Object.freeze({ network, subnetLen, subnetMin, subnetMax });
}

function readBackend(v: unknown): BackendConfig {
  if (v === undefined) return Object.freeze({ type: 'udp', raw: Object.freeze({}) });
  if (!isPlainObject(v))
    throw configError('Backend', 'must be an object such as {"Type": "vxlan"}');
  const type = jsonField(v, 'Type');
  if (typeof type !== 'string' || type === '') {
    throw configError('Backend.Type', 'must be a non-empty string such as "vxlan"');
  }
  // flannel looks backends up by lower-cased name.
  return Object.freeze({ type: type.toLowerCase(), raw: deepFreeze(v) });
}

function deepFreeze<T>(v: T): T {
  if (typeof v === 'object' && v !== null && !Object.isFrozen(v)) {
    for (const child of Object.values(v)) deepFreeze(child);
    Object.freeze(v);
  }
  return v;
}
