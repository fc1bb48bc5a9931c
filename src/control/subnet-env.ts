/**
 * subnet.env, the file the CNI plugin reads (default /run/flannel/subnet.env): KEY=VALUE lines,
 * no quotes, written atomically (temp file + fsync + rename) with mode 0644.
 *
 *   FLANNEL_NETWORK=10.5.0.0/16
 *   FLANNEL_SUBNET=10.5.38.1/24          (the subnet's first address, with the prefix)
 *   FLANNEL_IPV6_NETWORK=fc00::/48       (when IPv6 is enabled)
 *   FLANNEL_IPV6_SUBNET=fc00:0:0:5d::1/64
 *   FLANNEL_MTU=1450
 *   FLANNEL_IPMASQ=true
 */
import { mkdir, open, readFile, rename, unlink } from 'node:fs/promises';
import { dirname, join, basename } from 'node:path';
import { WeftError } from '../common/errors.js';
import {
  canonical,
  formatCIDR,
  formatIP,
  nthAddress,
  parseCIDR,
  type IPNet,
} from '../common/ip.js';

export interface SubnetEnv {
  network: IPNet | null;
  subnet: IPNet | null;
  ipv6Network: IPNet | null;
  ipv6Subnet: IPNet | null;
  mtu: number;
  ipMasq: boolean;
}

function gatewayForm(net: IPNet): string {
  return `${formatIP(net.family, nthAddress(net, 1n).addr)}/${net.prefix}`;
}

export function renderSubnetEnv(env: SubnetEnv): string {
  const lines: string[] = [];
  if (env.network) lines.push(`FLANNEL_NETWORK=${formatCIDR(env.network)}`);
  if (env.subnet) lines.push(`FLANNEL_SUBNET=${gatewayForm(env.subnet)}`);
  if (env.ipv6Network) lines.push(`FLANNEL_IPV6_NETWORK=${formatCIDR(env.ipv6Network)}`);
  if (env.ipv6Subnet) lines.push(`FLANNEL_IPV6_SUBNET=${gatewayForm(env.ipv6Subnet)}`);
  lines.push(`FLANNEL_MTU=${env.mtu}`);
  lines.push(`FLANNEL_IPMASQ=${env.ipMasq}`);
  return lines.join('\n') + '\n';
}

/** Parses the KEY=VALUE lines; unknown keys and comments are ignored. */
export function parseSubnetEnvText(text: string): Record<string, string> {
  const vars: Record<string, string> = {};
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (!line || line.startsWith('#')) continue;
    const eq = line.indexOf('=');
    if (eq <= 0) continue;
    vars[line.slice(0, eq).trim()] = line.slice(eq + 1).trim();
  }
  return vars;
}

function cidrVar(vars: Record<string, string>, name: string, path: string): IPNet | null {
  const v = vars[name];
  if (v === undefined || v === '') return null;
  const net = parseCIDR(v);
  if (!net) throw new WeftError('WEFT_ERR_SUBNET_ENV', `${path}: ${name}=${v} is not a CIDR`);
  return name.endsWith('SUBNET') ? canonical(net) : net;
}

/** Reads subnet.env back; subnets come back as their network address (10.5.38.0/24). */
export function subnetEnvFromText(text: string, path = 'subnet.env'): SubnetEnv {
  const vars = parseSubnetEnvText(text);
  const mtu = Number(vars.FLANNEL_MTU ?? '0');
  return {
    network: cidrVar(vars, 'FLANNEL_NETWORK', path),
    subnet: cidrVar(vars, 'FLANNEL_SUBNET', path),
    ipv6Network: cidrVar(vars, 'FLANNEL_IPV6_NETWORK', path),
    ipv6Subnet: cidrVar(vars, 'FLANNEL_IPV6_SUBNET', path),
    mtu: Number.isInteger(mtu) ? mtu : 0,
    ipMasq: vars.FLANNEL_IPMASQ === 'true',
  };
}

export async function readSubnetEnv(path: string): Promise<SubnetEnv | null> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw new WeftError('WEFT_ERR_SUBNET_ENV', `read ${path}: ${(err as Error).message}`, {
      cause: err,
    });
  }
  return subnetEnvFromText(text, path);
}

/** Atomic write: temp file in the same directory, fsync, rename over, mode 0644. */
export async function writeFileAtomic(path: string, data: string, mode = 0o644): Promise<void> {
  const dir = dirname(path);
  await mkdir(dir, { recursive: true });
  const tmp = join(dir, `.${basename(path)}.${process.pid}.${Date.now()}.tmp`);
  const fh = await open(tmp, 'w', mode);
  try {
    await fh.writeFile(data);
    await fh.chmod(mode);
    await fh.sync();
  } finally {
    await fh.close();
  }
  try {
    await rename(tmp, path);
  } catch (err) {
    await unlink(tmp).catch(() => {});
    throw err;
  }
}

export async function writeSubnetEnv(path: string, env: SubnetEnv): Promise<void> {
  try {
    await writeFileAtomic(path, renderSubnetEnv(env));
  } catch (err) {
    throw new WeftError('WEFT_ERR_SUBNET_ENV', `write ${path}: ${(err as Error).message}`, {
      cause: err,
    });
  }
}
