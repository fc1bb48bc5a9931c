import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { parseCIDR } from '../../../../src/common/ip.js';
import { planHostGw } from '../../../../src/control/backend/host-gw.js';
import { planVxlan, type VxlanPlanContext } from '../../../../src/control/backend/vxlan.js';
import { FAM, FAMILIES, PEER_MAC, PEER_MAC_V6, peerLease } from './fixtures.js';

// One loop over families: every case runs for IPv4 and IPv6 from the same table.
for (const family of FAMILIES) {
  const F = FAM[family];
  const mac = family === 4 ? PEER_MAC : PEER_MAC_V6;
  const ctx: VxlanPlanContext = {
    dev: F.dev,
    extDev: 'eth0',
    directRouting: false,
    extNets: [parseCIDR(F.extNet)!],
  };

  describe(`planVxlan, IPv${family}`, () => {
    test('an added peer gets neigh, then FDB, then an onlink route', () => {
      assert.deepEqual(planVxlan({ type: 'added', lease: peerLease() }, family, ctx), [
        { op: 'replaceNeigh', dst: F.subnetAddr, mac, dev: F.dev },
        { op: 'appendFdb', mac, dst: F.publicIP, dev: F.dev },
        { op: 'replaceRoute', dst: F.subnet, gw: F.subnetAddr, dev: F.dev, onlink: true },
      ]);
    });

    test('a removed peer loses route, FDB and neigh (reverse order)', () => {
      assert.deepEqual(planVxlan({ type: 'removed', lease: peerLease() }, family, ctx), [
        { op: 'delRoute', dst: F.subnet, gw: F.subnetAddr, dev: F.dev, onlink: true },
        { op: 'delFdb', mac, dst: F.publicIP, dev: F.dev },
        { op: 'delNeigh', dst: F.subnetAddr, dev: F.dev },
      ]);
    });

    test('DirectRouting routes a peer on our L2 segment via its public IP', () => {
      const dr = { ...ctx, directRouting: true };
      assert.deepEqual(planVxlan({ type: 'added', lease: peerLease() }, family, dr), [
        { op: 'replaceRoute', dst: F.subnet, gw: F.publicIP, dev: 'eth0' },
      ]);
    });

    test('DirectRouting keeps the tunnel for a peer off our segment', () => {
      const dr = { ...ctx, directRouting: true };
      const lease = peerLease(
        family === 4 ? { publicIP: F.offLinkIP } : { publicIPv6: F.offLinkIP },
      );
      const ops = planVxlan({ type: 'added', lease }, family, dr);
      assert.deepEqual(
        ops.map((o) => o.op),
        ['replaceNeigh', 'appendFdb', 'replaceRoute'],
      );
    });

    test('peers of another backend type are not programmed', () => {
      assert.deepEqual(
        planVxlan({ type: 'added', lease: peerLease({ backendType: 'host-gw' }) }, family, ctx),
        [],
      );
    });

    test('a malformed VtepMAC is skipped with a reason', () => {
      const reasons: string[] = [];
      const bad = { VNI: 1, VtepMAC: 'zz:zz' };
      const lease = peerLease(family === 4 ? { backendData: bad } : { backendV6Data: bad });
      const ops = planVxlan({ type: 'added', lease }, family, {
        ...ctx,
        onSkip: (_l, r) => reasons.push(r),
      });
      assert.deepEqual(ops, []);
      assert.match(reasons[0] ?? '', /VtepMAC "zz:zz" is not a MAC address/);
    });

    test('a peer without an address of this family is not programmed', () => {
      const lease = peerLease(family === 4 ? { publicIP: '0.0.0.0' } : { publicIPv6: null });
      assert.deepEqual(planVxlan({ type: 'added', lease }, family, ctx), []);
    });
  });

  describe(`planHostGw, IPv${family}`, () => {
    const hg = peerLease({
      backendType: 'host-gw',
      backendData: undefined,
      backendV6Data: undefined,
    });
    test('an added peer gets a route via its public IP on the external interface', () => {
      assert.deepEqual(planHostGw({ type: 'added', lease: hg }, family, { extDev: 'eth0' }), [
        { op: 'replaceRoute', dst: F.subnet, gw: F.publicIP, dev: 'eth0' },
      ]);
    });

    test('a removed peer loses its route', () => {
      assert.deepEqual(planHostGw({ type: 'removed', lease: hg }, family, { extDev: 'eth0' }), [
        { op: 'delRoute', dst: F.subnet, gw: F.publicIP, dev: 'eth0' },
      ]);
    });

    test('vxlan peers are not programmed by host-gw', () => {
      assert.deepEqual(
        planHostGw({ type: 'added', lease: peerLease() }, family, { extDev: 'eth0' }),
        [],
      );
    });
  });
}
