/**
 * The one resync loop both rule modes share (iptables, nftables): put the rules in place now,
 * then re-check them every --iptables-resync seconds and repair what differs.
 */
import { errorMessage } from '../../common/errors.js';
import { sleep } from '../../common/lifecycle.js';
import { LogOnce, type Logger } from '../../common/log.js';
import { isResourceShortage } from './command.js';

export interface RuleKeeper {
  /** Checks the rules and re-applies what differs; resolves to how many tables were re-applied. */
  ensure(): Promise<number>;
}

/**
 * Ensures now, then every `resyncSec` until `signal` (failures logged once per message). A first
 * failure is fatal, unless the tool could not even be started for want of resources (EMFILE,
 * ENFILE, EAGAIN, ENOMEM): that one is logged and retried on the next resync.
 */
export async function keepRules(
  keeper: RuleKeeper,
  o: { readonly resyncSec: number; readonly signal: AbortSignal; readonly log: Logger },
): Promise<void> {
  const once = new LogOnce();
  try {
    await keeper.ensure();
  } catch (err) {
    if (!isResourceShortage(err)) throw err;
    once.first(errorMessage(err));
    o.log.warn({ err: errorMessage(err) }, 'rules not applied yet, retrying');
  }
  o.log.debug({ everySec: o.resyncSec }, 'rule resync started');
  try {
    while (!o.signal.aborted) {
      await sleep(o.resyncSec * 1000, o.signal).catch(() => undefined);
      if (o.signal.aborted) break;
      try {
        await keeper.ensure();
      } catch (err) {
        if (once.first(errorMessage(err)))
          o.log.warn({ err: errorMessage(err) }, 'rule resync failed');
      }
    }
  } finally {
    o.log.debug('rule resync stopped');
  }
}
