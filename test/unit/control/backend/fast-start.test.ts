import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { logger, setLogLevel } from '../../../../src/common/log.js';
import {
  DataplaneRecord,
  recordPath,
  startEarly,
} from '../../../../src/control/backend/fast-start.js';
import { FakeNetlink } from '../../../../src/control/netlink/fake-netlink.js';
import type { Dataplane, DataplaneOptions } from '../../../../src/dataplane/engine.js';
import { applyPeerDelta, encodePeerTable, parseMac } from '../../../../src/dataplane/peer-table.js';
import { parseCIDR, parseIP } from '../../../../src/common/ip.js';
import { decodeCounters } from '../../../../src/dataplane/stats.js';
import {
  decodeWireguardPeers,
  encodeWireguardPeers,
} from '../../../../src/dataplane/wireguard-peers.js';

setLogLevel('silent');
const log = logger('test');
const dir = mkdtempSync(join(tmpdir(), 'weft-fast-start-'));
after(() => rmSync(dir, { recursive: true, force: true }));
let n = 0;
const subnetFile = () => join(dir, `subnet${n++}.env`);

const OPTIONS: DataplaneOptions = {
  format: 'vxlan',
  engine: 'native',
  tunName: 'flannel.1',
  underlay: 'eth0',
  workers: 2,
  offloads: ['csum'],
  busyPollUs: 0,
  queueThreads: 1,
  cpuAffine: true,
  persist: true,
  bindIp: '10.250.0.2',
  port: 8472,
  tunMtu: 1450,
  vni: 1,
  vtepMac: parseMac('02:aa:bb:cc:dd:ee')!,
  log,
};
const BACKEND = { Type: 'vxlan', Dataplane: 'userspace' };
const TABLE = encodePeerTable([
  {
    subnet: parseCIDR('10.5.3.0/24')!,
    publicIP: parseIP('10.250.0.3')!,
    port: 8472,
    vtepMac: parseMac('02:00:00:00:00:03'),
  },
]);

/** A netlink with the TUNs the last run left: persistent, multi-queue, no queue attached. */
function leftTun(queues = 0, names: readonly string[] = ['flannel.1']): FakeNetlink {
  const nl = new FakeNetlink();
  for (const name of names) {
    nl.addLink(name, {
      kind: 'tun',
      tun: { type: 'tun', pi: false, vnetHdr: true, multiQueue: true, persist: true, queues },
    });
  }
  return nl;
}

interface FakeDp extends Dataplane {
  tables: Buffer[];
  closed: number;
  started: DataplaneOptions;
}

function deps(nl: FakeNetlink) {
  const made: FakeDp[] = [];
  return {
    made,
    openNetlink: () => nl,
    startDataplane: async (o: DataplaneOptions): Promise<Dataplane> => {
      const dp: FakeDp = {
        engine: o.engine,
        tunName: o.tunName,
        tables: [],
        closed: 0,
        started: o,
        failed: new Promise(() => undefined),
        setPeers() {},
        setPeerTable(t) {
          dp.tables.push(Buffer.from(t));
        },
        updatePeerTable(d) {
          dp.tables.push(applyPeerDelta(dp.tables.at(-1) ?? Buffer.alloc(0), d));
        },
        stats: () => decodeCounters('native', []),
        async close() {
          dp.closed++;
        },
      };
      made.push(dp);
      return dp;
    },
  };
}

async function recorded(file: string, backend: unknown = BACKEND): Promise<void> {
  const r = new DataplaneRecord(file, log);
  r.start(backend, OPTIONS);
  r.peers(TABLE);
  await r.flush();
}

