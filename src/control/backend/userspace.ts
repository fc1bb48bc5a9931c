/**
 * What the two userspace backends (udp, vxlan-userspace) share: a Dataplane whose TUN carries the
 * subnet's network address and a route for the whole cluster network, and a peer table planned
 * from the lease events (peer-plan.ts: only the leases an event names are parsed) and handed
 * over once per flush window: the first snapshot (and a new engine) as the whole table, after
 * that only what changed (a PeerDelta; the whole table again should the engine refuse one).
 *
 *   prepare  → the dataplane starts (TUN exists, sockets bound, workers in their loops)
 *   start    → TUN MTU, address <subnet network address>/32 (/128), up, route <network> dev TUN
 *   run      → leases → peer records → setPeers, until the signal fires; every resync (10 s, the
 *              kernel backends' Reconciler loop) the TUN's link state, address and route are
 *              re-checked and restored (isReady is false while they cannot be)
 *   close    → the dataplane stops; the native engine's TUN is persistent (persistent-tun.ts):
 *              it stays with its address and route for the next run (a crash, kill -9 or stop
 *              costs pods packet loss until the next daemon attaches, never "net unreachable"),
 *              unless the lease is released or revoked (close({ release: true })): then it goes
 */
import { availableParallelism } from 'node:os';
import { WeftError, errorMessage } from '../../common/errors.js';
import { type Family, formatCIDR } from '../../common/ip.js';
import { jsonField } from '../../common/json-field.js';
import { Racer } from '../../common/lifecycle.js';
import { LogOnce } from '../../common/log.js';
import { loadNative } from '../../common/native.js';
import { offloadsFromEnv } from '../../dataplane/offloads.js';
import type { OffloadName } from '../../dataplane/offloads.js';
import type {
  Dataplane,
  DataplaneEngine,
  DataplaneFormat,
  DataplaneOptions,
} from '../../dataplane/index.js';
import type { PeerEntry } from '../../dataplane/peer-table.js';
import { registerDataplaneMetrics } from '../../dataplane/stats-metrics.js';
import { secondsSince } from '../../common/metrics.js';
import type { Lease, LeaseEvent } from '../lease/types.js';
import { openNetlink } from '../netlink/open-netlink.js';
import { PodBridgeFollower } from '../netlink/pod-bridge.js';
import { type Netlink, type Op, applyAll } from '../netlink/netlink.js';
import { AUTO_PREFERS_BPF } from './backend.js';
import type { Backend, BackendContext, PreparedBackend } from './backend.js';
import { DataplaneRecord } from './fast-start.js';
import { removeBpfPins } from '../../dataplane/bpf-pins.js';
import { inspectTun, staleTunOps } from './persistent-tun.js';
import { type PeerPlanContext, PeerRecords, planPeers } from './peer-plan.js';
import {
  clusterNetwork,
  enabledFamilies,
  kernelMetrics,
  reconcilerMetricHooks,
  leaseSubnet,
  subnetAddress,
} from './kernel-common.js';
import { FLUSH_WINDOW_MS, Reconciler } from './reconcile.js';
import { sendAddress } from './send-address.js';
import { type HostForwardPath, egressTapBlocked, readHostForwardPath } from './host-forward.js';

/**
 * The re-check of the TUN's own state: restores (with `ops`, the ones start applied) when the
 * link is down, an address is gone or the cluster route no longer goes through the TUN. Returns
 * how many pieces were missing.
 */
async function restoreTun(nl: Netlink, tun: string, ops: readonly Op[]): Promise<number> {
  let missing = 0;
  const link = await nl.getLink(tun);
  if (!link?.up) missing++;
  for (const op of ops) {
    if (op.op === 'replaceAddr') {
      const family = op.addr.includes(':') ? 6 : 4;
      if (!(await nl.listAddrs(family, tun)).some((a) => a.addr === op.addr)) missing++;
    } else if (op.op === 'replaceRoute') {
      const family = op.dst.includes(':') ? 6 : 4;
      const routes = await nl.listRoutes({ family, dev: tun });
      if (!routes.some((r) => r.dst === op.dst && r.gw === null)) missing++;
    }
  }
  if (missing > 0) await applyAll(nl, ops);
  return missing;
}

