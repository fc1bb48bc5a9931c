/**
 * `weft daemon --kube-subnet-mgr ...` for the namespace tests, run from the sources:
 * `node --import tsx test/helpers/kube-daemon.ts <daemon flags>`. It parses the real daemon flag
 * table and runs the real runDaemon with openKubeManager — the wiring proposed for
 * src/control/cli/daemon-command.ts. Once that file opens the kube manager itself, tests should
 * run `test/helpers/weft-src.ts daemon ...` instead and this file can go.
 */
import { errorMessage } from '../../src/common/errors.js';
import { logger, setLogLevel } from '../../src/common/log.js';
import { DAEMON_FLAGS, parseFlags } from '../../src/control/config/flags.js';
import { runDaemon } from '../../src/control/daemon.js';
import { selectExternalInterface } from '../../src/control/iface.js';
import { openKubeManager, type KubeManager } from '../../src/control/registry/kube.js';

const o = parseFlags(DAEMON_FLAGS, process.argv.slice(2), process.env).values;
setLogLevel(o.logLevel);
const log = logger('main');
const ac = new AbortController();
const stop = () => ac.abort();
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
let kube: KubeManager | null = null;
try {
  await runDaemon(
    {
      subnetFile: o.subnetFile,
      renewMarginMs: o.subnetLeaseRenewMargin * 60_000,
      healthzIp: o.healthzIp,
      healthzPort: o.healthzPort,
      releaseLeaseOnExit: o.releaseLeaseOnExit,
      ipMasq: o.ipMasq,
      backendOptions: {
        dataplaneEngine: o.dataplaneEngine,
        dataplaneWorkers: o.dataplaneWorkers,
        ipMasq: o.ipMasq,
        storeDir: o.storeDir,
        subnetFile: o.subnetFile,
        storedVtepMACs: () => kube?.storedVtepMACs() ?? { v4: null, v6: null },
      },
      openManager: async (metrics) => {
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
  process.exit(0);
} catch (err) {
  log.error({ err: errorMessage(err), code: (err as { code?: string }).code }, 'daemon failed');
  process.exit(1);
}
