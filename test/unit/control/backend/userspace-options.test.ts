import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { backendOptions } from '../../../../src/control/backend/backend.js';
import { workersOption } from '../../../../src/control/backend/userspace.js';
import { backendContext } from './fixtures.js';

const ctx = (dataplaneWorkers: number) =>
  backendContext({ Type: 'udp' }, { options: backendOptions({ dataplaneWorkers }) });

describe('userspace backend: dataplane queues', () => {
  it('--dataplane-workers=N gives N queues', () => assert.equal(workersOption(ctx(3), 16), 3));
  it('0 (the default) gives one queue per CPU', () => assert.equal(workersOption(ctx(0), 2), 2));
  it('0 gives at most 4 queues', () => assert.equal(workersOption(ctx(0), 64), 4));
  it('0 on one CPU gives one queue', () => assert.equal(workersOption(ctx(0), 1), 1));
});

describe('backend options', () => {
  it('are one frozen object: defaults with the given flags applied', () => {
    const o = backendOptions({ dataplaneWorkers: 2 });
    assert.equal(Object.isFrozen(o), true);
    assert.equal(o.dataplaneWorkers, 2);
    assert.equal(o.dataplaneEngine, 'auto');
    assert.equal(o.subnetFile, null);
  });
});
