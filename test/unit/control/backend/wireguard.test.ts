// The wireguard backend's pure parts: the net-conf Backend block (flannel's fields, defaults and
// the rules a bad value breaks), the lease BackendData both ways (a Port-less lease of flannel
// < v0.26.6 included), the tunnels each Mode makes, and the peer a lease stands for in each.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { describe, it } from 'node:test';
import { isWeftError } from '../../../../src/common/errors.js';
import { formatCIDR } from '../../../../src/common/ip.js';
import type { Lease, LeaseEvent } from '../../../../src/control/lease/types.js';
import {
  DEFAULT_LISTEN_PORT,
  DEFAULT_LISTEN_PORT_V6,
  type Tunnel,
  WireguardBackend,
  WireguardPeers,
  fanOut,
  parseWireguardConfig,
  readWireguardLeaseData,
  selectEndpointFamily,
  wireguardLeaseData,
  wireguardPeerFor,
  wireguardTunnels,
} from '../../../../src/control/backend/wireguard.js';
import { backendFactory, checkBackendConfig } from '../../../../src/control/backend/registry.js';
import { parseNetConfig } from '../../../../src/control/config/net-config.js';
import {
  desiredAnnotations,
  kubeAnnotations,
  nodeToLease,
} from '../../../../src/control/kube/kube-manager.js';
import { EXT, FAM, backendContext, peerLease } from './fixtures.js';

const KEY = randomBytes(32);
const KEY_B64 = KEY.toString('base64');

const refused = (block: Record<string, unknown>, field: string, rule: RegExp) =>
  assert.throws(
    () => parseWireguardConfig({ Type: 'wireguard', ...block }),
    (err: unknown) =>
      isWeftError(err) &&
      err.code === 'WEFT_ERR_CONFIG_INVALID' &&
      err.message.startsWith(`Backend.${field}: `) &&
      rule.test(err.message),
  );

describe('wireguard net-conf', () => {
  it("defaults are flannel's: ports 51820/51821, the interface MTU, no PSK, no keepalive, separate", () => {
    assert.deepEqual(
      { ...parseWireguardConfig({ Type: 'wireguard' }) },
      {
        listenPort: 51820,
        listenPortV6: 51821,
        mtu: null,
        psk: null,
        keepalive: 0,
        mode: 'separate',
      },
    );
  });

  it('every field is read, names matched case-insensitively as Go does', () => {
    const c = parseWireguardConfig({
      Type: 'wireguard',
      listenport: 5000,
      ListenPortV6: 5001,
      mtu: 1400,
      PSK: KEY_B64,
      PersistentKeepaliveInterval: 25,
      Mode: 'auto',
    });
    assert.equal(c.listenPort, 5000);
    assert.equal(c.listenPortV6, 5001);
    assert.equal(c.mtu, 1400);
    assert.ok(c.psk?.equals(KEY));
    assert.equal(c.keepalive, 25);
    assert.equal(c.mode, 'auto');
  });

  it('each Mode flannel knows is taken', () => {
    for (const m of ['separate', 'auto', 'ipv4', 'ipv6'])
      assert.equal(parseWireguardConfig({ Mode: m }).mode, m);
  });

  it('a Mode flannel does not know is refused, naming the choices', () => {
    refused({ Mode: 'both' }, 'Mode', /one of separate, auto, ipv4, ipv6/);
    refused({ Mode: 'IPv4' }, 'Mode', /one of/);
    refused({ Mode: '' }, 'Mode', /one of/);
    refused({ Mode: 4 }, 'Mode', /one of/);
  });

  it('ports must be integers in 1..65535 (0 is the default, as Go reads it)', () => {
    assert.equal(parseWireguardConfig({ ListenPort: 0 }).listenPort, DEFAULT_LISTEN_PORT);
    assert.equal(parseWireguardConfig({ ListenPortV6: 0 }).listenPortV6, DEFAULT_LISTEN_PORT_V6);
    refused({ ListenPort: 70000 }, 'ListenPort', /1\.\.65535/);
    refused({ ListenPortV6: -1 }, 'ListenPortV6', /1\.\.65535/);
    refused({ ListenPort: '51820' }, 'ListenPort', /integer/);
    refused({ ListenPort: 5.5 }, 'ListenPort', /integer/);
  });

  it('PSK must be base64 of 32 bytes; an empty one is none', () => {
    assert.equal(parseWireguardConfig({ PSK: '' }).psk, null);
    refused({ PSK: 'c2hvcnQ=' }, 'PSK', /32 bytes/);
    refused({ PSK: KEY_B64.slice(0, 43) }, 'PSK', /32 bytes/);
    refused({ PSK: randomBytes(33).toString('base64') }, 'PSK', /32 bytes/);
    refused({ PSK: 42 }, 'PSK', /32 bytes/);
  });

  it('PersistentKeepaliveInterval is a whole number of seconds in 0..65535', () => {
    refused({ PersistentKeepaliveInterval: 2.5 }, 'PersistentKeepaliveInterval', /seconds/);
    refused({ PersistentKeepaliveInterval: '25s' }, 'PersistentKeepaliveInterval', /seconds/);
    refused({ PersistentKeepaliveInterval: -1 }, 'PersistentKeepaliveInterval', /0\.\.65535/);
    refused({ PersistentKeepaliveInterval: 65536 }, 'PersistentKeepaliveInterval', /0\.\.65535/);
  });

  it('MTU must leave the device (MTU − 80) an IPv4 packet; 0 is the interface MTU', () => {
    assert.equal(parseWireguardConfig({ MTU: 0 }).mtu, null);
    refused({ MTU: 100 }, 'MTU', /at least 148/);
    refused({ MTU: 'big' }, 'MTU', /integer/);
  });

  it('with IPv6 on, MTU must leave the device 1280', () => {
    assert.throws(
      () => new WireguardBackend(backendContext({ Type: 'wireguard', MTU: 1300 })),
      (err: unknown) => isWeftError(err) && /Backend\.MTU: must be at least 1360/.test(err.message),
    );
  });

  it('`weft config set` runs the same check (registry)', () => {
    const backend = parseNetConfig(
      JSON.stringify({ Network: '10.5.0.0/16', Backend: { Type: 'wireguard', Mode: 'x' } }),
    ).backend;
    assert.throws(() => checkBackendConfig(backend), /Backend\.Mode/);
    assert.equal(typeof backendFactory('wireguard'), 'function');
  });
});

