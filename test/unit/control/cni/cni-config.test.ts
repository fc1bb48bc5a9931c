import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  checkVersion,
  DEFAULT_DATA_DIR,
  DEFAULT_SUBNET_FILE,
  parseCniConfig,
  versionAtLeast,
} from '../../../../src/control/cni/cni-config.js';
import { CNI_ERR, CniError } from '../../../../src/control/cni/cni-error.js';

function cniCode(fn: () => unknown): { code: number; msg: string } {
  try {
    fn();
  } catch (err) {
    assert.ok(err instanceof CniError, `expected a CniError, got ${String(err)}`);
    return { code: err.cniCode, msg: err.message };
  }
  assert.fail('expected a CniError');
}

const parse = (o: unknown) => parseCniConfig(JSON.stringify(o));

test('a minimal config gets flannel defaults for subnetFile and dataDir', () => {
  const c = parse({ name: 'cni-flannel', type: 'flannel', cniVersion: '1.0.0' });
  assert.equal(c.name, 'cni-flannel');
  assert.equal(c.subnetFile, DEFAULT_SUBNET_FILE);
  assert.equal(c.dataDir, DEFAULT_DATA_DIR);
  assert.equal(c.delegate, null);
  assert.equal(c.ipam, null);
});

test("the config libcni hands a kube-flannel conflist entry parses with type 'flannel' or 'weft'", () => {
  for (const type of ['flannel', 'weft']) {
    const c = parse({
      type,
      delegate: { hairpinMode: true, isDefaultGateway: true },
      name: 'cbr0',
      cniVersion: '0.3.1',
    });
    assert.deepEqual(c.delegate, { hairpinMode: true, isDefaultGateway: true });
    assert.equal(c.cniVersion, '0.3.1');
  }
});

test('subnetFile, dataDir, ipam and runtimeConfig are read', () => {
  const c = parse({
    name: 'n',
    subnetFile: '/tmp/s.env',
    dataDir: '/tmp/d',
    ipam: {
      type: 'host-local',
      dataDir: '/tmp/h',
      routes: [{ dst: '10.96.0.0/12' }, { dst: '192.168.244.0/24', gw: '10.1.17.20' }],
    },
    runtimeConfig: { portMappings: [] },
  });
  assert.equal(c.subnetFile, '/tmp/s.env');
  assert.equal(c.dataDir, '/tmp/d');
  assert.equal(c.ipam?.dataDir, '/tmp/h');
  assert.deepEqual(c.runtimeConfig, { portMappings: [] });
});

test('stdin that is not JSON is code 6', () => {
  assert.equal(cniCode(() => parseCniConfig('{"name": ')).code, CNI_ERR.DECODING_FAILURE);
  assert.equal(cniCode(() => parseCniConfig('[1]')).code, CNI_ERR.DECODING_FAILURE);
});

test('a missing or malformed name is code 7 naming the field', () => {
  for (const name of [undefined, '', 3, 'bad name', '../x']) {
    const e = cniCode(() => parse({ name }));
    assert.equal(e.code, CNI_ERR.INVALID_CONFIG, String(name));
    assert.match(e.msg, /^name: /);
  }
});

test("flannel's delegate rules: a string type, and no name or ipam", () => {
  const cases: Array<[unknown, RegExp]> = [
    [
      { type: 7 },
      /^delegate.type: 'delegate' dictionary, if present, must have \(string\) 'type' field/,
    ],
    [{ name: 'x' }, /^delegate.name: 'delegate' dictionary must not have 'name' field/],
    [{ ipam: {} }, /^delegate.ipam: 'delegate' dictionary must not have 'ipam' field/],
  ];
  for (const [delegate, msg] of cases) {
    const e = cniCode(() => parse({ name: 'n', delegate }));
    assert.equal(e.code, CNI_ERR.INVALID_CONFIG);
    assert.match(e.msg, msg);
  }
});

test('a delegate type that is a path or this plugin itself is code 7', () => {
  for (const type of ['../bin/sh', 'weft', 'flannel']) {
    const e = cniCode(() => parse({ name: 'n', delegate: { type } }));
    assert.equal(e.code, CNI_ERR.INVALID_CONFIG, type);
    assert.match(e.msg, /^delegate.type: /);
  }
});

test('fields of the wrong shape are code 7 naming the field', () => {
  const cases: Array<[Record<string, unknown>, string]> = [
    [{ subnetFile: 5 }, 'subnetFile'],
    [{ dataDir: true }, 'dataDir'],
    [{ delegate: [] }, 'delegate'],
    [{ ipam: 'host-local' }, 'ipam'],
    [{ ipam: { type: 1 } }, 'ipam.type'],
    [{ ipam: { routes: {} } }, 'ipam.routes'],
    [{ ipam: { routes: [{ dst: '10.0.0.0' }] } }, 'ipam.routes[0].dst'],
    [{ ipam: { routes: [{ dst: '10.0.0.0/8', gw: 'x' }] } }, 'ipam.routes[0].gw'],
    [{ runtimeConfig: 1 }, 'runtimeConfig'],
  ];
  for (const [extra, field] of cases) {
    const e = cniCode(() => parse({ name: 'n', ...extra }));
    assert.equal(e.code, CNI_ERR.INVALID_CONFIG, field);
    assert.ok(e.msg.startsWith(`${field}: `), e.msg);
  }
});

test('the four spec versions pass the version check', () => {
  for (const v of ['0.3.0', '0.3.1', '0.4.0', '1.0.0']) checkVersion(v);
});

test('an unsupported or absent cniVersion is code 1 (absent means 0.1.0, as libcni)', () => {
  for (const v of ['0.2.0', '', '1.1.0']) {
    assert.equal(cniCode(() => checkVersion(v)).code, CNI_ERR.INCOMPATIBLE_VERSION, v);
  }
});

test('a cniVersion that is not a version is code 6', () => {
  assert.equal(cniCode(() => checkVersion('one')).code, CNI_ERR.DECODING_FAILURE);
});

test('versionAtLeast compares numerically', () => {
  assert.equal(versionAtLeast('0.10.0', '0.4.0'), true);
  assert.equal(versionAtLeast('0.3.1', '0.4.0'), false);
  assert.equal(versionAtLeast('1.0.0', '1.0.0'), true);
});
