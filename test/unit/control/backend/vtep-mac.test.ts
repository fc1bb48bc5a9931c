/** The VtepMAC policy (backend/vtep-mac.ts): one file per node, never a MAC another node holds. */
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { logger } from '../../../../src/common/log.js';
import {
  chooseVtepMAC,
  leaseVtepMACs,
  peerVtepMAC,
  randomVtepMAC,
  usableVtepMAC,
  vtepMacFiles,
} from '../../../../src/control/backend/vtep-mac.js';
import { peerLease } from './fixtures.js';

const log = logger('test');
const dir = mkdtempSync(join(tmpdir(), 'weft-vtep-mac-'));
after(() => rmSync(dir, { recursive: true, force: true }));

function sub(): string {
  return mkdtempSync(join(dir, 's-'));
}

const choose = (o: Partial<Parameters<typeof chooseVtepMAC>[0]> & { subnetFile: string | null }) =>
  chooseVtepMAC({ dev: 'flannel.1', inUse: new Set(), log, ...o });

describe('VtepMAC files', () => {
  test('subnet files in one directory get one MAC file each', () => {
    const d = sub();
    const a = vtepMacFiles(join(d, 'n1.env'), 'flannel.1');
    const b = vtepMacFiles(join(d, 'n2.env'), 'flannel.1');
    assert.equal(a.file, join(d, 'n1.env.flannel.1.vtep-mac'));
    assert.notEqual(a.file, b.file);
    assert.equal(a.legacy, join(d, 'weft-flannel.1.vtep-mac'));
  });

  test('three daemons sharing a directory choose three MACs', async () => {
    const d = sub();
    const macs = await Promise.all(
      ['n1.env', 'n2.env', 'n3.env'].map((f) => choose({ subnetFile: join(d, f) })),
    );
    assert.equal(new Set(macs.map((m) => m.mac)).size, 3);
    for (const [i, f] of ['n1.env', 'n2.env', 'n3.env'].entries()) {
      assert.equal(readFileSync(join(d, `${f}.flannel.1.vtep-mac`), 'utf8'), `${macs[i]!.mac}\n`);
    }
  });

  test('our file is reused on the next start', async () => {
    const d = sub();
    const first = await choose({ subnetFile: join(d, 'subnet.env') });
    const again = await choose({ subnetFile: join(d, 'subnet.env') });
    assert.deepEqual(again, { mac: first.mac, source: 'file' });
  });

  test('the old per-directory file is taken over by one node only (renamed to its own)', async () => {
    const d = sub();
    writeFileSync(join(d, 'weft-flannel.1.vtep-mac'), '0a:00:00:00:00:42\n');
    const a = await choose({ subnetFile: join(d, 'n1.env') });
    const b = await choose({ subnetFile: join(d, 'n2.env') });
    assert.deepEqual(a, { mac: '0a:00:00:00:00:42', source: 'legacy-file' });
    assert.equal(b.source, 'new');
    assert.notEqual(b.mac, a.mac);
    assert.equal(existsSync(join(d, 'weft-flannel.1.vtep-mac')), false);
    assert.equal(readFileSync(join(d, 'n1.env.flannel.1.vtep-mac'), 'utf8'), '0a:00:00:00:00:42\n');
  });

  test('an old file whose MAC another node publishes is not adopted', async () => {
    const d = sub();
    writeFileSync(join(d, 'weft-flannel.1.vtep-mac'), '0a:00:00:00:00:42\n');
    const r = await choose({
      subnetFile: join(d, 'n1.env'),
      inUse: new Set(['0a:00:00:00:00:42']),
    });
    assert.equal(r.source, 'new');
    assert.notEqual(r.mac, '0a:00:00:00:00:42');
  });

  test('order: device, then the store, then our file; each refused when another node holds it', async () => {
    const d = sub();
    writeFileSync(join(d, 'subnet.env.flannel.1.vtep-mac'), '0a:00:00:00:00:03\n');
    const f = join(d, 'subnet.env');
    const dev = '0a:00:00:00:00:01';
    const st = '0a:00:00:00:00:02';
    assert.equal((await choose({ subnetFile: f, device: dev, stored: st })).source, 'device');
    assert.deepEqual(
      await choose({ subnetFile: f, device: dev, stored: st, inUse: new Set([dev]) }),
      {
        mac: st,
        source: 'store',
      },
    );
    // (the file now holds st: choose persisted it)
    writeFileSync(join(d, 'subnet.env.flannel.1.vtep-mac'), '0a:00:00:00:00:03\n');
    assert.deepEqual(
      await choose({ subnetFile: f, device: dev, stored: st, inUse: new Set([dev, st]) }),
      { mac: '0a:00:00:00:00:03', source: 'file' },
    );
  });

  test('without a subnet file nothing is written and a MAC is still chosen', async () => {
    const r = await choose({ subnetFile: null });
    assert.equal(r.source, 'new');
    assert.ok(usableVtepMAC(r.mac));
  });
});

describe('VtepMAC values', () => {
  test('random MACs are unicast and locally administered', () => {
    for (let i = 0; i < 200; i++) {
      const m = randomVtepMAC();
      const first = parseInt(m.slice(0, 2), 16);
      assert.equal(first & 1, 0);
      assert.equal(first & 2, 2);
    }
  });

  test('usable: unicast and non-zero only', () => {
    assert.equal(usableVtepMAC('0a:00:00:00:00:01'), true);
    assert.equal(usableVtepMAC('01:00:5e:00:00:01'), false);
    assert.equal(usableVtepMAC('00:00:00:00:00:00'), false);
    assert.equal(usableVtepMAC('garbage'), false);
  });

  test('a lease publishes its VtepMACs in BackendData and BackendV6Data', () => {
    assert.deepEqual(leaseVtepMACs(peerLease()), ['aa:bb:cc:dd:ee:01', 'aa:bb:cc:dd:ee:02']);
    assert.deepEqual(
      leaseVtepMACs(
        peerLease({ backendData: { vtepmac: 'AA:BB:CC:DD:EE:09' }, backendV6Data: undefined }),
      ),
      ['aa:bb:cc:dd:ee:09'],
    );
    assert.deepEqual(peerVtepMAC({ VtepMAC: 7 }), { reason: 'VtepMAC 7 is not a MAC address' });
    // a group address cannot be a VTEP: the kernel would flood to it, the engine never match it
    assert.deepEqual(peerVtepMAC({ VtepMAC: '01:00:5E:00:00:01' }), {
      reason: 'VtepMAC "01:00:5E:00:00:01" is not a unicast address',
    });
    assert.deepEqual(peerVtepMAC({ VtepMAC: '00:00:00:00:00:00' }), {
      reason: 'VtepMAC "00:00:00:00:00:00" is not a unicast address',
    });
  });
});
