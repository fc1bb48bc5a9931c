/**
 * `weft daemon [flags]`: flags → DaemonConfig → runDaemon, with signal handling.
 *
 * On a restart, forwarding comes first: the last run's userspace dataplane starts on its
 * persistent TUN (backend/fast-start.ts) before the daemon's own modules (store clients,
 * iptables, metrics) are loaded, so only what that start needs is imported statically here.
 */
import { errorMessage } from '../../common/errors.js';
import { backendOptions } from '../backend/backend.js';
import { startEarly } from '../backend/fast-start.js';
import { openNetlink } from '../netlink/open-netlink.js';
import { logger, setLogFormat, setLogLevel, verbosityLevel } from '../../common/log.js';
import {
  DAEMON_FLAGS,
  IGNORED_FLANNELD_FLAGS,
  parseFlags,
  storeKind,
  usage,
} from '../config/flags.js';
import type { KubeManager } from '../kube/kube-manager.js';
import { sdNotify } from '../sd-notify.js';
import { VERSION } from '../version.js';
import type { Io } from './store-commands.js';

/** SIGTERM/SIGINT: stop cleanly; if cleanup has not finished by then, exit anyway. */
export const STOP_DEADLINE_MS = 1900;

export async function daemonCommand(argv: readonly string[], io: Io): Promise<number> {
  const parsed = parseFlags(DAEMON_FLAGS, argv, io.env);
  const o = parsed.values;
  if (o.help) {
    io.stdout.write(
      usage(DAEMON_FLAGS, 'weft daemon', 'The node agent: lease, subnet.env, backend.'),
    );
    return 0;
  }
  if (o.version) {
    io.stdout.write(`${VERSION}\n`);
    return 0;
  }
  setLogFormat(o.logFormat);
  setLogLevel(parsed.explicit.has('log-level') ? o.logLevel : verbosityLevel(o.v));
  const log = logger('main');
  for (const name of IGNORED_FLANNELD_FLAGS) {
    if (parsed.explicit.has(name))
      log.warn(
        { flag: `--${name}` },
        'flag accepted for flanneld compatibility; no effect in weft',
      );
  }
  const ac = new AbortController();
  // systemd Type=notify: readiness and stopping are reported when NOTIFY_SOCKET is set.
  const notify = (state: string) => {
    try {
      sdNotify(state, io.env);
    } catch (err) {
      log.warn({ err: errorMessage(err) }, 'sd_notify failed');
    }
  };
  let kube: KubeManager | null = null;
  let stopping = false;
  const onSignal = (sig: NodeJS.Signals) => {
    if (stopping) return;
    stopping = true;
    log.info({ signal: sig }, 'stopping');
    notify('STOPPING=1');
    ac.abort();
    setTimeout(() => {
      log.warn({ deadlineMs: STOP_DEADLINE_MS }, 'cleanup did not finish in time; exiting');
      process.exit(0);
    }, STOP_DEADLINE_MS).unref();
  };
  // A fatal error (an uncaught exception, an unhandled rejection) is logged as JSON and ends the
  // process with 1; the native engine's 'exit' hook stops its loops so that the exit completes.
  const onFatal = (err: unknown, origin: string) => {
    log.fatal(
      { err: errorMessage(err), stack: (err as Error)?.stack, origin },
      'fatal error; exiting',
    );
    process.exit(1);
  };
  process.on('SIGTERM', onSignal);
  process.on('SIGINT', onSignal);
  process.on('uncaughtException', onFatal);
  log.info({ version: VERSION, store: storeKind(parsed) }, 'starting weft daemon');
  // The last run's userspace dataplane forwards again first; the store client loads after it
  // (on the same thread, its loading would hold back the engine's start).
  const early = o.subnetFile
    ? await startEarly(o.subnetFile, logger('fast-start'), {
        openNetlink,
        startDataplane: async (opts) =>
          (await import('../../dataplane/index.js')).startDataplane(opts),
      })
    : undefined;
  const [
    { runDaemon },
    { selectExternalInterface },
    { iptablesTask },
    { LocalManager },
    { openRegistry },
    { blackholeRouteTask },
    { egressTapOf },
  ] = await Promise.all([
    import('../daemon.js'),
    import('../iface.js'),
    import('../iptables/iptables.js'),
    import('../lease/local-manager.js'),
    import('../registry/open.js'),
    import('../blackhole-route.js'),
    import('../backend/egress-tap.js'),
  ]);
  try {
    await runDaemon(
      {
        subnetFile: o.subnetFile,
        renewMarginMs: o.subnetLeaseRenewMargin * 60_000,
        healthzIp: o.healthzIp,
        healthzPort: o.healthzPort,
        releaseLeaseOnExit: o.releaseLeaseOnExit,
        ipMasq: o.ipMasq,
        backendOptions: backendOptions({
          dataplaneEngine: o.dataplaneEngine,
          dataplaneWorkers: o.dataplaneWorkers,
          dataplaneOffloads: o.dataplaneOffloads,
          dataplaneBusyPoll: o.dataplaneBusyPoll,
          // flags.ts allows 1..2
          dataplaneQueueThreads: o.dataplaneQueueThreads === 2 ? 2 : 1,
          dataplaneCpuAffine: o.dataplaneCpuAffine,
          dataplaneSchedFifo: o.dataplaneSchedFifo,
          // vxlan keeps its VtepMAC in a file beside subnet.env (backend/vtep-mac.ts)
          subnetFile: o.subnetFile || null,
          iptablesForwardRules: o.iptablesForwardRules,
          podBridge: o.podBridge,
        }),
        // ... and in kube mode in our node's backend-data annotation too
        storedVtepMACs: () => kube?.storedVtepMACs() ?? { v4: null, v6: null },
        early,
        tasks: [
          iptablesTask({
            ipMasq: o.ipMasq,
            forwardRules: o.iptablesForwardRules,
            resyncSec: o.iptablesResync,
            fullyRandom: !o.ipMasqFullyRandomDisable,
            egressTapOf,
          }),
          ...(o.ipBlackholeRoute ? [blackholeRouteTask({ resyncSec: o.iptablesResync })] : []),
        ],
        openManager: async (metrics) => {
          if (storeKind(parsed) !== 'kube') {
            const { REGISTRY_OPERATIONS, timedStore } = await import('../metrics/metrics.js');
            const registry = await openRegistry(parsed);
            const store = registry.kind === 'etcd' ? 'etcd' : 'embedded';
            return new LocalManager(timedStore(registry, store, REGISTRY_OPERATIONS, metrics), {
              metrics,
            });
          }
          // the Kubernetes client (~1.5 s, ~60 MB to load) only in kube mode
          const { openKubeManager } = await import('../kube/kube-manager.js');
          kube = await openKubeManager(
            {
              kubeApiUrl: o.kubeApiUrl,
              kubeconfigFile: o.kubeconfigFile,
              kubeAnnotationPrefix: o.kubeAnnotationPrefix,
              netConfigPath: o.netConfigPath,
              setNodeNetworkUnavailable: o.setNodeNetworkUnavailable,
              signal: ac.signal,
            },
            metrics,
          );
          return kube;
        },
        onReady: () => {
          notify('READY=1');
          crashForTests(io.env.WEFT_TEST_CRASH);
        },
        selectInterface: (cfg) =>
          selectExternalInterface(
            {
              iface: o.iface,
              ifaceRegex: o.ifaceRegex,
              ifaceCanReach: o.ifaceCanReach,
              publicIP: o.publicIp,
              publicIPv6: o.publicIpv6,
            },
            { ipv4: cfg.enableIPv4, ipv6: cfg.enableIPv6 },
          ),
      },
      ac.signal,
    );
    return 0;
  } catch (err) {
    if (stopping) log.warn({ err: errorMessage(err) }, 'error while stopping');
    throw err;
  } finally {
    process.off('SIGTERM', onSignal);
    process.off('SIGINT', onSignal);
    process.off('uncaughtException', onFatal);
  }
}

/**
 * Test-only (test/netns/crash-exit.test.ts): after ready, crash the way a bug would — `throw` an
 * uncaught exception, `reject` a promise nobody handles, or `exit` with process.exit(3).
 */
function crashForTests(how: string | undefined): void {
  if (how === 'throw') {
    setImmediate(() => {
      throw new Error('WEFT_TEST_CRASH=throw');
    });
  } else if (how === 'reject') {
    void Promise.reject(new Error('WEFT_TEST_CRASH=reject'));
  } else if (how === 'exit') {
    setImmediate(() => process.exit(3));
  }
}
