/**
 * The node agent (flanneld's job), as one sequence:
 *
 *   store → network config → external interface → backend.prepare → acquire lease
 *   → subnet.env → backend.start → ready; then, concurrently until stopped:
 *   renew the lease · watch our own lease (revoked → stop) · feed peer leases to the backend
 *
 * Where the store gives our lease before it is published (kube: the node's podCIDR,
 * SubnetManager.leaseBeforePublish), the backend starts on it and the peers are fed while their
 * first list is still read (issue #28: 5,000 real Nodes take ~0.8 s to read, their routes ~0.6 s
 * to program; now the two overlap); our lease is published, and subnet.env written, once that
 * list is checked. The VtepMAC the backend chose is checked against the list there instead of
 * before (a peer holding it makes us choose another, as at any start): none a peer holds is
 * ever published.
 *
 * Stopping (signal): every loop is cancelled through one AbortSignal; the backend is closed,
 * the lease stays in the store (as flannel) unless releaseLeaseOnExit, the store is closed.
 */
import { WeftError, errorMessage, isWeftError } from '../common/errors.js';
import { sleep } from '../common/lifecycle.js';
import { loadNative } from '../common/native.js';
import { LogOnce, logger } from '../common/log.js';
import type {
  Backend,
  BackendOptions,
  ExternalInterface,
  PreparedBackend,
} from './backend/backend.js';
import { unsupportedBackendOptions } from './backend/options.js';
import type { EarlyDataplane } from './backend/fast-start.js';
import { checkedPeerEvents, peerCheckConfig } from './backend/peer-check.js';
import { SNAPSHOT_CHUNK } from './backend/reconcile.js';
import { logPeerEvents } from './peer-log.js';
import { MemoryTrimmer, type MemoryTrimmerOptions, noteLeaseChanges } from './memory-trim.js';
import { backendFactory } from './backend/registry.js';
import { leaseVtepMACs } from './backend/vtep-mac.js';
import type { NetConfig } from './config/net-config.js';
import { startHealthServer, type HealthServer } from './http.js';
import type { AcquireOptions, SubnetManager } from './lease/manager.js';
import { runRenewer } from './lease/renewer.js';
import type { Lease, LeaseAttrs } from './lease/types.js';
import { createDaemonMetrics, type DaemonMetrics, type LeaseMetrics } from './metrics/metrics.js';
import { readSubnetEnv, writeSubnetEnv } from './subnet-env.js';

export interface DaemonConfig {
  readonly subnetFile: string;
  readonly renewMarginMs: number;
  readonly healthzIp: string;
  /** 0 disables the HTTP endpoint. */
  readonly healthzPort: number;
  readonly releaseLeaseOnExit: boolean;
  readonly ipMasq: boolean;
  /** Passed to backends as BackendContext.options (engine choice, workers, kill switches, ...). */
  readonly backendOptions: BackendOptions;
  /** The VtepMACs the store still publishes for this node from an earlier run (kube). */
  readonly storedVtepMACs?: () => { v4: string | null; v6: string | null };
  readonly openManager: (metrics: LeaseMetrics) => Promise<SubnetManager>;
  readonly selectInterface: (cfg: NetConfig) => Promise<ExternalInterface>;
  /**
   * Extra tasks started once the lease is held (iptables masquerading, ...). Each runs until the
   * signal fires; a rejection stops the daemon.
   */
  readonly tasks?: ReadonlyArray<(ctx: DaemonTaskContext) => Promise<void>>;
  /**
   * The last run's userspace dataplane, started on its persistent TUN before the store client
   * loads (backend/fast-start.ts); the daemon hands it to the backend or stops it.
   */
  readonly early?: EarlyDataplane | null;
  /**
   * Returning freed malloc memory to the kernel once a large lease change has settled
   * (memory-trim.ts): `trim` is the addon's mallocTrim by default; the thresholds are
   * MemoryTrimmer's.
   */
  readonly memoryTrim?: Pick<MemoryTrimmerOptions, 'trim' | 'quietMs' | 'minChanges'>;
  /** Called once the daemon is ready (tests, sd_notify). */
  readonly onReady?: (info: { lease: Lease; healthPort: number | null }) => void;
}

export interface DaemonTaskContext {
  readonly lease: Lease;
  readonly netConfig: NetConfig;
  readonly extIface: ExternalInterface;
  readonly metrics: DaemonMetrics;
  readonly signal: AbortSignal;
}

const log = logger('daemon');

/** How long the daemon waits for a network config to appear in the store between tries. */
const CONFIG_RETRY_MS = 1000;

