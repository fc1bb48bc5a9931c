/**
 * The plugin's network config (JSON on stdin), as flannel's CNI plugin reads it, so a config
 * written for `"type": "flannel"` works unchanged with `"type": "weft"`:
 *
 *   {
 *     "name": "cbr0", "cniVersion": "1.0.0", "type": "weft",
 *     "subnetFile": "/run/flannel/subnet.env",   (default)
 *     "dataDir": "/var/lib/cni/flannel",         (default; the delegate cache)
 *     "delegate": { "hairpinMode": true, "isDefaultGateway": true },
 *     "ipam": { "type": "host-local", "dataDir": "...", "routes": [{ "dst": "0.0.0.0/0" }] },
 *     "runtimeConfig": { ... }
 *   }
 *
 * Parsing is pure: bad input becomes a CniError whose message names the field and the rule.
 */
import { parseCIDR, parseIP } from '../../common/ip.js';
import { CNI_NAME_RE } from './cni-args.js';
import { CNI_ERR, CniError } from './cni-error.js';

export const DEFAULT_SUBNET_FILE = '/run/flannel/subnet.env';
export const DEFAULT_DATA_DIR = '/var/lib/cni/flannel';

/** The CNI spec versions this plugin speaks (VERSION reports them). */
export const SUPPORTED_VERSIONS = ['0.3.0', '0.3.1', '0.4.0', '1.0.0'] as const;
export const CURRENT_VERSION = '1.0.0';
/** What libcni assumes when a config has no cniVersion. */
export const IMPLICIT_VERSION = '0.1.0';

/** Plugin types that are this plugin: delegating to them would call ourselves forever. */
const SELF_TYPES = new Set(['weft', 'flannel']);

export type JsonObject = Record<string, unknown>;

export interface CniConfig {
  name: string;
  /** as written; '' when absent */
  cniVersion: string;
  subnetFile: string;
  dataDir: string;
  /** null when absent (or JSON null) */
  delegate: JsonObject | null;
  ipam: JsonObject | null;
  runtimeConfig: JsonObject | null;
  /** CHECK (and DEL in 1.0) carry the previous result; passed to the delegate on CHECK */
  prevResult: unknown;
}

export function isObject(v: unknown): v is JsonObject {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function invalid(field: string, rule: string): CniError {
  return new CniError(CNI_ERR.INVALID_CONFIG, `${field}: ${rule}`);
}

function optString(o: JsonObject, field: string, dflt: string): string {
  const v = o[field];
  if (v === undefined || v === null || v === '') return dflt;
  if (typeof v !== 'string') throw invalid(field, 'must be a string');
  return v;
}

function optObject(o: JsonObject, field: string): JsonObject | null {
  const v = o[field];
  if (v === undefined || v === null) return null;
  if (!isObject(v)) throw invalid(field, 'must be an object');
  return v;
}

/** "1.0.0" → [1, 0, 0]; null when not a three-part version. */
function parseVersion(v: string): [number, number, number] | null {
  const m = /^(\d+)\.(\d+)\.(\d+)$/.exec(v);
  return m ? [Number(m[1]), Number(m[2]), Number(m[3])] : null;
}

/** a >= b for dotted versions (both already valid). */
export function versionAtLeast(a: string, b: string): boolean {
  const x = parseVersion(a);
  const y = parseVersion(b);
  if (!x || !y) return false;
  for (let i = 0; i < 3; i++) {
    if (x[i]! !== y[i]!) return x[i]! > y[i]!;
  }
  return true;
}

/** Throws code 6 (not a version) or 1 (a version this plugin does not speak). */
export function checkVersion(cniVersion: string): void {
  const v = cniVersion || IMPLICIT_VERSION;
  if (!parseVersion(v)) {
    throw new CniError(
      CNI_ERR.DECODING_FAILURE,
      `cniVersion: ${JSON.stringify(v)} is not a version`,
    );
  }
  if (!(SUPPORTED_VERSIONS as readonly string[]).includes(v)) {
    throw new CniError(
      CNI_ERR.INCOMPATIBLE_VERSION,
      'incompatible CNI versions',
      `config is ${JSON.stringify(v)}, plugin supports ${JSON.stringify(SUPPORTED_VERSIONS)}`,
    );
  }
}

function checkRoutes(ipam: JsonObject): void {
  const routes = ipam.routes;
  if (routes === undefined || routes === null) return;
  if (!Array.isArray(routes)) throw invalid('ipam.routes', 'must be an array');
  routes.forEach((r: unknown, i) => {
    const at = `ipam.routes[${i}]`;
    if (!isObject(r)) throw invalid(at, 'must be an object');
    if (typeof r.dst !== 'string' || !parseCIDR(r.dst))
      throw invalid(`${at}.dst`, 'must be a CIDR');
    if (r.gw !== undefined && r.gw !== null && (typeof r.gw !== 'string' || !parseIP(r.gw))) {
      throw invalid(`${at}.gw`, 'must be an IP address');
    }
  });
}

function checkDelegate(d: JsonObject): void {
  // flannel's three rules, then weft's: the type names a plugin file, and not this plugin.
  if ('type' in d && typeof d.type !== 'string') {
    throw invalid(
      'delegate.type',
      "'delegate' dictionary, if present, must have (string) 'type' field",
    );
  }
  if ('name' in d) {
    throw invalid(
      'delegate.name',
      "'delegate' dictionary must not have 'name' field, it'll be set by flannel",
    );
  }
  if ('ipam' in d) {
    throw invalid(
      'delegate.ipam',
      "'delegate' dictionary must not have 'ipam' field, it'll be set by flannel",
    );
  }
  if (typeof d.type === 'string') {
    if (!CNI_NAME_RE.test(d.type))
      throw invalid('delegate.type', `${JSON.stringify(d.type)} is not a plugin name`);
    if (SELF_TYPES.has(d.type)) throw invalid('delegate.type', `must not be ${d.type} itself`);
  }
}

/** Parses stdin. Not JSON → code 6; a field breaking a rule → code 7 naming the field. */
export function parseCniConfig(text: string): CniConfig {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (err) {
    throw new CniError(
      CNI_ERR.DECODING_FAILURE,
      `error unmarshalling network config: ${(err as Error).message}`,
      '',
      { cause: err },
    );
  }
  if (!isObject(raw))
    throw new CniError(CNI_ERR.DECODING_FAILURE, 'network config must be a JSON object');
  const name = raw.name;
  if (name === undefined || name === null || name === '')
    throw invalid('name', 'missing network name');
  if (typeof name !== 'string') throw invalid('name', 'must be a string');
  if (!CNI_NAME_RE.test(name)) throw invalid('name', 'invalid characters found in network name');
  const cniVersion = optString(raw, 'cniVersion', '');
  const conf: CniConfig = {
    name,
    cniVersion,
    subnetFile: optString(raw, 'subnetFile', DEFAULT_SUBNET_FILE),
    dataDir: optString(raw, 'dataDir', DEFAULT_DATA_DIR),
    delegate: optObject(raw, 'delegate'),
    ipam: optObject(raw, 'ipam'),
    runtimeConfig: optObject(raw, 'runtimeConfig'),
    prevResult: raw.prevResult,
  };
  if (conf.delegate) checkDelegate(conf.delegate);
  if (conf.ipam) {
    if ('type' in conf.ipam && typeof conf.ipam.type !== 'string')
      throw invalid('ipam.type', 'must be a string');
    checkRoutes(conf.ipam);
  }
  return conf;
}
