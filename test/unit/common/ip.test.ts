import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  parseIP,
  formatIP,
  parseCIDR,
  formatCIDR,
  containsNet,
  isAligned,
  ipToBytes,
  ipFromBytes,
  maskOf,
} from '../../../src/common/ip.js';

test('ipv6 text round-trips in Go/RFC 5952 form', () => {
  const cases: Array<[string, string]> = [
    ['fc00:0:0:1::', 'fc00:0:0:1::'],
    ['fc00:0000:0000:ffff:0:0:0:0', 'fc00:0:0:ffff::'],
    ['::', '::'],
    ['::1', '::1'],
    ['2001:db8:0:0:1:0:0:1', '2001:db8::1:0:0:1'],
    ['2001:db8::ffff:10.0.0.1', '2001:db8::ffff:a00:1'],
    ['FC00::5D:0:0:0', 'fc00::5d:0:0:0'],
    ['1:0:2:3:4:5:6:7', '1:0:2:3:4:5:6:7'],
  ];
  for (const [input, want] of cases) {
    const ip = parseIP(input);
    assert.ok(ip, input);
    assert.equal(formatIP(ip.family, ip.addr), want, input);
  }
});

test('ipv4 parse and format', () => {
  const ip = parseIP('10.5.34.0');
  assert.deepEqual(ip, { family: 4, addr: 0x0a052200n });
  assert.equal(formatIP(4, 0x0a052200n), '10.5.34.0');
  assert.equal(parseIP('10.5.34'), null);
  assert.equal(parseIP('256.1.1.1'), null);
});

test('ipv4: the ends of the range and every octet position round-trip', () => {
  for (const [text, addr] of [
    ['0.0.0.0', 0n],
    ['255.255.255.255', 0xffffffffn],
    ['1.2.3.4', 0x01020304n],
    ['192.168.0.255', 0xc0a800ffn],
    ['128.0.0.1', 0x80000001n],
  ] as const) {
    assert.deepEqual(parseIP(text), { family: 4, addr }, text);
    assert.equal(formatIP(4, addr), text);
  }
});

test('cidr parse rejects bad prefixes and checks containment', () => {
  assert.equal(parseCIDR('10.0.0.0/33'), null);
  assert.equal(parseCIDR('10.0.0.0'), null);
  assert.equal(parseCIDR('10.0.0.0/x'), null);
  const net = parseCIDR('10.5.0.0/16')!;
  assert.equal(formatCIDR(net), '10.5.0.0/16');
  assert.ok(containsNet(net, parseCIDR('10.5.34.0/24')!));
  assert.ok(!containsNet(net, parseCIDR('10.6.34.0/24')!));
  assert.ok(!containsNet(net, parseCIDR('10.0.0.0/8')!));
  assert.ok(isAligned(parseCIDR('10.5.34.0/24')!));
  assert.ok(!isAligned(parseCIDR('10.5.34.1/24')!));
});

test('bytes round-trip for both families', () => {
  for (const s of ['192.168.7.9', 'fc00:0:0:5d::1']) {
    const ip = parseIP(s)!;
    assert.deepEqual(ipFromBytes(ipToBytes(ip)), ip);
  }
});

test('maskOf: every prefix of both families, the same value when asked again', () => {
  for (const [family, width] of [
    [4, 32],
    [6, 128],
  ] as const) {
    const all = (1n << BigInt(width)) - 1n;
    for (let prefix = 0; prefix <= width; prefix++) {
      const want = all ^ ((1n << BigInt(width - prefix)) - 1n);
      assert.equal(maskOf(family, prefix), want, `/${prefix} (IPv${family})`);
      assert.equal(maskOf(family, prefix), want, `/${prefix} (IPv${family}), again`);
    }
  }
  assert.equal(maskOf(4, 24), 0xffffff00n);
});
