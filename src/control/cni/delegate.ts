/**
 * Turns the plugin's config plus this node's subnet.env into the delegate's config, flannel's
 * way (flannel-io/cni-plugin doCmdAdd/getDelegateIPAM). For subnet.env
 *
 *   FLANNEL_NETWORK=10.5.0.0/16  FLANNEL_SUBNET=10.5.38.1/24  FLANNEL_MTU=1450  FLANNEL_IPMASQ=true
 *
 * and `{"name":"cbr0","cniVersion":"1.0.0","delegate":{"hairpinMode":true}}` the delegate is
 *
 *   {"cniVersion":"1.0.0","hairpinMode":true,"ipMasq":false,"isGateway":true,"mtu":1450,
 *    "name":"cbr0","type":"bridge",
 *    "ipam":{"ranges":[[{"subnet":"10.5.38.0/24"}]],"routes":[{"dst":"10.5.0.0/16"}],"type":"host-local"}}
 *
 * Rules: keys the delegate sets win over ipMasq/mtu/isGateway (flannel's "if absent");
 * `name`, `cniVersion`, `ipam` and `runtimeConfig` always come from the plugin config;
 * ipam keeps its other keys (type default host-local, dataDir, ...), `ranges` is replaced by the
 * node's subnet(s), `routes` gets the cluster network(s) appended. Keys are written sorted, as
 * Go's encoding/json writes maps, so the cache file reads the same as one flannel wrote — and a
 * cache flannel wrote replays the same under weft.
 */
import { WeftError } from '../../common/errors.js';
import { canonical, formatCIDR, parseCIDR, sameNet, type IPNet } from '../../common/ip.js';
import { parseSubnetEnvText, subnetEnvFromText, type SubnetEnv } from '../subnet-env.js';
import type { CniConfig, JsonObject } from './cni-config.js';
import { isObject } from './cni-config.js';
import { CNI_ERR, CniError } from './cni-error.js';

export const DEFAULT_DELEGATE_TYPE = 'bridge';
export const DEFAULT_IPAM_TYPE = 'host-local';

/**
 * subnet.env as the plugin needs it. flannel lets FLANNEL_NETWORK / FLANNEL_IPV6_NETWORK hold a
 * comma-separated list (one route each); weft's daemon writes one network, but a list is read
 * here too, so a subnet.env written by flanneld works.
 */
export interface CniSubnetEnv extends SubnetEnv {
  networks: IPNet[];
  ipv6Networks: IPNet[];
}

const NETWORK_VARS = ['FLANNEL_NETWORK', 'FLANNEL_IPV6_NETWORK'] as const;

function networkList(value: string | undefined, name: string, path: string): IPNet[] {
  const out: IPNet[] = [];
  for (const part of (value ?? '').split(',')) {
    const text = part.trim();
    if (!text) continue;
    const net = parseCIDR(text);
    if (!net)
      throw new CniError(
        CNI_ERR.SUBNET_ENV_INVALID,
        `${path}: ${name}=${value} is not a CIDR list`,
      );
    const c = canonical(net);
    if (!out.some((n) => sameNet(n, c))) out.push(c);
  }
  return out;
}

/**
 * Checks subnet.env's text the way flannel does (a network, a subnet, the MTU and the masq flag
 * must all be there, v4 or v6) and parses it with the daemon's own reader. Missing values mean
 * the daemon has not finished starting: code 11, so the runtime retries.
 */
