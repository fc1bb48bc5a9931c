import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  egressTapBlocked,
  legacyForwardDrops,
  nftForwardDrops,
} from '../../../../src/control/backend/host-forward.js';

const OPEN = { rpFilterAll: '0', forwardDrop: [] };

describe('egressTapBlocked', () => {
  test('a fresh namespace (rp_filter 0, FORWARD accept) forwards the TAP frames', () => {
    assert.equal(egressTapBlocked(OPEN, true), null);
    assert.equal(egressTapBlocked(OPEN, false), null);
  });
  test('strict and loose reverse-path filtering both refuse them (the TAP has no address)', () => {
    assert.match(egressTapBlocked({ ...OPEN, rpFilterAll: '1' }, true)!, /strict .*rp_filter=1/);
    assert.match(egressTapBlocked({ ...OPEN, rpFilterAll: '2' }, true)!, /loose .*rp_filter=2/);
  });
  test('a FORWARD policy of drop refuses them only without weft forward rules', () => {
    const host = { ...OPEN, forwardDrop: ['nft ip filter FORWARD'] };
    assert.equal(egressTapBlocked(host, true), null);
    assert.match(
      egressTapBlocked(host, false)!,
      /FORWARD policy is drop \(nft ip filter FORWARD\) and --iptables-forward-rules=false/,
    );
  });
});

describe('the FORWARD policy readers', () => {
  test('nft list chains: base chains hooked on forward with policy drop, by table', () => {
    const text = `table ip filter {
	chain FORWARD {
		type filter hook forward priority filter; policy drop;
	}
	chain INPUT {
		type filter hook input priority filter; policy drop;
	}
}
table inet firewalld {
	chain filter_FORWARD {
		type filter hook forward priority filter + 10; policy accept;
	}
}
table inet other {
	chain fwd {
		type filter hook forward priority 0; policy drop;
	}
}
`;
    assert.deepEqual(nftForwardDrops(text), ['nft ip filter FORWARD', 'nft inet other fwd']);
    assert.deepEqual(nftForwardDrops(''), []);
  });
  test('iptables-legacy-save: the filter table FORWARD policy', () => {
    const drop =
      '*nat\n:FORWARD DROP [0:0]\nCOMMIT\n*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [3:180]\nCOMMIT\n';
    assert.deepEqual(legacyForwardDrops(drop), ['iptables-legacy FORWARD']);
    assert.deepEqual(legacyForwardDrops('*filter\n:FORWARD ACCEPT [0:0]\nCOMMIT\n'), []);
    assert.deepEqual(legacyForwardDrops(''), []);
  });
});
