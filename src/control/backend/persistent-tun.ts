/**
 * The userspace backends' TUN outlives the daemon (issue 17 §1): the native engine makes it
 * persistent (TUNSETPERSIST), so a daemon killed with SIGKILL leaves the device with its address
 * and the cluster route — pods see packet loss (the kernel drops what it routes into a detached
 * TUN), never "net unreachable" — and the next daemon attaches to it again.
 *
 *   inspectTun(nl, name, engine) → before the engine starts: adopt the device left behind when
 *                                  the engine can attach to it (a multi-queue TUN, no queue
 *                                  held); delete a persistent one it cannot use (the js engine's
 *                                  single queue, a TAP); refuse one another process holds
 *   staleTunOps(nl, tun, ops)    → after start() applied its address and route: the addresses
 *                                  and routes an adopted device still carries from an earlier
 *                                  lease or network config, to delete
 *
 * A clean stop keeps the device too (the lease stays ours, as flannel keeps flannel.1 and its
 * routes); releasing or losing the lease removes it (userspace.ts close()).
 */
import { WeftError } from '../../common/errors.js';
import type { Logger } from '../../common/log.js';
import type { DataplaneEngine } from '../../dataplane/index.js';
import { type LinkInfo, type Netlink, type Op, applyAll } from '../netlink/netlink.js';

/** What the engine about to start finds: a device to attach to again, or none. */
export type TunFound = 'adopt' | 'create';

/** Whether `engine` can attach to the persistent TUN `link` as it is (same type and queues). */
export function canAdoptTun(link: LinkInfo, engine: DataplaneEngine): boolean {
  const t = link.tun;
  // The first queue attached sets pi and vnet_hdr again; type and multi-queue are fixed.
  return engine !== 'js' && link.kind === 'tun' && !!t && t.type === 'tun' && t.multiQueue;
}

export async function inspectTun(
  nl: Netlink,
  name: string,
  engine: DataplaneEngine,
  log: Logger,
): Promise<TunFound> {
  const link = await nl.getLink(name);
  // Absent, or another kind of device: the engine creates the TUN (or says why it cannot).
  if (!link || link.kind !== 'tun' || !link.tun) return 'create';
  const t = link.tun;
  // A device that is not persistent exists only while a process holds it.
  if (t.queues > 0 || !t.persist) {
    throw new WeftError(
      'WEFT_ERR_DATAPLANE',
      `tun ${name} is in use by another process` +
        (t.multiQueue ? ` (${t.queues} queue(s) attached)` : ' (not persistent: someone holds it)'),
      { details: { tun: name, queues: t.queues, persist: t.persist } },
    );
  }
  if (canAdoptTun(link, engine)) {
    log.info({ tun: name, index: link.index }, 'adopting the persistent tun left by the last run');
    return 'adopt';
  }
  log.warn(
    { tun: name, index: link.index, engine, type: t.type, multiQueue: t.multiQueue },
    'recreating a persistent tun this engine cannot attach to',
  );
  await applyAll(nl, [{ op: 'delLink', dev: name }]);
  return 'create';
}

/** IPv6 link-local addresses and routes are the kernel's own. */
const isLinkLocal = (cidr: string) => /^fe80:/i.test(cidr);

/**
 * The addresses and routes on `tun` that `ops` (what start applied: replaceAddr, replaceRoute)
 * do not name, as delete ops: what an adopted device kept from an earlier lease or config.
 */
export async function staleTunOps(nl: Netlink, tun: string, ops: readonly Op[]): Promise<Op[]> {
  const addrs = new Set(ops.flatMap((o) => (o.op === 'replaceAddr' ? [o.addr] : [])));
  const routes = new Set(ops.flatMap((o) => (o.op === 'replaceRoute' ? [o.dst] : [])));
  const stale: Op[] = [];
  for (const family of [4, 6] as const) {
    for (const a of await nl.listAddrs(family, tun)) {
      if (!addrs.has(a.addr) && !isLinkLocal(a.addr))
        stale.push({ op: 'delAddr', addr: a.addr, dev: tun });
    }
    for (const r of await nl.listRoutes({ family, dev: tun })) {
      if (!routes.has(r.dst) && !isLinkLocal(r.dst))
        stale.push({ op: 'delRoute', dst: r.dst, dev: tun });
    }
  }
  return stale;
}
