/**
 * The bench's testbed (bench/run.ts, one per path), shared with the namespace test that pins it
 * (test/netns/bench-testbed.test.ts) so both build exactly the same thing: two nodes on the
 * underlay bridge with a default route via it, the built daemons (dist launcher) started
 * together with `--ip-masq` and the daemon's own iptables resync, pods made by weft-cni behind
 * cni0. No daemon runs yet: the caller starts them (`startDaemons()`) and adds the pods.
 */
import { type Backend, Cluster } from './cluster.js';

export interface BenchClusterOptions {
  /** The path's net-conf Backend block; null: no daemons (the underlay path). */
  readonly backend: Backend | null;
  readonly flags?: readonly string[];
  /** Extra daemon environment. */
  readonly env?: Readonly<Record<string, string>>;
  readonly prefix?: string;
  /** IPv4 + IPv6 underlay and pods (with netConf `EnableIPv4: false`: IPv6 alone). */
  readonly dualStack?: boolean;
  /** More net-conf fields. */
  readonly netConf?: Readonly<Record<string, unknown>>;
}

export function buildBenchCluster(o: BenchClusterOptions): Promise<Cluster> {
  return Cluster.build({
    nodes: 2,
    ...(o.prefix ? { prefix: o.prefix } : {}),
    // The measured daemons are the built ones, started together, with pods made by weft-cni.
    launcher: 'dist',
    parallelStart: true,
    podWiring: 'cni',
    defaultRoute: true,
    ipMasq: true,
    iptablesResync: null,
    ...(o.backend ? { backend: o.backend } : {}),
    flags: o.flags ?? [],
    ...(o.env ? { env: o.env } : {}),
    ...(o.dualStack ? { dualStack: true } : {}),
    ...(o.netConf ? { netConf: o.netConf } : {}),
  });
}