describe('wireguard lease data', () => {
  it('ours is {"PublicKey": base64, "Port": port}, as flannel writes it', () => {
    assert.equal(
      JSON.stringify(wireguardLeaseData(KEY, 51820)),
      `{"PublicKey":"${KEY_B64}","Port":51820}`,
    );
  });

  it("a peer's is read back, field names in any case", () => {
    const d = readWireguardLeaseData({ publickey: KEY_B64, PORT: 4000 });
    assert.ok(!('reason' in d));
    assert.ok(d.publicKey.equals(KEY));
    assert.equal(d.port, 4000);
  });

  it('without Port (flannel < v0.26.6), or Port 0, the port is left to the reader', () => {
    const d = readWireguardLeaseData({ PublicKey: KEY_B64 });
    assert.ok(!('reason' in d) && d.port === null);
    const z = readWireguardLeaseData({ PublicKey: KEY_B64, Port: 0 });
    assert.ok(!('reason' in z) && z.port === null);
  });

  it('malformed data says why', () => {
    const reason = (v: unknown) => {
      const d = readWireguardLeaseData(v);
      return 'reason' in d ? d.reason : null;
    };
    assert.match(reason('x')!, /not an object/);
    assert.match(reason(null)!, /not an object/);
    assert.match(reason({})!, /PublicKey/);
    assert.match(reason({ PublicKey: 'AAAA' })!, /PublicKey/);
    assert.match(reason({ PublicKey: KEY_B64, Port: 'x' })!, /Port/);
    assert.match(reason({ PublicKey: KEY_B64, Port: 65536 })!, /Port/);
  });
});

const wgLease = (over: Partial<Lease['attrs']> = {}) =>
  peerLease({
    backendType: 'wireguard',
    backendData: { PublicKey: KEY_B64, Port: 6000 },
    backendV6Data: { PublicKey: KEY_B64, Port: 6001 },
    ...over,
  });

