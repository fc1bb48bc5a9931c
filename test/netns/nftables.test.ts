/**
 * nftables mode (`"EnableNFTables": true`) in a namespace of its own: the tables exactly as
 * flannel writes them (golden `nft list table` text, IPv4 and IPv6), repair after a rule or a
 * chain is deleted by hand, fully-random off, and each mode removing the other's leftovers.
 *
 *   ┌─ weft-<pid>-<n> ───────────────────────────────────────┐
 *   │  table ip flannel-ipv4 { postrtg (nat), forward }       │
 *   │  table ip6 flannel-ipv6 { postrtg (nat), forward }      │
 *   │  (iptables chains FLANNEL-POSTRTG / FLANNEL-FWD: cleanup) │
 *   └────────────────────────────────────────────────────────┘
 */
import assert from 'node:assert/strict';
import { egressTapOf } from '../../src/control/backend/egress-tap.js';
import { after, before, describe, test } from 'node:test';
import { type Family, parseCIDR } from '../../src/common/ip.js';
import { logger } from '../../src/common/log.js';
import { parseNetConfig } from '../../src/control/config/net-config.js';
import {
  type CommandRunner,
  IptablesKeeper,
  iptablesTask,
  removeIptablesRules,
  runCommand,
} from '../../src/control/iptables/iptables.js';
import {
  NftablesKeeper,
  nftSupportsFullyRandom,
  removeNftTables,
} from '../../src/control/iptables/nftables.js';
import { forwardRules, masqRules } from '../../src/control/iptables/rules.js';
import { NetnsScope, isRoot, nsExec } from '../../src/testbed/netns.js';
import { nftGolden } from '../helpers/nft-golden.js';

const log = logger('test');
log.level = 'silent';

const skip = isRoot() ? false : 'needs root (network namespaces)';

const NETS = {
  4: { N: '10.5.0.0/16', S: '10.5.1.0/24', oldS: '10.5.9.0/24' },
  6: { N: 'fc00::/48', S: 'fc00:0:0:1::/64', oldS: 'fc00:0:0:9::/64' },
} as const;

function spec(family: Family, S: string, fullyRandom = true) {
  const network = parseCIDR(NETS[family].N)!;
  return { family, fullyRandom, masq: { network, subnet: parseCIDR(S)! }, forward: { network } };
}

