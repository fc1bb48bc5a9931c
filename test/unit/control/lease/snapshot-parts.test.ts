import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { parseCIDR } from '../../../../src/common/ip.js';
import {
  continuesSnapshot,
  snapshotPart,
  wholeSnapshots,
} from '../../../../src/control/lease/snapshot-parts.js';
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

async function* feed(batches: LeaseEvent[][]): AsyncIterable<LeaseEvent[]> {
  for (const b of batches) yield b;
}

async function collect(batches: AsyncIterable<LeaseEvent[]>): Promise<LeaseEvent[][]> {
  const out: LeaseEvent[][] = [];
  for await (const b of batches) out.push(b);
  return out;
}

describe('snapshot parts', () => {
  test('a part is marked as continued; any other batch is not', () => {
    const part = [added(1)];
    assert.equal(snapshotPart(part), part);
    assert.equal(continuesSnapshot(part), true);
    assert.equal(continuesSnapshot([added(1)]), false);
  });

  test('wholeSnapshots puts the parts and the batch ending them together, in order', async () => {
    const out = await collect(
      wholeSnapshots(
        feed([snapshotPart([added(1), added(2)]), snapshotPart([added(3)]), [added(4)]]),
      ),
    );
    assert.deepEqual(
      out.map((b) => b.map((e) => e.lease.key)),
      [['10.5.1.0-24', '10.5.2.0-24', '10.5.3.0-24', '10.5.4.0-24']],
    );
    assert.equal(continuesSnapshot(out[0]!), false);
  });

  test('wholeSnapshots passes a batch that ends no parts on as it is, an empty one included', async () => {
    const first: LeaseEvent[] = [];
    const second = [added(1)];
    const out = await collect(wholeSnapshots(feed([first, second])));
    assert.equal(out.length, 2);
    assert.equal(out[0], first);
    assert.equal(out[1], second);
  });
});
