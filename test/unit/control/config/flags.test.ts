import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import {
  DAEMON_FLAGS,
  STORE_FLAGS,
  bool,
  envName,
  int,
  parseFlags,
  storeKind,
  usage,
  type DaemonOptions,
} from '../../../../src/control/config/flags.js';
import { isWeftError } from '../../../../src/common/errors.js';

const parse = (argv: string[], env: Record<string, string> = {}) =>
  parseFlags(DAEMON_FLAGS, argv, env);

function usageFails(argv: string[], message: string, env: Record<string, string> = {}) {
  assert.throws(
    () => parse(argv, env),
    (err: unknown) => {
      assert.ok(isWeftError(err, 'WEFT_ERR_USAGE'), `not a usage error: ${String(err)}`);
      assert.equal(err.message, message);
      assert.equal(err.exitCode, 2);
      return true;
    },
  );
}

describe('daemon flags: defaults (flannel names and values)', () => {
  const v: DaemonOptions = parse([]).values;
  const expected: Partial<Record<keyof DaemonOptions, unknown>> = {
    etcdEndpoints: 'http://127.0.0.1:4001,http://127.0.0.1:2379',
    etcdPrefix: '/coreos.com/network',
    etcdKeyfile: '',
    etcdCertfile: '',
    etcdCafile: '',
    etcdUsername: '',
    etcdPassword: '',
    kubeSubnetMgr: false,
    kubeApiUrl: '',
    kubeconfigFile: '',
    kubeAnnotationPrefix: 'flannel.alpha.coreos.com',
    netConfigPath: '/etc/kube-flannel/net-conf.json',
    iface: [],
    ifaceRegex: [],
    ifaceCanReach: '',
    publicIp: '',
    publicIpv6: '',
    ipMasq: false,
    ipMasqFullyRandomDisable: false,
    iptablesResync: 5,
    iptablesForwardRules: true,
    subnetFile: '/run/flannel/subnet.env',
    subnetLeaseRenewMargin: 60,
    healthzIp: '0.0.0.0',
    healthzPort: 0,
    ipBlackholeRoute: false,
    setNodeNetworkUnavailable: true,
    v: 0,
    vmodule: '',
    log_backtrace_at: '',
    version: false,
    help: false,
    storeDir: '/var/lib/weft/store',
    logLevel: 'info',
    logFormat: 'json',
    releaseLeaseOnExit: false,
    dataplaneEngine: 'auto',
    dataplaneOffloads: '',
    dataplaneWorkers: 0,
    dataplaneBusyPoll: 0,
    dataplaneCpuAffine: true,
    dataplaneSchedFifo: 0,
    dataplaneQueueThreads: 1,
    podBridge: 'cni0',
  };
  for (const [key, value] of Object.entries(expected)) {
    it(`${key} defaults to ${JSON.stringify(value)}`, () => {
      assert.deepEqual(v[key as keyof DaemonOptions], value);
    });
  }

  it('has a default for every flag and nothing else', () => {
    assert.deepEqual(Object.keys(v).sort(), Object.keys(expected).sort());
  });
});

