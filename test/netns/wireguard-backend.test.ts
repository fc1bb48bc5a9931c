/**
 * The wireguard backend end to end: two real `weft daemon`s (etcd store, --dataplane-engine
 * native) on Type wireguard, and a third node that runs Debian's wireguard-go set up exactly as
 * flanneld sets up its kernel flannel-wg link (its lease written into etcd by this test):
 *
 *                      underlay br0 10.250.0.254 (etcd)               10.250.0.0/24
 *        ┌───────────────────┼──────────────────────┐
 *   node 0 10.250.0.1     node 1 10.250.0.2      wg node 10.250.0.9
 *   weft daemon           weft daemon            wireguard-go <dev> 10.5.200.0/32, MTU 1420,
 *   TUN flannel-wg        TUN flannel-wg           route 10.5.0.0/16 dev <dev> scope link,
 *   (MTU 1420, /32,       (key: node dir wgkey)    `wg set`: listen-port, private-key, per
 *   route 10.5.0.0/16)                             weft peer its key, endpoint, AllowedIPs,
 *   cni0 ── pod 0.0       cni0 ── pod 1.0          PSK, persistent-keepalive
 *
 * The weft devices, lease and key file as flanneld's; ping and a fixed amount of TCP both ways
 * weft ⇄ weft and weft ⇄ wireguard-go; the wg node's lease with Port (wireguard-go on another
 * port) and without Port (weft uses its own listen port); a wrong PSK carries nothing; a
 * restarted daemon keeps its key (wireguard-go, untouched, handshakes with it again).
 * wireguard-go's device name is unique (its UAPI socket directory is the host's, shared by every
 * namespace); everything else is flanneld's.
 */
