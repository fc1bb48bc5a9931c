/**
 * weft's WireGuard protocol code (native/src/wg_*.cc, driven by test/helpers/wireguard-peer.ts
 * through the addon's wgDevice test export) against a real Debian `wireguard-go`, over UDP on
 * the loopback of a namespace each test creates:
 *
 *   namespace weft-<pid>-<n> (lo up, nothing else)
 *   ┌─────────────────────────────────────────────────────────────────────────────────────┐
 *   │  wireguard-go <dev> 10.99.0.1/24            node wireguard-peer.ts (weft's C++)     │
 *   │  key W, peer = weft's key, PSK, AllowedIPs  key O, peer = W, PSK                     │
 *   │  10.99.0.2/32, endpoint 127.0.0.1:51821     answers pings to 10.99.0.2              │
 *   │  listen-port 51820  ◄──────── UDP on lo ────────►  127.0.0.1:51821                  │
 *   └─────────────────────────────────────────────────────────────────────────────────────┘
 *
 * Each side initiates once: a kernel `ping` through wireguard-go's device is answered by weft
 * (wireguard-go initiates), and weft's own ICMP echo gets the namespace kernel's reply through
 * wireguard-go (weft initiates); weft under load answers wireguard-go's first initiation with a
 * cookie reply (XChaCha20-Poly1305) that wireguard-go takes, its retry carrying a mac2 weft
 * accepts; with a wrong PSK the handshake fails at the initiator and
 * wireguard-go records no session. Keys and PSK come from `wg genkey` / `wg genpsk`; weft's
 * public key as `wg pubkey` computes it.
 */
import assert from 'node:assert/strict';
import { type ChildProcess, execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, it } from 'node:test';
import { loadNative } from '../../src/common/native.js';
import { PACKAGE_ROOT, waitFor } from '../../src/testbed/cluster.js';
import { UAPI_DIR, claimUapiDir, stopWireguardGo } from '../helpers/wireguard-go.js';
import { NetnsScope, ip, isRoot, nsExec, nsExecAsync, uniqueDev } from '../../src/testbed/netns.js';

const native = loadNative();
const hasWg =
  spawnSync('wireguard-go', ['--version']).status === 0 && spawnSync('wg', ['--help']).status === 0;
const skip = !isRoot()
  ? 'needs root (network namespaces, /dev/net/tun)'
  : !hasWg
    ? 'wireguard-go or wg missing (npm run setup installs wireguard-go and wireguard-tools)'
    : false;
const WG_PORT = 51820;
const OUR_PORT = 51821;

interface Peer {
  ns: string;
  dev: string;
  child: ChildProcess;
  lines: Array<Record<string, unknown>>;
}

const wgTool = (args: string[], input?: string): string =>
  execFileSync('wg', args, { encoding: 'utf8', input }).trim();

let scope: NetnsScope | null = null;
let releaseUapiDir: (() => void) | null = null;
let wireguardGo: ChildProcess | null = null;
let dir = '';

afterEach(async () => {
  await stopWireguardGo(wireguardGo);
  wireguardGo = null;
  await scope?.cleanup();
  scope = null;
  if (dir) rmSync(dir, { recursive: true, force: true });
  dir = '';
  releaseUapiDir?.();
  releaseUapiDir = null;
});

/** wireguard-go and weft's peer in a new namespace, keyed and configured; see the drawing. */
async function setup(opts: {
  initiate: boolean;
  wrongPsk?: boolean;
  underLoad?: boolean;
}): Promise<Peer> {
  scope = new NetnsScope();
  const ns = scope.add();
  const dev = uniqueDev('g');
  dir = mkdtempSync(join(tmpdir(), 'weft-wg-'));
  releaseUapiDir = await claimUapiDir();

  const wgPriv = wgTool(['genkey']);
  const wgPub = wgTool(['pubkey'], wgPriv + '\n');
  const ourPriv = wgTool(['genkey']);
  const ourPub = native.wgCrypto('publicKey', Buffer.from(ourPriv, 'base64'))!.toString('base64');
  assert.equal(ourPub, wgTool(['pubkey'], ourPriv + '\n'), 'weft and wg derive the same key');
  const psk = wgTool(['genpsk']);
  const ourPsk = opts.wrongPsk ? wgTool(['genpsk']) : psk;
  writeFileSync(join(dir, 'priv'), wgPriv + '\n', { mode: 0o600 });
  writeFileSync(join(dir, 'psk'), psk + '\n', { mode: 0o600 });

  wireguardGo = scope.spawn(ns, 'wireguard-go', ['-f', dev], {
    env: {
      ...process.env,
      WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD: '1',
      LOG_LEVEL: 'verbose',
    },
  });
  await waitFor(() => existsSync(join(UAPI_DIR, `${dev}.sock`)), 20_000, 'wireguard-go UAPI');
  nsExec(ns, 'wg', [
    'set',
    dev,
    'listen-port',
    String(WG_PORT),
    'private-key',
    join(dir, 'priv'),
    'peer',
    ourPub,
    'preshared-key',
    join(dir, 'psk'),
    'endpoint',
    `127.0.0.1:${OUR_PORT}`,
    'allowed-ips',
    '10.99.0.2/32',
  ]);
  ip(ns, 'addr', 'add', '10.99.0.1/24', 'dev', dev);
  ip(ns, 'link', 'set', dev, 'up');

  const cfg = {
    privateKey: ourPriv,
    peerPublicKey: wgPub,
    psk: ourPsk,
    port: OUR_PORT,
    peerPort: WG_PORT,
    ourIp: '10.99.0.2',
    peerIp: '10.99.0.1',
    initiate: opts.initiate,
    underLoad: opts.underLoad ?? false,
  };
  const child = scope.spawn(
    ns,
    process.execPath,
    ['--import', 'tsx', join(PACKAGE_ROOT, 'test/helpers/wireguard-peer.ts'), JSON.stringify(cfg)],
    { cwd: PACKAGE_ROOT },
  );
  const lines: Array<Record<string, unknown>> = [];
  let buf = '';
  child.stdout!.on('data', (d: Buffer) => {
    buf += d.toString();
    for (let i = buf.indexOf('\n'); i >= 0; i = buf.indexOf('\n')) {
      lines.push(JSON.parse(buf.slice(0, i)) as Record<string, unknown>);
      buf = buf.slice(i + 1);
    }
  });
  await waitFor(() => lines.some((l) => l.event === 'listening'), 30_000, 'weft peer listening');
  return { ns, dev, child, lines };
}