describe('parseFlags: spellings', () => {
  it('accepts --flag=value', () => {
    assert.equal(parse(['--etcd-prefix=/x']).values.etcdPrefix, '/x');
  });

  it('accepts --flag value', () => {
    assert.equal(parse(['--etcd-prefix', '/x']).values.etcdPrefix, '/x');
  });

  it('accepts -flag=value and -flag value', () => {
    assert.equal(parse(['-etcd-prefix=/x']).values.etcdPrefix, '/x');
    assert.equal(parse(['-etcd-prefix', '/y']).values.etcdPrefix, '/y');
  });

  it('keeps "=" inside a value', () => {
    assert.equal(parse(['--etcd-password=a=b']).values.etcdPassword, 'a=b');
  });

  it('accepts an empty value with =', () => {
    assert.equal(parse(['--kube-annotation-prefix=']).values.kubeAnnotationPrefix, '');
  });

  it('lets the last occurrence of a single-valued flag win', () => {
    assert.equal(parse(['--etcd-prefix=/a', '--etcd-prefix=/b']).values.etcdPrefix, '/b');
  });

  it('treats a bare boolean as true', () => {
    assert.equal(parse(['--ip-masq']).values.ipMasq, true);
  });

  it('accepts --bool=false and Go spellings of booleans', () => {
    assert.equal(parse(['--iptables-forward-rules=false']).values.iptablesForwardRules, false);
    assert.equal(parse(['--ip-masq=1']).values.ipMasq, true);
    assert.equal(parse(['--ip-masq=F']).values.ipMasq, false);
    assert.equal(parse(['--ip-masq=TRUE']).values.ipMasq, true);
  });

  it('never takes the next argument as a boolean value', () => {
    const p = parse(['--ip-masq', 'false']);
    assert.equal(p.values.ipMasq, true);
    assert.deepEqual(p.positionals, ['false']);
  });

  it('parses integers', () => {
    assert.equal(parse(['--healthz-port', '8080']).values.healthzPort, 8080);
  });

  it('accumulates a repeatable flag in order', () => {
    assert.deepEqual(parse(['--iface=eth1', '--iface', '10.0.0.1', '-iface=eth0']).values.iface, [
      'eth1',
      '10.0.0.1',
      'eth0',
    ]);
  });

  it('returns non-flag arguments as positionals, and everything after --', () => {
    const p = parse(['set', '--ip-masq', 'net.json', '--', '--etcd-prefix=/x']);
    assert.deepEqual(p.positionals, ['set', 'net.json', '--etcd-prefix=/x']);
    assert.equal(p.values.etcdPrefix, '/coreos.com/network');
  });

  it('reads -h as --help', () => {
    assert.equal(parse(['-h']).values.help, true);
  });

  it('returns frozen values and lists', () => {
    const p = parse(['--iface=eth0']);
    assert.ok(Object.isFrozen(p.values));
    assert.ok(Object.isFrozen(p.values.iface));
  });
});

describe('parseFlags: environment', () => {
  it('derives FLANNELD_<UPPER_SNAKE> names', () => {
    assert.equal(envName('etcd-endpoints'), 'FLANNELD_ETCD_ENDPOINTS');
    assert.equal(envName('public-ipv6'), 'FLANNELD_PUBLIC_IPV6');
  });

  it('reads a flag from the environment', () => {
    const p = parse([], { FLANNELD_ETCD_ENDPOINTS: 'http://10.0.0.1:2379' });
    assert.equal(p.values.etcdEndpoints, 'http://10.0.0.1:2379');
    assert.equal(p.sources['etcd-endpoints'], 'env');
  });

  it('reads booleans and numbers from the environment', () => {
    const p = parse([], { FLANNELD_IP_MASQ: 'true', FLANNELD_SUBNET_LEASE_RENEW_MARGIN: '30' });
    assert.equal(p.values.ipMasq, true);
    assert.equal(p.values.subnetLeaseRenewMargin, 30);
  });

  it('lets the command line beat the environment', () => {
    const p = parse(['--etcd-prefix=/cli'], { FLANNELD_ETCD_PREFIX: '/env' });
    assert.equal(p.values.etcdPrefix, '/cli');
    assert.equal(p.sources['etcd-prefix'], 'flag');
  });

  it('ignores an empty environment variable', () => {
    const p = parse([], { FLANNELD_ETCD_PREFIX: '' });
    assert.equal(p.values.etcdPrefix, '/coreos.com/network');
    assert.equal(p.explicit.has('etcd-prefix'), false);
  });

  it('splits a repeatable flag from the environment on commas', () => {
    assert.deepEqual(parse([], { FLANNELD_IFACE: 'eth1, 10.0.0.1,eth0' }).values.iface, [
      'eth1',
      '10.0.0.1',
      'eth0',
    ]);
  });

  it('keeps --iface-regex from the environment whole (regexes contain commas)', () => {
    assert.deepEqual(parse([], { FLANNELD_IFACE_REGEX: '^eth[0-9]{1,2}$' }).values.ifaceRegex, [
      '^eth[0-9]{1,2}$',
    ]);
  });

  it('does not add environment entries to a repeatable flag given on the command line', () => {
    assert.deepEqual(parse(['--iface=eth9'], { FLANNELD_IFACE: 'eth1,eth2' }).values.iface, [
      'eth9',
    ]);
  });

  it('names the variable when an environment value is invalid', () => {
    usageFails([], '--healthz-port (from FLANNELD_HEALTHZ_PORT): must be a whole number, got "x"', {
      FLANNELD_HEALTHZ_PORT: 'x',
    });
  });
});