import assert from 'node:assert/strict';
import { type ChildProcess, execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { x25519PublicKey } from '../../src/dataplane/index.js';
import { Cluster, ETCD_URL, type Pod, waitFor } from '../../src/testbed/cluster.js';
import { ip, isRoot, nsExec, nsExecAsync, uniqueDev } from '../../src/testbed/netns.js';
import { TCP_FIXED, assertBothWays } from '../helpers/carried.js';
import { sample, scrape } from '../helpers/scrape.js';
import { UAPI_DIR, claimUapiDir, stopWireguardGo } from '../helpers/wireguard-go.js';

const hasWg =
  spawnSync('wireguard-go', ['--version']).status === 0 && spawnSync('wg', ['--help']).status === 0;
const skip = !isRoot()
  ? 'needs root (network namespaces)'
  : !hasWg && 'wireguard-go or wg missing (npm run setup installs them)';
const HEALTH = 10281;
const KEEPALIVE = 25;
const WG = { ip: '10.250.0.9', subnet: '10.5.200.0/24', addr: '10.5.200.0', port: 51900 };
const LEASE_KEY = '/coreos.com/network/subnets/10.5.200.0-24';

interface StoredLease {
  PublicIP: string;
  BackendType?: string;
  BackendData?: { PublicKey: string; Port?: number };
  BackendV6Data?: unknown;
}

const metrics = (ns: string) => scrape(ns, HEALTH);
const ping = (ns: string, dst: string, count = 3) =>
  nsExecAsync(ns, 'ping', ['-c', String(count), '-i', '0.2', '-w', '30', dst], 60_000);

describe('wireguard backend: weft ⇄ weft and weft ⇄ wireguard-go', { skip }, () => {
  const psk = execFileSync('wg', ['genpsk'], { encoding: 'utf8' }).trim();
  let c: Cluster;
  let dir = '';
  let wgNs = '';
  let dev = '';
  let wgGo: ChildProcess | null = null;
  let releaseUapiDir: (() => void) | null = null;
  let goPub = '';
  const pod = (i: number): Pod => c.nodes[i]!.pods[0]!;

  const etcdctl = (...args: string[]) =>
    nsExec(c.underlay, 'etcdctl', ['--endpoints', ETCD_URL, ...args]);
  const leaseOf = (i: number): StoredLease => {
    const sub = c.nodes[i]!.env.FLANNEL_SUBNET!.replace(/\.1\/24$/, '.0-24');
    return JSON.parse(etcdctl('get', '--print-value-only', `/coreos.com/network/subnets/${sub}`));
  };
  const subnetOf = (i: number) => c.nodes[i]!.env.FLANNEL_SUBNET!.replace(/\.1\/24$/, '.0/24');
  /** The wg node's lease, with or without Port (flannel < v0.26.6 wrote none). */
  const writeWgLease = (port: number | null) =>
    etcdctl(
      'put',
      LEASE_KEY,
      JSON.stringify({
        PublicIP: WG.ip,
        PublicIPv6: null,
        BackendType: 'wireguard',
        BackendData: { PublicKey: goPub, ...(port === null ? {} : { Port: port }) },
      }),
    );
  const wgSet = (...args: string[]) => nsExec(wgNs, 'wg', ['set', dev, ...args]);
  /** wireguard-go's peer entry for weft node i, as flanneld's addPeer makes it. */
  const wgPeerArgs = (i: number, pskFile: string) => {
    const l = leaseOf(i);
    return [
      'peer',
      l.BackendData!.PublicKey,
      'endpoint',
      `${l.PublicIP}:${l.BackendData!.Port}`,
      'allowed-ips',
      subnetOf(i),
      'preshared-key',
      pskFile,
      'persistent-keepalive',
      String(KEEPALIVE),
    ];
  };
  /** wireguard-go's latest handshake with weft node i (unix seconds; 0: none). */
  const lastHandshake = (i: number): number => {
    const key = leaseOf(i).BackendData!.PublicKey;
    const line = nsExec(wgNs, 'wg', ['show', dev, 'dump'])
      .trim()
      .split('\n')
      .slice(1)
      .map((l) => l.split('\t'))
      .find((f) => f[0] === key);
    return Number(line?.[4] ?? 0);
  };

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'weft-wg-backend-'));
    releaseUapiDir = await claimUapiDir();
    c = await Cluster.create({
      nodes: 2,
      store: 'etcd',
      backend: { Type: 'wireguard', PSK: psk, PersistentKeepaliveInterval: KEEPALIVE },
      flags: ['--dataplane-engine=native'],
    });
    // the wireguard-go node, as flanneld sets up flannel-wg
    wgNs = c.scope.add();
    c.scope.vethBetween(c.underlay, 'u9', wgNs, 'eth0');
    ip(c.underlay, 'link', 'set', 'u9', 'master', 'br0', 'up');
    ip(wgNs, 'addr', 'add', `${WG.ip}/24`, 'dev', 'eth0');
    ip(wgNs, 'link', 'set', 'eth0', 'up');
    const goPriv = execFileSync('wg', ['genkey'], { encoding: 'utf8' });
    goPub = execFileSync('wg', ['pubkey'], { input: goPriv, encoding: 'utf8' }).trim();
    writeFileSync(join(dir, 'priv'), goPriv, { mode: 0o600 });
    writeFileSync(join(dir, 'psk'), `${psk}\n`, { mode: 0o600 });
    writeFileSync(join(dir, 'wrong-psk'), execFileSync('wg', ['genpsk']), { mode: 0o600 });
    dev = uniqueDev('wg');
    wgGo = c.scope.spawn(wgNs, 'wireguard-go', ['-f', dev], {
      env: { ...process.env, WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD: '1' },
    });
    await waitFor(() => existsSync(join(UAPI_DIR, `${dev}.sock`)), 20_000, 'wireguard-go UAPI');
    wgSet('listen-port', String(WG.port), 'private-key', join(dir, 'priv'));
    for (const i of [0, 1]) wgSet(...wgPeerArgs(i, join(dir, 'psk')));
    ip(wgNs, 'link', 'set', dev, 'mtu', '1420');
    ip(wgNs, 'addr', 'add', `${WG.addr}/32`, 'dev', dev);
    ip(wgNs, 'link', 'set', dev, 'up');
    ip(wgNs, 'route', 'add', '10.5.0.0/16', 'dev', dev, 'scope', 'link');
    writeWgLease(WG.port);
  });
  after(async () => {
    await stopWireguardGo(wgGo);
    await c?.destroy();
    if (dir) rmSync(dir, { recursive: true, force: true });
    releaseUapiDir?.();
  });

  test("the TUN is flanneld's flannel-wg: MTU − 80, the subnet address /32, the Network route", () => {
    for (const i of [0, 1]) {
      assert.match(c.ipIn(i, 'link', 'show', 'flannel-wg'), /mtu 1420/);
      assert.equal(c.nodes[i]!.env.FLANNEL_MTU, '1420');
      const addr = subnetOf(i).replace('/24', '/32');
      assert.match(c.ipIn(i, 'addr', 'show', 'flannel-wg'), new RegExp(`inet ${addr}`));
      assert.match(
        c.ipIn(i, 'route', 'show', '10.5.0.0/16'),
        /^10\.5\.0\.0\/16 dev flannel-wg scope link/m,
      );
    }
  });

  test("the lease is flannel's: BackendType wireguard, BackendData {PublicKey, Port}", () => {
    for (const i of [0, 1]) {
      const l = leaseOf(i);
      assert.equal(l.BackendType, 'wireguard');
      assert.deepEqual(Object.keys(l.BackendData!), ['PublicKey', 'Port']);
      assert.equal(l.BackendData!.Port, 51820);
      assert.equal(l.BackendV6Data, undefined, 'IPv6 is off');
    }
  });

  test('the key file is the node’s, mode 0400, and its public key is the lease’s', () => {
    for (const i of [0, 1]) {
      const path = join(c.nodes[i]!.dir, 'wgkey');
      assert.equal(statSync(path).mode & 0o777, 0o400);
      const priv = Buffer.from(readFileSync(path, 'utf8').trim(), 'base64');
      assert.equal(x25519PublicKey(priv).toString('base64'), leaseOf(i).BackendData!.PublicKey);
    }
  });

  test('each node serves wg show (the UAPI get=1) for flannel-wg: its key, its peers', async () => {
    await ping(pod(0).ns, pod(1).ip);
    // the testbed's daemons keep the sockets in their node directory (WEFT_WIREGUARD_UAPI_DIR)
    const sock = join(c.nodes[0]!.dir, 'wireguard', 'flannel-wg.sock');
    const answer = await new Promise<string>((resolve, reject) => {
      const chunks: Buffer[] = [];
      const s = connect(sock, () => s.write('get=1\n\n'));
      s.on('data', (d) => {
        chunks.push(d);
        if (/errno=-?\d+\n\n$/.test(Buffer.concat(chunks).toString())) {
          s.end();
          resolve(Buffer.concat(chunks).toString());
        }
      });
      s.on('error', reject);
    });
    const hex = (b64: string) => Buffer.from(b64, 'base64').toString('hex');
    const priv = Buffer.from(readFileSync(join(c.nodes[0]!.dir, 'wgkey'), 'utf8').trim(), 'base64');
    assert.match(answer, new RegExp(`^private_key=${priv.toString('hex')}$`, 'm'));
    assert.match(answer, new RegExp(`^public_key=${hex(leaseOf(1).BackendData!.PublicKey)}$`, 'm'));
    assert.match(answer, new RegExp(`^public_key=${hex(goPub)}$`, 'm'));
    assert.match(answer, /^errno=0$/m);
  });

  test('weft ⇄ weft: pods ping and carry a fixed amount of TCP both ways', async () => {
    await ping(pod(0).ns, pod(1).ip);
    await ping(pod(1).ns, pod(0).ip);
    await assertBothWays(c, pod(0), pod(0).ip, pod(1), TCP_FIXED, metrics);
  });

  test('weft ⇄ wireguard-go (lease with Port): ping and a fixed amount of TCP both ways', async () => {
    await ping(pod(0).ns, WG.addr);
    await ping(wgNs, pod(1).ip);
    assert.ok(lastHandshake(0) > 0 && lastHandshake(1) > 0, 'wireguard-go made sessions');
    await assertBothWays(c, pod(0), pod(0).ip, { ns: wgNs, ip: WG.addr }, TCP_FIXED, metrics);
  });

  test("a lease without Port is reached on weft's own listen port", async () => {
    // wireguard-go moves to 51820; weft reaches it there only by the Port-less rule (it sends to
    // the lease's endpoint, never to where a datagram came from)
    wgSet('listen-port', '51820');
    writeWgLease(null);
    await ping(pod(0).ns, WG.addr);
    await ping(pod(1).ns, WG.addr);
  });

  test('a wrong PSK carries nothing', async () => {
    const m0 = await metrics(c.nodes[0]!.ns);
    // the peer made again, with the wrong PSK: no session left on wireguard-go's side
    wgSet('peer', leaseOf(0).BackendData!.PublicKey, 'remove');
    wgSet(...wgPeerArgs(0, join(dir, 'wrong-psk')));
    await assert.rejects(
      nsExecAsync(pod(0).ns, 'ping', ['-c', '3', '-i', '0.3', '-W', '1', WG.addr], 30_000),
      /100% packet loss/,
    );
    // wireguard-go initiates (its new peer has a persistent keepalive to send) and weft answers:
    // the handshake reaches weft, and fails on wireguard-go's side
    const sent = async () =>
      sample(await metrics(c.nodes[0]!.ns), 'weft_dataplane_wg_handshakes_sent_total');
    const sent0 = sample(m0, 'weft_dataplane_wg_handshakes_sent_total');
    await waitFor(async () => (await sent()) > sent0, 30_000, 'weft answered a handshake');
    assert.equal(lastHandshake(0), 0, 'wireguard-go completed no handshake with weft');
    // the right PSK again: it carries
    wgSet(...wgPeerArgs(0, join(dir, 'psk')));
    await ping(pod(0).ns, WG.addr);
  });

  test('a restarted daemon keeps its key, starts early with its peers, and handshakes again', async () => {
    const key = leaseOf(1).BackendData!.PublicKey;
    await c.stopDaemon(1);
    await c.startDaemon(1);
    assert.equal(leaseOf(1).BackendData!.PublicKey, key);
    const msgs = c.nodes[1]!.logs.map((l) => l.msg).join('\n');
    assert.match(msgs, /wireguard key loaded/);
    // fast start: the engine ran on the kept TUN with the last run's peers before the store
    assert.match(msgs, /forwarding with the last run’s peers until the store answers/);
    // the new engine has no session: each of these needs a new handshake
    await ping(pod(1).ns, pod(0).ip);
    await ping(pod(0).ns, pod(1).ip);
    await ping(pod(1).ns, WG.addr);
    await ping(wgNs, pod(1).ip);
  });

  test('a TUN deleted by hand: the new engine greets its peers, which carry again', async () => {
    const sent = async () =>
      sample(await metrics(c.nodes[0]!.ns), 'weft_dataplane_wg_handshakes_sent_total');
    ip(c.nodes[0]!.ns, 'link', 'del', 'flannel-wg');
    await waitFor(
      () => /inet 10\.5\./.test(c.ipIn(0, 'addr', 'show', 'flannel-wg')),
      30_000,
      'flannel-wg back with its address',
    );
    // node 1 and wireguard-go still hold sessions with the engine that went: the new engine
    // (its counters start at 0) initiates to its peers with no traffic of its own to send
    await waitFor(async () => (await sent()) >= 2, 30_000, 'the new engine initiated');
    await ping(pod(1).ns, pod(0).ip);
    await ping(pod(0).ns, pod(1).ip);
  });
});
