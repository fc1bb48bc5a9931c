/**
 * `weft daemon` end to end on a real etcd (Debian etcd-server), as real processes, all inside
 * one test namespace (`ip netns exec`): the daemons program iptables where they run.
 *
 *   weft-<pid>-N  (lo only)
 *   ┌─────────────────────────────────────────────────────────────────────┐
 *   │  weft daemon A ──┐                                                  │
 *   │  --iface lo      ├──► etcd 127.0.0.1:<port>, temp data dir          │
 *   │  weft daemon B ──┘    (prefix /coreos.com/network, flannel's keys)  │
 *   └─────────────────────────────────────────────────────────────────────┘
 * The public IPs are only data in the leases (10.99.0.x); no packet is sent anywhere.
 */
import { after, afterEach, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  freePort,
  nsHttpGet,
  runWeft,
  startWeft,
  stopAll,
  type WeftProcess,
  waitReady,
} from '../helpers/daemon.js';
import { etcdSkipReason, opensslSkipReason, startEtcd, type TestEtcd } from '../helpers/etcd.js';
import { NetnsScope, isRoot } from '../../src/testbed/netns.js';

const PREFIX = '/coreos.com/network';
const NET_CONF = JSON.stringify({ Network: '10.5.0.0/16', Backend: { Type: 'alloc' } });
const skip = isRoot()
  ? etcdSkipReason()
  : 'needs root (etcd and the daemons run in a network namespace)';