const has = (p: Peer, key: string, value: string) => p.lines.some((l) => l[key] === value);

/** wireguard-go's view of its one peer (`wg show <dev> dump`): latest handshake and bytes. */
function wgPeer(p: Peer): { handshake: number; rx: number; tx: number } {
  const rows = nsExec(p.ns, 'wg', ['show', p.dev, 'dump']).trim().split('\n');
  const f = rows[1]!.split('\t');
  return { handshake: Number(f[4]), rx: Number(f[5]), tx: Number(f[6]) };
}

/**
 * Whether `ping -c 1 -w N` got its reply: with -w, ping sends one request a second until a reply
 * comes, so the requests queued behind a slow handshake may all be answered at once ("2
 * received"); any count but 0 is the reply.
 */
function answered(out: string): void {
  assert.match(out, /\b[1-9]\d* received/);
}

describe('WireGuard interop with wireguard-go', { skip }, () => {
  it('wireguard-go initiates: weft answers the handshake and the ping through the tunnel', async () => {
    const p = await setup({ initiate: false });
    // -w: up to 20 s for the reply (the first packet waits for the handshake)
    const out = await nsExecAsync(p.ns, 'ping', ['-c', '1', '-w', '20', '10.99.0.2'], 30_000);
    answered(out);
    assert.ok(has(p, 'verdict', 'response'), 'weft took the initiation and answered');
    assert.ok(has(p, 'verdict', 'data'), 'weft decrypted wireguard-go data');
    assert.ok(has(p, 'event', 'echo_request'));
    const s = wgPeer(p);
    assert.ok(s.handshake > 0, 'wireguard-go completed the handshake');
    assert.ok(s.rx > 0 && s.tx > 0);
  });

  it('weft under load: wireguard-go takes weft’s cookie reply and retries with a valid mac2', async () => {
    const p = await setup({ initiate: false, underLoad: true });
    // the retry comes with wireguard-go's retransmission, REKEY_TIMEOUT (5 s) later
    const out = await nsExecAsync(p.ns, 'ping', ['-c', '1', '-w', '30', '10.99.0.2'], 40_000);
    answered(out);
    const verdicts = p.lines.map((l) => l.verdict).filter((v) => v !== undefined);
    const cookie = verdicts.indexOf('cookie_reply');
    assert.ok(cookie >= 0, `weft sent a cookie reply: ${verdicts.join(' ')}`);
    assert.ok(verdicts.indexOf('response') > cookie, 'then took an initiation with mac2');
  });

  it('weft initiates: wireguard-go answers and carries weft’s ping to its kernel and back', async () => {
    const p = await setup({ initiate: true });
    await waitFor(
      () => has(p, 'event', 'echo_reply'),
      20_000,
      'the echo reply through wireguard-go',
    );
    assert.ok(has(p, 'verdict', 'handshake_done'), 'weft took wireguard-go’s response');
    const reply = p.lines.find((l) => l.event === 'echo_reply')!;
    assert.equal(reply.src, '10.99.0.1');
    assert.equal(reply.data, 'weft wireguard interop');
    assert.ok(wgPeer(p).handshake > 0);
  });

  it('a wrong PSK: weft refuses wireguard-go’s response; no session on either side', async () => {
    const p = await setup({ initiate: true, wrongPsk: true });
    await waitFor(() => has(p, 'verdict', 'drop_handshake'), 20_000, 'the refused response');
    assert.ok(!has(p, 'verdict', 'handshake_done'));
    // wireguard-go completes a responder handshake only on the initiator's first transport packet
    assert.equal(wgPeer(p).handshake, 0);
  });
});