async function waitForConfig(sm: SubnetManager, signal: AbortSignal): Promise<NetConfig> {
  const once = new LogOnce();
  for (;;) {
    try {
      return await sm.getNetworkConfig(signal);
    } catch (err) {
      // A missing config may still be written; anything else (a broken config) is final.
      if (
        !isWeftError(err, 'WEFT_ERR_CONFIG_NOT_FOUND') &&
        !isWeftError(err, 'WEFT_ERR_STORE_UNAVAILABLE')
      ) {
        throw err;
      }
      if (once.first(errorMessage(err)))
        log.warn({ err: errorMessage(err) }, 'waiting for the network config');
      await sleep(CONFIG_RETRY_MS, signal);
    }
  }
}

/**
 * Runs the daemon until `signal` fires (resolves) or something fatal happens (rejects with a
 * WeftError: a bad config, a revoked lease, a backend failure).
 */
export async function runDaemon(cfg: DaemonConfig, signal: AbortSignal): Promise<void> {
  const metrics = createDaemonMetrics();
  let ready = false;
  let health: HealthServer | null = null;
  let manager: SubnetManager | null = null;
  let backend: Backend | null = null;
  let lease: Lease | null = null;
  let early: EarlyDataplane | null = null;
  // The store took our lease away: what would go on serving its subnet is removed at shutdown.
  let revoked = false;
  // Internal stop: the outer signal or the first fatal error in any loop.
  const stop = new AbortController();
  const trimmer = new MemoryTrimmer({
    trim: nativeMallocTrim,
    ...cfg.memoryTrim,
    onTrim: (before, after, released) =>
      log.debug(
        {
          rssMiB: +(after / 2 ** 20).toFixed(1),
          releasedMiB: +((before - after) / 2 ** 20).toFixed(1),
          released,
        },
        'returned freed memory to the kernel after lease changes',
      ),
  });
  const onOuterAbort = () => stop.abort(signal.reason);
  signal.addEventListener('abort', onOuterAbort, { once: true });
  if (signal.aborted) stop.abort(signal.reason);

  try {
    if (cfg.healthzPort !== 0) {
      health = await startHealthServer({
        host: cfg.healthzIp,
        port: cfg.healthzPort,
        metrics: metrics.registry,
        isReady: () => ready && (backend?.isReady?.() ?? true),
      });
      log.info({ address: cfg.healthzIp, port: health.port }, 'serving /healthz /readyz /metrics');
    }
    manager = await cfg.openManager(metrics.lease);
    const deferred = manager.leaseBeforePublish === true;
    /**
     * Whether the VtepMACs in use are asked of the store: not before the peers' first list is
     * checked when our lease is published after it (the check there does that job).
     */
    let askInUse = !deferred;
    /** The backend has a VtepMAC to check (it asked which are in use). */
    let checksVtepMAC = false;
    const netConfig = await waitForConfig(manager, stop.signal);
    log.info({ backend: netConfig.backend.type, store: manager.kind }, 'network config loaded');
    for (const option of unsupportedBackendOptions(netConfig.backend)) {
      log.warn(
        { code: 'WEFT_ERR_BACKEND_UNSUPPORTED', field: `Backend.${option}` },
        `ignoring Backend.${option}: the ${netConfig.backend.type} backend does not support it`,
      );
    }
    // an early dataplane under another Backend block goes now, before any backend starts
    early = (await cfg.early?.forBackend(netConfig.backend.raw)) ?? null;
    const extIface = await cfg.selectInterface(netConfig);
    log.info(
      { iface: extIface.name, publicIP: extIface.publicIP, publicIPv6: extIface.publicIPv6 },
      'using interface',
    );

    const sm0 = manager;
    const makeBackend = (): Backend =>
      backendFactory(netConfig.backend.type)({
        netConfig,
        extIface,
        log: logger(`backend-${netConfig.backend.type}`),
        metrics: metrics.registry,
        options: cfg.backendOptions,
        vtepMACs: {
          stored: (family) => {
            const macs = cfg.storedVtepMACs?.();
            return (family === 4 ? macs?.v4 : macs?.v6) ?? null;
          },
          inUse: async () => {
            checksVtepMAC = true;
            if (!askInUse) return new Set<string>();
            const others = await sm0.otherLeases(
              { publicIP: extIface.publicIP ?? '0.0.0.0', publicIPv6: extIface.publicIPv6 },
              stop.signal,
            );
            return new Set(others.flatMap(leaseVtepMACs));
          },
        },
        early,
        signal: stop.signal,
      });
    backend = makeBackend();
    let prepared = await backend.prepare();
    await early?.release();
    const attrsOf = (p: PreparedBackend): LeaseAttrs => ({
      publicIP: (netConfig.enableIPv4 && extIface.publicIP) || '0.0.0.0',
      publicIPv6: netConfig.enableIPv6 ? extIface.publicIPv6 : null,
      ...p.attrs,
    });
    let attrs = attrsOf(prepared);
    const previous = await readSubnetEnv(cfg.subnetFile).catch((err: unknown) => {
      log.warn({ err: errorMessage(err) }, 'ignoring unreadable subnet.env');
      return null;
    });
    const sm = manager;
    /** Publishes our lease (attrs as they are now) and writes subnet.env for it. */
    const publish = async (prev: AcquireOptions['previous']): Promise<Lease> => {
      const acquired = metrics.lease.acquireDuration.startTimer();
      const l = await sm.acquireLease(attrs, { previous: prev, signal: stop.signal });
      acquired();
      metrics.lease.expiration.set(l.expiration ? l.expiration.getTime() / 1000 : 0);
      await writeSubnetEnv(cfg.subnetFile, {
        network: netConfig.ipv4?.network ?? null,
        subnet: l.subnet,
        ipv6Network: netConfig.ipv6?.network ?? null,
        ipv6Subnet: l.ipv6Subnet,
        mtu: prepared.mtu,
        ipMasq: cfg.ipMasq,
      });
      return l;
    };
    const prev = previous
      ? { subnet: previous.subnet, ipv6Subnet: previous.ipv6Subnet }
      : undefined;
    lease = deferred
      ? await sm.acquireLease(attrs, {
          previous: prev,
          signal: stop.signal,
          publish: false,
          latestPeers: checksVtepMAC,
        })
      : await publish(prev);
    await backend.start(lease);
    /** Called once a round's startup snapshot is checked with no peer holding our VtepMAC. */
    let snapshotChecked: () => void = () => undefined;
    const checked = new Promise<void>((resolve) => (snapshotChecked = resolve));
    /**
     * Feeds checked peer leases to the backend. When a peer that was there before us publishes
     * our VtepMAC, we are the newcomer: the backend is rebuilt (it chooses a MAC no other lease
     * holds), our lease re-published with it, and the peers fed again.
     */
    const runBackend = async (first: Lease): Promise<void> => {
      let current = first;
      for (;;) {
        const be = backend!;
        const round = new AbortController();
        const end = () => round.abort(stop.signal.reason);
        stop.signal.addEventListener('abort', end, { once: true });
        let taken: Lease | null = null;
        const events = checkedPeerEvents(
          sm.watchLeases(current, round.signal),
          peerCheckConfig(netConfig, current),
          {
            log,
            metrics: metrics.registry,
            onOwnVtepMACTaken: (peer) => {
              taken ??= peer;
              round.abort(new WeftError('WEFT_ERR_ABORTED', 'choosing a new VtepMAC'));
            },
            onSnapshotChecked: () => {
              if (taken) return;
              askInUse = true;
              snapshotChecked();
            },
          },
          // the startup snapshot in parts to a backend that programs each as it comes, a
          // part the size of runPlanned's chunk (one kernel batch of the start)
          be.snapshotParts ? { part: SNAPSHOT_CHUNK } : {},
        );
        try {
          await be.run(noteLeaseChanges(logPeerEvents(events, log), trimmer), round.signal);
        } catch (err) {
          if (!(taken && isWeftError(err, 'WEFT_ERR_ABORTED'))) throw err;
        } finally {
          stop.signal.removeEventListener('abort', end);
        }
        if (stop.signal.aborted || !taken) return;
        const peer: Lease = taken;
        log.warn(
          { peer: peer.key, vtepMACs: leaseVtepMACs(peer) },
          'an older peer lease holds our VtepMAC; choosing a new one',
        );
        await be.close();
        askInUse = true; // (the new MAC must be one no peer holds)
        backend = makeBackend();
        prepared = await backend.prepare();
        attrs = attrsOf(prepared);
        const reacquired = metrics.lease.acquireDuration.startTimer();
        const again = await sm.acquireLease(attrs, {
          previous: { subnet: current.subnet, ipv6Subnet: current.ipv6Subnet },
          signal: stop.signal,
        });
        reacquired();
        if (again.key !== current.key) {
          throw new WeftError(
            'WEFT_ERR_LEASE_REVOKED',
            `re-publishing our lease with a new VtepMAC moved it from ${current.key} to ${again.key}`,
            { details: { key: current.key } },
          );
        }
        current = again;
        await backend.start(current);
        log.info({ key: current.key, vtepMACs: leaseVtepMACs(current) }, 'lease re-published');
      }
    };
    const backendLoop = runBackend(lease);
    if (deferred) {
      backendLoop.catch(() => undefined); // (its failure is seen below, and in the loops)
      const ended = await Promise.race([checked.then(() => false), backendLoop.then(() => true)]);
      if (ended) {
        if (signal.aborted) return;
        throw new WeftError(
          'WEFT_ERR_STORE_UNAVAILABLE',
          'the peer lease watch ended before its first list was read',
        );
      }
      lease = await publish({ subnet: lease.subnet, ipv6Subnet: lease.ipv6Subnet });
    }
    const own = lease;
    const loops: Array<Promise<void>> = [
      runRenewer({
        // renewals write the attributes we publish now (a new VtepMAC included)
        manager: {
          renewLease: (l, sig) => {
            const renewed = metrics.lease.renewDuration.startTimer();
            return sm.renewLease({ ...l, attrs }, sig).finally(() => renewed());
          },
        },
        lease: own,
        marginMs: cfg.renewMarginMs,
        signal: stop.signal,
        log,
        onRenewed: (l) =>
          metrics.lease.expiration.set(l.expiration ? l.expiration.getTime() / 1000 : 0),
      }),
      (async () => {
        for await (const _l of sm.watchOwnLease(own, stop.signal)) {
          /* renewals (ours or another's write) need nothing; a delete throws REVOKED */
        }
      })(),
      backendLoop,
      ...(cfg.tasks ?? []).map((task) =>
        task({ lease: own, netConfig, extIface, metrics, signal: stop.signal }),
      ),
    ];
    ready = true;
    metrics.ready.set(1);
    log.info({ key: own.key, subnetFile: cfg.subnetFile }, 'ready');
    cfg.onReady?.({ lease: own, healthPort: health?.port ?? null });

    // The first loop to fail stops the others; a clean stop ends them all.
    const fatal = await firstFailure(loops, stop);
    if (fatal !== undefined) throw fatal;
  } catch (err) {
    if (isWeftError(err, 'WEFT_ERR_ABORTED') && signal.aborted) return;
    revoked = isWeftError(err, 'WEFT_ERR_LEASE_REVOKED');
    throw err;
  } finally {
    ready = false;
    trimmer.close();
    stop.abort(new WeftError('WEFT_ERR_ABORTED', 'daemon stopping'));
    signal.removeEventListener('abort', onOuterAbort);
    // unclaimed (or never looked at: a stop before the config came), the early engine stops
    await cfg.early?.release();
    await shutdown({ backend, manager, lease, health, release: cfg.releaseLeaseOnExit, revoked });
  }
}