describe('nftables mode in a namespace', { skip }, () => {
  const scope = new NetnsScope();
  let ns = '';
  let run: CommandRunner;
  const table = (family: Family) =>
    nsExec(ns, 'nft', ['list', 'table', family === 4 ? 'ip' : 'ip6', `flannel-ipv${family}`]);
  const tables = () => nsExec(ns, 'nft', ['list', 'tables']);

  before(() => {
    ns = scope.add();
    run = (cmd, args, input) => runCommand('ip', ['netns', 'exec', ns, cmd, ...args], input);
  });
  after(() => scope.cleanup());

  test('masquerade fully-random is supported here (the probe writes nothing)', async () => {
    assert.equal(await nftSupportsFullyRandom(run, log), true);
    assert.equal(tables(), '');
  });

  for (const family of [4, 6] as Family[]) {
    const { S, oldS } = NETS[family];

    test(`IPv${family}: an earlier subnet's table is replaced by exactly the golden text`, async () => {
      await new NftablesKeeper([spec(family, oldS)], { run, log }).ensure();
      assert.equal(table(family), nftGolden(family, NETS[family].N, oldS));
      const k = new NftablesKeeper([spec(family, S)], { run, log });
      assert.equal(await k.ensure(), 1);
      assert.equal(table(family), nftGolden(family, NETS[family].N, S));
      assert.equal(await k.ensure(), 0); // in place: nothing re-applied
    });

    test(`IPv${family}: a rule or a chain deleted by hand is restored`, async () => {
      const k = new NftablesKeeper([spec(family, S)], { run, log });
      assert.equal(await k.ensure(), 1);
      const t = family === 4 ? ['ip', 'flannel-ipv4'] : ['ip6', 'flannel-ipv6'];
      const handles = nsExec(ns, 'nft', ['-a', 'list', 'chain', ...t, 'postrtg']);
      const handle = /saddr != \S+ \S+ daddr \S+ return # handle (\d+)/.exec(handles)![1]!;
      nsExec(ns, 'nft', ['delete', 'rule', ...t, 'postrtg', 'handle', handle]);
      assert.notEqual(table(family), nftGolden(family, NETS[family].N, S));
      assert.equal(await k.ensure(), 1);
      assert.equal(table(family), nftGolden(family, NETS[family].N, S));
      nsExec(ns, 'nft', ['delete', 'chain', ...t, 'forward']);
      assert.equal(await k.ensure(), 1);
      assert.equal(table(family), nftGolden(family, NETS[family].N, S));
      nsExec(ns, 'nft', ['delete', 'table', ...t]);
      assert.equal(await k.ensure(), 1);
      assert.equal(table(family), nftGolden(family, NETS[family].N, S));
    });

    test(`IPv${family}: --ip-masq-fully-random-disable writes plain masquerade`, async () => {
      await new NftablesKeeper([spec(family, S, false)], { run, log }).ensure();
      assert.equal(table(family), nftGolden(family, NETS[family].N, S, false));
    });
  }

  test('each mode removes the other mode’s leftovers, IPv4 and IPv6', async () => {
    for (const family of [4, 6] as Family[]) {
      const N = parseCIDR(NETS[family].N)!;
      await new IptablesKeeper(
        [{ family, chains: [masqRules(family, N, parseCIDR(NETS[family].S)!), forwardRules(N)] }],
        { run, log },
      ).ensure();
    }
    await removeIptablesRules(run, log);
    for (const save of ['iptables-save', 'ip6tables-save']) {
      assert.doesNotMatch(nsExec(ns, save), /FLANNEL|flanneld/, save);
    }
    await new NftablesKeeper([spec(4, NETS[4].S), spec(6, NETS[6].S)], { run, log }).ensure();
    assert.match(tables(), /flannel-ipv4[\s\S]*flannel-ipv6/);
    await removeNftTables(run, log);
    // iptables-nft's own tables (ip nat, ip filter, …) stay; ours are gone.
    assert.doesNotMatch(tables(), /flannel/);
  });

  test('the daemon task in nftables mode: both tables (v6 empty on a v4 network), repaired; the udp backend’s egress TAP accepted', async () => {
    const cfg = parseNetConfig(JSON.stringify({ Network: NETS[4].N, EnableNFTables: true }));
    const lease = {
      key: '10.5.1.0-24',
      subnet: parseCIDR(NETS[4].S)!,
      ipv6Subnet: null,
      attrs: { publicIP: '192.168.1.1', publicIPv6: null, backendType: '' },
      expiration: null,
    };
    const ac = new AbortController();
    const task = iptablesTask({
      ipMasq: true,
      forwardRules: true,
      resyncSec: 0.05,
      egressTapOf,
      run,
      log,
    });
    const done = task({ lease, netConfig: cfg, signal: ac.signal });
    try {
      const until = async (what: string, ok: () => boolean) => {
        const deadline = Date.now() + 20_000;
        while (!ok()) {
          if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
          await new Promise((r) => setTimeout(r, 20));
        }
      };
      const listed = (family: Family) => {
        try {
          return table(family);
        } catch {
          return '';
        }
      };
      const v4 = () => listed(4);
      const emptyV6 = 'table ip6 flannel-ipv6 {\n\tcomment "rules for flannel-ipv6"\n}\n';
      // No Backend block: udp, whose engine may send through its egress TAP.
      const golden = nftGolden(4, NETS[4].N, NETS[4].S, true, 'flannel0-tx');
      await until('both tables', () => v4() === golden && listed(6) === emptyV6);
      nsExec(ns, 'nft', ['flush', 'chain', 'ip', 'flannel-ipv4', 'postrtg']);
      await until('the repair', () => v4() === golden);
    } finally {
      ac.abort();
      await done;
    }
  });
});
