/**
 * --ip-blackhole-route's kernel op through both Netlink implementations (native libmnl and
 * iproute2), in a namespace of its own: the route appears as `blackhole <subnet>`, replacing it
 * again is harmless, deleting it works.
 *
 *   ┌─ weft-<pid>-<n> ───────────────────────┐
 *   │  blackhole 10.5.1.0/24                 │
 *   │  blackhole fc00:0:0:1::/64             │
 *   └────────────────────────────────────────┘
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { nativeAvailable } from '../../src/common/native.js';
import { Iproute2Netlink } from '../../src/control/netlink/iproute2-netlink.js';
import { NativeNetlink } from '../../src/control/netlink/native-netlink.js';
import { type Netlink, applyAll } from '../../src/control/netlink/netlink.js';
import { NetnsScope, ip, isRoot } from '../../src/testbed/netns.js';

const skip = isRoot() ? false : 'needs root (network namespaces)';

const impls: Array<[string, (ns: string) => Netlink, string | false]> = [
  [
    'native',
    (ns) => new NativeNetlink({ netns: ns }),
    nativeAvailable() ? false : 'addon not built',
  ],
  ['iproute2', (ns) => new Iproute2Netlink({ netns: ns }), false],
];

for (const [name, open, why] of impls) {
  describe(`blackhole routes through ${name} netlink`, { skip: skip || why }, () => {
    const scope = new NetnsScope();
    let ns = '';
    let nl: Netlink;
    before(() => {
      ns = scope.add();
      nl = open(ns);
    });
    after(async () => {
      nl?.close();
      await scope.cleanup();
    });

    test('a connected route of the same prefix (the pod bridge’s) is kept, not replaced', async () => {
      ip(ns, 'link', 'add', 'br9', 'type', 'bridge');
      ip(ns, 'addr', 'add', '10.5.9.1/24', 'dev', 'br9');
      ip(ns, 'link', 'set', 'br9', 'up');
      await applyAll(nl, [{ op: 'replaceRoute', type: 'blackhole', dst: '10.5.9.0/24' }]);
      assert.match(ip(ns, '-4', 'route', 'show', '10.5.9.0/24'), /^10\.5\.9\.0\/24 dev br9/);
      assert.doesNotMatch(ip(ns, '-4', 'route', 'show', 'type', 'blackhole'), /10\.5\.9\.0/);
      ip(ns, 'link', 'del', 'br9');
    });

    for (const [fam, dst] of [
      ['-4', '10.5.1.0/24'],
      ['-6', 'fc00:0:0:1::/64'],
    ] as const) {
      test(`replace (twice) and delete blackhole ${dst}`, async () => {
        const op = { op: 'replaceRoute', type: 'blackhole', dst } as const;
        await applyAll(nl, [op]);
        await applyAll(nl, [op]);
        assert.match(ip(ns, fam, 'route', 'show', dst), new RegExp(`^blackhole ${dst}`));
        await applyAll(nl, [{ ...op, op: 'delRoute' }]);
        assert.equal(ip(ns, fam, 'route', 'show', dst).trim(), '');
      });
    }
  });
}
