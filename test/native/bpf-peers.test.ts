/**
 * The bpf loader's peer maps at their capacity (native/src/bpf_loader.cc SetPeers/UpdatePeers,
 * 65,536 entries per family and as many public addresses): removals always apply — first when
 * the maps could not hold the old and the new entries together — so a removed peer never stays
 * live; a table the maps cannot hold is refused whole. What the maps hold is read through the
 * programs themselves (BPF_PROG_TEST_RUN of weft_tx: redirected = a peer, TCX_NEXT = none).
 * Nothing is attached. Needs root (bpf(2)).
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import {
  TC_ACT_REDIRECT,
  TC_ACT_UNSPEC,
  bpfObjectPath,
  loadBpfBinding,
} from '../../src/dataplane/bpf-binding.js';
import { encodePeerTable, peerEntry } from '../../src/dataplane/peer-table.js';
import type { PeerEntry } from '../../src/dataplane/peer-table.js';

const root = process.getuid?.() === 0;
const FULL = 65536;
const MAC = '02:00:00:00:00:09';

/** Peer i < 65536: subnet <first>.<hi>.<lo>.0/24, public address 172.16.<hi>.<lo>. */
function peer(first: number, i: number): PeerEntry {
  const hi = i >> 8;
  const lo = i & 0xff;
  return peerEntry(`${first}.${hi}.${lo}.0/24`, `172.16.${hi}.${lo}`, 8472, MAC);
}

/** An Ethernet frame with a small IPv4/UDP packet to `dst`. */
function frameTo(dst: string): Buffer {
  const f = Buffer.alloc(14 + 28);
  f.writeUInt16BE(0x0800, 12);
  f[14] = 0x45;
  f.writeUInt16BE(28, 16);
  f[22] = 64;
  f[23] = 17;
  Buffer.from([10, 250, 0, 2]).copy(f, 26);
  Buffer.from(dst.split('.').map(Number)).copy(f, 30);
  f.writeUInt16BE(8, 38);
  return f;
}

describe('bpf peer maps at capacity', { skip: !root && 'needs root (bpf(2))' }, () => {
  const bpf = root ? loadBpfBinding() : null;
  let id = -1;
  const verdict = (dst: string) => bpf!.bpfTestRun(id, 'tx', frameTo(dst)).verdict;
  before(() => {
    id = bpf!.bpfLoad(bpfObjectPath());
    bpf!.bpfConfigure(id, {
      format: 'vxlan',
      vni: 1,
      vtepMac: Buffer.alloc(6, 2),
      port: 8472,
      localV4: '10.250.0.1',
    });
    bpf!.bpfSetPeers(id, encodePeerTable(Array.from({ length: FULL }, (_, i) => peer(10, i))));
  });
  after(() => {
    if (id >= 0) bpf!.bpfClose(id);
  });

  it('a full table replaced in part: the removed peers go, the new ones come', () => {
    assert.equal(verdict('10.0.5.9'), TC_ACT_REDIRECT, 'a peer of the full table');
    // The first 300 subnets (and their public addresses) leave, 300 others come.
    const next = Array.from({ length: FULL }, (_, i) => (i < 300 ? peer(11, i) : peer(10, i)));
    bpf!.bpfSetPeers(id, encodePeerTable(next));
    assert.equal(verdict('10.0.5.9'), TC_ACT_UNSPEC, 'removed (index 5): no longer encapsulated');
    assert.equal(verdict('10.1.43.9'), TC_ACT_UNSPEC, 'removed (index 299)');
    assert.equal(verdict('10.1.44.9'), TC_ACT_REDIRECT, 'kept (index 300)');
    assert.equal(verdict('11.0.5.9'), TC_ACT_REDIRECT, 'added');
  });

  it('a delta on a full table: the removal applies before the add', () => {
    bpf!.bpfUpdatePeers(id, encodePeerTable([peer(11, 7)]), encodePeerTable([peer(12, 7)]));
    assert.equal(verdict('11.0.7.9'), TC_ACT_UNSPEC, 'removed');
    assert.equal(verdict('12.0.7.9'), TC_ACT_REDIRECT, 'added');
  });

  it('a table the maps cannot hold is refused whole, naming the limit', () => {
    const tooMany = [
      ...Array.from({ length: FULL }, (_, i) => peer(13, i)),
      peerEntry('14.0.0.0/24', '172.30.0.1', 8472, MAC),
    ];
    assert.throws(() => bpf!.bpfSetPeers(id, encodePeerTable(tooMany)), /hold 65536 each/);
    assert.equal(verdict('13.0.0.9'), TC_ACT_UNSPEC, 'nothing of it written');
    assert.equal(verdict('12.0.7.9'), TC_ACT_REDIRECT, 'the table before stays');
  });
});
