import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import {
  familyConfigs,
  parseNetConfig,
  subnetFits,
} from '../../../../src/control/config/net-config.js';
import type { FamilyConfig } from '../../../../src/control/config/net-config.js';
import { isWeftError } from '../../../../src/common/errors.js';
import { formatCIDR, formatIP, parseCIDR } from '../../../../src/common/ip.js';

/** The family config in text form, for compact expectations. */
function show(f: FamilyConfig | null) {
  if (f === null) return null;
  const fam = f.network.family;
  return {
    network: formatCIDR(f.network),
    subnetLen: f.subnetLen,
    subnetMin: formatIP(fam, f.subnetMin),
    subnetMax: formatIP(fam, f.subnetMax),
  };
}

function rejects(text: string, message: string) {
  assert.throws(
    () => parseNetConfig(text),
    (err: unknown) => {
      assert.ok(isWeftError(err, 'WEFT_ERR_CONFIG_INVALID'), `not a config error: ${String(err)}`);
      assert.equal(err.message, message);
      assert.equal(err.exitCode, 2);
      return true;
    },
  );
}

describe('parseNetConfig: defaults (flannel examples)', () => {
  const cases: {
    name: string;
    text: string;
    ipv4?: ReturnType<typeof show>;
    ipv6?: ReturnType<typeof show>;
  }[] = [
    {
      name: '/16 gets SubnetLen 24, min = second subnet, max = last subnet',
      text: '{"network":"10.3.0.0/16"}',
      ipv4: {
        network: '10.3.0.0/16',
        subnetLen: 24,
        subnetMin: '10.3.1.0',
        subnetMax: '10.3.255.0',
      },
    },
    {
      name: '/22 is still large enough for /24 subnets',
      text: '{"Network":"10.3.0.0/22"}',
      ipv4: { network: '10.3.0.0/22', subnetLen: 24, subnetMin: '10.3.1.0', subnetMax: '10.3.3.0' },
    },
    {
      name: '/23 splits into four: SubnetLen = prefix + 2',
      text: '{"Network":"10.3.0.0/23"}',
      ipv4: {
        network: '10.3.0.0/23',
        subnetLen: 25,
        subnetMin: '10.3.0.128',
        subnetMax: '10.3.1.128',
      },
    },
    {
      name: '/28 is the smallest network (four /30 subnets)',
      text: '{"Network":"10.3.0.0/28"}',
      ipv4: {
        network: '10.3.0.0/28',
        subnetLen: 30,
        subnetMin: '10.3.0.4',
        subnetMax: '10.3.0.12',
      },
    },
    {
      name: 'host bits in Network are dropped, as Go ParseCIDR does',
      text: '{"Network":"10.3.7.9/16"}',
      ipv4: {
        network: '10.3.0.0/16',
        subnetLen: 24,
        subnetMin: '10.3.1.0',
        subnetMax: '10.3.255.0',
      },
    },
    {
      name: 'explicit SubnetLen, SubnetMin, SubnetMax are kept',
      text: '{"Network":"10.0.0.0/8","SubnetLen":20,"SubnetMin":"10.10.0.0","SubnetMax":"10.99.240.0"}',
      ipv4: {
        network: '10.0.0.0/8',
        subnetLen: 20,
        subnetMin: '10.10.0.0',
        subnetMax: '10.99.240.0',
      },
    },
    {
      name: 'SubnetLen 0 and SubnetMin "0.0.0.0" mean "use the default"',
      text: '{"Network":"10.3.0.0/16","SubnetLen":0,"SubnetMin":"0.0.0.0"}',
      ipv4: {
        network: '10.3.0.0/16',
        subnetLen: 24,
        subnetMin: '10.3.1.0',
        subnetMax: '10.3.255.0',
      },
    },
    {
      name: 'IPv6 /48 gets /64 subnets from fc00:0:0:1:: to fc00:0:0:ffff::',
      text: '{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fc00::/48"}',
      ipv4: null,
      ipv6: {
        network: 'fc00::/48',
        subnetLen: 64,
        subnetMin: 'fc00:0:0:1::',
        subnetMax: 'fc00:0:0:ffff::',
      },
    },
    {
      name: 'IPv6 /63 splits into four /65',
      text: '{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fc00::/63"}',
      ipv6: {
        network: 'fc00::/63',
        subnetLen: 65,
        subnetMin: 'fc00::8000:0:0:0',
        subnetMax: 'fc00:0:0:1:8000::',
      },
    },
    {
      name: 'IPv6 /124 is the smallest network (four /126 subnets)',
      text: '{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fc00::/124"}',
      ipv6: { network: 'fc00::/124', subnetLen: 126, subnetMin: 'fc00::4', subnetMax: 'fc00::c' },
    },
    {
      name: 'dual stack fills both families',
      text: '{"Network":"10.5.0.0/16","EnableIPv6":true,"IPv6Network":"fc00::/48","IPv6SubnetLen":56}',
      ipv4: {
        network: '10.5.0.0/16',
        subnetLen: 24,
        subnetMin: '10.5.1.0',
        subnetMax: '10.5.255.0',
      },
      ipv6: {
        network: 'fc00::/48',
        subnetLen: 56,
        subnetMin: 'fc00:0:0:100::',
        subnetMax: 'fc00:0:0:ff00::',
      },
    },
  ];
  for (const c of cases) {
    it(c.name, () => {
      const cfg = parseNetConfig(c.text);
      if (c.ipv4 !== undefined) assert.deepEqual(show(cfg.ipv4), c.ipv4);
      if (c.ipv6 !== undefined) assert.deepEqual(show(cfg.ipv6), c.ipv6);
    });
  }
});