describe('parseFlags: explicit flags', () => {
  it('lists flags set on the command line or in the environment, not defaults', () => {
    const p = parse(['--ip-masq'], { FLANNELD_IFACE: 'eth0' });
    assert.deepEqual([...p.explicit].sort(), ['iface', 'ip-masq']);
  });

  it('counts a flag set to its default value as explicit', () => {
    assert.ok(parse(['--etcd-prefix=/coreos.com/network']).explicit.has('etcd-prefix'));
  });
});

describe('parseFlags: errors', () => {
  it('rejects an unknown flag', () => usageFails(['--nope=1'], '--nope: unknown flag'));
  it('rejects an unknown single-dash flag', () => usageFails(['-x'], '-x: unknown flag'));
  it('rejects a missing value at the end', () =>
    usageFails(['--etcd-prefix'], '--etcd-prefix: needs a value'));
  it('rejects a missing value before another flag', () =>
    usageFails(['--etcd-prefix', '--ip-masq'], '--etcd-prefix: needs a value'));
  it('rejects a bad number', () =>
    usageFails(['--iptables-resync=5s'], '--iptables-resync: must be a whole number, got "5s"'));
  it('rejects --subnet-lease-renew-margin outside 1..1439', () => {
    usageFails(
      ['--subnet-lease-renew-margin=0'],
      '--subnet-lease-renew-margin: must be between 1 and 1439, got 0',
    );
    usageFails(
      ['--subnet-lease-renew-margin=1440'],
      '--subnet-lease-renew-margin: must be between 1 and 1439, got 1440',
    );
  });
  it('rejects --dataplane-workers outside 0..64', () =>
    usageFails(
      ['--dataplane-workers=65'],
      '--dataplane-workers: must be between 0 and 64, got 65',
    ));
  it('rejects --dataplane-busy-poll above 10000 µs', () =>
    usageFails(
      ['--dataplane-busy-poll=20000'],
      '--dataplane-busy-poll: must be between 0 and 10000, got 20000',
    ));
  it('rejects --dataplane-sched-fifo above priority 99', () =>
    usageFails(
      ['--dataplane-sched-fifo=100'],
      '--dataplane-sched-fifo: must be between 0 and 99, got 100',
    ));
  it('rejects a --pod-bridge that cannot name a device', () => {
    usageFails(['--pod-bridge='], '--pod-bridge: must not be empty');
    usageFails(
      ['--pod-bridge=a-bridge-name-too-long'],
      '--pod-bridge: must be at most 15 bytes (IFNAMSIZ - 1)',
    );
    usageFails(['--pod-bridge=br/0'], "--pod-bridge: must not contain '/', ':' or whitespace");
  });
  it('takes any --pod-bridge a device may be named', () =>
    assert.equal(parse(['--pod-bridge=pods0']).values.podBridge, 'pods0'));
  it('rejects a bad boolean', () =>
    usageFails(['--ip-masq=yes'], '--ip-masq: must be true or false, got "yes"'));
  it('rejects a bad --log-level', () =>
    usageFails(
      ['--log-level=loud'],
      '--log-level: must be one of fatal|error|warn|info|debug|trace|silent, got "loud"',
    ));
  it('rejects a bad --dataplane-engine', () =>
    usageFails(
      ['--dataplane-engine', 'ebpf'],
      '--dataplane-engine: must be one of auto|native|bpf|js, got "ebpf"',
    ));
  it('rejects a --public-ip that is not an IPv4 address', () => {
    usageFails(['--public-ip=10.0.0'], '--public-ip: must be an IPv4 address, got "10.0.0"');
    usageFails(['--public-ip=fc00::1'], '--public-ip: must be an IPv4 address, got "fc00::1"');
  });
  it('rejects a --public-ipv6 that is not an IPv6 address', () =>
    usageFails(
      ['--public-ipv6=10.0.0.1'],
      '--public-ipv6: must be an IPv6 address, got "10.0.0.1"',
    ));
  it('rejects a --iface-can-reach that is not an address', () =>
    usageFails(
      ['--iface-can-reach=example.com'],
      '--iface-can-reach: must be an IP address, got "example.com"',
    ));
});