describe('wireguard tunnels and peers', () => {
  const cfg = (mode: string) => parseWireguardConfig({ Mode: mode });

  it('separate: flannel-wg (IPv4, ListenPort) and flannel-wg-v6 (IPv6, ListenPortV6)', () => {
    assert.deepEqual(wireguardTunnels(cfg('separate'), [4, 6]), [
      { dev: 'flannel-wg', families: [4], port: 51820, endpoint: 4 },
      { dev: 'flannel-wg-v6', families: [6], port: 51821, endpoint: 6 },
    ]);
    assert.deepEqual(
      wireguardTunnels(cfg('separate'), [6]).map((t) => t.dev),
      ['flannel-wg-v6'],
    );
  });

  it('auto, ipv4, ipv6: one flannel-wg on ListenPort for both families', () => {
    for (const [m, e] of [
      ['auto', 'auto'],
      ['ipv4', 4],
      ['ipv6', 6],
    ] as const) {
      assert.deepEqual(wireguardTunnels(cfg(m), [4, 6]), [
        { dev: 'flannel-wg', families: [4, 6], port: 51820, endpoint: e },
      ]);
    }
  });

  const [v4Tunnel, v6Tunnel] = wireguardTunnels(cfg('separate'), [4, 6]) as [Tunnel, Tunnel];

  it('separate IPv4: endpoint PublicIP:BackendData.Port, AllowedIPs the IPv4 subnet', () => {
    const p = wireguardPeerFor(wgLease(), v4Tunnel, EXT, 25);
    assert.ok(!('skip' in p));
    assert.ok(p.peer.publicKey.equals(KEY));
    assert.equal(p.peer.endpoint, FAM[4].publicIP);
    assert.equal(p.peer.port, 6000);
    assert.equal(p.peer.persistentKeepalive, 25);
    assert.deepEqual(
      p.entries.map((e) => [formatCIDR(e.subnet), e.port]),
      [[FAM[4].subnet, 6000]],
    );
  });

  it('separate IPv6: endpoint [PublicIPv6]:BackendV6Data.Port, AllowedIPs the IPv6 subnet', () => {
    const p = wireguardPeerFor(wgLease(), v6Tunnel, EXT, 0);
    assert.ok(!('skip' in p));
    assert.equal(p.peer.endpoint, FAM[6].publicIP);
    assert.equal(p.peer.port, 6001);
    assert.deepEqual(
      p.entries.map((e) => formatCIDR(e.subnet)),
      [FAM[6].subnet],
    );
  });

  it("a lease without Port is reached on the reader's own listen port of that tunnel", () => {
    const lease = wgLease({
      backendData: { PublicKey: KEY_B64 },
      backendV6Data: { PublicKey: KEY_B64 },
    });
    const p4 = wireguardPeerFor(lease, v4Tunnel, EXT, 0);
    const p6 = wireguardPeerFor(lease, v6Tunnel, EXT, 0);
    assert.ok(!('skip' in p4) && !('skip' in p6));
    assert.equal(p4.peer.port, 51820);
    assert.equal(p6.peer.port, 51821);
  });

  it('one tunnel: both subnets are the AllowedIPs of one peer, reached in the Mode family', () => {
    const [t4] = wireguardTunnels(cfg('ipv4'), [4, 6]) as [Tunnel];
    const [t6] = wireguardTunnels(cfg('ipv6'), [4, 6]) as [Tunnel];
    const p4 = wireguardPeerFor(wgLease(), t4, EXT, 0);
    const p6 = wireguardPeerFor(wgLease(), t6, EXT, 0);
    assert.ok(!('skip' in p4) && !('skip' in p6));
    assert.deepEqual([p4.peer.endpoint, p4.peer.port], [FAM[4].publicIP, 6000]);
    assert.deepEqual([p6.peer.endpoint, p6.peer.port], [FAM[6].publicIP, 6001]);
    for (const p of [p4, p6]) {
      assert.deepEqual(
        p.entries.map((e) => formatCIDR(e.subnet)),
        [FAM[4].subnet, FAM[6].subnet],
      );
      assert.ok(p.entries.every((e) => e.publicIP.family === (p === p4 ? 4 : 6)));
    }
  });

  it("auto picks as flannel's selectMode", () => {
    const ours = { publicIP: '203.0.113.1', publicIPv6: '2001:db8::1' };
    const lease = (v4: string, v6: string | null) =>
      peerLease({ backendType: 'wireguard', publicIP: v4, publicIPv6: v6 });
    // no IPv6 address: IPv4
    assert.equal(selectEndpointFamily(lease('10.0.0.1', null), ours), 4);
    // a public IPv4 address and one of ours: IPv4
    assert.equal(selectEndpointFamily(lease('198.51.100.1', '2001:db8::2'), ours), 4);
    // a private IPv4 (RFC 1918), both IPv6 addresses public: IPv6
    for (const v4 of ['10.1.1.1', '172.16.0.1', '172.31.9.9', '192.168.3.3'])
      assert.equal(selectEndpointFamily(lease(v4, '2001:db8::2'), ours), 6, v4);
    // 172.32/16 is not private
    assert.equal(selectEndpointFamily(lease('172.32.0.1', '2001:db8::2'), ours), 4);
    // a ULA (fc00::/7) on either side: IPv4
    assert.equal(selectEndpointFamily(lease('10.1.1.1', 'fd00::2'), ours), 4);
    assert.equal(
      selectEndpointFamily(lease('10.1.1.1', '2001:db8::2'), { ...ours, publicIPv6: 'fc00::1' }),
      4,
    );
    assert.equal(
      selectEndpointFamily(lease('10.1.1.1', '2001:db8::2'), { ...ours, publicIPv6: null }),
      4,
    );
  });

  it('another BackendType, no public address of the family, or bad data: skipped with why', () => {
    const skip = (l: Lease, t: Tunnel = v4Tunnel) => {
      const p = wireguardPeerFor(l, t, EXT, 0);
      return 'skip' in p ? p.skip : null;
    };
    assert.match(skip(peerLease())!, /BackendType "vxlan" is not wireguard/);
    assert.match(skip(wgLease({ publicIP: '0.0.0.0' }))!, /no public IPv4 address/);
    assert.match(skip(wgLease({ publicIPv6: null }), v6Tunnel)!, /no public IPv6 address/);
    assert.match(skip(wgLease({ backendData: { PublicKey: 'nope' } }))!, /PublicKey/);
    assert.match(skip(wgLease({ backendData: [1] }))!, /not an object/);
    assert.match(
      skip(wgLease({ backendData: undefined, backendV6Data: undefined }))!,
      /no BackendData/,
    );
  });
});

