/**
 * BridgeBypass: weft_bridge on the pods' bridge as control reports it (name, index, the MACs
 * behind each port), turned into the addon's calls: attach by name, the port map written whole.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { BridgeBypass, portRecords } from '../../../src/dataplane/bpf-engine.js';
import type { PodBridge } from '../../../src/dataplane/index.js';

/** A stand-in for the addon's two calls, recording them; `here`: the bridge's ifindex "here". */
function fakeBpf(here: number) {
  const calls: string[] = [];
  return {
    calls,
    here,
    bpfAttachBridge(_id: number, bridge: string | number): number {
      calls.push(`attach ${bridge}`);
      return bridge === 0 ? 0 : this.here;
    },
    bpfSetPorts(_id: number, records: Buffer): void {
      calls.push(`ports ${records.length / 12}`);
    },
  };
}

function capturingLog() {
  const warned: string[] = [];
  const log = { info() {}, warn: (o: { err: string }) => warned.push(o.err) };
  return { warned, log: log as unknown as ConstructorParameters<typeof BridgeBypass>[2] };
}

const pods0: PodBridge = {
  name: 'pods0',
  index: 4,
  ports: [
    { index: 7, name: 'veth1', macs: ['0a:58:0a:05:01:02'] },
    { index: 9, name: 'veth2', macs: ['0a:58:0a:05:01:03', '0a:58:0a:05:01:04'] },
    { index: 12, name: 'veth3', macs: [] },
  ],
};

test('portRecords: per MAC, the MAC, 2 pad bytes and the port ifindex (LE)', () => {
  const r = portRecords(
    new Map([
      ['0a:58:0a:05:01:02', 7],
      ['0a:58:0a:05:01:03', 0x0102],
    ]),
  );
  assert.equal(r.length, 24);
  assert.equal(r.subarray(0, 6).toString('hex'), '0a580a050102');
  assert.equal(r.readUInt16LE(6), 0);
  assert.equal(r.readUInt32LE(8), 7);
  assert.equal(r.subarray(12, 18).toString('hex'), '0a580a050103');
  assert.equal(r.readUInt32LE(20), 0x0102);
});

test('attaches to the bridge by the name reported and writes the MACs behind its ports', () => {
  const bpf = fakeBpf(4);
  const { warned, log } = capturingLog();
  const b = new BridgeBypass(bpf, 1, log);
  b.set(pods0);
  assert.deepEqual(bpf.calls, ['attach pods0', 'ports 3']);
  assert.deepEqual(b.bridge, { name: 'pods0', index: 4 });
  assert.deepEqual(
    [...b.ports],
    [
      ['0a:58:0a:05:01:02', 7],
      ['0a:58:0a:05:01:03', 9],
      ['0a:58:0a:05:01:04', 9],
    ],
  );
  assert.deepEqual(warned, []);
});

test('a later report rewrites the map without attaching again; the bridge gone detaches', () => {
  const bpf = fakeBpf(4);
  const { log } = capturingLog();
  const b = new BridgeBypass(bpf, 1, log);
  b.set(pods0);
  b.set({ ...pods0, ports: pods0.ports.slice(0, 1) });
  b.set(null);
  assert.deepEqual(bpf.calls, ['attach pods0', 'ports 3', 'ports 1', 'attach 0', 'ports 0']);
  assert.equal(b.bridge, null);
  assert.equal(b.ports.size, 0);
});

test('a bridge made again (new index) is attached again', () => {
  const bpf = fakeBpf(4);
  const { log } = capturingLog();
  const b = new BridgeBypass(bpf, 1, log);
  b.set(pods0);
  bpf.here = 5;
  b.set({ ...pods0, index: 5 });
  assert.deepEqual(bpf.calls, ['attach pods0', 'ports 3', 'attach pods0', 'ports 3']);
  assert.deepEqual(b.bridge, { name: 'pods0', index: 5 });
});

test('an index other than the one reported (another namespace) detaches, writes no port, warns once', () => {
  const bpf = fakeBpf(11);
  const { warned, log } = capturingLog();
  const b = new BridgeBypass(bpf, 1, log);
  b.set(pods0);
  b.set(pods0);
  assert.deepEqual(bpf.calls, ['attach pods0', 'attach 0', 'attach pods0', 'attach 0']);
  assert.equal(b.bridge, null);
  assert.equal(warned.length, 1);
  assert.match(warned[0]!, /pods0 is ifindex 11 here, 4 in the namespace/);
});
