/**
 * The Backend seam (flannel's Backend/Network pair, made explicit in three steps):
 *
 *   prepare(ctx)        → devices created (not yet addressed), lease attrs to publish, MTU
 *   (the daemon acquires the lease with those attrs and writes subnet.env)
 *   start(lease)        → the device gets its address and is up; the dataplane starts
 *   run(events, signal) → peers programmed from lease events until the signal fires
 *   close(how)          → stops what start() started; kernel state for peers is left as is
 *                         (flannel leaves routes on shutdown so traffic survives a restart), and
 *                         so is the userspace backends' persistent TUN, unless `how.release`
 *
 * Backends register by name (`alloc`, `host-gw`, `vxlan`, `udp`) in backend/registry.ts.
 * Kernel backends keep plan (pure: lease event → ops) apart from apply (reconcile.ts).
 */
import type { Logger } from '../../common/log.js';
import type { EngineRequest } from '../../dataplane/index.js';
import type { Registry as PromRegistry } from '../../common/metrics.js';
import type { NetConfig } from '../config/net-config.js';
import type { Lease, LeaseAttrs, LeaseEvent } from '../lease/types.js';
import type { EarlyDataplane } from './fast-start.js';

/** The node's external interface, chosen by --iface / --iface-regex / --iface-can-reach. */
export interface ExternalInterface {
  readonly name: string;
  readonly index: number;
  readonly mtu: number;
  /** The interface's own IPv4 address (null when it has none). */
  readonly ifaceAddr: string | null;
  readonly ifaceAddrV6: string | null;
  /** The address published in the lease (--public-ip, else the interface address). */
  readonly publicIP: string | null;
  readonly publicIPv6: string | null;
}

/**
 * The daemon flags backends read: one typed, frozen object, built once from the parsed flags
 * (flags.ts validates each: the engine's choices, the ranges, the offload list).
 */
export interface BackendOptions {
  /** --dataplane-engine (userspace backends). */
  readonly dataplaneEngine: EngineRequest;
  /** --dataplane-workers: TUN queues; 0 = one per CPU, at most 4. */
  readonly dataplaneWorkers: number;
  /** --dataplane-offloads; '' = $WEFT_DATAPLANE_OFFLOADS, else all. */
  readonly dataplaneOffloads: string;
  /** --dataplane-busy-poll, µs; 0 = off. */
  readonly dataplaneBusyPoll: number;
  /** --dataplane-queue-threads. */
  readonly dataplaneQueueThreads: 1 | 2;
  /** --dataplane-cpu-affine: queue k pinned to CPU k. */
  readonly dataplaneCpuAffine: boolean;
  /** --dataplane-sched-fifo: SCHED_FIFO priority of the loop threads; 0 = normal policy. */
  readonly dataplaneSchedFifo: number;
  /** --subnet-file: vxlan keeps its VtepMAC beside it (vtep-mac.ts); null = not kept. */
  readonly subnetFile: string | null;
  /** --iptables-forward-rules: weft accepts its traffic (and the egress TAP's) in FORWARD. */
  readonly iptablesForwardRules: boolean;
  /** --pod-bridge: the pods' bridge the bpf engine's bypass follows (netlink/pod-bridge.ts). */
  readonly podBridge: string;
}

export const DEFAULT_BACKEND_OPTIONS: BackendOptions = Object.freeze({
  dataplaneEngine: 'auto',
  dataplaneWorkers: 0,
  dataplaneOffloads: '',
  dataplaneBusyPoll: 0,
  dataplaneQueueThreads: 1,
  dataplaneCpuAffine: true,
  dataplaneSchedFifo: 0,
  subnetFile: null,
  iptablesForwardRules: true,
  podBridge: 'cni0',
});

/** The defaults with `o` applied, frozen. */
export function backendOptions(o: Partial<BackendOptions> = {}): BackendOptions {
  return Object.freeze({ ...DEFAULT_BACKEND_OPTIONS, ...o });
}

/** What the lease store knows about VtepMACs, for the vxlan backends (backend/vtep-mac.ts). */
export interface StoreVtepMACs {
  /** The MAC the store still publishes for this node from an earlier run (kube annotation). */
  stored(family: 4 | 6): string | null;
  /** The MACs other nodes' leases publish now (any family, lower case). */
  inUse(): Promise<ReadonlySet<string>>;
}

