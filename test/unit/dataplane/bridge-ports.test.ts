/**
 * bridgePortRecords: the pods' bridge's FDB (sysfs `brforward`, `brif/<port>/port_no`) turned
 * into the bpf engine's port-map records, on a sysfs tree written here in the kernel's format.
 */
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { bridgePortRecords, watchPodBridge } from '../../../src/dataplane/bpf-engine.js';

const root = mkdtempSync(join(tmpdir(), 'weft-sysnet-'));
after(() => rmSync(root, { recursive: true, force: true }));

/** One `struct __fdb_entry` (16 bytes: mac, port_no, is_local, ageing, port_hi, pad, unused). */
function fdbEntry(mac: string, port: number, local = false): Buffer {
  const e = Buffer.alloc(16);
  Buffer.from(mac.replace(/:/g, ''), 'hex').copy(e, 0);
  e[6] = port & 0xff;
  e[7] = local ? 1 : 0;
  e.writeUInt32LE(1234, 8);
  e[12] = port >> 8;
  return e;
}

function device(name: string, ifindex: number): void {
  mkdirSync(join(root, name), { recursive: true });
  writeFileSync(join(root, name, 'ifindex'), `${ifindex}\n`);
}

/** cni0 (ifindex 4) with ports veth1 (7, port 1) and veth2 (9, port 0x102). */
before(() => {
  device('cni0', 4);
  device('veth1', 7);
  device('veth2', 9);
  mkdirSync(join(root, 'cni0', 'brif', 'veth1'), { recursive: true });
  mkdirSync(join(root, 'cni0', 'brif', 'veth2'), { recursive: true });
  writeFileSync(join(root, 'cni0', 'brif', 'veth1', 'port_no'), '0x1\n');
  // A port number above 255 (port_hi) is read whole.
  writeFileSync(join(root, 'cni0', 'brif', 'veth2', 'port_no'), '0x102\n');
  writeFileSync(
    join(root, 'cni0', 'brforward'),
    Buffer.concat([
      fdbEntry('0a:58:0a:05:01:02', 1),
      fdbEntry('ee:26:4a:62:2f:9c', 1, true), // the port's own MAC
      fdbEntry('0a:58:0a:05:01:03', 0x102),
      fdbEntry('0a:58:0a:05:01:04', 5), // no such port any more
    ]),
  );
});

test('learnt entries map to their port ifindex; local entries and unknown ports are left out', () => {
  const got = bridgePortRecords('cni0', root);
  assert.ok(got);
  assert.equal(got.ifindex, 4);
  assert.equal(got.records.length, 24);
  assert.equal(got.records.subarray(0, 6).toString('hex'), '0a580a050102');
  assert.equal(got.records.readUInt32LE(8), 7);
  assert.equal(got.records.subarray(12, 18).toString('hex'), '0a580a050103');
  assert.equal(got.records.readUInt32LE(20), 9);
});

test('no bridge: null', () => {
  assert.equal(bridgePortRecords('nosuchbr', root), null);
});

/** A stand-in for the addon's two calls, recording them; `here` is cni0's ifindex "here". */
function fakeBpf(here: number) {
  const calls: string[] = [];
  return {
    calls,
    bpfAttachBridge(_id: number, bridge: string | number): number {
      calls.push(`attach ${bridge}`);
      return bridge === 0 ? 0 : here;
    },
    bpfSetPorts(_id: number, records: Buffer): void {
      calls.push(`ports ${records.length / 12}`);
    },
  };
}

function capturingLog() {
  const warned: string[] = [];
  const log = { info() {}, warn: (o: { err: string }) => warned.push(o.err) };
  return { warned, log: log as unknown as Parameters<typeof watchPodBridge>[2] };
}

test('watchPodBridge: attaches to cni0 by name and writes its ports', () => {
  const bpf = fakeBpf(4); // the same ifindex as sysfs says
  const { warned, log } = capturingLog();
  watchPodBridge(bpf, 1, log, root).stop();
  assert.deepEqual(bpf.calls, ['attach cni0', 'ports 2']);
  assert.deepEqual(warned, []);
});

test('watchPodBridge: a sysfs of another namespace (other ifindex) detaches and writes no port', () => {
  const bpf = fakeBpf(11);
  const { warned, log } = capturingLog();
  watchPodBridge(bpf, 1, log, root).stop();
  assert.deepEqual(bpf.calls, ['attach cni0', 'attach 0']);
  assert.equal(warned.length, 1);
  assert.match(warned[0]!, /another network namespace/);
});
