// Expected delegates are flannel-io/cni-plugin's own test fixtures (flannel_linux_test.go):
// same subnet.env in, same delegate out.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { parseCniConfig } from '../../../../src/control/cni/cni-config.js';
import { CNI_ERR, CniError } from '../../../../src/control/cni/cni-error.js';
import {
  renderDelegate,
  serializeDelegate,
  subnetEnvForCni,
} from '../../../../src/control/cni/delegate.js';

const V4_ENV =
  'FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_SUBNET=10.1.17.1/24\nFLANNEL_MTU=1472\nFLANNEL_IPMASQ=true\n';
const V6_ENV =
  'FLANNEL_IPV6_NETWORK=fc00::/48\nFLANNEL_IPV6_SUBNET=fc00::1/64\nFLANNEL_MTU=1472\nFLANNEL_IPMASQ=true\n';
const DUAL_ENV =
  'FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_SUBNET=10.1.17.1/24\nFLANNEL_IPV6_NETWORK=fc00::/48\n' +
  'FLANNEL_IPV6_SUBNET=fc00::1/64\nFLANNEL_MTU=1472\nFLANNEL_IPMASQ=true\n';
const MULTI_ENV =
  'FLANNEL_NETWORK=10.1.0.0/16,192.168.0.0/16\nFLANNEL_SUBNET=10.1.17.1/24\nFLANNEL_MTU=1472\nFLANNEL_IPMASQ=true\n';

const FLANNEL_INPUT = { name: 'cni-flannel', type: 'flannel' };
const IPAM_ROUTES = [{ dst: '10.96.0.0/12' }, { dst: '192.168.244.0/24', gw: '10.1.17.20' }];

function render(conf: Record<string, unknown>, envText: string) {
  return renderDelegate(
    parseCniConfig(JSON.stringify(conf)),
    subnetEnvForCni(envText, 'subnet.env'),
  );
}

function cniCode(fn: () => unknown): { code: number; msg: string; details: string } {
  try {
    fn();
  } catch (err) {
    assert.ok(err instanceof CniError, `expected a CniError, got ${String(err)}`);
    return { code: err.cniCode, msg: err.message, details: err.cniDetails };
  }
  assert.fail('expected a CniError');
}

test('v4: bridge + host-local on the node subnet, route to the cluster network (flannel fixture)', () => {
  assert.deepEqual(render(FLANNEL_INPUT, V4_ENV), {
    ipMasq: false,
    ipam: {
      routes: [{ dst: '10.1.0.0/16' }],
      ranges: [[{ subnet: '10.1.17.0/24' }]],
      type: 'host-local',
    },
    isGateway: true,
    mtu: 1472,
    name: 'cni-flannel',
    type: 'bridge',
  });
});

test('v6 only (flannel fixture)', () => {
  assert.deepEqual(render(FLANNEL_INPUT, V6_ENV).ipam, {
    routes: [{ dst: 'fc00::/48' }],
    ranges: [[{ subnet: 'fc00::/64' }]],
    type: 'host-local',
  });
});

test('dual-stack: one range and one route per family, v4 first (flannel fixture)', () => {
  assert.deepEqual(render(FLANNEL_INPUT, DUAL_ENV).ipam, {
    routes: [{ dst: '10.1.0.0/16' }, { dst: 'fc00::/48' }],
    ranges: [[{ subnet: '10.1.17.0/24' }], [{ subnet: 'fc00::/64' }]],
    type: 'host-local',
  });
});

test("flannel's multi-network FLANNEL_NETWORK list gives one route each (flannel fixture)", () => {
  assert.deepEqual(render(FLANNEL_INPUT, MULTI_ENV).ipam, {
    routes: [{ dst: '10.1.0.0/16' }, { dst: '192.168.0.0/16' }],
    ranges: [[{ subnet: '10.1.17.0/24' }]],
    type: 'host-local',
  });
});

test('ipam from the config keeps its type, routes and unknown keys; ranges come from subnet.env', () => {
  const ipam = { type: 'my-ipam', 'unknown-param': 'unknown-value', routes: IPAM_ROUTES };
  assert.deepEqual(render({ ...FLANNEL_INPUT, ipam }, DUAL_ENV).ipam, {
    type: 'my-ipam',
    'unknown-param': 'unknown-value',
    routes: [...IPAM_ROUTES, { dst: '10.1.0.0/16' }, { dst: 'fc00::/48' }],
    ranges: [[{ subnet: '10.1.17.0/24' }], [{ subnet: 'fc00::/64' }]],
  });
});