export function subnetEnvForCni(text: string, path: string): CniSubnetEnv {
  const vars = parseSubnetEnvText(text);
  const has = (k: string): boolean => (vars[k] ?? '') !== '';
  const missing: string[] = [];
  if (!has('FLANNEL_NETWORK') && !has('FLANNEL_IPV6_NETWORK'))
    missing.push('FLANNEL_NETWORK', 'FLANNEL_IPV6_NETWORK');
  if (!has('FLANNEL_SUBNET') && !has('FLANNEL_IPV6_SUBNET'))
    missing.push('FLANNEL_SUBNET', 'FLANNEL_IPV6_SUBNET');
  if (!has('FLANNEL_MTU')) missing.push('FLANNEL_MTU');
  if (!has('FLANNEL_IPMASQ')) missing.push('FLANNEL_IPMASQ');
  if (missing.length > 0) {
    throw new CniError(
      CNI_ERR.TRY_AGAIN_LATER,
      `${path} is missing ${missing.join(', ')}`,
      'the node agent writes this file once it holds a subnet lease: is `weft daemon` (or flanneld) running and ready on this node?',
    );
  }
  const mtu = vars.FLANNEL_MTU ?? '';
  if (!/^\d+$/.test(mtu) || Number(mtu) <= 0 || Number(mtu) > 0xffff) {
    throw new CniError(CNI_ERR.SUBNET_ENV_INVALID, `${path}: FLANNEL_MTU=${mtu} is not an MTU`);
  }
  const networks = networkList(vars.FLANNEL_NETWORK, 'FLANNEL_NETWORK', path);
  const ipv6Networks = networkList(vars.FLANNEL_IPV6_NETWORK, 'FLANNEL_IPV6_NETWORK', path);
  // The daemon's reader takes one network per family: hand it the rest of the file.
  const rest = text
    .split('\n')
    .filter((l) => !NETWORK_VARS.some((k) => l.trim().startsWith(`${k}=`)))
    .join('\n');
  try {
    const env = subnetEnvFromText(rest, path);
    return {
      ...env,
      network: networks[0] ?? null,
      ipv6Network: ipv6Networks[0] ?? null,
      networks,
      ipv6Networks,
    };
  } catch (err) {
    if (err instanceof WeftError) {
      throw new CniError(CNI_ERR.SUBNET_ENV_INVALID, err.message, '', { cause: err });
    }
    throw err;
  }
}

function route(net: IPNet): JsonObject {
  return { dst: formatCIDR(canonical(net)) };
}

export function renderIpam(conf: CniConfig, env: CniSubnetEnv): JsonObject {
  const ipam: JsonObject = { ...(conf.ipam ?? {}) };
  if (!('type' in ipam)) ipam.type = DEFAULT_IPAM_TYPE;
  const ranges: JsonObject[][] = [];
  for (const sn of [env.subnet, env.ipv6Subnet]) {
    if (sn) ranges.push([{ subnet: formatCIDR(canonical(sn)) }]);
  }
  ipam.ranges = ranges;
  const routes: unknown[] = Array.isArray(ipam.routes) ? [...(ipam.routes as unknown[])] : [];
  for (const nw of [...env.networks, ...env.ipv6Networks]) routes.push(route(nw));
  ipam.routes = routes;
  return ipam;
}

export function renderDelegate(conf: CniConfig, env: CniSubnetEnv): JsonObject {
  const d: JsonObject = { ...(conf.delegate ?? {}) };
  if (conf.runtimeConfig) d.runtimeConfig = conf.runtimeConfig;
  d.name = conf.name;
  if (!('type' in d)) d.type = DEFAULT_DELEGATE_TYPE;
  // flannel masquerades pod traffic itself with --ip-masq; otherwise the bridge must.
  if (!('ipMasq' in d)) d.ipMasq = !env.ipMasq;
  if (!('mtu' in d)) d.mtu = env.mtu;
  if (d.type === 'bridge' && !('isGateway' in d)) d.isGateway = true;
  if (conf.cniVersion) d.cniVersion = conf.cniVersion;
  d.ipam = renderIpam(conf, env);
  return d;
}

function sortKeys(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(sortKeys);
  if (!isObject(v)) return v;
  const out: JsonObject = {};
  for (const k of Object.keys(v).sort()) out[k] = sortKeys(v[k]);
  return out;
}

/** The delegate config as bytes: object keys sorted (Go's map order), no whitespace. */
export function serializeDelegate(d: JsonObject): string {
  return JSON.stringify(sortKeys(d));
}
