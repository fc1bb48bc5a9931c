/**
 * --ip-blackhole-route (flanneld's flag): a blackhole route for the node's own subnet (and IPv6
 * subnet), so traffic to a pod address that no local pod holds is dropped here instead of
 * following the default route out (flannel adds it for setups without the bridge plugin, e.g.
 * Canal). The more specific routes of local pods win over it. Re-applied every
 * --iptables-resync seconds, as flannel does; left in place on exit, as flannel does.
 */
import { errorMessage } from '../common/errors.js';
import { formatCIDR } from '../common/ip.js';
import { sleep } from '../common/lifecycle.js';
import { LogOnce, type Logger, logger } from '../common/log.js';
import type { NetConfig } from './config/net-config.js';
import type { Lease } from './lease/types.js';
import type { Netlink, Op } from './netlink/netlink.js';
import { openNetlink } from './netlink/open-netlink.js';

/** The blackhole routes for our subnets (pure). */
export function blackholeOps(cfg: NetConfig, lease: Lease): Op[] {
  const ops: Op[] = [];
  if (cfg.enableIPv4 && lease.subnet)
    ops.push({ op: 'replaceRoute', type: 'blackhole', dst: formatCIDR(lease.subnet) });
  if (cfg.enableIPv6 && lease.ipv6Subnet)
    ops.push({ op: 'replaceRoute', type: 'blackhole', dst: formatCIDR(lease.ipv6Subnet) });
  return ops;
}

/** The daemon task: keeps the blackhole routes until the daemon stops. */
export function blackholeRouteTask(o: {
  readonly resyncSec: number;
  readonly openNetlink?: () => Netlink;
  readonly log?: Logger;
}) {
  return async (ctx: { lease: Lease; netConfig: NetConfig; signal: AbortSignal }) => {
    const log = o.log ?? logger('blackhole');
    const once = new LogOnce();
    const ops = blackholeOps(ctx.netConfig, ctx.lease);
    const nl = (o.openNetlink ?? openNetlink)();
    try {
      while (!ctx.signal.aborted) {
        const results = await nl.apply(ops);
        results.forEach((err, i) => {
          if (err && once.first(err.message)) {
            log.warn({ err: errorMessage(err) }, 'blackhole route failed, retrying');
          } else if (!err && once.first(`ok ${i}`)) {
            log.info({ dst: (ops[i] as { dst: string }).dst }, 'blackhole route in place');
          }
        });
        await sleep(o.resyncSec * 1000, ctx.signal).catch(() => undefined);
      }
    } finally {
      nl.close();
    }
  };
}