describe('fast start', () => {
  test('no record: nothing starts', async () => {
    const d = deps(leftTun());
    assert.equal(await startEarly(subnetFile(), log, d), null);
    assert.equal(d.made.length, 0);
  });

  test('the record starts the same engine on the TUN left behind, with the last peer table', async () => {
    const file = subnetFile();
    await recorded(file);
    const d = deps(leftTun());
    const early = (await startEarly(file, log, d))!;
    assert.ok(early);
    assert.equal(early.peerCount, 1);
    const dp = d.made[0]!;
    assert.deepEqual(dp.tables, [TABLE]);
    assert.equal(dp.started.persist, true);
    assert.deepEqual(dp.started.vtepMac, OPTIONS.vtepMac);
    // same Backend block, same options: the backend takes the running engine
    assert.equal(await early.forBackend({ ...BACKEND }), early);
    assert.equal(await early.claim({ ...OPTIONS }), dp);
    await early.release();
    assert.equal(dp.closed, 0, 'a claimed engine is the backend’s to close');
  });

  test('other options: the early engine stops and the backend starts its own', async () => {
    const file = subnetFile();
    await recorded(file);
    const d = deps(leftTun());
    const early = (await startEarly(file, log, d))!;
    assert.equal(await early.claim({ ...OPTIONS, workers: 1 }), null);
    assert.equal(d.made[0]!.closed, 1);
    await early.release();
    assert.equal(d.made[0]!.closed, 1, 'closed once');
  });

  test('another Backend block: the engine stops, its TUN and the record are removed', async () => {
    const file = subnetFile();
    await recorded(file);
    const nl = leftTun();
    const d = deps(nl);
    const early = (await startEarly(file, log, d))!;
    assert.equal(await early.forBackend({ Type: 'host-gw' }), null);
    assert.equal(d.made[0]!.closed, 1);
    assert.deepEqual(nl.ops, [{ op: 'delLink', dev: 'flannel.1' }]);
    assert.ok(!existsSync(recordPath(file)));
  });

  test('no TUN left, one a process holds, or a record of another version: nothing starts', async () => {
    const file = subnetFile();
    await recorded(file);
    for (const nl of [new FakeNetlink(), leftTun(1)]) {
      const d = deps(nl);
      assert.equal(await startEarly(file, log, d), null);
      assert.equal(d.made.length, 0);
    }
    writeFileSync(recordPath(file), JSON.stringify({ version: '0.0.0-other' }));
    assert.equal(await startEarly(file, log, deps(leftTun())), null);
    writeFileSync(recordPath(file), '{ not json');
    assert.equal(await startEarly(file, log, deps(leftTun())), null);
  });

  test('the record keeps the latest table of a burst and goes with remove()', async () => {
    const file = subnetFile();
    const r = new DataplaneRecord(file, log);
    r.start(BACKEND, OPTIONS);
    r.peers(Buffer.alloc(0));
    r.peers(TABLE);
    await r.flush();
    const d = deps(leftTun());
    await startEarly(file, log, d);
    assert.deepEqual(d.made[0]!.tables, [TABLE]);
    await r.remove();
    assert.ok(!existsSync(recordPath(file)));
    r.peers(Buffer.alloc(0));
    await r.flush();
    assert.ok(!existsSync(recordPath(file)), 'no write after remove');
  });

  test('while tables change the record waits out its interval, then writes the table of that moment, read once', async () => {
    const file = subnetFile();
    const held: Array<() => void> = [];
    let paused!: () => void;
    const pausedOnce = new Promise<void>((resolve) => (paused = resolve));
    const r = new DataplaneRecord(file, log, {
      intervalMs: 60_000,
      pause: (_ms, signal) =>
        new Promise<void>((resolve) => {
          held.push(resolve);
          signal.addEventListener('abort', () => resolve(), { once: true });
          paused();
        }),
    });
    const reads: string[] = [];
    const table = (name: string, b: Buffer) => () => {
      reads.push(name);
      return b;
    };
    const written = () =>
      (JSON.parse(readFileSync(recordPath(file), 'utf8')) as { peers: string }).peers;
    r.start(BACKEND, OPTIONS);
    r.peers(table('a', Buffer.alloc(0)));
    await r.flush(); // the first table goes at once; the interval runs from its write
    r.peers(table('b', Buffer.alloc(0)));
    await pausedOnce; // the next write waits for the interval
    r.peers(table('c', TABLE));
    assert.deepEqual(reads, ['a'], 'no table is read while the record waits');
    assert.equal(written(), '');
    held[0]!();
    await r.flush();
    assert.deepEqual(reads, ['a', 'c']);
    assert.equal(written(), TABLE.toString('base64'));
  });

  test('flush() writes what is pending without waiting for the interval', async () => {
    const file = subnetFile();
    const r = new DataplaneRecord(file, log, { intervalMs: 3_600_000 });
    r.start(BACKEND, OPTIONS);
    r.peers(Buffer.alloc(0));
    await r.flush(); // the interval runs from here
    r.peers(TABLE);
    await r.flush(); // would take an hour if it waited
    const rec = JSON.parse(readFileSync(recordPath(file), 'utf8')) as { peers: string };
    assert.equal(rec.peers, TABLE.toString('base64'));
  });
});

describe('fast start of a wireguard engine', () => {
  const KEY = Buffer.alloc(32, 3);
  const PSK = Buffer.alloc(32, 4);
  const WG_OPTIONS: DataplaneOptions = {
    ...OPTIONS,
    format: 'wireguard',
    port: 51820,
    wireguard: { privateKey: KEY, psk: PSK, greet: true },
  };
  const PEERS = encodeWireguardPeers([
    { publicKey: Buffer.alloc(32, 9), endpoint: '10.250.0.3', port: 51820, persistentKeepalive: 0 },
  ]);

  test('the record keeps the keys and the peers; the early engine gets them back', async () => {
    const file = subnetFile();
    const r = new DataplaneRecord(file, log);
    r.start({ Type: 'wireguard' }, WG_OPTIONS);
    r.peers(TABLE);
    r.wgPeers(() => PEERS);
    await r.flush();
    const d = deps(leftTun());
    const wg: unknown[] = [];
    const start = d.startDataplane;
    d.startDataplane = async (o) => {
      const dp = await start(o);
      return Object.assign(dp, { setWireguardPeers: (p: unknown[]) => wg.push(...p) });
    };
    const early = (await startEarly(file, log, d))!;
    assert.ok(early);
    const dp = d.made[0]!;
    assert.ok(dp.started.wireguard?.privateKey.equals(KEY));
    assert.ok(dp.started.wireguard?.psk?.equals(PSK));
    assert.equal(dp.started.wireguard?.greet, true);
    assert.deepEqual(wg, decodeWireguardPeers(PEERS));
    // the backend's options are the same: it takes the running engine
    assert.equal(await early.claim({ ...WG_OPTIONS }), dp);
  });
});

