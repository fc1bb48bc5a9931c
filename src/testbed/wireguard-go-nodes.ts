/**
 * flanneld's wireguard backend reproduced on a testbed cluster without weft: on each node,
 * Debian's `wireguard-go` configured exactly as flanneld configures its kernel `flannel-wg` link
 * (pkg/backend/wireguard), and a pod behind a bridge as flannel's CNI makes it. The bench's
 * `wireguard-go` row (bench/run.ts) measures it beside weft's `wireguard` row.
 *
 *   node i (eth0 10.250.0.<i+1>)
 *     wireguard-go <unique dev>: listen-port 51820, private-key (wg genkey), MTU = eth0 − 80,
 *       10.5.<i+1>.0/32, route 10.5.0.0/16 dev <dev> scope link;
 *       per other node j: peer <its key> endpoint 10.250.0.<j+1>:51820 allowed-ips 10.5.<j+1>.0/24
 *     cni0 10.5.<i+1>.1/24 (MTU as the device) ── pod 10.5.<i+1>.2, default route via cni0
 *
 * The device name is unique per node (wireguard-go's UAPI sockets share the host's
 * /var/run/wireguard); each wireguard-go runs as the node's `daemon`, so its CPU is counted and
 * Cluster.destroy() stops it with SIGTERM (it then removes its socket). The caller removes
 * /var/run/wireguard afterwards if it made it (`removeUapiDirIfMade`).
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, readdirSync, rmdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { CLUSTER_NETWORK, type Cluster, type Pod, waitFor } from './cluster.js';
import { ip, nsExec, uniqueDev } from './netns.js';

export const WG_UAPI_DIR = '/var/run/wireguard';
const PORT = 51820;

/** Whether Debian's wireguard-go and wg are installed. */
export function haveWireguardGo(): boolean {
  return (
    spawnSync('wireguard-go', ['--version']).status === 0 &&
    spawnSync('wg', ['--help']).status === 0
  );
}

/** Removes the UAPI directory when it was not there before (`wasThere`) and is empty. */
export function removeUapiDirIfMade(wasThere: boolean): void {
  if (!wasThere && existsSync(WG_UAPI_DIR) && readdirSync(WG_UAPI_DIR).length === 0)
    rmdirSync(WG_UAPI_DIR);
}

/** Sets up every node of `c` (built, no daemon) as a flanneld wireguard node; returns the pods. */
export async function startWireguardGoNodes(c: Cluster, mtu = 1500): Promise<Pod[]> {
  if (!haveWireguardGo())
    throw new Error('wireguard-go or wg missing (npm run setup installs them)');
  const wg = (args: string[], input?: string) =>
    execFileSync('wg', args, { encoding: 'utf8', ...(input ? { input } : {}) }).trim();
  const nodes = c.nodes.map((n, i) => {
    const priv = wg(['genkey']);
    const keyFile = join(c.dir, `wg-node${i}.key`);
    writeFileSync(keyFile, `${priv}\n`, { mode: 0o600 });
    return { n, keyFile, pub: wg(['pubkey'], `${priv}\n`), dev: uniqueDev('wg'), net: i + 1 };
  });
  for (const x of nodes) {
    x.n.daemon = c.scope.spawn(x.n.ns, 'wireguard-go', ['-f', x.dev], {
      env: { ...process.env, WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD: '1' },
      stdio: 'ignore',
    });
  }
  for (const x of nodes)
    await waitFor(
      () => existsSync(join(WG_UAPI_DIR, `${x.dev}.sock`)),
      20_000,
      'wireguard-go UAPI',
    );
  const devMtu = String(mtu - 80);
  const pods: Pod[] = [];
  for (const x of nodes) {
    const ns = x.n.ns;
    const peers = nodes
      .filter((y) => y !== x)
      .flatMap((y) => [
        'peer',
        y.pub,
        'endpoint',
        `${y.n.ip}:${PORT}`,
        'allowed-ips',
        `10.5.${y.net}.0/24`,
      ]);
    nsExec(ns, 'wg', [
      'set',
      x.dev,
      'listen-port',
      String(PORT),
      'private-key',
      x.keyFile,
      ...peers,
    ]);
    ip(ns, 'link', 'set', x.dev, 'mtu', devMtu);
    ip(ns, 'addr', 'add', `10.5.${x.net}.0/32`, 'dev', x.dev);
    ip(ns, 'link', 'set', x.dev, 'up');
    ip(ns, 'route', 'add', CLUSTER_NETWORK, 'dev', x.dev, 'scope', 'link');
    ip(ns, 'link', 'add', 'cni0', 'type', 'bridge');
    ip(ns, 'addr', 'add', `10.5.${x.net}.1/24`, 'dev', 'cni0');
    ip(ns, 'link', 'set', 'cni0', 'mtu', devMtu, 'up');
    const pns = c.scope.add();
    c.scope.vethBetween(ns, 'p0', pns, 'eth0');
    ip(ns, 'link', 'set', 'p0', 'master', 'cni0', 'mtu', devMtu, 'up');
    ip(pns, 'addr', 'add', `10.5.${x.net}.2/24`, 'dev', 'eth0');
    ip(pns, 'link', 'set', 'eth0', 'mtu', devMtu, 'up');
    ip(pns, 'route', 'add', 'default', 'via', `10.5.${x.net}.1`);
    const pod: Pod = {
      name: `pod${x.n.index}.0`,
      ns: pns,
      node: x.n.index,
      ip: `10.5.${x.net}.2`,
      ip6: null,
    };
    x.n.pods.push(pod);
    pods.push(pod);
  }
  return pods;
}