describe('storeKind', () => {
  it('is embedded by default', () => assert.equal(storeKind(parse([])), 'embedded'));
  it('is etcd when --etcd-endpoints is given', () =>
    assert.equal(storeKind(parse(['--etcd-endpoints=http://127.0.0.1:2379'])), 'etcd'));
  it('is etcd when FLANNELD_ETCD_ENDPOINTS is set', () =>
    assert.equal(
      storeKind(parse([], { FLANNELD_ETCD_ENDPOINTS: 'http://127.0.0.1:2379' })),
      'etcd',
    ));
  it('is kube with --kube-subnet-mgr, even with --etcd-endpoints', () =>
    assert.equal(
      storeKind(parse(['--kube-subnet-mgr', '--etcd-endpoints=http://x:2379'])),
      'kube',
    ));
  it('works on the store-only flag table', () =>
    assert.equal(storeKind(parseFlags(STORE_FLAGS, ['--etcd-endpoints=http://x:2379'])), 'etcd'));
});

describe('store-only flags', () => {
  it('hold the store, config and logging flags', () => {
    assert.deepEqual(Object.keys(STORE_FLAGS), [
      'etcd-endpoints',
      'etcd-prefix',
      'etcd-keyfile',
      'etcd-certfile',
      'etcd-cafile',
      'etcd-username',
      'etcd-password',
      'kube-subnet-mgr',
      'kube-api-url',
      'kubeconfig-file',
      'kube-annotation-prefix',
      'net-config-path',
      'store-dir',
      'log-level',
      'help',
    ]);
  });

  it('reject daemon-only flags', () => {
    assert.throws(() => parseFlags(STORE_FLAGS, ['--ip-masq']), /--ip-masq: unknown flag/);
  });
});

describe('tables are extensible', () => {
  it('a new row becomes a typed, env-backed flag', () => {
    const table = {
      ...DAEMON_FLAGS,
      'offload-gso': bool(true, 'use UDP GSO'),
      'batch-size': int(64, 'packets per batch', { min: 1, max: 1024 }),
    };
    const p = parseFlags(table, ['--offload-gso=false'], { FLANNELD_BATCH_SIZE: '128' });
    const gso: boolean = p.values.offloadGso;
    const batch: number = p.values.batchSize;
    assert.equal(gso, false);
    assert.equal(batch, 128);
  });
});

describe('usage', () => {
  const text = usage(DAEMON_FLAGS, 'weft daemon');

  it('lists every flag', () => {
    for (const name of Object.keys(DAEMON_FLAGS)) assert.match(text, new RegExp(`--${name}\\b`));
  });

  it('shows defaults and env variables', () => {
    assert.match(
      text,
      /--subnet-file=FILE\n.*default "\/run\/flannel\/subnet.env"; env FLANNELD_SUBNET_FILE/,
    );
    assert.match(text, /--iface=NAME\|IP\n.*repeatable; env FLANNELD_IFACE/);
  });

  it('starts with the command line', () => {
    assert.ok(text.startsWith('Usage: weft daemon [OPTION]...\n'));
  });
});

describe('dataplane flags', () => {
  it('--dataplane-offloads takes all, none or a list of known offloads', () => {
    assert.equal(
      parseFlags(DAEMON_FLAGS, ['--dataplane-offloads=csum,tso4']).values.dataplaneOffloads,
      'csum,tso4',
    );
    assert.equal(
      parseFlags(DAEMON_FLAGS, ['--dataplane-offloads', 'none']).values.dataplaneOffloads,
      'none',
    );
    assert.throws(() => parseFlags(DAEMON_FLAGS, ['--dataplane-offloads=tso9']), {
      code: 'WEFT_ERR_USAGE',
      message: /--dataplane-offloads: unknown offload\(s\) tso9/,
    });
  });
});
