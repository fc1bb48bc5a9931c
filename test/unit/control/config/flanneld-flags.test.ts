/**
 * Every flag of flanneld HEAD (v0.28.x, main.go: its own flags plus the klog flags it copies:
 * v, vmodule, log_backtrace_at) is accepted by `weft daemon`, with a value of its type, both as
 * `-flag=value` and from FLANNELD_<NAME> (#13.4). What each one does is pinned in the rows below.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { textLine, verbosityLevel } from '../../../../src/common/log.js';
import {
  DAEMON_FLAGS,
  IGNORED_FLANNELD_FLAGS,
  envName,
  parseFlags,
} from '../../../../src/control/config/flags.js';

/** flanneld's flags as main.go declares them: name → a value on the command line. */
const FLANNELD_FLAGS: Record<string, string | null> = {
  'etcd-endpoints': 'http://10.0.0.1:2379',
  'etcd-prefix': '/coreos.com/network',
  'etcd-keyfile': '/k.pem',
  'etcd-certfile': '/c.pem',
  'etcd-cafile': '/ca.pem',
  'etcd-username': 'u',
  'etcd-password': 'p',
  iface: 'eth0',
  'iface-regex': '^eth',
  'iface-can-reach': '10.0.0.1',
  'subnet-file': '/run/flannel/subnet.env',
  'public-ip': '10.0.0.5',
  'public-ipv6': 'fd00::5',
  'subnet-lease-renew-margin': '30',
  'ip-masq': null,
  'ip-masq-fully-random-disable': null,
  'kube-subnet-mgr': null,
  'kube-api-url': 'https://10.0.0.1:6443',
  'kube-annotation-prefix': 'flannel.alpha.coreos.com',
  'kubeconfig-file': '/kubeconfig',
  version: null,
  'healthz-ip': '127.0.0.1',
  'healthz-port': '8471',
  'iptables-resync': '5',
  'iptables-forward-rules': null,
  'ip-blackhole-route': null,
  'net-config-path': '/etc/kube-flannel/net-conf.json',
  'set-node-network-unavailable': null,
  // klog's, copied by flanneld
  v: '2',
  vmodule: 'main=3',
  log_backtrace_at: 'main.go:100',
};

describe("flanneld's flags", () => {
  for (const [name, value] of Object.entries(FLANNELD_FLAGS)) {
    test(`-${name} is accepted on the command line and from ${envName(name)}`, () => {
      assert.ok(Object.hasOwn(DAEMON_FLAGS, name), `--${name} is not a weft daemon flag`);
      const arg = value === null ? `-${name}` : `-${name}=${value}`;
      const p = parseFlags(DAEMON_FLAGS, [arg], {});
      assert.ok(p.explicit.has(name as keyof typeof DAEMON_FLAGS));
      const e = parseFlags(DAEMON_FLAGS, [], { [envName(name)]: value ?? 'true' });
      assert.equal(e.sources[name as keyof typeof DAEMON_FLAGS], 'env');
    });
  }

  test('-v=2 and -v 2 both parse (as Go flag does)', () => {
    assert.equal(parseFlags(DAEMON_FLAGS, ['-v=2'], {}).values.v, 2);
    assert.equal(parseFlags(DAEMON_FLAGS, ['-v', '7'], {}).values.v, 7);
  });

  test('-v maps to the log level: 0 info, 1-4 debug, 5+ trace', () => {
    assert.deepEqual([0, 1, 2, 4, 5, 10].map(verbosityLevel), [
      'info',
      'debug',
      'debug',
      'debug',
      'trace',
      'trace',
    ]);
  });

  test('the flags without meaning in weft are exactly the klog internals', () => {
    assert.deepEqual([...IGNORED_FLANNELD_FLAGS], ['vmodule', 'log_backtrace_at']);
  });

  test('--ip-masq-fully-random-disable and --ip-blackhole-route default off, as flanneld', () => {
    const p = parseFlags(DAEMON_FLAGS, [], {});
    assert.equal(p.values.ipMasqFullyRandomDisable, false);
    assert.equal(p.values.ipBlackholeRoute, false);
  });
});

describe('--log-format', () => {
  test('json (default) or text; anything else exits 2 naming the flag', () => {
    assert.equal(parseFlags(DAEMON_FLAGS, [], {}).values.logFormat, 'json');
    assert.equal(parseFlags(DAEMON_FLAGS, ['--log-format=text'], {}).values.logFormat, 'text');
    assert.throws(
      () => parseFlags(DAEMON_FLAGS, ['--log-format=xml'], {}),
      (e: unknown) => /--log-format/.test((e as Error).message),
    );
  });

  test('a text line: time, level, component, message, fields', () => {
    const json = JSON.stringify({
      level: 'warn',
      time: '2026-11-23T17:00:00.000Z',
      pid: 7,
      component: 'iptables',
      table: 'nat',
      err: 'exit 1: no such chain',
      msg: 'rule resync failed',
    });
    assert.equal(
      textLine(json),
      '2026-11-23T17:00:00.000Z WARN  [iptables] rule resync failed table=nat err="exit 1: no such chain"\n',
    );
  });
});
