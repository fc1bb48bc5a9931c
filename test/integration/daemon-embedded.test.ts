/**
 * `weft daemon` end to end on the embedded store, as real processes (bin/weft), inside a test
 * namespace (`ip netns exec`): the daemon programs iptables (FLANNEL-FWD with the flannel default
 * `--iptables-forward-rules=true`, FLANNEL-POSTRTG with `--ip-masq`) in the namespace it runs in.
 *
 *   weft-<pid>-0  (lo only)
 *   ┌───────────────────────────────────────────────────────────────────────┐
 *   │  weft daemon A ──┐                                                    │
 *   │  --iface lo      ├──► <tmp>/store  (embedded lease store, shared)      │
 *   │  weft daemon B ──┘                                                    │
 *   │  /healthz /readyz /metrics on 127.0.0.1:<port>, read by ip netns exec │
 *   └───────────────────────────────────────────────────────────────────────┘
 * The public IPs are only data in the leases (10.99.0.x); no packet is sent anywhere.
 */
import { after, afterEach, before, test as nodeTest } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { EmbeddedRegistry } from '../../src/control/registry/embedded.js';
import {
  freePort,
  nsHttpGet,
  runWeft,
  startWeft,
  stopAll,
  type WeftProcess,
  waitReady,
} from '../helpers/daemon.js';
import { NetnsScope, isRoot } from '../../src/testbed/netns.js';
import { HOLD_CONNECTIONS } from '../../src/testbed/probes.js';

const skip = isRoot() ? false : 'needs root (the daemons run in a network namespace)';
const test = (name: string, fn: () => Promise<void>) => nodeTest(name, { skip }, fn);
const scope = new NetnsScope();
let ns = '';

let dir: string;
const NET_CONF = JSON.stringify({ Network: '10.5.0.0/16', Backend: { Type: 'alloc' } });

before(() => {
  dir = mkdtempSync(join(tmpdir(), 'weft-daemon-'));
  if (!skip) ns = scope.add();
});
afterEach(stopAll);
after(async () => {
  await stopAll();
  await scope.cleanup();
  rmSync(dir, { recursive: true, force: true });
});
const httpGet = (url: string) => nsHttpGet(ns, url);

let n = 0;
/** A fresh store with the config written through `weft config set`. */
async function freshStore(conf = NET_CONF): Promise<string> {
  const store = join(dir, `store-${n++}`);
  const file = join(dir, `conf-${n}.json`);
  writeFileSync(file, conf);
  const r = await runWeft(['config', 'set', file, '--store-dir', store]);
  assert.equal(r.code, 0, r.stderr);
  return store;
}

async function startNode(
  store: string,
  ip: string,
  extra: string[] = [],
): Promise<{ p: WeftProcess; port: number; subnetFile: string }> {
  const port = await freePort();
  const subnetFile = join(dir, `subnet-${ip}.env`);
  // No store flag on the command line: the embedded store is the default; its directory comes
  // from the environment like every flag (FLANNELD_STORE_DIR), to keep the test out of /var/lib.
  const p = startWeft(
    [
      'daemon',
      '--iface',
      'lo',
      '--public-ip',
      ip,
      '--healthz-ip',
      '127.0.0.1',
      '--healthz-port',
      String(port),
      '--subnet-file',
      subnetFile,
      ...extra,
    ],
    { env: { FLANNELD_STORE_DIR: store }, netns: ns },
  );
  return { p, port, subnetFile };
}

/** Ready on /readyz (not a log line); resolves to the lease key. */
const ready = (node: { p: WeftProcess; port: number; subnetFile: string }) =>
  waitReady(node.p, { ns, port: node.port, subnetFile: node.subnetFile });

test('two daemons get distinct subnets and see each other within 1 s', async () => {
  const store = await freshStore();
  const a = await startNode(store, '10.99.0.1');
  const b = await startNode(store, '10.99.0.2');
  const [ra, rb] = await Promise.all([ready(a), ready(b)]);
  assert.notEqual(ra.key, rb.key);
  // How fast a peer shows up is bench:scale's figure; here: each side's watch delivers the other.
  await a.p.waitForLog((l) => l.msg === 'peer lease added' && l.key === rb.key);
  await b.p.waitForLog((l) => l.msg === 'peer lease added' && l.key === ra.key);
  const metrics = await httpGet(`http://127.0.0.1:${a.port}/metrics`);
  assert.match(metrics.body, /^weft_lease_peers 1$/m);
});

test('subnet.env holds flannel variables for the acquired lease', async () => {
  const store = await freshStore();
  const a = await startNode(store, '10.99.0.1', ['--ip-masq']);
  const r = await ready(a);
  const env = readFileSync(a.subnetFile, 'utf8');
  const [net] = String(r.key).split('-');
  const gw = net!.replace(/\.0$/, '.1');
  assert.equal(
    env,
    `FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET=${gw}/24\nFLANNEL_MTU=65536\nFLANNEL_IPMASQ=true\n`,
  );
});

