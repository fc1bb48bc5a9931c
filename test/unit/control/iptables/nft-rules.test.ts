import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { parseCIDR } from '../../../../src/common/ip.js';
import { logger } from '../../../../src/common/log.js';
import { egressTapOf } from '../../../../src/control/backend/egress-tap.js';
import { parseNetConfig } from '../../../../src/control/config/net-config.js';
import {
  type IptablesFlavour,
  detectFlavour,
  iptablesTools,
} from '../../../../src/control/iptables/flavour.js';
import { wantedNftTables } from '../../../../src/control/iptables/iptables.js';
import { nftReplaceScript, nftTableScript } from '../../../../src/control/iptables/nft-rules.js';
import { masqRules } from '../../../../src/control/iptables/rules.js';

const log = logger('test');
log.level = 'silent';

describe('nftables rule set', () => {
  const network = parseCIDR('10.5.0.0/16')!;
  const subnet = parseCIDR('10.5.1.0/24')!;
  /** Our lease on 10.5.0.0/16, IPv4 only. */
  const LEASE = {
    key: '10.5.1.0-24',
    subnet,
    ipv6Subnet: null,
    attrs: { publicIP: '192.168.1.1', publicIPv6: null, backendType: '' },
    expiration: null,
  };

  test('flannel’s rules in flannel’s order; the 4th return negates the subnet, not the network', () => {
    const lines = nftTableScript({
      family: 4,
      fullyRandom: true,
      masq: { network, subnet },
      forward: { network },
    });
    assert.deepEqual(lines, [
      'add table ip flannel-ipv4 { comment "rules for flannel-ipv4" ; }',
      'add chain ip flannel-ipv4 postrtg { type nat hook postrouting priority srcnat ; comment "chain to manage traffic masquerading by flannel" ; }',
      'add rule ip flannel-ipv4 postrtg meta mark 0x4000 return',
      'add rule ip flannel-ipv4 postrtg ip saddr 10.5.1.0/24 ip daddr 10.5.0.0/16 return',
      'add rule ip flannel-ipv4 postrtg ip saddr 10.5.0.0/16 ip daddr 10.5.1.0/24 return',
      'add rule ip flannel-ipv4 postrtg ip saddr != 10.5.1.0/24 ip daddr 10.5.0.0/16 return',
      'add rule ip flannel-ipv4 postrtg ip saddr 10.5.0.0/16 ip daddr != 224.0.0.0/4 masquerade fully-random',
      'add rule ip flannel-ipv4 postrtg ip saddr != 10.5.0.0/16 ip daddr 10.5.0.0/16 masquerade fully-random',
      'add chain ip flannel-ipv4 forward { type filter hook forward priority filter ; comment "chain to accept flannel traffic" ; }',
      'add rule ip flannel-ipv4 forward ip saddr 10.5.0.0/16 accept',
      'add rule ip flannel-ipv4 forward ip daddr 10.5.0.0/16 accept',
    ]);
  });

  test('IPv6 uses ip6, ff00::/8, table flannel-ipv6; fully-random can be off', () => {
    const n6 = parseCIDR('fc00::/48')!;
    const s6 = parseCIDR('fc00:0:0:1::/64')!;
    const lines = nftTableScript({
      family: 6,
      fullyRandom: false,
      masq: { network: n6, subnet: s6 },
    });
    assert.equal(lines[0], 'add table ip6 flannel-ipv6 { comment "rules for flannel-ipv6" ; }');
    assert.equal(
      lines[6],
      'add rule ip6 flannel-ipv6 postrtg ip6 saddr fc00::/48 ip6 daddr != ff00::/8 masquerade',
    );
    assert.equal(lines.length, 8); // no forward chain asked for
  });

  test('the forward chain accepts the egress TAP’s frames when a userspace backend may run one', () => {
    const lines = nftTableScript({
      family: 4,
      fullyRandom: true,
      forward: { network, egressTap: 'flannel0-tx' },
    });
    assert.equal(lines.at(-1), 'add rule ip flannel-ipv4 forward iifname "flannel0-tx" accept');
    const cfg = parseNetConfig(
      JSON.stringify({ Network: '10.5.0.0/16', Backend: { Type: 'udp' } }),
    );
    const want = wantedNftTables(cfg, LEASE, {
      ipMasq: false,
      forwardRules: true,
      fullyRandom: true,
      egressTapOf,
    });
    assert.equal(want[0]!.forward?.egressTap, 'flannel0-tx');
  });

  test('the replace script deletes the table first, in the same transaction', () => {
    const text = nftReplaceScript({ family: 4, fullyRandom: true });
    assert.deepEqual(text.split('\n'), [
      'add table ip flannel-ipv4',
      'delete table ip flannel-ipv4',
      'add table ip flannel-ipv4 { comment "rules for flannel-ipv4" ; }',
      '',
    ]);
  });

  test('wantedNftTables: both tables always, chains for enabled families only', () => {
    const cfg = parseNetConfig(JSON.stringify({ Network: '10.5.0.0/16', EnableNFTables: true }));
    assert.equal(cfg.enableNFTables, true);
    const want = wantedNftTables(cfg, LEASE, {
      ipMasq: true,
      forwardRules: false,
      fullyRandom: true,
    });
    assert.equal(want.length, 2);
    assert.ok(want[0]!.masq && !want[0]!.forward);
    assert.ok(!want[1]!.masq && !want[1]!.forward);
  });

  test('iptables masquerade without --random-fully when fully-random is off', () => {
    const r = masqRules(4, network, subnet, false).rules;
    assert.ok(r.slice(-2).every((l) => l.endsWith('-j MASQUERADE')));
  });
});

