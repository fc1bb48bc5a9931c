import { test } from 'node:test';
import assert from 'node:assert/strict';
import { makeSubnetKey, parseSubnetKey } from '../../../../src/control/lease/subnet-key.js';
import { formatCIDR, parseCIDR } from '../../../../src/common/ip.js';
import { decodeLeaseAttrs, encodeLeaseAttrs } from '../../../../src/control/lease/lease-json.js';

test('subnet keys round-trip for IPv4, dual-stack and IPv6-only', () => {
  for (const [v4, v6, key] of [
    ['10.5.34.0/24', null, '10.5.34.0-24'],
    ['10.5.77.0/24', 'fc00:0:0:5d::/64', '10.5.77.0-24&fc00:0:0:5d::-64'],
    [null, 'fc00:0:0:5d::/64', '0.0.0.0-0&fc00:0:0:5d::-64'],
  ] as const) {
    const a = v4 ? parseCIDR(v4) : null;
    const b = v6 ? parseCIDR(v6) : null;
    assert.equal(makeSubnetKey(a, b), key);
    const back = parseSubnetKey(key)!;
    assert.equal(back.v4 && formatCIDR(back.v4), v4);
    assert.equal(back.v6 && formatCIDR(back.v6), v6);
  }
});

test('malformed or unaligned keys do not parse', () => {
  for (const k of [
    '10.5.34.0',
    '10.5.34.0-33',
    '10.5.34.1-24',
    'x-24',
    '10.5.34.0-24&zz::-64',
    '10.5.34.0-24&fc00::1-64',
    '',
  ]) {
    assert.equal(parseSubnetKey(k), null, k);
  }
});

test('lease JSON keeps flannel field order and writes PublicIPv6 null', () => {
  assert.equal(
    encodeLeaseAttrs({ publicIP: '10.0.0.1', publicIPv6: null, backendType: 'host-gw' }),
    '{"PublicIP":"10.0.0.1","PublicIPv6":null,"BackendType":"host-gw"}',
  );
  assert.equal(
    encodeLeaseAttrs({ publicIP: '10.0.0.1', publicIPv6: null, backendType: '' }),
    '{"PublicIP":"10.0.0.1","PublicIPv6":null}',
  );
  assert.equal(
    encodeLeaseAttrs({
      publicIP: '10.0.0.1',
      publicIPv6: 'fd00::1',
      backendType: 'vxlan',
      backendData: { VNI: 1, VtepMAC: 'aa:bb:cc:dd:ee:ff' },
      backendV6Data: { VNI: 1, VtepMAC: 'aa:bb:cc:dd:ee:01' },
    }),
    '{"PublicIP":"10.0.0.1","PublicIPv6":"fd00::1","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"aa:bb:cc:dd:ee:ff"},"BackendV6Data":{"VNI":1,"VtepMAC":"aa:bb:cc:dd:ee:01"}}',
  );
});

test('lease JSON field names match case-insensitively on read', () => {
  const r = decodeLeaseAttrs(
    '{"publicip":"10.0.0.1","BACKENDTYPE":"vxlan","backenddata":{"VNI":1}}',
  );
  assert.ok(r.ok);
  assert.equal(r.value.publicIP, '10.0.0.1');
  assert.equal(r.value.backendType, 'vxlan');
  assert.deepEqual(r.value.backendData, { VNI: 1 });
});

test('malformed lease values yield a reason instead of throwing', () => {
  for (const v of [
    '',
    '{',
    '[]',
    'null',
    '{"PublicIP":"nope"}',
    '{"PublicIP":42}',
    '{}',
    '{"PublicIP":"10.0.0.1","BackendType":5}',
  ]) {
    const r = decodeLeaseAttrs(v);
    assert.equal(r.ok, false, v);
  }
});
