/**
 * External interface selection against a real kernel: the selection runs in a child process
 * inside namespaces made for this file (sysfs, /proc/net and the UDP route lookup are all
 * per-namespace), and prints its result as JSON.
 *
 *   ┌──────────────────────── weft-<pid>-a ───────────────────────────┐
 *   │ a0 (veth, peer a1 up) 10.99.1.1/24, fd00:99:1::1/64, mtu 1400   │
 *   │    default via 10.99.1.254, default via fd00:99:1::fe           │
 *   │ b0 (veth, peer b1 up) 10.99.2.1/24                              │
 *   │ c0 (veth, peer c1 up) no IPv4 address                           │
 *   └─────────────────────────────────────────────────────────────────┘
 *   ┌──────────── weft-<pid>-b ─────────────┐
 *   │ n0 (veth, peer n1 up) 10.98.0.1/24    │   no default route
 *   └───────────────────────────────────────┘
 * No packet is sent: --iface-can-reach only connect()s a UDP socket.
 */
import assert from 'node:assert/strict';
import { createInterface } from 'node:readline';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import type { ExternalInterface } from '../../src/control/backend/backend.js';
import type { IfaceSelection } from '../../src/control/iface.js';
import { NetnsScope, ip, isRoot } from '../../src/testbed/netns.js';

const skip = isRoot() ? false : 'needs root (network namespaces)';
const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const PROBE = fileURLToPath(new URL('../helpers/iface-probe.ts', import.meta.url));

type ProbeResult = { ok: ExternalInterface } | { error: { code: string; message: string } };
const NONE: IfaceSelection = {
  iface: [],
  ifaceRegex: [],
  ifaceCanReach: '',
  publicIP: '',
  publicIPv6: '',
};
const V4 = { ipv4: true, ipv6: false };

/** One iface-probe process per namespace, started with the first request, serving the file. */
const probes = new Map<string, (line: string) => Promise<string>>();

function prober(scope: NetnsScope, ns: string): (line: string) => Promise<string> {
  let ask = probes.get(ns);
  if (ask) return ask;
  const child = scope.spawn(ns, process.execPath, ['--import', 'tsx', PROBE], {
    cwd: ROOT,
    env: { ...process.env, WEFT_LOG_LEVEL: 'silent' },
  });
  const lines = createInterface({ input: child.stdout! })[Symbol.asyncIterator]();
  let last: Promise<unknown> = Promise.resolve();
  ask = (line: string) => {
    const answer = last.then(async () => {
      child.stdin!.write(line + '\n');
      let timer: NodeJS.Timeout | undefined;
      const timeout = new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new Error(`iface-probe in ${ns}: no answer in 30 s`)),
          30_000,
        );
      });
      try {
        const next = await Promise.race([lines.next(), timeout]);
        if (next.done) throw new Error(`iface-probe in ${ns} exited (code ${child.exitCode})`);
        return next.value;
      } finally {
        clearTimeout(timer);
      }
    });
    last = answer.catch(() => undefined);
    return answer;
  };
  probes.set(ns, ask);
  return ask;
}

let probeScope: NetnsScope;

async function probe(
  ns: string,
  sel: Partial<IfaceSelection>,
  families = V4,
): Promise<ProbeResult> {
  const line = await prober(probeScope, ns)(JSON.stringify({ sel: { ...NONE, ...sel }, families }));
  return JSON.parse(line) as ProbeResult;
}

async function selected(ns: string, sel: Partial<IfaceSelection>, families = V4) {
  const r = await probe(ns, sel, families);
  if ('error' in r) assert.fail(`selection failed: ${r.error.message}`);
  return r.ok;
}

function ifindex(ns: string, dev: string): number {
  const [link] = JSON.parse(ip(ns, '-j', 'link', 'show', dev)) as { ifindex: number }[];
  return link!.ifindex;
}

