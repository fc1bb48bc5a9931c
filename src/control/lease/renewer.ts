/**
 * Keeps our lease alive: renews it `marginMs` before it lapses (flannel's
 * --subnet-lease-renew-margin), and after a failed renewal tries again a minute later (as
 * flannel) or sooner when the lease would lapse first. A reservation never lapses, so it is never
 * renewed. Time is injected (`now`, `sleep`) so the schedule is testable without waiting.
 */
import { isWeftError } from '../../common/errors.js';
import { sleep as realSleep } from '../../common/lifecycle.js';
import type { Logger } from '../../common/log.js';
import type { SubnetManager } from './manager.js';
import type { Lease } from './types.js';

export const RENEW_RETRY_MS = 60_000;

export interface RenewerOptions {
  readonly manager: Pick<SubnetManager, 'renewLease'>;
  readonly lease: Lease;
  readonly marginMs: number;
  readonly signal: AbortSignal;
  readonly log: Logger;
  readonly onRenewed?: (lease: Lease) => void;
  readonly now?: () => number;
  readonly sleep?: (ms: number, signal: AbortSignal) => Promise<void>;
}

/** Runs until `signal` fires (resolves) or the lease is revoked (rejects WEFT_ERR_LEASE_REVOKED). */
export async function runRenewer(o: RenewerOptions): Promise<void> {
  const now = o.now ?? Date.now;
  const sleep = o.sleep ?? realSleep;
  let lease = o.lease;
  let retryAt: number | null = null;
  try {
    while (!o.signal.aborted) {
      if (lease.expiration === null) {
        await sleep(2 ** 31 - 1, o.signal); // a reservation: nothing to renew, ever
        continue;
      }
      // (an expiration nobody looked up is renewed at once, which tells it)
      const lapses = lease.expiration?.getTime() ?? now() + o.marginMs;
      const due = retryAt ?? lapses - o.marginMs;
      await sleep(Math.max(0, due - now()), o.signal);
      try {
        lease = await o.manager.renewLease(lease, o.signal);
        retryAt = null;
        o.log.info(
          { key: lease.key, expiration: lease.expiration?.toISOString() },
          'lease renewed',
        );
        o.onRenewed?.(lease);
      } catch (err) {
        if (isWeftError(err, 'WEFT_ERR_LEASE_REVOKED') || o.signal.aborted) throw err;
        retryAt = Math.min(now() + RENEW_RETRY_MS, Math.max(now(), lapses - 1000));
        o.log.warn(
          { key: lease.key, err: (err as Error).message },
          'lease renewal failed; will retry',
        );
      }
    }
  } catch (err) {
    if (isWeftError(err, 'WEFT_ERR_ABORTED') && o.signal.aborted) return;
    throw err;
  }
}