describe('wireguard peers beside the table', () => {
  const OWN = randomBytes(32);
  const tunnel = wireguardTunnels(parseWireguardConfig({}), [4])[0]!;
  const leaseAt = (n: number, key: Buffer, publicIP = `192.168.1.${n}`): Lease => {
    const l = peerLease(
      {
        backendType: 'wireguard',
        publicIP,
        backendData: { PublicKey: key.toString('base64'), Port: 51820 },
      },
      { v4: `10.5.${n}.0/24`, v6: `fc00:0:0:${n}::/64` },
    );
    return l;
  };
  const added = (l: Lease): LeaseEvent => ({ type: 'added', lease: l });

  it('one peer per lease; removal and unchanged leases are told apart', () => {
    const w = new WireguardPeers(tunnel, backendContext({ Type: 'wireguard' }), 0, () => OWN);
    const a = leaseAt(2, randomBytes(32));
    const b = leaseAt(3, randomBytes(32));
    assert.equal(w.update([added(a), added(b)], null), true);
    assert.equal(w.list().length, 2);
    assert.equal(w.update([added(a)], null), false);
    assert.equal(w.update([{ type: 'removed', lease: a }], null), true);
    assert.deepEqual(
      w.list().map((p) => p.endpoint),
      ['192.168.1.3'],
    );
  });

  it('our own lease, our own key, a repeated key or address: left out, counted once', async () => {
    const ctx = backendContext({ Type: 'wireguard' });
    const w = new WireguardPeers(tunnel, ctx, 0, () => OWN);
    const k = randomBytes(32);
    const own = leaseAt(9, randomBytes(32));
    w.update(
      [
        added(own),
        added(leaseAt(2, k)),
        added(leaseAt(3, k)),
        added(leaseAt(4, randomBytes(32), '192.168.1.2')),
        added(leaseAt(5, OWN)),
      ],
      own.key,
    );
    assert.deepEqual(
      w.list().map((p) => p.endpoint),
      ['192.168.1.2'],
    );
    w.list();
    const m = await ctx.metrics.getSingleMetricAsString('weft_backend_peer_leases_skipped_total');
    assert.match(m, /weft_backend_peer_leases_skipped_total 3$/m);
  });

  it('the engine gets the list when it changed or is a new engine', () => {
    const w = new WireguardPeers(tunnel, backendContext({ Type: 'wireguard' }), 0, () => OWN);
    const calls: number[] = [];
    const engine = () => ({ setWireguardPeers: (p: unknown[]) => calls.push(p.length) }) as never;
    const e1 = engine();
    w.update([added(leaseAt(2, randomBytes(32)))], null);
    w.handOver(e1);
    w.handOver(e1);
    w.handOver(engine());
    w.update([added(leaseAt(3, randomBytes(32)))], null);
    w.handOver(e1);
    assert.deepEqual(calls, [1, 1, 2]);
  });
});

