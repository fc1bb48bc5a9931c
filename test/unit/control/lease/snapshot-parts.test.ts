import assert from 'node:assert/strict';
import { test } from 'node:test';
import { parseCIDR } from '../../../../src/common/ip.js';
import { continuesSnapshot, snapshotPart } from '../../../../src/control/lease/snapshot-parts.js';
import type { LeaseEvent } from '../../../../src/control/lease/types.js';

const added = (third: number): LeaseEvent => ({
  type: 'added',
  lease: {
    key: `10.5.${third}.0-24`,
    subnet: parseCIDR(`10.5.${third}.0/24`)!,
    ipv6Subnet: null,
    attrs: { publicIP: `192.168.1.${third}`, publicIPv6: null, backendType: 'host-gw' },
    expiration: null,
  },
});

test('a snapshot part is marked as continued, the same array; any other batch is not', () => {
  const part = [added(1)];
  assert.equal(snapshotPart(part), part);
  assert.equal(continuesSnapshot(part), true);
  assert.equal(continuesSnapshot([added(1)]), false);
});
