/**
 * The native engine: the addon's packet loops, one piscina thread per TUN queue (or two, one per
 * direction, with queueThreads: 2), each running one task that stays parked in C++ until close()
 * signals the engine's eventfd.
 */
import { MessageChannel } from 'node:worker_threads';
import { Piscina } from 'piscina';
import { WeftError, errorMessage } from '../common/errors.js';
import { logger } from '../common/log.js';
import { loadDataplaneBinding } from './binding.js';
import type { Dataplane, DataplaneOptions } from './engine.js';
import type { Direction, WorkerMessage, WorkerResult, WorkerTask } from './messages.js';
import { OFFLOAD_NAMES, egressTapName, offloadsFromEnv } from './offloads.js';
import type { OffloadName } from './offloads.js';
import { encodePeerTable } from './peer-table.js';
import { encodeWireguardPeers } from './wireguard-peers.js';
import type { WireguardPeer, WireguardState } from './wireguard-peers.js';
import { COUNTERS, DROP_REASONS, decodeCounters } from './stats.js';

/**
 * The pool's task file: worker.js from dist/; from the .ts sources under tsx, a bootstrap that
 * registers tsx in the thread first (see worker-bootstrap.mjs).
 */
function poolWorkerFile(): string {
  const ts = import.meta.url.endsWith('.ts');
  return new URL(ts ? './worker-bootstrap.mjs' : './worker.js', import.meta.url).href;
}

/**
 * A pool thread runs JS only to enter the native loop: ~5 MB of heap from dist/, ~7 MB from the
 * sources under tsx. Bounding its old generation (V8 otherwise sizes it like the main thread's)
 * keeps ~0.7 MB less resident per thread (bench:footprint); 32 MB leaves 4× headroom.
 */
const POOL_THREAD_LIMITS = { maxOldGenerationSizeMb: 32 } as const;

/** Where the engine's queues are: before every one has started, running, or being closed. */
type Phase = 'starting' | 'running' | 'closing';

/**
 * One queue's pool task. `started` resolves with the thread's id once the task is about to enter
 * the native loop; `done` settles when the task leaves it (the rc) or could not enter it.
 */
function runLoop(
  pool: Piscina<WorkerTask, WorkerResult>,
  engineId: number,
  worker: number,
  direction: Direction,
): { started: Promise<number>; done: Promise<WorkerResult> } {
  const { port1, port2 } = new MessageChannel();
  const started = new Promise<number>((resolve) => {
    port1.once('message', (m: WorkerMessage) => resolve(m.threadId));
  });
  const task: WorkerTask = { engineId, worker, direction, port: port2 };
  const done = pool.run(task, { transferList: [port2] });
  // The port is only for 'started'; once the task is over nothing else can come.
  void done.then(
    () => port1.close(),
    () => port1.close(),
  );
  return { started, done };
}

/** How long an exiting process waits for the loops to leave before a native thread ends it. */
export const EXIT_WATCHDOG_MS = 1500;

let exitHookInstalled = false;

/**
 * On process exit (process.exit, an uncaught exception, the SIGTERM deadline) Node joins its
 * worker threads, which never happens while one sits in the native loop: the process would stay
 * alive, dead inside. So every engine is stopped first; and should a loop not leave, a native
 * thread ends the process with the same code after EXIT_WATCHDOG_MS.
 */
function installExitHook(native: ReturnType<typeof loadDataplaneBinding>): void {
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  process.on('exit', (code) => {
    native.exitWatchdog(EXIT_WATCHDOG_MS, code);
    native.engineStopAll();
  });
}

