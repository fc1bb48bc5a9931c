/**
 * Which host firewall rules the bpf engine would bypass (src/dataplane/bpf-firewall.ts), read
 * from `nft list ruleset` and `iptables-save` texts as the tools print them.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  iptablesRulesOnPort,
  nftRulesOnPort,
  portSpecIncludes,
} from '../../../src/dataplane/bpf-firewall.js';

// iptables-nft's translation of `-I INPUT -s 192.168.77.1 -p udp --dport 8472 -j DROP` and of a
// multiport REJECT in OUTPUT, plus rules that must not count.
const NFT = `table ip filter {
	chain INPUT {
		type filter hook input priority filter; policy accept;
		ip saddr 192.168.77.1 udp dport 8472 counter packets 0 bytes 0 drop
		udp dport 8472 counter packets 0 bytes 0 accept
		tcp dport 8472 drop
	}

	chain FORWARD {
		type filter hook forward priority filter; policy accept;
		udp dport 8472 drop
	}

	chain OUTPUT {
		type filter hook output priority filter; policy accept;
		meta l4proto udp udp dport { 53, 8472 } counter packets 0 bytes 0 reject
		udp dport 9000-9100 drop
	}
}
table ip6 filter6 {
	chain INPUT {
		type filter hook input priority filter; policy accept;
		udp dport 8472 drop
	}
}
table inet fw {
	chain quarantine {
		th dport 8000-9000 jump block
	}
}
`;

describe('bpf-firewall: rules the programs would bypass', () => {
  it('port specs: a number, a range, a set', () => {
    assert.ok(portSpecIncludes('8472', 8472));
    assert.ok(portSpecIncludes('8000-9000', 8472));
    assert.ok(portSpecIncludes('8000:9000', 8472));
    assert.ok(portSpecIncludes('{ 53, 8472 }', 8472));
    assert.ok(portSpecIncludes('53,8472', 8472));
    assert.ok(!portSpecIncludes('84720', 8472));
    assert.ok(!portSpecIncludes('{ 53, 8285 }', 8472));
  });

  it('nft: drop, reject and jump on the port in input/output/regular chains; not accept, tcp, forward, ip6', () => {
    const found = nftRulesOnPort(NFT, 8472);
    assert.equal(found.length, 3, found.join('\n'));
    assert.match(found[0]!, /filter INPUT \(hook input\).*saddr 192\.168\.77\.1.*drop/);
    assert.match(found[1]!, /filter OUTPUT \(hook output\).*\{ 53, 8472 \}.*reject/);
    assert.match(found[2]!, /inet fw quarantine: th dport 8000-9000 jump block/);
    assert.deepEqual(nftRulesOnPort(NFT, 4789), []);
  });

  it('nft, IPv6 underlay: ip6 and inet tables count, ip tables do not; dual-stack: all three', () => {
    const v6 = nftRulesOnPort(NFT, 8472, [6]);
    assert.equal(v6.length, 2, v6.join('\n'));
    assert.match(v6[0]!, /^nft ip6 filter6 INPUT \(hook input\): udp dport 8472 drop/);
    assert.match(v6[1]!, /inet fw quarantine/);
    assert.equal(nftRulesOnPort(NFT, 8472, [4, 6]).length, 4);
  });

  it('ip6tables-legacy-save: the same rules, named by their tool', () => {
    const save = [
      '*filter',
      ':INPUT ACCEPT [0:0]',
      '-A INPUT -s fd00::1/128 -p udp -m udp --dport 8472 -j DROP',
      'COMMIT',
    ].join('\n');
    assert.deepEqual(iptablesRulesOnPort(save, 8472, 'ip6tables-legacy'), [
      'ip6tables-legacy filter: -A INPUT -s fd00::1/128 -p udp -m udp --dport 8472 -j DROP',
    ]);
  });

  it('iptables-legacy-save: non-ACCEPT targets on the port in INPUT/OUTPUT and user chains', () => {
    const save = [
      '*filter',
      ':INPUT ACCEPT [0:0]',
      ':FORWARD ACCEPT [0:0]',
      ':OUTPUT ACCEPT [0:0]',
      ':QUARANTINE - [0:0]',
      '-A INPUT -s 192.168.77.1/32 -p udp -m udp --dport 8472 -j DROP',
      '-A INPUT -p udp -m udp --dport 8472 -j ACCEPT',
      '-A FORWARD -p udp -m udp --dport 8472 -j DROP',
      '-A OUTPUT -p udp -m multiport --dports 53,8472 -j REJECT',
      '-A QUARANTINE -p udp -m udp ! --dport 8472 -j DROP',
      '-A QUARANTINE -p udp -m udp --sport 8472 -j DROP',
      'COMMIT',
    ].join('\n');
    const found = iptablesRulesOnPort(save, 8472);
    assert.deepEqual(
      found.map((f) => f.replace(/^iptables-legacy filter: /, '')),
      [
        '-A INPUT -s 192.168.77.1/32 -p udp -m udp --dport 8472 -j DROP',
        '-A OUTPUT -p udp -m multiport --dports 53,8472 -j REJECT',
        '-A QUARANTINE -p udp -m udp --sport 8472 -j DROP',
      ],
    );
  });

  it('IPIP: rules on IP protocol 4 (ipencap) count, for nft and iptables; not ipip (94), not negated', () => {
    const nft = `table ip filter {
	chain INPUT {
		type filter hook input priority filter; policy accept;
		meta l4proto ipencap ip saddr 192.168.77.1 counter packets 0 bytes 0 drop
		ip protocol 4 reject
		ip protocol != ipencap drop
		meta l4proto ipencap accept
		meta l4proto ipip drop
		udp dport 8472 drop
	}
}
`;
    const found = nftRulesOnPort(nft, 'ipip');
    assert.equal(found.length, 2, found.join('\n'));
    assert.match(found[0]!, /meta l4proto ipencap ip saddr 192\.168\.77\.1.*drop/);
    assert.match(found[1]!, /ip protocol 4 reject/);
    const save = [
      '*filter',
      ':INPUT ACCEPT [0:0]',
      ':FORWARD ACCEPT [0:0]',
      ':OUTPUT ACCEPT [0:0]',
      '-A INPUT -s 192.168.77.1/32 -p ipencap -j DROP',
      '-A INPUT -p 4 -j REJECT',
      '-A INPUT ! -p ipencap -j DROP',
      '-A INPUT -p ipip -j DROP',
      '-A INPUT -p ipencap -j ACCEPT',
      '-A FORWARD -p ipencap -j DROP',
      '-A INPUT -p udp -m udp --dport 8472 -j DROP',
      'COMMIT',
    ].join('\n');
    assert.deepEqual(
      iptablesRulesOnPort(save, 'ipip').map((f) => f.replace(/^iptables-legacy filter: /, '')),
      ['-A INPUT -s 192.168.77.1/32 -p ipencap -j DROP', '-A INPUT -p 4 -j REJECT'],
    );
  });
});