export interface UserspaceSpec {
  readonly type: string;
  readonly format: DataplaneFormat;
  readonly tunName: string;
  readonly port: number;
  /** Bytes the encapsulation adds over an IPv4 underlay (udp 28, vxlan 50, ipip 20). */
  readonly overhead: number;
  /** The same over an IPv6 underlay (vxlan 70); default overhead + 20. */
  readonly overheadV6?: number;
  /** The TUN's MTU when the Backend block sets one (vxlan `MTU` − 50); else from the overheads. */
  readonly mtu?: number;
  /**
   * Each pod family rides the underlay of its own family, as flannel's vxlan does (IPv4 pods to
   * the peer's PublicIP, IPv6 pods to its PublicIPv6; a dual-stack node binds both addresses).
   * Else (udp) every family rides one underlay: IPv4 when the node has an IPv4 address.
   */
  readonly underlayPerFamily?: boolean;
  readonly vni: number;
  /** Our VtepMAC (vxlan); null for udp. */
  readonly vtepMac: Buffer | null;
  readonly attrs: PreparedBackend['attrs'];
  /** The peer record for a lease, or a reason to skip it (logged once per lease). */
  peerFor(lease: Lease, family: Family, publicIP: string): PeerEntry | { skip: string };
}

/**
 * The engine to start: js, native and bpf as asked; auto is native, except where vxlan
 * "Dataplane": "auto" handed over for lack of kernel vxlan (AUTO_PREFERS_BPF): bpf, which itself
 * falls back to native where its programs cannot run.
 */
function engineOption(ctx: BackendContext): DataplaneEngine {
  const e = ctx.options.dataplaneEngine;
  if (e !== 'auto') return e;
  return ctx.options[AUTO_PREFERS_BPF] ? 'bpf' : 'native';
}

/** The native engine needs the addon: without it, say so and name the way out. */
function checkEngine(type: string, engine: DataplaneEngine): void {
  if (engine === 'js') return;
  try {
    loadNative();
  } catch (err) {
    throw new WeftError(
      'WEFT_ERR_NATIVE_UNAVAILABLE',
      `${type}: the native dataplane engine cannot run (${errorMessage(err)}); ` +
        'start with --dataplane-engine=js to use the js engine instead',
      { cause: err },
    );
  }
}

/**
 * --dataplane-offloads when given, else the WEFT_DATAPLANE_OFFLOADS kill switch, else all; minus
 * the egress TAP (tap_gso) where the host would drop its frames (host-forward.ts: strict
 * reverse-path filtering, a FORWARD policy of drop without weft's forward rules), said once.
 */
export function offloadsOption(
  ctx: BackendContext,
  engine: DataplaneEngine,
  host: () => HostForwardPath = readHostForwardPath,
): readonly OffloadName[] {
  const o = ctx.options.dataplaneOffloads;
  const offloads = o !== '' ? offloadsFromEnv(o) : offloadsFromEnv();
  if (engine === 'js' || !offloads.includes('tap_gso')) return offloads;
  const reason = egressTapBlocked(host(), ctx.options.iptablesForwardRules);
  if (reason === null) return offloads;
  ctx.log.info(
    { reason },
    'egress TAP not used: TCP super-packets are split and sent with UDP GSO',
  );
  return offloads.filter((n) => n !== 'tap_gso');
}

/**
 * --dataplane-workers (TUN queues), or 0: one queue per CPU, at most 4 (the kernel spreads
 * flows over the queues, and over the queues' SO_REUSEPORT sockets).
 */
export function workersOption(ctx: BackendContext, cpus = availableParallelism()): number {
  const w = ctx.options.dataplaneWorkers;
  return w >= 1 ? w : Math.max(1, Math.min(cpus, 4));
}

/**
 * The underlay addresses the engine binds and sends from: one (IPv4, else IPv6), or with
 * `perFamily` one per enabled pod family (IPv4 first; bindIp6 when both). Each is the public IP
 * when that is an address of this host (send-address.ts), else the interface's address.
 */