test('readyz is 503 until the config exists and the lease is held, then 200', async () => {
  const store = join(dir, `store-${n++}`);
  const a = await startNode(store, '10.99.0.1');
  await a.p.waitForLog((l) => l.msg === 'waiting for the network config');
  assert.equal((await httpGet(`http://127.0.0.1:${a.port}/healthz`)).status, 200);
  assert.equal((await httpGet(`http://127.0.0.1:${a.port}/readyz`)).status, 503);
  const file = join(dir, 'late.json');
  writeFileSync(file, NET_CONF);
  assert.equal((await runWeft(['config', 'set', file, '--store-dir', store])).code, 0);
  await ready(a);
  assert.equal((await httpGet(`http://127.0.0.1:${a.port}/readyz`)).status, 200);
});

test('SIGTERM stops the daemon by itself with exit 0 and leaves the lease in the store', async () => {
  const store = await freshStore();
  const a = await startNode(store, '10.99.0.1');
  const r = await ready(a);
  // Exit 0 is the daemon's own: stop() sends SIGKILL after 10 s (the exit would read SIGKILL).
  // How soon within that is the machine's load (the bound was 2 s).
  assert.equal(await a.p.stop('SIGTERM'), 0);
  const list = await runWeft(['leases', '--json', '--store-dir', store]);
  assert.deepEqual(
    JSON.parse(list.stdout).map((l: { key: string }) => l.key),
    [r.key],
  );
});

test('--release-lease-on-exit deletes the lease on SIGTERM', async () => {
  const store = await freshStore();
  const a = await startNode(store, '10.99.0.1', ['--release-lease-on-exit']);
  await ready(a);
  assert.equal(await a.p.stop('SIGTERM'), 0);
  const list = await runWeft(['leases', '--json', '--store-dir', store]);
  assert.deepEqual(JSON.parse(list.stdout), []);
});

test('after kill -9 a restarted daemon gets the same subnet back', async () => {
  const store = await freshStore();
  const first = await startNode(store, '10.99.0.1');
  const r1 = await ready(first);
  await first.p.stop('SIGKILL');
  const second = await startNode(store, '10.99.0.1');
  const r2 = await ready(second);
  assert.equal(r2.key, r1.key);
});

test('deleting our lease from the store stops the daemon saying it was revoked', async () => {
  const store = await freshStore();
  const a = await startNode(store, '10.99.0.1');
  const r = await ready(a);
  const reg = new EmbeddedRegistry(store);
  await reg.deleteSubnet(String(r.key));
  await reg.close();
  const line = await a.p.waitForLog((l) => l.code === 'WEFT_ERR_LEASE_REVOKED', 30_000);
  assert.match(line.msg, /revoked/);
  assert.equal(await a.p.exited, 1);
});

test('a malformed net-conf in the store makes the daemon exit 2 naming the field and rule', async () => {
  const store = await freshStore();
  // Written behind weft's back: `weft config set` would refuse it.
  writeFileSync(join(store, 'config'), JSON.stringify({ Network: '10.5.0.0/16', SubnetLen: 31 }));
  const a = await startNode(store, '10.99.0.1');
  assert.equal(await a.p.exited, 2);
  assert.match(a.p.stderr(), /SubnetLen: .*30/);
});

test('weft config set refuses a malformed file with exit 2 naming the field', async () => {
  const file = join(dir, 'bad.json');
  writeFileSync(file, JSON.stringify({ Network: '10.5.0.0/33' }));
  const r = await runWeft(['config', 'set', file, '--store-dir', join(dir, 'never')]);
  assert.equal(r.code, 2);
  assert.match(r.stderr, /Network: /);
});

test('SubnetMin above SubnetMax is refused with exit 2 naming both fields', async () => {
  const file = join(dir, 'min-max.json');
  writeFileSync(
    file,
    JSON.stringify({ Network: '10.5.0.0/16', SubnetMin: '10.5.20.0', SubnetMax: '10.5.10.0' }),
  );
  const r = await runWeft(['config', 'set', file, '--store-dir', join(dir, 'never')]);
  assert.equal(r.code, 2);
  assert.match(r.stderr, /SubnetMin: must not be above SubnetMax \(10\.5\.20\.0 > 10\.5\.10\.0\)/);
});

