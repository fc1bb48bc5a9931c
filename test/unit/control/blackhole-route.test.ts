import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { parseCIDR } from '../../../src/common/ip.js';
import { logger } from '../../../src/common/log.js';
import { blackholeOps, blackholeRouteTask } from '../../../src/control/blackhole-route.js';
import { parseNetConfig } from '../../../src/control/config/net-config.js';
import { FakeNetlink } from '../../../src/control/netlink/fake-netlink.js';
import { describeOp } from '../../../src/control/netlink/netlink.js';

const log = logger('test');
log.level = 'silent';

const lease = {
  key: '10.5.1.0-24&fc00:0:0:1::-64',
  subnet: parseCIDR('10.5.1.0/24')!,
  ipv6Subnet: parseCIDR('fc00:0:0:1::/64')!,
  attrs: { publicIP: '192.168.1.1', publicIPv6: 'fd00::1', backendType: 'vxlan' },
  expiration: null,
};

describe('--ip-blackhole-route', () => {
  test('one blackhole route per enabled family, for our own subnet', () => {
    const dual = parseNetConfig(
      JSON.stringify({ Network: '10.5.0.0/16', EnableIPv6: true, IPv6Network: 'fc00::/48' }),
    );
    assert.deepEqual(blackholeOps(dual, lease).map(describeOp), [
      'add route blackhole 10.5.1.0/24',
      'add route blackhole fc00:0:0:1::/64',
    ]);
    const v4 = parseNetConfig(JSON.stringify({ Network: '10.5.0.0/16' }));
    assert.equal(blackholeOps(v4, lease).length, 1);
  });

  test('never replaces another route of the prefix (the pod bridge’s own): that one stays', async () => {
    const nl = new FakeNetlink();
    nl.addLink('cni0');
    const cfg = parseNetConfig(JSON.stringify({ Network: '10.5.0.0/16' }));
    await nl.apply([{ op: 'replaceRoute', dst: '10.5.1.0/24', dev: 'cni0' }]);
    const results = await nl.apply(blackholeOps(cfg, lease));
    assert.deepEqual(results, [null]); // EEXIST counts as done
    assert.equal(nl.blackholes.size, 0);
    assert.equal((await nl.listRoutes({ family: 4 }))[0]?.dev, 'cni0');
  });

  test('the task puts the route in and re-applies it each resync until stopped', async () => {
    const nl = new FakeNetlink();
    const cfg = parseNetConfig(JSON.stringify({ Network: '10.5.0.0/16' }));
    const ac = new AbortController();
    const task = blackholeRouteTask({ resyncSec: 0.001, openNetlink: () => nl, log });
    const done = task({ lease, netConfig: cfg, signal: ac.signal });
    while (nl.calls.length < 2) await new Promise((r) => setImmediate(r));
    assert.deepEqual([...nl.blackholes], ['254|10.5.1.0/24']);
    nl.blackholes.clear(); // deleted by hand: the next resync restores it
    while (nl.blackholes.size === 0) await new Promise((r) => setImmediate(r));
    ac.abort();
    await done;
    assert.equal(nl.closed, true);
  });
});