describe('iptables flavour detection (flanneld image’s iptables-wrapper rule)', () => {
  /** A runner answering `<tool> [args]` from a table; a missing entry fails as ENOENT would. */
  const fake =
    (answers: Record<string, string>) => async (cmd: string, args: readonly string[]) => {
      const key = [cmd, ...args].join(' ');
      if (key in answers) return answers[key]!;
      throw new Error(`${cmd}: cannot run: spawn ${cmd} ENOENT`);
    };
  const hint = '*mangle\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n';
  const rules = (n: number) => `*filter\n${'-A INPUT -j ACCEPT\n'.repeat(n)}COMMIT\n`;
  const cases: Array<[string, Record<string, string>, IptablesFlavour]> = [
    [
      'kubelet hint in nft mangle',
      { 'iptables-nft-save -t mangle': hint, 'iptables-legacy-save': rules(50) },
      'nft',
    ],
    [
      'kubelet hint in ip6 nft mangle',
      { 'iptables-nft-save -t mangle': '', 'ip6tables-nft-save -t mangle': hint },
      'nft',
    ],
    [
      'kubelet canary in legacy',
      {
        'iptables-nft-save -t mangle': '',
        'iptables-legacy-save': ':KUBE-KUBELET-CANARY - [0:0]\n',
      },
      'legacy',
    ],
    [
      'no kubelet: legacy holds more rules',
      {
        'iptables-nft-save -t mangle': '',
        'iptables-nft-save': rules(1),
        'iptables-legacy-save': rules(3),
      },
      'legacy',
    ],
    [
      'no kubelet: a tie goes to nft',
      { 'iptables-nft-save -t mangle': '', 'iptables-nft-save': '', 'iptables-legacy-save': '' },
      'nft',
    ],
    ['only legacy tools', { 'iptables-legacy-save': '' }, 'legacy'],
    ['no flavoured tools at all', {}, 'default'],
  ];
  for (const [name, answers, want] of cases) {
    test(name, async () => assert.equal(await detectFlavour(fake(answers), log), want));
  }

  test('tool names per flavour and family', () => {
    assert.deepEqual(iptablesTools(4, 'legacy'), {
      save: 'iptables-legacy-save',
      restore: 'iptables-legacy-restore',
    });
    assert.deepEqual(iptablesTools(6, 'nft'), {
      save: 'ip6tables-nft-save',
      restore: 'ip6tables-nft-restore',
    });
    assert.deepEqual(iptablesTools(4, 'default'), {
      save: 'iptables-save',
      restore: 'iptables-restore',
    });
  });
});
