import { test } from 'node:test';
import assert from 'node:assert/strict';
import { pino } from 'pino';
import { runRenewer, RENEW_RETRY_MS } from '../../../../src/control/lease/renewer.js';
import { WeftError, abortError } from '../../../../src/common/errors.js';
import type { Lease } from '../../../../src/control/lease/types.js';

const quiet = pino({ level: 'silent' });
const HOUR = 3_600_000;

/** A fake clock: sleep() advances time instantly and records each wait. */
function fakeTime(start = 1_000_000) {
  let now = start;
  const waits: number[] = [];
  return {
    now: () => now,
    waits,
    sleep: async (ms: number, signal: AbortSignal) => {
      if (signal.aborted) throw abortError(signal);
      waits.push(ms);
      now += ms;
    },
  };
}

function leaseExpiring(at: number | null): Lease {
  return {
    key: '10.5.1.0-24',
    subnet: null,
    ipv6Subnet: null,
    attrs: { publicIP: '192.168.0.1', publicIPv6: null, backendType: '' },
    expiration: at === null ? null : new Date(at),
  };
}

test('renews margin before expiry, then again a TTL later', async () => {
  const t = fakeTime();
  const ac = new AbortController();
  const renewedAt: number[] = [];
  await runRenewer({
    manager: {
      renewLease: async (l) => {
        renewedAt.push(t.now());
        if (renewedAt.length === 2) ac.abort();
        return { ...l, expiration: new Date(t.now() + 24 * HOUR) };
      },
    },
    lease: leaseExpiring(1_000_000 + 24 * HOUR),
    marginMs: HOUR,
    signal: ac.signal,
    log: quiet,
    now: t.now,
    sleep: t.sleep,
  });
  assert.deepEqual(t.waits.slice(0, 2), [23 * HOUR, 23 * HOUR]);
  assert.deepEqual(renewedAt, [1_000_000 + 23 * HOUR, 1_000_000 + 46 * HOUR]);
});

test('a failed renewal is retried a minute later', async () => {
  const t = fakeTime();
  const ac = new AbortController();
  let calls = 0;
  await runRenewer({
    manager: {
      renewLease: async (l) => {
        calls++;
        if (calls === 1) throw new WeftError('WEFT_ERR_STORE_UNAVAILABLE', 'etcd down');
        ac.abort();
        return l;
      },
    },
    lease: leaseExpiring(1_000_000 + 24 * HOUR),
    marginMs: HOUR,
    signal: ac.signal,
    log: quiet,
    now: t.now,
    sleep: t.sleep,
  });
  assert.deepEqual(t.waits, [23 * HOUR, RENEW_RETRY_MS]);
});

test('a revoked lease ends the renewer with the revocation', async () => {
  const t = fakeTime();
  await assert.rejects(
    runRenewer({
      manager: {
        renewLease: async () => {
          throw new WeftError('WEFT_ERR_LEASE_REVOKED', 'gone');
        },
      },
      lease: leaseExpiring(1_000_000 + 24 * HOUR),
      marginMs: HOUR,
      signal: new AbortController().signal,
      log: quiet,
      now: t.now,
      sleep: t.sleep,
    }),
    { code: 'WEFT_ERR_LEASE_REVOKED' },
  );
});

test('a reservation is never renewed', async () => {
  const t = fakeTime();
  const ac = new AbortController();
  let calls = 0;
  const sleep = async (ms: number, signal: AbortSignal) => {
    await t.sleep(ms, signal);
    ac.abort();
  };
  await runRenewer({
    manager: { renewLease: async (l) => (calls++, l) },
    lease: leaseExpiring(null),
    marginMs: HOUR,
    signal: ac.signal,
    log: quiet,
    now: t.now,
    sleep,
  });
  assert.equal(calls, 0);
});
