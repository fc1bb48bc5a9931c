import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import {
  defaultRouteIface,
  parseProcIPv6Route,
  parseProcNetRoute,
  selectExternalInterface,
  type IfaceSelection,
  type LinkInfo,
} from '../../../src/control/iface.js';
import { isWeftError } from '../../../src/common/errors.js';
import { formatIP } from '../../../src/common/ip.js';

// /proc/net/route from a little-endian host: default via 192.168.1.1 on eth0 (metric 100), a
// second default via 10.0.0.1 on wlan0 (metric 600), and two connected routes.
const ROUTE_LE = `Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
wlan0\t00000000\t0100000A\t0003\t0\t0\t600\t00000000\t0\t0\t0
eth0\t00000000\t0101A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0
eth0\t0001A8C0\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0
docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0
`;

// /proc/net/ipv6_route: a connected /64, the default via fe80::1 on eth0, the kernel's
// unreachable ::/0 reject route on lo, and a local /128.
const ROUTE6 = `fd000000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0
00000000000000000000000000000000 00 00000000000000000000000000000000 00 fe800000000000000000000000000001 00000400 00000002 00000000 00000003     eth0
00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo
fd000000000000000000000000000002 80 00000000000000000000000000000000 00 00000000000000000000000000000000 00000000 00000003 00000000 80200001     eth0
`;

describe('parseProcNetRoute', () => {
  const routes = parseProcNetRoute(ROUTE_LE, 'LE');

  it('reads every route line and skips the header', () => {
    assert.equal(routes.length, 4);
  });

  it('decodes host-order hex addresses on a little-endian host', () => {
    const r = routes[2]!;
    assert.deepEqual(
      [r.iface, formatIP(4, r.dst), r.prefix, formatIP(4, r.gateway)],
      ['eth0', '192.168.1.0', 24, '0.0.0.0'],
    );
  });

  it('decodes the gateway, metric and flags', () => {
    const r = routes[1]!;
    assert.deepEqual([formatIP(4, r.gateway), r.metric, r.flags], ['192.168.1.1', 100, 3]);
  });

  it('decodes big-endian text', () => {
    const be =
      'Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\nen0\tC0A80100\t00000000\t0001\t0\t0\t0\tFFFFFF00\n';
    const [r] = parseProcNetRoute(be, 'BE');
    assert.deepEqual([formatIP(4, r!.dst), r!.prefix], ['192.168.1.0', 24]);
  });

  it('skips malformed lines', () => {
    const text = ROUTE_LE + 'junk line\neth1\tZZZZZZZZ\t00000000\t0001\t0\t0\t0\t00000000\n';
    assert.equal(parseProcNetRoute(text, 'LE').length, 4);
  });
});

describe('parseProcIPv6Route', () => {
  const routes = parseProcIPv6Route(ROUTE6);

  it('reads every line', () => {
    assert.equal(routes.length, 4);
  });

  it('decodes destination, prefix, gateway, metric, flags and device', () => {
    const r = routes[1]!;
    assert.deepEqual(
      [r.iface, formatIP(6, r.dst), r.prefix, formatIP(6, r.gateway), r.metric, r.flags],
      ['eth0', '::', 0, 'fe80::1', 0x400, 3],
    );
  });

  it('decodes a host route', () => {
    const r = routes[3]!;
    assert.deepEqual([formatIP(6, r.dst), r.prefix], ['fd00::2', 128]);
  });

  it('skips malformed lines', () => {
    assert.equal(parseProcIPv6Route(ROUTE6 + 'x y z\n').length, 4);
  });
});

describe('defaultRouteIface', () => {
  it('picks the default route with the lowest metric', () => {
    assert.equal(defaultRouteIface(parseProcNetRoute(ROUTE_LE, 'LE')), 'eth0');
  });

  it('ignores the IPv6 reject route on lo', () => {
    assert.equal(defaultRouteIface(parseProcIPv6Route(ROUTE6)), 'eth0');
  });

  it('returns null without a default route', () => {
    assert.equal(
      defaultRouteIface(parseProcNetRoute(ROUTE_LE, 'LE').filter((r) => r.prefix > 0)),
      null,
    );
  });

  it('ignores a default route that is not up', () => {
    const down = ROUTE_LE.replace(
      'eth0\t00000000\t0101A8C0\t0003',
      'eth0\t00000000\t0101A8C0\t0002',
    );
    assert.equal(defaultRouteIface(parseProcNetRoute(down, 'LE')), 'wlan0');
  });
});

// Selection over a given link list (the namespace test covers the default route and
// --iface-can-reach against a real kernel).
const LINKS: LinkInfo[] = [
  { name: 'lo', index: 1, mtu: 65536, loopback: true, ipv4: ['127.0.0.1'], ipv6: ['::1'] },
  {
    name: 'eth0',
    index: 2,
    mtu: 1500,
    loopback: false,
    ipv4: ['10.0.0.5', '10.0.0.6'],
    ipv6: ['fe80::5', 'fd00::5'],
  },
  {
    name: 'eth1',
    index: 3,
    mtu: 9000,
    loopback: false,
    ipv4: ['169.254.3.3', '172.16.0.9'],
    ipv6: [],
  },
  { name: 'bare0', index: 4, mtu: 1500, loopback: false, ipv4: [], ipv6: [] },
  { name: 'nomtu0', index: 5, mtu: 0, loopback: false, ipv4: ['10.9.9.9'], ipv6: [] },
  { name: 'll0', index: 6, mtu: 1500, loopback: false, ipv4: ['169.254.7.7'], ipv6: ['fe80::7'] },
];
const NONE: IfaceSelection = {
  iface: [],
  ifaceRegex: [],
  ifaceCanReach: '',
  publicIP: '',
  publicIPv6: '',
};
const V4 = { ipv4: true, ipv6: false };
const DUAL = { ipv4: true, ipv6: true };
const select = (sel: Partial<IfaceSelection>, fams = V4) =>
  selectExternalInterface({ ...NONE, ...sel }, fams, LINKS);