export async function startNativeEngine(opts: DataplaneOptions): Promise<Dataplane> {
  const log = opts.log ?? logger('dataplane');
  const native = loadDataplaneBinding();
  installExitHook(native);
  const want = [...COUNTERS, ...DROP_REASONS.map((r) => `drop_${r}`)].join(',');
  if (
    native.counterNames().join(',') !== want ||
    native.offloadNames().join(',') !== OFFLOAD_NAMES.join(',')
  ) {
    throw new WeftError(
      'WEFT_ERR_NATIVE_UNAVAILABLE',
      'native addon counters or offloads do not match this build of weft (rebuild the addon)',
      {
        details: {
          native: [...native.counterNames(), ...native.offloadNames()],
          expected: [want, OFFLOAD_NAMES.join(',')],
        },
      },
    );
  }
  let created: ReturnType<typeof native.engineCreate>;
  try {
    created = native.engineCreate({
      format: opts.format,
      tunName: opts.tunName,
      workers: opts.workers,
      bindIp: opts.bindIp,
      ...(opts.bindIp6 ? { bindIp6: opts.bindIp6 } : {}),
      port: opts.port,
      tunMtu: opts.tunMtu,
      vni: opts.vni,
      vtepMac: opts.vtepMac,
      offloads: opts.offloads ?? offloadsFromEnv(),
      busyPollUs: opts.busyPollUs ?? 0,
      cpuAffine: opts.cpuAffine ?? false,
      steering: opts.steering ?? true,
      ...(opts.steeringGapUs !== undefined ? { steeringGapUs: opts.steeringGapUs } : {}),
      tapName: egressTapName(opts.tunName),
      // test knob: the egress TAP's probe is refused, so the engine starts on the fallback
      tapProbeFail: process.env.WEFT_TEST_TAP_PROBE_FAIL === '1',
      // test knob: each loop's Nth TAP frame is refused, so the engine switches back at run time
      tapFailAt: Number(process.env.WEFT_TEST_TAP_FAIL_AT ?? 0) || 0,
      fifoPriority: opts.schedFifo ?? 0,
      persist: opts.persist ?? false,
      ...(opts.wireguard
        ? {
            wgPrivateKey: opts.wireguard.privateKey,
            ...(opts.wireguard.psk ? { wgPsk: opts.wireguard.psk } : {}),
            wgGreet: opts.wireguard.greet ?? false,
          }
        : {}),
    });
  } catch (err) {
    throw new WeftError('WEFT_ERR_DATAPLANE', (err as Error).message, {
      cause: err,
      details: { tun: opts.tunName, bind: `${opts.bindIp}:${opts.port}` },
    });
  }
  const id = created.id;
  const directions: readonly Direction[] = opts.queueThreads === 2 ? ['tx', 'rx'] : ['both'];
  const loops = Array.from({ length: opts.workers }, (_, w) =>
    directions.map((d) => ({ worker: w, direction: d })),
  ).flat();
  const pool = new Piscina<WorkerTask, WorkerResult>({
    filename: poolWorkerFile(),
    minThreads: loops.length,
    maxThreads: loops.length,
    concurrentTasksPerWorker: 1,
    idleTimeout: Infinity,
    maxQueue: 0,
    resourceLimits: POOL_THREAD_LIMITS,
    // piscina's run/wait-time histograms (~360 KB each, native) time tasks; weft's only task per
    // thread is its queue loop, which runs for the engine's life, so there is nothing to time.
    recordTiming: false,
  });
  // Only a thread that dies with no task emits this; one with a task rejects the task instead.
  pool.on('error', (err: unknown) => log.error({ err: errorMessage(err) }, 'dataplane pool error'));
  let phase: Phase = 'starting';
  const queues = loops.map((l) => runLoop(pool, id, l.worker, l.direction));
  const settled = Promise.allSettled(queues.map((q) => q.done));
  let fail!: (e: WeftError) => void;
  const failed = new Promise<WeftError>((resolve) => (fail = resolve));
  queues.forEach((q, i) =>
    q.done.then(
      (rc) => {
        // While starting, leaving the loop fails startDataplane instead (below).
        if (phase === 'running' || (phase === 'closing' && rc !== 0)) {
          log.error({ ...loops[i], errno: rc }, 'dataplane worker left its loop');
        }
        if (phase === 'running') {
          fail(
            new WeftError('WEFT_ERR_DATAPLANE', `worker ${loops[i]!.worker} left its loop`, {
              details: { tun: created.tunName, ...loops[i], errno: rc },
            }),
          );
        }
      },
      (err: unknown) => {
        if (phase === 'running') {
          log.error({ ...loops[i], err: errorMessage(err) }, 'dataplane worker failed');
          fail(
            new WeftError(
              'WEFT_ERR_DATAPLANE',
              `worker ${loops[i]!.worker}: ${errorMessage(err)}`,
              {
                cause: err,
                details: { tun: created.tunName, ...loops[i] },
              },
            ),
          );
        }
      },
    ),
  );
  const stopAll = async () => {
    native.engineClose(id);
    await settled;
    await pool.destroy();
  };
  let threadIds: number[];
  try {
    // Every queue says 'started', or the first one to end (or fail) before that is the error.
    const ended = Promise.race(
      queues.map((q, i) =>
        q.done.then(
          (rc) => {
            const w = loops[i]!.worker;
            throw new WeftError('WEFT_ERR_DATAPLANE', `worker ${w} left its loop at start`, {
              details: { tun: created.tunName, ...loops[i], errno: rc },
            });
          },
          (err: unknown) => {
            const w = loops[i]!.worker;
            throw new WeftError('WEFT_ERR_DATAPLANE', `worker ${w}: ${errorMessage(err)}`, {
              cause: err,
              details: { tun: created.tunName, ...loops[i] },
            });
          },
        ),
      ),
    );
    ended.catch(() => undefined);
    threadIds = await Promise.race([Promise.all(queues.map((q) => q.started)), ended]);
    phase = 'running';
  } catch (err) {
    phase = 'closing';
    await stopAll();
    throw err;
  }
  if (created.affinityNote !== '' && (opts.cpuAffine || opts.steering !== false)) {
    // Once per start: what was asked for and why it is not so (the queues still run, slower).
    log.info(
      { tun: created.tunName, steering: created.steering, reason: created.affinityNote },
      opts.cpuAffine ? 'dataplane queues run unpinned' : 'dataplane TUN steering unavailable',
    );
  }
  const wanted = opts.offloads ?? offloadsFromEnv();
  if (created.tapNote !== '' && wanted.includes('tap_gso')) {
    log.info(
      { tun: created.tunName, reason: created.tapNote },
      'egress TAP unavailable: TCP super-packets are split and sent with UDP GSO',
    );
  }
  if (created.fifoNote !== '') {
    log.warn(
      { tun: created.tunName, reason: created.fifoNote },
      'dataplane loops run unprioritised',
    );
  }
  log.debug(
    {
      tun: created.tunName,
      tap: created.tapName,
      workers: opts.workers,
      threadIds,
      offloadsAccepted: created.offloadsAccepted,
      offloadsEnabled: created.offloadsEnabled,
      steering: created.steering,
    },
    'dataplane started',
  );
  const offloads = Object.fromEntries(
    OFFLOAD_NAMES.map((f) => [f, created.offloadsEnabled.includes(f)]),
  ) as Record<OffloadName, boolean>;
  // A runtime EINVAL from the TAP switches the engine back to split + UDP GSO for good (the
  // tap_disabled counter): said once.
  let tapWatch: NodeJS.Timeout | undefined;
  if (created.tapName !== '') {
    tapWatch = setInterval(() => {
      if (phase !== 'running') return;
      const s = decodeCounters('native', native.engineCounters(id));
      if (s.total.counters.tap_disabled > 0) {
        clearInterval(tapWatch);
        log.warn(
          { tun: created.tunName, tap: created.tapName },
          'egress TAP refused a frame (EINVAL): TCP super-packets are split and sent with UDP GSO from now on',
        );
      }
    }, 1000);
    tapWatch.unref();
  }
  let closed: Promise<void> | null = null;
  return {
    engine: 'native',
    tunName: created.tunName,
    threadIds,
    failed,
    setPeers(entries) {
      if (phase === 'closing') return;
      native.engineSetPeers(id, encodePeerTable(entries));
    },
    setPeerTable(table) {
      if (phase === 'closing') return;
      native.engineSetPeers(id, table);
    },
    updatePeerTable(delta) {
      if (phase === 'closing') return;
      native.engineUpdatePeers(id, delta.removed, delta.upserts);
    },
    ...(created.wgPublicKey
      ? {
          wireguardPublicKey: created.wgPublicKey,
          setWireguardPeers(peers: readonly WireguardPeer[]) {
            if (phase === 'closing') return;
            native.engineSetWgPeers(id, encodeWireguardPeers(peers));
          },
          wireguardState(): WireguardState {
            if (phase === 'closing') throw new WeftError('WEFT_ERR_DATAPLANE', 'dataplane closed');
            const st = native.engineWgState(id);
            if (!st) throw new WeftError('WEFT_ERR_DATAPLANE', 'not a wireguard dataplane');
            return st;
          },
        }
      : {}),
    stats() {
      if (phase === 'closing') return decodeCounters('native', []);
      return {
        ...decodeCounters('native', native.engineCounters(id)),
        offloads,
        steering: created.steering,
      };
    },
    close() {
      closed ??= (async () => {
        phase = 'closing';
        clearInterval(tapWatch);
        await stopAll();
        log.debug({ tun: created.tunName }, 'dataplane stopped');
      })();
      return closed;
    },
  };
}