export function underlayBinds(
  ext: BackendContext['extIface'],
  families: readonly Family[],
  perFamily: boolean,
  local?: () => readonly string[],
): { bindIp: string | null; bindIp6?: string } {
  // Each family's send address: --public-ip where it is a local address, else the interface's.
  const v4Addr = sendAddress(ext, 4, local);
  const v6Addr = sendAddress(ext, 6, local);
  if (!perFamily) return { bindIp: v4Addr ?? v6Addr };
  const v4 = families.includes(4) ? v4Addr : null;
  const v6 = families.includes(6) ? v6Addr : null;
  if ((families.includes(4) && !v4) || (families.includes(6) && !v6)) return { bindIp: null };
  return v4 && v6 ? { bindIp: v4, bindIp6: v6 } : { bindIp: v4 ?? v6 };
}

export function createUserspaceBackend(
  ctx: BackendContext,
  spec: UserspaceSpec,
  deps: { openNetlink?: () => Netlink; hostForwardPath?: () => HostForwardPath } = {},
): Backend {
  const log = ctx.log;
  const families = enabledFamilies(ctx.netConfig);
  const ext = ctx.extIface;
  const binds = underlayBinds(ext, families, spec.underlayPerFamily ?? false);
  // An IPv6 underlay in use: its larger outer header sets the TUN MTU (one TUN for both).
  const v6Underlay = binds.bindIp6 !== undefined || (binds.bindIp?.includes(':') ?? false);
  const mtu =
    spec.mtu ?? ext.mtu - (v6Underlay ? (spec.overheadV6 ?? spec.overhead + 20) : spec.overhead);
  const skipped = new LogOnce();
  // Skipped peers are counted as the kernel backends count theirs (once per lease and reason).
  const backendMetrics = kernelMetrics(ctx.metrics);
  const skippedPeers = backendMetrics.skipped;
  let dp: Dataplane | null = null;
  let nl: Netlink | null = null;
  let ownKey: string | null = null;
  /** What start applied: the TUN's link state, address and route (restored by the re-check). */
  let tunOps: Op[] = [];
  // What the last re-check of the TUN found: false while its state is missing and not restored.
  let tunOk = true;
  /** The TUN was left by an earlier run and adopted (start then clears what it kept). */
  let adopted = false;
  let dpOptions: DataplaneOptions | null = null;
  // What the next run starts early with (fast-start.ts): not for the js engine, nor for
  // "Dataplane": "auto" (its next start may take the kernel device of the TUN's name).
  const auto =
    ctx.options[AUTO_PREFERS_BPF] || jsonField(ctx.netConfig.backend.raw, 'Dataplane') === 'auto';
  const record =
    ctx.options.subnetFile && !auto ? new DataplaneRecord(ctx.options.subnetFile, log) : null;

  return {
    type: spec.type,
    isReady: () => tunOk,
    async prepare(): Promise<PreparedBackend> {
      const { bindIp, bindIp6 } = binds;
      if (!bindIp) {
        throw new WeftError(
          'WEFT_ERR_BACKEND',
          `${spec.type}: ${ext.name} has no address to bind` +
            (spec.underlayPerFamily ? ' for every enabled family (each rides its own)' : ''),
        );
      }
      const engine = engineOption(ctx);
      checkEngine(spec.type, engine);
      nl = (deps.openNetlink ?? openNetlink)();
      const options: DataplaneOptions = {
        format: spec.format,
        engine,
        tunName: spec.tunName,
        underlay: ext.name,
        workers: workersOption(ctx),
        offloads: offloadsOption(ctx, engine, deps.hostForwardPath),
        busyPollUs: ctx.options.dataplaneBusyPoll,
        queueThreads: ctx.options.dataplaneQueueThreads,
        cpuAffine: ctx.options.dataplaneCpuAffine,
        schedFifo: ctx.options.dataplaneSchedFifo,
        persist: true,
        bindIp,
        ...(bindIp6 ? { bindIp6 } : {}),
        port: spec.port,
        tunMtu: mtu,
        vni: spec.vni,
        vtepMac: spec.vtepMac ?? Buffer.alloc(6),
        log,
      };
      // The last run's engine, started early on the TUN it left (fast-start.ts), when the
      // options are the same; else it stops here, before the TUN is inspected.
      const early = (await ctx.early?.claim(options)) ?? null;
      if (early) {
        dp = early;
        adopted = true;
      } else {
        adopted = (await inspectTun(nl, spec.tunName, engine, log)) === 'adopt';
        // the engine (worker pool, codecs) loads only when a userspace backend starts, so the
        // kernel backends' daemons never pay for it
        const { startDataplane } = await import('../../dataplane/index.js');
        dp = await startDataplane(options);
      }
      dpOptions = options;
      const running = dp;
      registerDataplaneMetrics(ctx.metrics, () => running.stats());
      log.info(
        {
          tun: dp.tunName,
          bind: `${bindIp}:${spec.port}`,
          ...(bindIp6 ? { bind6: `[${bindIp6}]:${spec.port}` } : {}),
          engine: dp.engine,
          mtu,
        },
        'userspace dataplane started',
      );
      return { attrs: spec.attrs, mtu };
    },
    async start(lease: Lease) {
      if (!dp || !nl) throw new Error(`${spec.type}: start before prepare`);
      ownKey = lease.key;
      const ops: Op[] = [{ op: 'setLink', dev: dp.tunName, mtu, up: true }];
      for (const family of families) {
        const subnet = leaseSubnet(lease, family);
        const network = clusterNetwork(ctx.netConfig, family);
        if (!subnet || !network) continue;
        ops.push(
          {
            op: 'replaceAddr',
            addr: `${subnetAddress(subnet)}/${family === 4 ? 32 : 128}`,
            dev: dp.tunName,
          },
          { op: 'replaceRoute', dst: formatCIDR(network), dev: dp.tunName },
        );
      }
      await applyAll(nl, ops);
      if (adopted) {
        const stale = await staleTunOps(nl, dp.tunName, ops);
        if (stale.length > 0) {
          log.info({ tun: dp.tunName, stale }, 'removing what the adopted tun kept from before');
          await applyAll(nl, stale);
        }
      }
      tunOps = ops;
      log.info({ tun: dp.tunName, adopted }, 'tun device up');
      if (dpOptions && dpOptions.engine !== 'js')
        record?.start(ctx.netConfig.backend.raw, dpOptions);
    },
    async run(events: AsyncIterable<LeaseEvent[]>, signal: AbortSignal) {
      if (!dp || !nl) throw new Error(`${spec.type}: run before prepare`);
      let running = dp;
      const netlink = nl;
      // Records per lease, encoded when the lease changes; once per flush window (events already
      // received are coalesced) the dataplane takes what changed, or the whole table when `whole`.
      const records = new PeerRecords();
      let whole = true;
      // A dataplane that dies is fatal: the daemon exits 1 and its supervisor restarts it. The
      // engine in use is watched (the re-check may start a new one on a new TUN).
      let fail: (err: unknown) => void = () => undefined;
      const died = new Promise<never>((_, reject) => (fail = reject));
      died.catch(() => undefined);
      const watch = (d: Dataplane) =>
        void d.failed.then((err) => {
          if (d === running) fail(err);
        });
      watch(running);
      // The pods' bridge, followed through netlink for an engine with a bridge bypass (bpf).
      const podBridge = new PodBridgeFollower(netlink, ctx.options.podBridge, log);
      podBridge.feed(running);
      const handOverTable = () => {
        try {
          running.setPeerTable(records.takeTable());
          whole = false;
          log.debug({ peers: records.size }, 'peer table replaced');
        } catch (err) {
          // the engine keeps its old table: the next flush hands over the whole table again
          whole = true;
          log.error({ err: errorMessage(err) }, 'peer table refused');
        }
      };
      // The TUN deleted by hand: its queues point at nothing, so the engine starts again on a
      // new TUN of the same name (same options, the current peer table); restoreTun then puts
      // back its link state, address and route.
      const restartOnNewTun = async (): Promise<void> => {
        log.warn({ tun: running.tunName }, 'tun device gone; starting the dataplane on a new one');
        const old = running;
        await old.close();
        const { startDataplane } = await import('../../dataplane/index.js');
        running = await startDataplane(dpOptions!);
        dp = running;
        const current = running;
        registerDataplaneMetrics(ctx.metrics, () => current.stats());
        watch(current);
        podBridge.feed(current);
        handOverTable();
      };
      // The TUN's state is re-checked by the kernel backends' resync loop (no peers of its own).
      const recheck = new AbortController();
      const reconciler = new Reconciler({
        netlink: netlink,
        log,
        ownership: [],
        watchDevs: [running.tunName],
        ...reconcilerMetricHooks(backendMetrics),
        ensureBase: async () => {
          let missing = 0;
          try {
            if (dpOptions && !(await netlink.getLink(running.tunName))) {
              await restartOnNewTun();
              missing++;
            }
            missing += await restoreTun(netlink, running.tunName, tunOps);
          } catch (err) {
            if (tunOk)
              log.error(
                { tun: running.tunName, err: errorMessage(err) },
                'tun state cannot be restored; not ready',
              );
            tunOk = false;
            throw err;
          }
          if (missing > 0)
            log.warn({ tun: running.tunName, missing }, 'tun address/route restored');
          else if (!tunOk) log.info({ tun: running.tunName }, 'tun state whole again; ready');
          tunOk = true;
          return missing;
        },
      });
      const rechecking = reconciler.run(recheck.signal);
      const planCtx: PeerPlanContext = {
        families,
        underlay: ext.ifaceAddr ? 4 : 6,
        perFamily: spec.underlayPerFamily ?? false,
        ownKey,
        peerFor: (lease, family, pub) => spec.peerFor(lease, family, pub),
      };
      let scheduled: NodeJS.Timeout | null = null;
      let first = true;
      // When each lease event not yet handed to the engine was received (performance.now()).
      let received: number[] = [];
      const push = () => {
        clearTimeout(scheduled ?? undefined);
        scheduled = null;
        const carried = received;
        received = [];
        try {
          pushTable();
        } finally {
          for (const t of carried)
            backendMetrics.programmed.observe({ target: 'engine' }, secondsSince(t));
        }
      };
      const pushTable = () => {
        if (whole) {
          handOverTable();
        } else {
          const delta = records.takeDelta();
          if (delta.changes === 0) return;
          try {
            running.updatePeerTable(delta);
            log.debug({ peers: records.size, changes: delta.changes }, 'peer table updated');
          } catch (err) {
            log.warn(
              { err: errorMessage(err) },
              'peer table change refused; handing over the whole table',
            );
            handOverTable();
          }
        }
        record?.peers(() => records.table());
      };
      const update = (batch: readonly LeaseEvent[]) => {
        const now = performance.now();
        const changes = planPeers(batch, planCtx);
        for (const c of changes) {
          for (const reason of c.skipped) {
            if (skipped.first(`${c.key}/${reason}`)) {
              skippedPeers.inc();
              log.warn({ lease: c.key, reason }, 'peer lease skipped');
            }
          }
        }
        // The store's first snapshot is handed over even when it changes nothing here (no
        // peers): it replaces whatever table the engine started with (fast-start.ts), at once.
        // After it, one table per flush window, as the kernel backends batch (a churn of small
        // batches would otherwise rebuild the 5,000-peer table on every event-loop turn).
        const wasFirst = first;
        const changed = records.apply(changes) || first;
        first = false;
        if (changed && !scheduled) {
          scheduled = setTimeout(push, wasFirst ? 0 : FLUSH_WINDOW_MS);
        }
        // (events that changed no record need no programming: they are not timed)
        if (changed) for (let i = 0; i < batch.length; i++) received.push(now);
      };
      const iter = events[Symbol.asyncIterator]();
      const aborted = new Promise<null>((resolve) => {
        if (signal.aborted) resolve(null);
        signal.addEventListener('abort', () => resolve(null), { once: true });
      });
      const racer = new Racer<null>([aborted, died]);
      try {
        while (!signal.aborted) {
          const next = await racer.race(iter.next());
          if (next === null || next.done) break;
          update(next.value);
        }
      } catch (err) {
        // The dataplane died: a next() is still pending (no abort will end it), so a return()
        // would wait behind it. The daemon aborts the lease stream as it stops.
        void iter.return?.()?.catch(() => undefined);
        throw err;
      } finally {
        podBridge.close();
        recheck.abort();
        await rechecking;
      }
      await iter.return?.();
      if (scheduled) push();
    },
    async close(how = {}) {
      const d = dp;
      dp = null;
      if (d) await d.close();
      if (d && how.release && nl) {
        // the subnet is no longer ours: the device that would keep serving it goes, with the
        // bpf engine's programs pinned on it
        await record?.remove();
        removeBpfPins(d.tunName, log);
        await applyAll(nl, [{ op: 'delLink', dev: d.tunName }]);
        log.info({ tun: d.tunName }, 'tun removed with the lease');
      } else {
        await record?.flush();
      }
      nl?.close();
      nl = null;
    },
  };
}