test('each Backend option the backend does not read is warned about once, and ignored', async () => {
  const store = await freshStore(
    JSON.stringify({
      Network: '10.5.0.0/16',
      Backend: { Type: 'alloc', MacPrefix: '0E:2A', VIN: 2 },
    }),
  );
  const a = await startNode(store, '10.99.0.1');
  await ready(a);
  const warned = a.p.logs.filter((l) => l.code === 'WEFT_ERR_BACKEND_UNSUPPORTED');
  assert.deepEqual(
    warned.map((l) => [l.level, l.field]),
    [
      ['warn', 'Backend.MacPrefix'],
      ['warn', 'Backend.VIN'],
    ],
  );
  assert.match(
    warned[0]!.msg,
    /ignoring Backend\.MacPrefix: the alloc backend does not support it/,
  );
});

test('a malformed lease is skipped, logged once and counted while daemons keep running', async () => {
  const store = await freshStore();
  const a = await startNode(store, '10.99.0.1');
  await ready(a);
  const reg = new EmbeddedRegistry(store);
  await reg.createSubnet('10.5.200.0-24', '{"PublicIP":"not-an-ip"}', 60_000);
  await reg.close();
  await a.p.waitForLog((l) => l.msg === 'skipping malformed lease' && l.key === '10.5.200.0-24');
  const b = await startNode(store, '10.99.0.2');
  const rb = await ready(b);
  assert.notEqual(rb.key, '10.5.200.0-24');
  await a.p.waitForLog((l) => l.msg === 'peer lease added' && l.key === rb.key);
  const body = (await httpGet(`http://127.0.0.1:${a.port}/metrics`)).body;
  assert.match(body, /^weft_lease_malformed_total\{store="embedded"\} 1$/m);
  assert.equal(a.p.logs.filter((l) => l.msg === 'skipping malformed lease').length, 1);
  assert.equal(a.p.proc.exitCode, null);
});

test('out of fds under a connection flood, the daemon lives on: it serves again and its watch still delivers', async () => {
  const store = await freshStore();
  const a = await startNode(store, '10.99.0.1', ['--iptables-resync', '1']);
  await ready(a);
  // Leave A 16 fds more than it holds, then hold 200 connections to its endpoint: it runs out
  // (accepts fail with EMFILE, and so do its iptables resyncs' spawns).
  const pid = a.p.proc.pid!;
  const limit = readdirSync(`/proc/${pid}/fd`).length + 16;
  execFileSync('prlimit', ['--pid', String(pid), `--nofile=${limit}:${limit}`]);
  const holder = spawn(
    'ip',
    ['netns', 'exec', ns, process.execPath, '-e', HOLD_CONNECTIONS, String(a.port), '200'],
    { stdio: ['pipe', 'pipe', 'inherit'] },
  );
  try {
    const held = await new Promise<string>((resolve, reject) => {
      holder.stdout.once('data', (d: Buffer) => resolve(d.toString()));
      holder.once('exit', (code) => reject(new Error(`connection holder exited ${code}`)));
    });
    assert.match(held, /^held \d+/);
    // Two resyncs' worth of spawns fail meanwhile (the verdict below does not depend on it).
    await new Promise((r) => setTimeout(r, 2500));
    assert.equal(a.p.proc.exitCode, null, 'daemon alive while out of fds');
  } finally {
    holder.stdin.end();
    await new Promise((r) => holder.once('exit', r));
  }
  // The connections are gone: A serves again, and its lease watch still delivers a new peer.
  let status = 0;
  for (let i = 0; i < 50 && status !== 200; i++) {
    status = await httpGet(`http://127.0.0.1:${a.port}/healthz`).then(
      (r) => r.status,
      () => 0,
    );
    if (status !== 200) await new Promise((r) => setTimeout(r, 200));
  }
  assert.equal(status, 200);
  const b = await startNode(store, '10.99.0.2');
  const rb = await ready(b);
  await a.p.waitForLog((l) => l.msg === 'peer lease added' && l.key === rb.key);
  assert.equal(a.p.proc.exitCode, null);
});

test('/metrics passes promtool check metrics', async () => {
  const store = await freshStore();
  const a = await startNode(store, '10.99.0.1');
  await ready(a);
  const body = (await httpGet(`http://127.0.0.1:${a.port}/metrics`)).body;
  const out = execFileSync('promtool', ['check', 'metrics'], { input: body, encoding: 'utf8' });
  assert.equal(out.trim(), '');
});

test('weft leases prints a table of the store', async () => {
  const store = await freshStore();
  const a = await startNode(store, '10.99.0.1');
  const r = await ready(a);
  const out = (await runWeft(['leases', '--store-dir', store])).stdout;
  const [head, row] = out.trim().split('\n');
  assert.match(head!, /^SUBNET\s+IPV6 SUBNET\s+PUBLIC IP\s+BACKEND\s+EXPIRES$/);
  assert.match(
    row!,
    new RegExp(
      `^${String(r.key).replace('-', '/').replace(/\./g, '\\.')}\\s+-\\s+10\\.99\\.0\\.1\\s+-\\s+\\d{4}-`,
    ),
  );
});