test('ipam without a type gets host-local', () => {
  const d = render({ ...FLANNEL_INPUT, ipam: { routes: IPAM_ROUTES, dataDir: '/tmp/h' } }, V4_ENV);
  assert.equal((d.ipam as Record<string, unknown>).type, 'host-local');
  assert.equal((d.ipam as Record<string, unknown>).dataDir, '/tmp/h');
});

test('FLANNEL_IPMASQ=false makes the bridge masquerade', () => {
  assert.equal(render(FLANNEL_INPUT, V4_ENV.replace('IPMASQ=true', 'IPMASQ=false')).ipMasq, true);
});

test('delegate keys win over ipMasq, mtu and isGateway, and pass through', () => {
  const delegate = { ipMasq: true, mtu: 1400, isGateway: false, hairpinMode: true, bridge: 'cni0' };
  const d = render({ ...FLANNEL_INPUT, delegate }, V4_ENV);
  assert.equal(d.ipMasq, true);
  assert.equal(d.mtu, 1400);
  assert.equal(d.isGateway, false);
  assert.equal(d.hairpinMode, true);
  assert.equal(d.bridge, 'cni0');
});

test('a non-bridge delegate gets no isGateway', () => {
  const d = render({ ...FLANNEL_INPUT, delegate: { type: 'ipvlan', master: 'eth0' } }, V4_ENV);
  assert.equal(d.type, 'ipvlan');
  assert.equal('isGateway' in d, false);
});

test('name and cniVersion come from the config, runtimeConfig is passed through', () => {
  const runtimeConfig = { portMappings: [{ hostPort: 8080, containerPort: 80, protocol: 'tcp' }] };
  const d = render(
    {
      ...FLANNEL_INPUT,
      name: 'cbr0',
      cniVersion: '0.3.1',
      delegate: { cniVersion: '0.2.0' },
      runtimeConfig,
    },
    V4_ENV,
  );
  assert.equal(d.name, 'cbr0');
  assert.equal(d.cniVersion, '0.3.1');
  assert.deepEqual(d.runtimeConfig, runtimeConfig);
});

test('the serialized delegate has sorted keys at every level, as Go writes maps', () => {
  const d = render(
    { ...FLANNEL_INPUT, cniVersion: '1.0.0', delegate: { hairpinMode: true } },
    V4_ENV,
  );
  assert.equal(
    serializeDelegate(d),
    '{"cniVersion":"1.0.0","hairpinMode":true,"ipMasq":false,' +
      '"ipam":{"ranges":[[{"subnet":"10.1.17.0/24"}]],"routes":[{"dst":"10.1.0.0/16"}],"type":"host-local"},' +
      '"isGateway":true,"mtu":1472,"name":"cni-flannel","type":"bridge"}',
  );
});

test('an empty subnet.env is code 11 naming every missing variable and the daemon', () => {
  const e = cniCode(() => subnetEnvForCni('foo=bar\n', '/run/flannel/subnet.env'));
  assert.equal(e.code, CNI_ERR.TRY_AGAIN_LATER);
  assert.equal(
    e.msg,
    '/run/flannel/subnet.env is missing FLANNEL_NETWORK, FLANNEL_IPV6_NETWORK, FLANNEL_SUBNET, FLANNEL_IPV6_SUBNET, FLANNEL_MTU, FLANNEL_IPMASQ',
  );
  assert.match(e.details, /weft daemon/);
});

test('a subnet.env without MTU and masq names just those', () => {
  const e = cniCode(() =>
    subnetEnvForCni('FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_SUBNET=10.1.17.1/24\n', 's'),
  );
  assert.equal(e.msg, 's is missing FLANNEL_MTU, FLANNEL_IPMASQ');
});

test('unparseable values in subnet.env are code 102', () => {
  for (const bad of [
    V4_ENV.replace('10.1.0.0/16', '10.1.0.0'),
    V4_ENV.replace('10.1.17.1/24', 'ten'),
    V4_ENV.replace('1472', '14x'),
  ]) {
    assert.equal(cniCode(() => subnetEnvForCni(bad, 's')).code, CNI_ERR.SUBNET_ENV_INVALID);
  }
});