describe('parseNetConfig: fields', () => {
  it('matches field names case-insensitively', () => {
    const cfg = parseNetConfig(
      '{"NETWORK":"10.1.0.0/16","subnetlen":26,"enableipv6":true,"ipv6network":"fc00::/48","BACKEND":{"TYPE":"VXLAN"}}',
    );
    assert.equal(cfg.ipv4?.subnetLen, 26);
    assert.equal(formatCIDR(cfg.ipv6!.network), 'fc00::/48');
    assert.equal(cfg.backend.type, 'vxlan');
  });

  it('ignores unknown fields', () => {
    const cfg = parseNetConfig('{"Network":"10.1.0.0/16","Foo":[1,2],"SubnetLength":99}');
    assert.equal(cfg.ipv4?.subnetLen, 24);
  });

  it('lets the last spelling of a field win, as Go does', () => {
    const cfg = parseNetConfig('{"Network":"10.1.0.0/16","network":"10.2.0.0/16"}');
    assert.equal(formatCIDR(cfg.ipv4!.network), '10.2.0.0/16');
  });

  it('treats null as absent (EnableIPv4 stays true)', () => {
    const cfg = parseNetConfig('{"Network":"10.1.0.0/16","EnableIPv4":null,"SubnetLen":null}');
    assert.equal(cfg.enableIPv4, true);
    assert.equal(cfg.ipv4?.subnetLen, 24);
  });

  it('enables IPv4 and not IPv6 by default', () => {
    const cfg = parseNetConfig('{"Network":"10.1.0.0/16"}');
    assert.equal(cfg.enableIPv4, true);
    assert.equal(cfg.enableIPv6, false);
    assert.equal(cfg.ipv6, null);
  });

  it('does not need Network when IPv4 is disabled', () => {
    const cfg = parseNetConfig('{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fc00::/48"}');
    assert.equal(cfg.ipv4, null);
    assert.deepEqual(
      familyConfigs(cfg).map((f) => f.network.family),
      [6],
    );
  });

  it('rejects a malformed field of a disabled family, as Go json.Unmarshal does', () => {
    rejects(
      '{"Network":"10.1.0.0/16","IPv6Network":"not-a-cidr"}',
      'IPv6Network: must be an IPv6 CIDR such as "fc00::/48"',
    );
  });

  it('ignores the rules of a disabled family', () => {
    const cfg = parseNetConfig('{"Network":"10.1.0.0/16","IPv6Network":"fc00::/127"}');
    assert.equal(cfg.ipv6, null);
  });

  it('uses the udp backend when there is no Backend block', () => {
    const cfg = parseNetConfig('{"Network":"10.1.0.0/16"}');
    assert.equal(cfg.backend.type, 'udp');
    assert.deepEqual(cfg.backend.raw, {});
  });

  it('keeps the Backend block as written for the backend to parse', () => {
    const cfg = parseNetConfig(
      '{"Network":"10.1.0.0/16","Backend":{"Type":"vxlan","VNI":4,"Port":4789}}',
    );
    assert.equal(cfg.backend.type, 'vxlan');
    assert.deepEqual(cfg.backend.raw, { Type: 'vxlan', VNI: 4, Port: 4789 });
  });

  it('keeps the source text', () => {
    const text = '{ "Network": "10.1.0.0/16" }';
    assert.equal(parseNetConfig(text).text, text);
  });

  it('returns a deeply frozen config', () => {
    const cfg = parseNetConfig(
      '{"Network":"10.1.0.0/16","Backend":{"Type":"vxlan","Opts":{"a":1}}}',
    );
    assert.ok(Object.isFrozen(cfg));
    assert.ok(Object.isFrozen(cfg.ipv4));
    assert.ok(Object.isFrozen(cfg.ipv4!.network));
    assert.ok(Object.isFrozen(cfg.backend));
    assert.ok(Object.isFrozen(cfg.backend.raw.Opts));
  });
});