describe('fast start of a node with two engines (wireguard Mode separate, dual-stack)', () => {
  const V4: DataplaneOptions = { ...OPTIONS, format: 'wireguard', tunName: 'flannel-wg' };
  const V6: DataplaneOptions = { ...V4, tunName: 'flannel-wg-v6', port: 51821 };
  const WG = { Type: 'wireguard' };

  /** The records the two tunnels' backends write: the first engine's, the second's by TUN. */
  async function recordedTwo(file: string): Promise<void> {
    for (const [o, tun] of [
      [V4, undefined],
      [V6, 'flannel-wg-v6'],
    ] as const) {
      const r = new DataplaneRecord(file, log, tun === undefined ? {} : { tun });
      r.start(WG, o);
      r.peers(TABLE);
      await r.flush();
    }
  }

  test('the second engine’s record is named by its TUN, beside the first’s', async () => {
    const file = subnetFile();
    await recordedTwo(file);
    assert.ok(existsSync(recordPath(file)));
    assert.ok(existsSync(`${file}.flannel-wg-v6.dataplane.json`));
    assert.equal(recordPath(file, 'flannel-wg-v6'), `${file}.flannel-wg-v6.dataplane.json`);
  });

  test('both engines start early, and each backend claims the one on its own TUN', async () => {
    const file = subnetFile();
    await recordedTwo(file);
    const d = deps(leftTun(0, ['flannel-wg', 'flannel-wg-v6']));
    const early = (await startEarly(file, log, d))!;
    assert.deepEqual(
      d.made.map((dp) => dp.tunName),
      ['flannel-wg', 'flannel-wg-v6'],
    );
    assert.equal(early.peerCount, 2);
    assert.equal(await early.forBackend({ ...WG }), early);
    assert.equal(await early.claim({ ...V6 }), d.made[1]);
    assert.equal(await early.claim({ ...V4 }), d.made[0]);
    await early.release();
    assert.deepEqual(
      d.made.map((dp) => dp.closed),
      [0, 0],
      'claimed engines are the backends’ to close',
    );
  });

  test('release(tun) stops only the engine on that TUN; release() the rest', async () => {
    const file = subnetFile();
    await recordedTwo(file);
    const d = deps(leftTun(0, ['flannel-wg', 'flannel-wg-v6']));
    const early = (await startEarly(file, log, d))!;
    await early.release('flannel-wg-v6');
    assert.deepEqual(
      d.made.map((dp) => dp.closed),
      [0, 1],
    );
    await early.release();
    assert.deepEqual(
      d.made.map((dp) => dp.closed),
      [1, 1],
    );
  });

  test('another Backend block: both engines stop, both TUNs and both records are removed', async () => {
    const file = subnetFile();
    await recordedTwo(file);
    const nl = leftTun(0, ['flannel-wg', 'flannel-wg-v6']);
    const d = deps(nl);
    const early = (await startEarly(file, log, d))!;
    assert.equal(await early.forBackend({ Type: 'udp' }), null);
    assert.deepEqual(
      d.made.map((dp) => dp.closed),
      [1, 1],
    );
    assert.deepEqual(nl.ops, [
      { op: 'delLink', dev: 'flannel-wg' },
      { op: 'delLink', dev: 'flannel-wg-v6' },
    ]);
    assert.ok(!existsSync(recordPath(file)));
    assert.ok(!existsSync(recordPath(file, 'flannel-wg-v6')));
  });

  test('a second record of the TUN the first record names is not started (one engine a TUN)', async () => {
    const file = subnetFile();
    await recordedTwo(file);
    // the node went to IPv6 only: flannel-wg-v6 is its first engine now
    const r = new DataplaneRecord(file, log);
    r.start(WG, V6);
    r.peers(TABLE);
    await r.flush();
    const d = deps(leftTun(0, ['flannel-wg-v6']));
    await startEarly(file, log, d);
    assert.deepEqual(
      d.made.map((dp) => dp.tunName),
      ['flannel-wg-v6'],
    );
  });

  test('the first engine’s record removes a second record of its own TUN', async () => {
    const file = subnetFile();
    await recordedTwo(file);
    const r = new DataplaneRecord(file, log);
    r.start(WG, V6);
    await r.flush();
    assert.ok(!existsSync(recordPath(file, 'flannel-wg-v6')));
    assert.ok(existsSync(recordPath(file)));
  });
});