async function ifaceFails(p: Promise<unknown>, message: RegExp) {
  await assert.rejects(p, (err: unknown) => {
    assert.ok(isWeftError(err, 'WEFT_ERR_IFACE'), `not an iface error: ${String(err)}`);
    assert.match(err.message, message);
    return true;
  });
}

describe('selectExternalInterface over a link list', () => {
  it('finds an interface by name and takes its first global address', async () => {
    const e = await select({ iface: ['eth0'] });
    assert.deepEqual(
      [e.name, e.index, e.mtu, e.ifaceAddr, e.publicIP],
      ['eth0', 2, 1500, '10.0.0.5', '10.0.0.5'],
    );
  });

  it('finds an interface by address and keeps that address', async () => {
    const e = await select({ iface: ['10.0.0.6'] });
    assert.deepEqual([e.name, e.ifaceAddr], ['eth0', '10.0.0.6']);
  });

  it('prefers a global address over a link-local one', async () => {
    assert.equal((await select({ iface: ['eth1'] })).ifaceAddr, '172.16.0.9');
  });

  it('settles for a link-local address when there is no other (as flannel)', async () => {
    assert.equal((await select({ iface: ['ll0'] })).ifaceAddr, '169.254.7.7');
  });

  it('prefers the global IPv6 address over the link-local one', async () => {
    assert.equal((await select({ iface: ['eth0'] }, DUAL)).ifaceAddrV6, 'fd00::5');
  });

  it('tries --iface entries in order', async () => {
    assert.equal((await select({ iface: ['missing0', 'bare0', 'eth1', 'eth0'] })).name, 'eth1');
  });

  it('tries --iface before --iface-regex', async () => {
    assert.equal((await select({ iface: ['eth1'], ifaceRegex: ['^eth0$'] })).name, 'eth1');
  });

  it('matches a regex against addresses before names', async () => {
    const e = await select({ ifaceRegex: ['^172\\.16\\.'] });
    assert.deepEqual([e.name, e.ifaceAddr], ['eth1', '172.16.0.9']);
  });

  it('matches a regex against names', async () => {
    assert.equal((await select({ ifaceRegex: ['^eth1$'] })).name, 'eth1');
  });

  it('skips loopback in regex matching', async () => {
    await ifaceFails(
      select({ ifaceRegex: ['^lo$'] }),
      /--iface-regex \^lo\$: matches no interface/,
    );
  });

  it('uses loopback when named explicitly', async () => {
    const e = await select({ iface: ['lo'] });
    assert.deepEqual([e.name, e.ifaceAddr], ['lo', '127.0.0.1']);
  });

  it('overrides the published addresses with --public-ip and --public-ipv6', async () => {
    const e = await select(
      { iface: ['eth0'], publicIP: '203.0.113.7', publicIPv6: '2001:db8::7' },
      DUAL,
    );
    assert.deepEqual(
      [e.ifaceAddr, e.publicIP, e.ifaceAddrV6, e.publicIPv6],
      ['10.0.0.5', '203.0.113.7', 'fd00::5', '2001:db8::7'],
    );
  });

  it('publishes no IPv6 address when IPv6 is off', async () => {
    const e = await select({ iface: ['eth0'] });
    assert.equal(e.publicIPv6, null);
  });

  it('uses the interface holding --public-ip when no --iface is given', async () => {
    assert.equal((await select({ publicIP: '172.16.0.9' })).name, 'eth1');
  });

  it('names the interface and the missing IPv4 address', async () => {
    await ifaceFails(
      select({ iface: ['bare0'] }),
      /--iface bare0: interface bare0 has no IPv4 address/,
    );
  });

  it('names the interface and the missing IPv6 address when IPv6 is on', async () => {
    await ifaceFails(select({ iface: ['eth1'] }, DUAL), /interface eth1 has no IPv6 address/);
  });

  it('rejects an interface whose MTU is 0', async () => {
    await ifaceFails(select({ iface: ['nomtu0'] }), /interface nomtu0 has no MTU/);
  });

  it('lists every candidate tried when none fits', async () => {
    await ifaceFails(
      select({ iface: ['missing0', '10.1.1.1'], ifaceRegex: ['^bare'] }),
      /--iface missing0: no interface named missing0; --iface 10\.1\.1\.1: no interface has address 10\.1\.1\.1; --iface-regex \^bare: interface bare0 has no IPv4 address/,
    );
  });

  it('rejects an invalid regex as a usage error', async () => {
    await assert.rejects(select({ ifaceRegex: ['(eth'] }), (err: unknown) =>
      isWeftError(err, 'WEFT_ERR_USAGE'),
    );
  });
});