describe('parseNetConfig: errors name the field and the rule', () => {
  const cases: [string, string, string][] = [
    ['invalid JSON', '{"Network":', 'net-conf: invalid JSON'],
    ['not an object', '["10.1.0.0/16"]', 'net-conf: must be a JSON object'],
    ['no Network', '{}', 'Network: is required (e.g. "10.244.0.0/16")'],
    [
      'Network not a CIDR',
      '{"Network":"10.1.0.0"}',
      'Network: must be an IPv4 CIDR such as "10.244.0.0/16"',
    ],
    [
      'Network is IPv6',
      '{"Network":"fc00::/48"}',
      'Network: must be an IPv4 CIDR such as "10.244.0.0/16"',
    ],
    [
      'Network not a string',
      '{"Network":10}',
      'Network: must be an IPv4 CIDR such as "10.244.0.0/16"',
    ],
    [
      'Network is 0.0.0.0/0',
      '{"Network":"0.0.0.0/0"}',
      'Network: must not be the zero network (e.g. "10.244.0.0/16")',
    ],
    [
      'Network smaller than /28',
      '{"Network":"10.1.0.0/29"}',
      'Network: is too small: the prefix must be /28 or shorter (got /29)',
    ],
    ['SubnetLen over 30', '{"Network":"10.1.0.0/16","SubnetLen":31}', 'SubnetLen: must be <= 30'],
    [
      'SubnetLen leaves room for fewer than 4 subnets',
      '{"Network":"10.1.0.0/16","SubnetLen":17}',
      'SubnetLen: must be >= 18 so that Network 10.1.0.0/16 holds at least 4 subnets',
    ],
    [
      'SubnetLen not a whole number',
      '{"Network":"10.1.0.0/16","SubnetLen":24.5}',
      'SubnetLen: must be a whole number',
    ],
    [
      'SubnetLen negative',
      '{"Network":"10.1.0.0/16","SubnetLen":-1}',
      'SubnetLen: must be a whole number',
    ],
    [
      'SubnetLen a string',
      '{"Network":"10.1.0.0/16","SubnetLen":"24"}',
      'SubnetLen: must be a whole number',
    ],
    [
      'SubnetMin outside',
      '{"Network":"10.1.0.0/16","SubnetMin":"10.2.0.0"}',
      'SubnetMin: must be inside Network 10.1.0.0/16',
    ],
    [
      'SubnetMax outside',
      '{"Network":"10.1.0.0/16","SubnetMax":"10.0.255.0"}',
      'SubnetMax: must be inside Network 10.1.0.0/16',
    ],
    [
      'SubnetMin not aligned',
      '{"Network":"10.1.0.0/16","SubnetMin":"10.1.1.1"}',
      'SubnetMin: must be on a SubnetLen /24 boundary (got 10.1.1.1)',
    ],
    [
      'SubnetMax not aligned',
      '{"Network":"10.1.0.0/16","SubnetLen":20,"SubnetMax":"10.1.241.0"}',
      'SubnetMax: must be on a SubnetLen /20 boundary (got 10.1.241.0)',
    ],
    [
      'SubnetMin not an address',
      '{"Network":"10.1.0.0/16","SubnetMin":"x"}',
      'SubnetMin: must be an IPv4 address',
    ],
    [
      'SubnetMin above SubnetMax',
      '{"Network":"10.1.0.0/16","SubnetMin":"10.1.20.0","SubnetMax":"10.1.10.0"}',
      'SubnetMin: must not be above SubnetMax (10.1.20.0 > 10.1.10.0)',
    ],
    [
      'SubnetMax below the default SubnetMin',
      '{"Network":"10.1.0.0/16","SubnetLen":20,"SubnetMax":"10.1.0.0"}',
      'SubnetMin: must not be above SubnetMax (10.1.16.0 > 10.1.0.0)',
    ],
    [
      'EnableIPv4 not a boolean',
      '{"Network":"10.1.0.0/16","EnableIPv4":"true"}',
      'EnableIPv4: must be true or false',
    ],
    [
      'both families disabled',
      '{"EnableIPv4":false}',
      'EnableIPv4: EnableIPv4 or EnableIPv6 must be true',
    ],
    [
      'IPv6 enabled without IPv6Network',
      '{"Network":"10.1.0.0/16","EnableIPv6":true}',
      'IPv6Network: is required (e.g. "fc00::/48")',
    ],
    [
      'IPv6Network is IPv4',
      '{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"10.0.0.0/8"}',
      'IPv6Network: must be an IPv6 CIDR such as "fc00::/48"',
    ],
    [
      'IPv6Network smaller than /124',
      '{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fc00::/125"}',
      'IPv6Network: is too small: the prefix must be /124 or shorter (got /125)',
    ],
    [
      'IPv6SubnetLen over 126',
      '{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fc00::/48","IPv6SubnetLen":127}',
      'IPv6SubnetLen: must be <= 126',
    ],
    [
      'IPv6SubnetLen leaves room for fewer than 4 subnets',
      '{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fc00::/48","IPv6SubnetLen":49}',
      'IPv6SubnetLen: must be >= 50 so that IPv6Network fc00::/48 holds at least 4 subnets',
    ],
    [
      'IPv6SubnetMin outside',
      '{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fc00::/48","IPv6SubnetMin":"fc01::"}',
      'IPv6SubnetMin: must be inside IPv6Network fc00::/48',
    ],
    [
      'IPv6SubnetMax outside',
      '{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fc00::/48","IPv6SubnetMax":"fc00:1::"}',
      'IPv6SubnetMax: must be inside IPv6Network fc00::/48',
    ],
    [
      'IPv6SubnetMin not aligned',
      '{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fc00::/48","IPv6SubnetMin":"fc00:0:0:1::1"}',
      'IPv6SubnetMin: must be on a IPv6SubnetLen /64 boundary (got fc00:0:0:1::1)',
    ],
    [
      'IPv6SubnetMin above IPv6SubnetMax',
      '{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fc00::/48","IPv6SubnetMin":"fc00:0:0:9::","IPv6SubnetMax":"fc00:0:0:2::"}',
      'IPv6SubnetMin: must not be above IPv6SubnetMax (fc00:0:0:9:: > fc00:0:0:2::)',
    ],
    [
      'IPv6SubnetMax an IPv4 address',
      '{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fc00::/48","IPv6SubnetMax":"10.0.0.0"}',
      'IPv6SubnetMax: must be an IPv6 address',
    ],
    [
      'Backend not an object',
      '{"Network":"10.1.0.0/16","Backend":"vxlan"}',
      'Backend: must be an object such as {"Type": "vxlan"}',
    ],
    [
      'Backend without Type',
      '{"Network":"10.1.0.0/16","Backend":{"VNI":1}}',
      'Backend.Type: must be a non-empty string such as "vxlan"',
    ],
  ];
  for (const [name, text, message] of cases) {
    it(name, () => {
      if (message.startsWith('net-conf: invalid JSON')) {
        assert.throws(
          () => parseNetConfig(text),
          (err: unknown) => {
            assert.ok(isWeftError(err, 'WEFT_ERR_CONFIG_INVALID'));
            assert.match(err.message, /^net-conf: invalid JSON \(/);
            return true;
          },
        );
      } else {
        rejects(text, message);
      }
    });
  }

  it('puts the field in the error details', () => {
    assert.throws(
      () => parseNetConfig('{"Network":"10.1.0.0/16","SubnetLen":31}'),
      (err: unknown) => isWeftError(err) && err.details.field === 'SubnetLen',
    );
  });
});

describe('subnetFits', () => {
  const cfg = parseNetConfig(
    '{"Network":"10.1.0.0/16","SubnetMin":"10.1.10.0","SubnetMax":"10.1.20.0","EnableIPv6":true,"IPv6Network":"fc00::/48"}',
  );
  const v4 = cfg.ipv4!;
  const cases: [string, string, boolean][] = [
    ['SubnetMin itself', '10.1.10.0/24', true],
    ['SubnetMax itself', '10.1.20.0/24', true],
    ['a subnet in between', '10.1.15.0/24', true],
    ['below SubnetMin', '10.1.9.0/24', false],
    ['above SubnetMax', '10.1.21.0/24', false],
    ['wrong prefix length', '10.1.16.0/25', false],
    ['not aligned', '10.1.15.1/24', false],
    ['outside Network', '10.2.15.0/24', false],
    ['other family', 'fc00:0:0:f::/24', false],
  ];
  for (const [name, subnet, fits] of cases) {
    it(`${name}: ${subnet} → ${fits}`, () => {
      assert.equal(subnetFits(v4, parseCIDR(subnet)!), fits);
    });
  }

  it('works for IPv6', () => {
    assert.equal(subnetFits(cfg.ipv6!, parseCIDR('fc00:0:0:5d::/64')!), true);
    assert.equal(subnetFits(cfg.ipv6!, parseCIDR('fc00::/64')!), false);
  });
});
