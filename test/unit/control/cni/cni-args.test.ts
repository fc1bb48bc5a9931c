import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readCniArgs } from '../../../../src/control/cni/cni-args.js';
import { CNI_ERR, CniError } from '../../../../src/control/cni/cni-error.js';

const ADD_ENV = {
  CNI_COMMAND: 'ADD',
  CNI_CONTAINERID: 'abc123',
  CNI_NETNS: '/var/run/netns/pod',
  CNI_IFNAME: 'eth0',
  CNI_PATH: '/opt/cni/bin::/usr/lib/cni',
};

function cniCode(fn: () => unknown): { code: number; msg: string } {
  try {
    fn();
  } catch (err) {
    assert.ok(err instanceof CniError, `expected a CniError, got ${String(err)}`);
    return { code: err.cniCode, msg: err.message };
  }
  assert.fail('expected a CniError');
}

test('reads the ADD environment and splits CNI_PATH', () => {
  const a = readCniArgs({ ...ADD_ENV, CNI_ARGS: 'K8S_POD_NAME=p' });
  assert.deepEqual(a, {
    command: 'ADD',
    containerId: 'abc123',
    netns: '/var/run/netns/pod',
    ifName: 'eth0',
    args: 'K8S_POD_NAME=p',
    path: ['/opt/cni/bin', '/usr/lib/cni'],
  });
});

test('missing variables are code 4 and named in the message', () => {
  const e = cniCode(() => readCniArgs({ CNI_COMMAND: 'ADD', CNI_IFNAME: 'eth0' }));
  assert.equal(e.code, CNI_ERR.INVALID_ENV);
  assert.equal(e.msg, 'required env variables [CNI_CONTAINERID,CNI_NETNS,CNI_PATH] missing');
});

test('a missing CNI_COMMAND is code 4', () => {
  assert.equal(cniCode(() => readCniArgs({})).code, CNI_ERR.INVALID_ENV);
});

test('DEL does not need CNI_NETNS', () => {
  const { CNI_NETNS: _netns, ...env } = ADD_ENV;
  assert.equal(readCniArgs({ ...env, CNI_COMMAND: 'DEL' }).netns, '');
});

test('VERSION needs only CNI_COMMAND', () => {
  assert.equal(readCniArgs({ CNI_COMMAND: 'VERSION' }).command, 'VERSION');
});

test('an unknown command is code 4', () => {
  const e = cniCode(() => readCniArgs({ ...ADD_ENV, CNI_COMMAND: 'FROB' }));
  assert.equal(e.code, CNI_ERR.INVALID_ENV);
  assert.match(e.msg, /unknown CNI_COMMAND: FROB/);
});

test('a container ID that could leave the cache dir is code 4', () => {
  for (const id of ['../etc', 'a/b', '.hidden', '']) {
    const e = cniCode(() => readCniArgs({ ...ADD_ENV, CNI_CONTAINERID: id }));
    assert.equal(e.code, CNI_ERR.INVALID_ENV, id);
  }
});

test('interface names longer than 15 or with / are code 4', () => {
  for (const ifName of ['eth0123456789abc', 'a/b', '..', 'a b']) {
    const e = cniCode(() => readCniArgs({ ...ADD_ENV, CNI_IFNAME: ifName }));
    assert.equal(e.code, CNI_ERR.INVALID_ENV, ifName);
    assert.match(e.msg, /CNI_IFNAME/);
  }
});