describe('selectExternalInterface in a namespace', { skip }, () => {
  const scope = new NetnsScope();
  probeScope = scope;
  let ns = '';
  let bare = '';

  before(() => {
    ns = scope.add();
    for (const d of ['a', 'b', 'c']) {
      ip(ns, 'link', 'add', `${d}0`, 'type', 'veth', 'peer', 'name', `${d}1`);
      ip(ns, 'link', 'set', `${d}1`, 'up');
    }
    ip(ns, 'link', 'set', 'a0', 'mtu', '1400');
    ip(ns, 'addr', 'add', '10.99.1.1/24', 'dev', 'a0');
    ip(ns, 'addr', 'add', 'fd00:99:1::1/64', 'dev', 'a0', 'nodad');
    ip(ns, 'addr', 'add', '10.99.2.1/24', 'dev', 'b0');
    for (const d of ['a0', 'b0', 'c0']) ip(ns, 'link', 'set', d, 'up');
    ip(ns, 'route', 'add', 'default', 'via', '10.99.1.254', 'dev', 'a0');
    ip(ns, '-6', 'route', 'add', 'default', 'via', 'fd00:99:1::fe', 'dev', 'a0');

    bare = scope.add();
    ip(bare, 'link', 'add', 'n0', 'type', 'veth', 'peer', 'name', 'n1');
    ip(bare, 'addr', 'add', '10.98.0.1/24', 'dev', 'n0');
    ip(bare, 'link', 'set', 'n0', 'up');
    ip(bare, 'link', 'set', 'n1', 'up');
  });

  after(async () => {
    await scope.cleanup();
  });

  test('--iface by name', async () => {
    const e = await selected(ns, { iface: ['b0'] });
    assert.deepEqual(e, {
      name: 'b0',
      index: ifindex(ns, 'b0'),
      mtu: 1500,
      ifaceAddr: '10.99.2.1',
      ifaceAddrV6: e.ifaceAddrV6, // the kernel's fe80:: address, checked elsewhere
      publicIP: '10.99.2.1',
      publicIPv6: null,
    });
  });

  test('--iface by address', async () => {
    const e = await selected(ns, { iface: ['10.99.2.1'] });
    assert.deepEqual([e.name, e.ifaceAddr], ['b0', '10.99.2.1']);
  });

  test('--iface-regex on addresses', async () => {
    const e = await selected(ns, { ifaceRegex: ['^10\\.99\\.2\\.'] });
    assert.deepEqual([e.name, e.ifaceAddr], ['b0', '10.99.2.1']);
  });

  test('--iface-regex on names', async () => {
    assert.equal((await selected(ns, { ifaceRegex: ['^b0$'] })).name, 'b0');
  });

  test('default route interface, dual stack, with its MTU', async () => {
    const e = await selected(ns, {}, { ipv4: true, ipv6: true });
    assert.deepEqual(e, {
      name: 'a0',
      index: ifindex(ns, 'a0'),
      mtu: 1400,
      ifaceAddr: '10.99.1.1',
      ifaceAddrV6: 'fd00:99:1::1',
      publicIP: '10.99.1.1',
      publicIPv6: 'fd00:99:1::1',
    });
  });

  test('--iface-can-reach an address on a connected subnet', async () => {
    const e = await selected(ns, { ifaceCanReach: '10.99.2.77' });
    assert.deepEqual([e.name, e.ifaceAddr], ['b0', '10.99.2.1']);
  });

  test('--iface-can-reach an address behind the default route', async () => {
    const e = await selected(ns, { ifaceCanReach: '10.200.0.1' });
    assert.deepEqual([e.name, e.ifaceAddr], ['a0', '10.99.1.1']);
  });

  test('--iface-can-reach an IPv6 address', async () => {
    const e = await selected(ns, { ifaceCanReach: 'fd00:99:1::77' }, { ipv4: true, ipv6: true });
    assert.deepEqual([e.name, e.ifaceAddr, e.ifaceAddrV6], ['a0', '10.99.1.1', 'fd00:99:1::1']);
  });

  test('--public-ip overrides the published address only', async () => {
    const e = await selected(ns, { iface: ['a0'], publicIP: '203.0.113.9' });
    assert.deepEqual([e.ifaceAddr, e.publicIP], ['10.99.1.1', '203.0.113.9']);
  });

  test('an interface without an IPv4 address is an error naming it', async () => {
    const r = await probe(ns, { iface: ['c0'] });
    assert.deepEqual(r, {
      error: {
        code: 'WEFT_ERR_IFACE',
        message: 'no usable external interface: --iface c0: interface c0 has no IPv4 address',
      },
    });
  });

  test('an unknown --iface falls through to the next entry', async () => {
    assert.equal((await selected(ns, { iface: ['nope0', 'b0'] })).name, 'b0');
  });

  test('no default route is an error', async () => {
    const r = await probe(bare, {});
    assert.deepEqual(r, {
      error: {
        code: 'WEFT_ERR_IFACE',
        message: 'no usable external interface: default route: no IPv4 default route (use --iface)',
      },
    });
  });

  test('--iface-can-reach without a route is an error', async () => {
    const r = await probe(bare, { ifaceCanReach: '10.200.0.1' });
    assert.deepEqual(r, {
      error: {
        code: 'WEFT_ERR_IFACE',
        message:
          'no usable external interface: --iface-can-reach 10.200.0.1: no route to 10.200.0.1',
      },
    });
  });
});
