/**
 * The ipip kernel backend between two node namespaces (no daemon: the backend itself over the
 * native netlink opened inside each namespace), both DirectRouting cases:
 *
 *   ┌─ weft-<pid>-a ───────────┐        ┌─ weft-<pid>-b ───────────┐
 *   │ flannel.ipip 10.5.1.0/32 │        │ flannel.ipip 10.5.2.0/32 │
 *   │   local 192.168.77.1     │        │   local 192.168.77.2     │
 *   │ a0 192.168.77.1/24 ──────┼─ veth ─┼── b0 192.168.77.2/24     │
 *   └──────────────────────────┘        └──────────────────────────┘
 *
 * The device is flannel's (`ipip remote any local <addr> ttl inherit nopmtudisc`, MTU 1480),
 * each side routes the other's subnet (`via <peer> dev flannel.ipip onlink`, or `dev a0 onlink`
 * with DirectRouting) and the tunnel addresses ping each other. It needs the kernel's ipip
 * module: where it is missing the suite is skipped and says so.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Registry } from '../../src/common/metrics.js';
import { parseCIDR } from '../../src/common/ip.js';
import { logger } from '../../src/common/log.js';
import { type Backend, DEFAULT_BACKEND_OPTIONS } from '../../src/control/backend/backend.js';
import { IPIP_DEV, createIpipBackend } from '../../src/control/backend/ipip.js';
import { parseNetConfig } from '../../src/control/config/net-config.js';
import { makeSubnetKey } from '../../src/control/lease/subnet-key.js';
import type { Lease, LeaseEvent } from '../../src/control/lease/types.js';
import { NativeNetlink } from '../../src/control/netlink/native-netlink.js';
import { NetnsScope, ip, isRoot, nsExec } from '../../src/testbed/netns.js';
import { ipipMissing } from '../helpers/ipip.js';

const log = logger('test');
log.level = 'silent';

const skip = !isRoot()
  ? 'needs root (network namespaces)'
  : (() => {
      const why = ipipMissing();
      return why === null
        ? false
        : `this kernel has no ipip module (ip link add type ipip: ${why})`;
    })();

const NODES = [
  { ext: 'a0', addr: '192.168.77.1', subnet: '10.5.1.0/24', tunnel: '10.5.1.0' },
  { ext: 'b0', addr: '192.168.77.2', subnet: '10.5.2.0/24', tunnel: '10.5.2.0' },
] as const;

function lease(i: 0 | 1): Lease {
  const subnet = parseCIDR(NODES[i].subnet)!;
  return {
    key: makeSubnetKey(subnet, null),
    subnet,
    ipv6Subnet: null,
    attrs: { publicIP: NODES[i].addr, publicIPv6: null, backendType: 'ipip' },
    expiration: null,
  };
}

for (const directRouting of [false, true]) {
  describe(`ipip kernel backend, DirectRouting ${directRouting}`, { skip }, () => {
    const scope = new NetnsScope();
    const ns: string[] = [];
    const backends: Backend[] = [];
    const ac = new AbortController();
    const runs: Promise<void>[] = [];

    before(async () => {
      ns.push(scope.add(), scope.add());
      scope.vethBetween(ns[0]!, 'a0', ns[1]!, 'b0');
      for (const i of [0, 1] as const) {
        ip(ns[i]!, 'addr', 'add', `${NODES[i].addr}/24`, 'dev', NODES[i].ext);
        ip(ns[i]!, 'link', 'set', NODES[i].ext, 'up');
        const netConfig = parseNetConfig(
          JSON.stringify({
            Network: '10.5.0.0/16',
            Backend: { Type: 'ipip', DirectRouting: directRouting },
          }),
        );
        const b = createIpipBackend(
          {
            netConfig,
            extIface: {
              name: NODES[i].ext,
              index: 0,
              mtu: 1500,
              ifaceAddr: NODES[i].addr,
              ifaceAddrV6: null,
              publicIP: NODES[i].addr,
              publicIPv6: null,
            },
            log,
            metrics: new Registry(),
            options: DEFAULT_BACKEND_OPTIONS,
            signal: ac.signal,
          },
          { openNetlink: () => new NativeNetlink({ netns: ns[i]! }) },
        );
        backends.push(b);
        await b.prepare();
        await b.start(lease(i));
        const peer: LeaseEvent[] = [{ type: 'added', lease: lease(i === 0 ? 1 : 0) }];
        async function* events() {
          yield peer;
          await new Promise((r) => ac.signal.addEventListener('abort', r));
        }
        runs.push(b.run(events(), ac.signal));
      }
    });

    after(async () => {
      ac.abort();
      await Promise.allSettled(runs);
      for (const b of backends) await b.close();
      await scope.cleanup();
    });

    test('flannel.ipip is flannel’s device: local = interface address, remote any, MTU 1480', () => {
      const d = ip(ns[0]!, '-d', 'link', 'show', IPIP_DEV);
      assert.match(d, /mtu 1480/);
      assert.match(d, /ipip remote any local 192\.168\.77\.1 ttl inherit .*nopmtudisc/);
      assert.match(ip(ns[0]!, '-4', 'addr', 'show', 'dev', IPIP_DEV), /inet 10\.5\.1\.0\/32/);
    });

    test('each node routes the other’s subnet as flannel does, and the tunnel addresses ping', async () => {
      const dev = directRouting ? 'a0' : IPIP_DEV;
      const want = `10.5.2.0/24 via 192.168.77.2 dev ${dev}`;
      const deadline = Date.now() + 10_000;
      while (!ip(ns[0]!, 'route', 'show', '10.5.2.0/24').includes(want)) {
        if (Date.now() > deadline) assert.fail(`no route "${want}"`);
        await new Promise((r) => setTimeout(r, 50));
      }
      assert.match(ip(ns[0]!, 'route', 'show', '10.5.2.0/24'), /onlink/);
      if (!directRouting) {
        nsExec(ns[0]!, 'ping', ['-c', '2', '-W', '2', '-I', '10.5.1.0', '10.5.2.0']);
      }
    });
  });
}
