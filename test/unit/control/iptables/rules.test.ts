import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { type Family, parseCIDR } from '../../../../src/common/ip.js';
import { egressTapOf } from '../../../../src/control/backend/egress-tap.js';
import { parseNetConfig } from '../../../../src/control/config/net-config.js';
import { iptablesTask, wantedRules } from '../../../../src/control/iptables/iptables.js';
import {
  forwardRules,
  isInPlace,
  masqRules,
  parseSave,
  restoreScript,
} from '../../../../src/control/iptables/rules.js';

const NETS = {
  4: { N: '10.5.0.0/16', S: '10.5.1.0/24', mc: '224.0.0.0/4' },
  6: { N: 'fc00::/48', S: 'fc00:0:0:1::/64', mc: 'ff00::/8' },
} as const;

for (const family of [4, 6] as Family[]) {
  const { N, S, mc } = NETS[family];
  const masq = masqRules(family, parseCIDR(N)!, parseCIDR(S)!);
  describe(`iptables rules, IPv${family}`, () => {
    test('masquerade rules are flannel’s, in flannel’s order', () => {
      const m = '-m comment --comment "flanneld masq"';
      assert.equal(masq.jump, `${m} -j FLANNEL-POSTRTG`);
      assert.deepEqual(masq.rules, [
        `-m mark --mark 0x4000/0x4000 ${m} -j RETURN`,
        `-s ${S} -d ${N} ${m} -j RETURN`,
        `-s ${N} -d ${S} ${m} -j RETURN`,
        `! -s ${N} -d ${S} ${m} -j RETURN`,
        `-s ${N} ! -d ${mc} ${m} -j MASQUERADE --random-fully`,
        `! -s ${N} -d ${N} ${m} -j MASQUERADE --random-fully`,
      ]);
    });

    test('forward rules accept the cluster network both ways', () => {
      const f = forwardRules(parseCIDR(N)!);
      const m = '-m comment --comment "flanneld forward"';
      assert.deepEqual(
        [f.parent, f.chain, f.jump],
        ['FORWARD', 'FLANNEL-FWD', `${m} -j FLANNEL-FWD`],
      );
      assert.deepEqual(f.rules, [`-s ${N} ${m} -j ACCEPT`, `-d ${N} ${m} -j ACCEPT`]);
    });

    test('with a userspace backend, the egress TAP’s frames are accepted too (weft’s own rule)', () => {
      const m = '-m comment --comment "flanneld forward"';
      const rules = (backend: object) => {
        const cfg = parseNetConfig(
          JSON.stringify(
            family === 4
              ? { Network: N, Backend: backend }
              : { EnableIPv4: false, EnableIPv6: true, IPv6Network: N, Backend: backend },
          ),
        );
        const subnet = parseCIDR(S)!;
        const lease = {
          key: 'k',
          subnet: family === 4 ? subnet : null,
          ipv6Subnet: family === 6 ? subnet : null,
          attrs: { publicIP: '192.168.1.1', publicIPv6: null, backendType: '' },
          expiration: null,
        };
        const want = wantedRules(cfg, lease, { ipMasq: false, forwardRules: true, egressTapOf });
        return want[0]!.chains[0]!.rules;
      };
      assert.equal(rules({ Type: 'udp' })[2], `-i flannel0-tx ${m} -j ACCEPT`);
      assert.equal(
        rules({ Type: 'vxlan', VNI: 4, Dataplane: 'userspace' })[2],
        `-i flannel.4-tx ${m} -j ACCEPT`,
      );
      assert.equal(
        rules({ Type: 'vxlan', Dataplane: 'auto' })[2],
        `-i flannel.1-tx ${m} -j ACCEPT`,
      );
      // kernel vxlan and host-gw: flannel's two rules only
      assert.equal(rules({ Type: 'vxlan' }).length, 2);
      assert.equal(rules({ Type: 'host-gw' }).length, 2);
    });

    test('a missing rule, a reordered chain or a duplicate jump is noticed', () => {
      const good = [
        '-A POSTROUTING ' + masq.jump,
        ...masq.rules.map((r) => '-A FLANNEL-POSTRTG ' + r),
      ];
      assert.equal(isInPlace(good, masq), true);
      assert.equal(
        isInPlace(
          good.filter((_, i) => i !== 3),
          masq,
        ),
        false,
      );
      assert.equal(isInPlace([good[0]!, ...good.slice(1).reverse()], masq), false);
      assert.equal(isInPlace([good[0]!, ...good], masq), false);
    });

    test('the restore script flushes our chain, drops old jumps and inserts the jump first', () => {
      const save = parseSave(
        `*nat\n:POSTROUTING ACCEPT [0:0]\n-A POSTROUTING -j OTHER\n-A POSTROUTING ${masq.jump}\nCOMMIT\n`,
      ).get('nat')!;
      const script = restoreScript(save, masq).split('\n');
      assert.deepEqual(script.slice(0, 4), [
        '*nat',
        ':FLANNEL-POSTRTG - [0:0]',
        `-D POSTROUTING ${masq.jump}`,
        `-I POSTROUTING 1 ${masq.jump}`,
      ]);
      assert.equal(script.filter((l) => l.startsWith('-A FLANNEL-POSTRTG ')).length, 6);
      assert.equal(script.at(-2), 'COMMIT');
    });
  });
}

describe('iptablesTask', () => {
  test('with no rules wanted it only looks for nftables-mode leftovers and lasts until the signal', async () => {
    const calls: string[] = [];
    const task = iptablesTask({
      ipMasq: false,
      forwardRules: false,
      resyncSec: 1,
      run: async (cmd) => {
        calls.push(cmd);
        return '';
      },
    });
    const ac = new AbortController();
    const cfg = parseNetConfig(JSON.stringify({ Network: '10.5.0.0/16' }));
    const lease = {
      key: '10.5.1.0-24',
      subnet: parseCIDR('10.5.1.0/24')!,
      ipv6Subnet: null,
      attrs: { publicIP: '192.168.1.1', publicIPv6: null, backendType: '' },
      expiration: null,
    };
    let ended = false;
    const running = task({ lease, netConfig: cfg, signal: ac.signal }).then(() => (ended = true));
    await new Promise((r) => setTimeout(r, 30));
    assert.equal(ended, false);
    ac.abort();
    await running;
    assert.deepEqual(calls, ['nft']); // `nft list tables`: nothing of an nftables-mode run
  });
});
