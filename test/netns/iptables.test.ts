/**
 * iptables masquerade/forward rules in a namespace of their own (IPv4 and IPv6): the golden list,
 * repair of a deleted rule, removal of an earlier run's stale rules.
 *
 *   ┌─ weft-<pid>-0 ────────────────────────────┐
 *   │  nat: POSTROUTING → FLANNEL-POSTRTG          │
 *   │  filter: FORWARD → FLANNEL-FWD               │
 *   └──────────────────────────────────────────┘
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { type Family, parseCIDR } from '../../src/common/ip.js';
import {
  IptablesKeeper,
  type CommandRunner,
  runCommand,
} from '../../src/control/iptables/iptables.js';
import { forwardRules, masqRules } from '../../src/control/iptables/rules.js';
import { logger } from '../../src/common/log.js';
import { NetnsScope, isRoot, nsExec } from '../../src/testbed/netns.js';

const log = logger('test');
log.level = 'silent';

const skip = isRoot() ? false : 'needs root (network namespaces)';

const NETS = {
  4: {
    N: '10.5.0.0/16',
    S: '10.5.1.0/24',
    oldS: '10.5.9.0/24',
    mc: '224.0.0.0/4',
    save: 'iptables-save',
  },
  6: {
    N: 'fc00::/48',
    S: 'fc00:0:0:1::/64',
    oldS: 'fc00:0:0:9::/64',
    mc: 'ff00::/8',
    save: 'ip6tables-save',
  },
} as const;

/** The golden list: our lines of `iptables-save` for nat and filter, in order. */
function golden(family: Family, S: string): string[] {
  const { N, mc } = NETS[family];
  const m = '-m comment --comment "flanneld masq"';
  const f = '-m comment --comment "flanneld forward"';
  // iptables-save prints the filter table before nat.
  return [
    `-A FORWARD ${f} -j FLANNEL-FWD`,
    `-A FLANNEL-FWD -s ${N} ${f} -j ACCEPT`,
    `-A FLANNEL-FWD -d ${N} ${f} -j ACCEPT`,
    `-A POSTROUTING ${m} -j FLANNEL-POSTRTG`,
    `-A FLANNEL-POSTRTG -m mark --mark 0x4000/0x4000 ${m} -j RETURN`,
    `-A FLANNEL-POSTRTG -s ${S} -d ${N} ${m} -j RETURN`,
    `-A FLANNEL-POSTRTG -s ${N} -d ${S} ${m} -j RETURN`,
    `-A FLANNEL-POSTRTG ! -s ${N} -d ${S} ${m} -j RETURN`,
    `-A FLANNEL-POSTRTG -s ${N} ! -d ${mc} ${m} -j MASQUERADE --random-fully`,
    `-A FLANNEL-POSTRTG ! -s ${N} -d ${N} ${m} -j MASQUERADE --random-fully`,
  ];
}

describe('iptables keeper in a namespace', { skip }, () => {
  const scope = new NetnsScope();
  let ns = '';
  let run: CommandRunner;

  before(() => {
    ns = scope.add();
    run = (cmd, args, input) => runCommand('ip', ['netns', 'exec', ns, cmd, ...args], input);
  });
  after(() => scope.cleanup());

  const ours = (family: Family) =>
    nsExec(ns, NETS[family].save)
      .split('\n')
      .filter((l) => l.startsWith('-A ') && l.includes('flanneld'));

  const keeper = (family: Family, S: string) => {
    const N = parseCIDR(NETS[family].N)!;
    return new IptablesKeeper(
      [{ family, chains: [masqRules(family, N, parseCIDR(S)!), forwardRules(N)] }],
      { run },
    );
  };

  for (const family of [4, 6] as Family[]) {
    const { S, oldS } = NETS[family];
    test(`IPv${family}: an earlier run's rules are replaced by exactly the golden list`, async () => {
      await keeper(family, oldS).ensure();
      assert.deepEqual(ours(family), golden(family, oldS));
      const k = keeper(family, S);
      assert.equal(await k.ensure(), 1); // nat changed (subnet); filter already right
      assert.deepEqual(ours(family), golden(family, S));
      assert.equal(await k.ensure(), 0); // in place: nothing re-applied
    });

    test(`IPv${family}: a rule deleted by hand is restored in order`, async () => {
      const k = keeper(family, S);
      const tool = family === 4 ? 'iptables' : 'ip6tables';
      nsExec(ns, tool, ['-t', 'nat', '-D', 'FLANNEL-POSTRTG', '3']);
      nsExec(ns, tool, ['-t', 'filter', '-D', 'FORWARD', '1']);
      assert.notDeepEqual(ours(family), golden(family, S));
      assert.equal(await k.ensure(), 2);
      assert.deepEqual(ours(family), golden(family, S));
    });
  }

  test('run() restores a deleted rule within one resync period', async () => {
    const k = keeper(4, NETS[4].S);
    const ac = new AbortController();
    const done = k.run(1, ac.signal);
    await new Promise((r) => setTimeout(r, 200));
    nsExec(ns, 'iptables', ['-t', 'nat', '-D', 'FLANNEL-POSTRTG', '1']);
    const t0 = Date.now();
    while (ours(4).length !== golden(4, NETS[4].S).length && Date.now() - t0 < 10_000) {
      await new Promise((r) => setTimeout(r, 100));
    }
    ac.abort();
    await done;
    // Restored by the resync loop (period 1 s here); how soon is not a verdict on a shared box.
    assert.deepEqual(ours(4), golden(4, NETS[4].S));
  });
});
