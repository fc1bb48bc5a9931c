import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { backendOptions } from '../../../../src/control/backend/backend.js';
import { offloadsOption, workersOption } from '../../../../src/control/backend/userspace.js';
import { logger } from '../../../../src/common/log.js';
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

describe('userspace backend: the egress TAP on a host that would drop its frames', () => {
  const strict = () => ({ rpFilterAll: '1', forwardDrop: [] });
  const open = () => ({ rpFilterAll: '0', forwardDrop: [] });
  const withLog = () => {
    const lines: string[] = [];
    const log = logger('test');
    log.info = ((o: { reason?: string }, msg: string) => {
      lines.push(`${msg}: ${o.reason}`);
    }) as typeof log.info;
    return { ctx: backendContext({ Type: 'udp' }, { log }), lines };
  };
  it('strict rp_filter: tap_gso left out, the reason said once', () => {
    const { ctx: c, lines } = withLog();
    const got = offloadsOption(c, 'native', strict);
    assert.equal(got.includes('tap_gso'), false);
    assert.equal(got.includes('udp_gso'), true);
    assert.deepEqual(lines, [
      "egress TAP not used: TCP super-packets are split and sent with UDP GSO: strict reverse-path filtering (net.ipv4.conf.all.rp_filter=1) drops the TAP's frames (it has no address)",
    ]);
  });
  it('an open host keeps tap_gso and says nothing', () => {
    const { ctx: c, lines } = withLog();
    assert.equal(offloadsOption(c, 'native', open).includes('tap_gso'), true);
    assert.deepEqual(lines, []);
  });
  it('the js engine has no TAP: nothing read, nothing said', () => {
    const { ctx: c, lines } = withLog();
    offloadsOption(c, 'js', () => assert.fail('read the host for the js engine'));
    assert.deepEqual(lines, []);
  });
});