const trimOnce = new LogOnce();

/** glibc's malloc_trim through the addon; false (said once) when the addon does not load. */
function nativeMallocTrim(): boolean {
  try {
    return loadNative().mallocTrim();
  } catch (err) {
    if (trimOnce.first('no-addon'))
      log.info(
        { err: errorMessage(err) },
        'freed memory is not trimmed: the native addon is unavailable',
      );
    return false;
  }
}

/** Waits until every loop settles; aborts `stop` on the first rejection and returns it. */
async function firstFailure(loops: Array<Promise<void>>, stop: AbortController): Promise<unknown> {
  let fatal: unknown;
  await Promise.all(
    loops.map((p) =>
      p.then(
        () => {
          // A loop that ends on its own without a stop is a failure too (the watch closed).
          if (!stop.signal.aborted) {
            fatal ??= new WeftError(
              'WEFT_ERR_STORE_UNAVAILABLE',
              'a control loop ended unexpectedly',
            );
            stop.abort(fatal);
          }
        },
        (err: unknown) => {
          if (!(isWeftError(err, 'WEFT_ERR_ABORTED') && stop.signal.aborted)) {
            fatal ??= err;
            stop.abort(err);
          }
        },
      ),
    ),
  );
  return fatal;
}

async function shutdown(s: {
  backend: Backend | null;
  manager: SubnetManager | null;
  lease: Lease | null;
  health: HealthServer | null;
  release: boolean;
  revoked: boolean;
}): Promise<void> {
  const step = async (what: string, fn: () => Promise<void>) => {
    try {
      await fn();
    } catch (err) {
      log.warn({ err: errorMessage(err) }, `shutdown: ${what} failed`);
    }
  };
  const release = s.release || s.revoked;
  if (s.backend) await step('backend close', () => s.backend!.close({ release }));
  if (s.release && s.manager && s.lease) {
    await step('lease release', () => s.manager!.releaseLease(s.lease!, AbortSignal.timeout(1500)));
    log.info({ key: s.lease.key }, 'lease released');
  }
  if (s.manager) await step('store close', () => s.manager!.close());
  if (s.health) await step('http close', () => s.health!.close());
  log.info('stopped');
}