export interface BackendContext {
  readonly netConfig: NetConfig;
  readonly extIface: ExternalInterface;
  readonly log: Logger;
  /** Prometheus registry the backend adds its metrics to. */
  readonly metrics: PromRegistry;
  /** Daemon flags a backend may read (e.g. dataplane engine choice, offload kill switches). */
  readonly options: BackendOptions;
  /** Absent: nothing is known (tests, a store without leases). */
  readonly vtepMACs?: StoreVtepMACs;
  /** The last run's dataplane, started early on its persistent TUN (fast-start.ts), if any. */
  readonly early?: EarlyDataplane | null;
  readonly signal: AbortSignal;
}

export interface PreparedBackend {
  /** backendType / backendData / backendV6Data for our lease (publicIP is filled by the daemon). */
  readonly attrs: Pick<LeaseAttrs, 'backendType' | 'backendData' | 'backendV6Data'>;
  /** MTU written to subnet.env (FLANNEL_MTU). */
  readonly mtu: number;
}

export interface Backend {
  readonly type: string;
  prepare(): Promise<PreparedBackend>;
  start(lease: Lease): Promise<void>;
  /** Consumes peer lease batches until `signal` fires; rejects only on a fatal backend error. */
  run(events: AsyncIterable<LeaseEvent[]>, signal: AbortSignal): Promise<void>;
  /**
   * Whether run() takes the first snapshot in parts (snapshot-parts.ts), programming each as it
   * comes; absent: the daemon's peer check hands it on whole.
   */
  readonly snapshotParts?: boolean;
  close(how?: CloseHow): Promise<void>;
  /**
   * Whether the dataplane can forward, as the last re-check of the backend's own state (device,
   * address, route) found it; absent: always. /readyz answers 503 while it is false.
   */
  isReady?(): boolean;
}

export interface CloseHow {
  /**
   * The subnet stops being ours (the lease is released or was revoked): state kept for a restart
   * that would go on serving it (the userspace backends' persistent TUN, its address and route)
   * goes too. Default false: a stop or a crash leaves it for the next run.
   */
  readonly release?: boolean;
}

/**
 * What a kernel backend tells the userspace backend it hands over to for lack of its kernel
 * module ("Dataplane": "auto"): passed to that factory as an argument, never through the options.
 */
export interface Handover {
  /**
   * The engine --dataplane-engine=auto means there (chooseEngine's EngineAsk.autoPrefers): bpf
   * runs at kernel speed without the module, and falls back to native where it cannot run.
   */
  readonly autoPrefers?: 'native' | 'bpf';
}

export type BackendFactory = (ctx: BackendContext, handover?: Handover) => Backend;

/**
 * A backend's one registration (registry.ts lists them, as flannel's backend.Register): all
 * that the daemon, `weft config set` and the iptables rules need to know of a type.
 */
export interface BackendSpec {
  /** The type name, as net-conf's Backend.Type spells it (lower case). */
  readonly type: string;
  /**
   * Creates the backend. `userspace` is the factory of the `fallback` type (null when it is not
   * registered); `handover` is set when a kernel backend hands over to this one.
   */
  readonly create: (
    ctx: BackendContext,
    handover: Handover | undefined,
    userspace: BackendFactory | null,
  ) => Backend;
  /** Parses the Backend block as create does first (`weft config set` runs it); absent: none. */
  readonly parseConfig?: (raw: Readonly<Record<string, unknown>>) => unknown;
  /**
   * The Backend options it reads besides `Type` (names as flannel spells them, matched
   * case-insensitively); anything else is reported unsupported (options.ts).
   */
  readonly options: readonly string[];
  /**
   * The egress TAP (tap_gso) its userspace engine may send through under this Backend block,
   * or null (iptables accepts its frames in FORWARD: egress-tap.ts); absent: never one.
   */
  readonly egressTap?: (raw: Readonly<Record<string, unknown>>) => string | null;
  /**
   * The userspace backend it hands over to ("Dataplane": "userspace", or "auto" without its
   * kernel module: kernel-fallback.ts); absent: kernel only, or userspace itself.
   */
  readonly fallback?: string;
}
