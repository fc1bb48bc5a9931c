import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  applyChanges,
  diffLease,
  diffSnapshots,
  type LeaseSnapshot,
} from '../../../../src/control/lease/watcher.js';
import { parseCIDR } from '../../../../src/common/ip.js';
import type { Lease } from '../../../../src/control/lease/types.js';

function lease(key: string, publicIP: string): Lease {
  const [net, len] = key.split('-');
  return {
    key,
    subnet: parseCIDR(`${net}/${len}`),
    ipv6Subnet: null,
    attrs: { publicIP, publicIPv6: null, backendType: 'host-gw' },
    expiration: null,
  };
}

const A = lease('10.5.1.0-24', '192.168.0.1');
const B = lease('10.5.2.0-24', '192.168.0.2');
const OWN = lease('10.5.3.0-24', '192.168.0.3');

const kinds = (evs: { type: string; lease: Lease }[]) =>
  evs.map((e) => `${e.type} ${e.lease.key} ${e.lease.attrs.publicIP}`);

test('diff reports removed, added and changed leases, never our own', () => {
  const prev: LeaseSnapshot = new Map([
    [A.key, A],
    [B.key, B],
  ]);
  const changedB = lease(B.key, '192.168.0.22');
  const next: LeaseSnapshot = new Map([
    [B.key, changedB],
    [OWN.key, OWN],
  ]);
  assert.deepEqual(kinds(diffSnapshots(prev, next, OWN.key)), [
    'removed 10.5.1.0-24 192.168.0.1',
    'added 10.5.2.0-24 192.168.0.22',
  ]);
});

test('diff of identical snapshots is empty', () => {
  const snap: LeaseSnapshot = new Map([[A.key, A]]);
  assert.deepEqual(diffSnapshots(snap, new Map(snap)), []);
});

test('diffLease gives what diffSnapshots gives for one known and one current lease', () => {
  const changedA = lease(A.key, '192.168.0.11');
  const options = [undefined, A, changedA, B, OWN];
  for (const before of options) {
    for (const after of [...options, null]) {
      for (const ownKey of [undefined, OWN.key]) {
        const prev: LeaseSnapshot = new Map(before ? [[before.key, before]] : []);
        const next: LeaseSnapshot = new Map(after ? [[after.key, after]] : []);
        assert.deepEqual(
          kinds(diffLease(before, after ?? null, ownKey)),
          kinds(diffSnapshots(prev, next, ownKey)),
          `before ${before?.key} after ${after?.key} own ${ownKey}`,
        );
      }
    }
  }
});

test('changes apply in order and a put of the same value is silent', () => {
  const snap: LeaseSnapshot = new Map([[A.key, A]]);
  const evs = applyChanges(
    snap,
    [
      { type: 'put', key: A.key, lease: A },
      { type: 'put', key: B.key, lease: B },
      { type: 'delete', key: A.key },
      { type: 'put', key: OWN.key, lease: OWN },
    ],
    OWN.key,
  );
  assert.deepEqual(kinds(evs), [
    'added 10.5.2.0-24 192.168.0.2',
    'removed 10.5.1.0-24 192.168.0.1',
  ]);
  assert.deepEqual([...snap.keys()], [B.key]);
});

test('a known lease overwritten by garbage is removed', () => {
  const snap: LeaseSnapshot = new Map([[A.key, A]]);
  assert.deepEqual(kinds(applyChanges(snap, [{ type: 'put', key: A.key, lease: null }])), [
    'removed 10.5.1.0-24 192.168.0.1',
  ]);
  assert.equal(snap.size, 0);
});

test('a delete of an unknown key is silent', () => {
  assert.deepEqual(applyChanges(new Map(), [{ type: 'delete', key: A.key }]), []);
});