describe('daemon on etcd', { skip }, () => {
  const scope = new NetnsScope();
  let ns = '';
  let etcd: TestEtcd;
  let dir: string;
  const httpGet = (url: string) => nsHttpGet(ns, url);

  before(async () => {
    ns = scope.add();
    etcd = await startEtcd({ netns: ns });
    dir = mkdtempSync(join(tmpdir(), 'weft-etcd-daemon-'));
    const file = join(dir, 'net-conf.json');
    writeFileSync(file, NET_CONF);
    const r = await runWeft(['config', 'set', file, '--etcd-endpoints', etcd.endpoint], {
      netns: ns,
    });
    assert.equal(r.code, 0, r.stderr);
  });
  afterEach(async () => {
    await stopAll();
    etcd.ctl(['del', '--prefix', `${PREFIX}/subnets/`]);
  });
  after(async () => {
    await stopAll();
    await etcd?.stop();
    await scope.cleanup();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  async function startNode(ip: string, extra: string[] = [], endpoint = etcd.endpoint) {
    const port = await freePort();
    const subnetFile = join(dir, `subnet-${ip}.env`);
    const p = startWeft(
      [
        'daemon',
        `--etcd-endpoints=${endpoint}`,
        '-iface=lo',
        `-public-ip=${ip}`,
        '--healthz-ip=127.0.0.1',
        `--healthz-port=${port}`,
        `--subnet-file=${subnetFile}`,
        ...extra,
      ],
      { netns: ns },
    );
    return { p, port, subnetFile };
  }
  /** Ready on /readyz (not a log line); resolves to the lease key. */
  const ready = (node: { p: WeftProcess; port: number; subnetFile: string }) =>
    waitReady(node.p, { ns, port: node.port, subnetFile: node.subnetFile });

  test('config get returns what config set stored', async () => {
    const r = await runWeft(['config', 'get', '--etcd-endpoints', etcd.endpoint], { netns: ns });
    assert.equal(r.stdout.trim(), NET_CONF);
    assert.equal(etcd.ctl(['get', '--print-value-only', `${PREFIX}/config`]).trim(), NET_CONF);
  });

  test('two daemons get distinct subnets, see each other through the watch, and write flannel keys with a 24 h TTL', async () => {
    const a = await startNode('10.99.0.1');
    const b = await startNode('10.99.0.2');
    const [ra, rb] = await Promise.all([ready(a), ready(b)]);
    assert.notEqual(ra.key, rb.key);
    // A peer's lease only arrives as a watch event; how soon is the machine's load (the bound
    // was 1 s), so the wait is generous.
    await a.p.waitForLog((l) => l.msg === 'peer lease added' && l.key === rb.key, 30_000);
    await b.p.waitForLog((l) => l.msg === 'peer lease added' && l.key === ra.key, 30_000);

    const lines = etcd
      .ctl(['get', '--prefix', `${PREFIX}/subnets/`])
      .trim()
      .split('\n');
    const pairs = new Map<string, string>();
    for (let i = 0; i < lines.length; i += 2) pairs.set(lines[i]!, lines[i + 1]!);
    for (const [r, ip] of [
      [ra, '10.99.0.1'],
      [rb, '10.99.0.2'],
    ] as const) {
      assert.match(String(r.key), /^10\.5\.\d+\.0-24$/);
      assert.equal(
        pairs.get(`${PREFIX}/subnets/${String(r.key)}`),
        `{"PublicIP":"${ip}","PublicIPv6":null}`,
      );
      // The lease id is an int64: read it from the JSON text, not through a JS number.
      const raw = etcd.ctl(['get', `${PREFIX}/subnets/${String(r.key)}`, '-w', 'json']);
      const leaseId = BigInt(/"lease":(\d+)/.exec(raw)![1]!).toString(16);
      assert.match(etcd.ctl(['lease', 'timetolive', leaseId]), /granted with TTL\(86400s\)/);
    }
  });

  test('after kill -9 a restarted daemon gets the same subnet back', async () => {
    const first = await startNode('10.99.0.1');
    const r1 = await ready(first);
    await first.p.stop('SIGKILL');
    const second = await startNode('10.99.0.1');
    assert.equal((await ready(second)).key, r1.key);
  });

  test('deleting our key in etcd stops the daemon saying the lease was revoked', async () => {
    const a = await startNode('10.99.0.1');
    const r = await ready(a);
    etcd.ctl(['del', `${PREFIX}/subnets/${String(r.key)}`]);
    const line = await a.p.waitForLog((l) => l.code === 'WEFT_ERR_LEASE_REVOKED', 30_000);
    assert.match(line.msg, /revoked/);
    assert.equal(await a.p.exited, 1);
  });

  test('a malformed lease put by hand is skipped, logged once and counted', async () => {
    const a = await startNode('10.99.0.1');
    await ready(a);
    etcd.ctl(['put', `${PREFIX}/subnets/10.5.201.0-24`, '{"PublicIP":']);
    etcd.ctl(['put', `${PREFIX}/subnets/garbage-key`, '{}']);
    await a.p.waitForLog((l) => l.msg === 'skipping malformed lease' && l.key === 'garbage-key');
    const b = await startNode('10.99.0.2');
    const rb = await ready(b);
    await a.p.waitForLog((l) => l.msg === 'peer lease added' && l.key === rb.key);
    const body = (await httpGet(`http://127.0.0.1:${a.port}/metrics`)).body;
    assert.match(body, /^weft_lease_malformed_total\{store="etcd"\} 2$/m);
    assert.equal(a.p.logs.filter((l) => l.msg === 'skipping malformed lease').length, 2);
    assert.equal(a.p.proc.exitCode, null);
    assert.equal(b.p.proc.exitCode, null);
  });

  test('weft leases --json lists the leases in etcd', async () => {
    const a = await startNode('10.99.0.1');
    const r = await ready(a);
    const out = await runWeft(['leases', '--json', '--etcd-endpoints', etcd.endpoint], {
      netns: ns,
    });
    const leases = JSON.parse(out.stdout) as Array<{
      key: string;
      publicIP: string;
      expiration: string;
    }>;
    assert.deepEqual(
      leases.map((l) => [l.key, l.publicIP]),
      [[r.key, '10.99.0.1']],
    );
    const ttl = Date.parse(leases[0]!.expiration) - Date.now();
    assert.ok(ttl > 86_300_000 && ttl <= 86_400_000, `ttl ${ttl}`);
  });
});

describe('daemon on etcd with TLS', { skip: skip ?? opensslSkipReason() }, () => {
  const scope = new NetnsScope();
  let ns = '';
  let etcd: TestEtcd;
  let dir: string;
  before(async () => {
    ns = scope.add();
    etcd = await startEtcd({ tls: true, netns: ns });
    dir = mkdtempSync(join(tmpdir(), 'weft-etcd-tls-'));
  });
  after(async () => {
    await stopAll();
    await etcd?.stop();
    await scope.cleanup();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  test('the daemon connects with --etcd-cafile/--etcd-certfile/--etcd-keyfile', async () => {
    const tls = etcd.tls!;
    const flags = [
      `--etcd-endpoints=${etcd.endpoint}`,
      `--etcd-cafile=${tls.caFile}`,
      `--etcd-certfile=${tls.certFile}`,
      `--etcd-keyfile=${tls.keyFile}`,
    ];
    const file = join(dir, 'net-conf.json');
    writeFileSync(file, NET_CONF);
    assert.equal((await runWeft(['config', 'set', file, ...flags], { netns: ns })).code, 0);
    const port = await freePort();
    const subnetFile = join(dir, 'subnet.env');
    const p = startWeft(
      [
        'daemon',
        ...flags,
        '--iface=lo',
        '--public-ip=10.99.0.1',
        `--subnet-file=${subnetFile}`,
        '--healthz-ip=127.0.0.1',
        `--healthz-port=${port}`,
      ],
      { netns: ns },
    );
    const r = await waitReady(p, { ns, port, subnetFile });
    assert.match(String(r.key), /^10\.5\.\d+\.0-24$/);
  });
});