describe('fanOut', () => {
  it('every consumer sees every item, and the end', async () => {
    async function* src() {
      yield 1;
      yield 2;
      yield 3;
    }
    const [a, b] = fanOut(src(), 2);
    const read = async (it: AsyncIterable<number>) => {
      const out: number[] = [];
      for await (const v of it) out.push(v);
      return out;
    };
    assert.deepEqual(await Promise.all([read(a!), read(b!)]), [
      [1, 2, 3],
      [1, 2, 3],
    ]);
  });
});

describe('wireguard in kube mode: flannel’s annotations', () => {
  const names = kubeAnnotations('flannel.alpha.coreos.com');
  const node = (annotations: Record<string, string>) => ({
    metadata: { name: 'n1', annotations },
    spec: { podCIDRs: ['10.5.7.0/24', 'fc00:0:0:7::/64'] },
  });

  it('our lease data goes into backend-data and backend-v6-data as flannel writes them', () => {
    const ann = desiredAnnotations(node({}), names, {
      publicIP: '192.168.1.7',
      publicIPv6: '2001:db8:1::7',
      backendType: 'wireguard',
      backendData: wireguardLeaseData(KEY, 51820),
      backendV6Data: wireguardLeaseData(KEY, 51821),
    });
    assert.equal(ann['flannel.alpha.coreos.com/backend-type'], 'wireguard');
    assert.equal(
      ann['flannel.alpha.coreos.com/backend-data'],
      `{"PublicKey":"${KEY_B64}","Port":51820}`,
    );
    assert.equal(
      ann['flannel.alpha.coreos.com/backend-v6-data'],
      `{"PublicKey":"${KEY_B64}","Port":51821}`,
    );
  });

  it("a flanneld node's annotations (one without Port) make a peer on each tunnel", () => {
    const cfg = backendContext({ Type: 'wireguard' }).netConfig;
    const r = nodeToLease(
      node({
        'flannel.alpha.coreos.com/backend-type': 'wireguard',
        'flannel.alpha.coreos.com/backend-data': `{"PublicKey":"${KEY_B64}","Port":6000}`,
        'flannel.alpha.coreos.com/backend-v6-data': `{"PublicKey":"${KEY_B64}"}`,
        'flannel.alpha.coreos.com/public-ip': '192.168.1.7',
        'flannel.alpha.coreos.com/public-ipv6': '2001:db8:1::7',
        'flannel.alpha.coreos.com/kube-subnet-manager': 'true',
      }),
      names,
      cfg,
    );
    assert.ok(r.ok);
    const [t4, t6] = wireguardTunnels(parseWireguardConfig({}), [4, 6]) as [Tunnel, Tunnel];
    const p4 = wireguardPeerFor(r.value, t4, EXT, 0);
    const p6 = wireguardPeerFor(r.value, t6, EXT, 0);
    assert.ok(!('skip' in p4) && !('skip' in p6));
    assert.deepEqual([p4.peer.endpoint, p4.peer.port], ['192.168.1.7', 6000]);
    assert.deepEqual([p6.peer.endpoint, p6.peer.port], ['2001:db8:1::7', 51821]);
  });
});
