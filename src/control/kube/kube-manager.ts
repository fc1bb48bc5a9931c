/**
 * The Kubernetes subnet manager (`--kube-subnet-mgr`, flannel's kube.go): the node's
 * `spec.podCIDR(s)` is the lease; what flannel keeps in an etcd lease value lives in node
 * annotations; peers are the nodes annotated `<prefix>kube-subnet-manager: "true"`.
 *
 *   acquireLease  GET node (wait for a podCIDR) → check it fits the network config →
 *                 strategic-merge PATCH nodes/<name>/status with the annotations that differ →
 *                 NetworkUnavailable=False (reason FlannelIsUp) unless disabled
 *   renewLease    nothing to renew: the lease is the node (expiration null, never lapses)
 *   watchLeases   one shared node informer (kube-informer.ts) → node → Lease → pure diff
 *   watchOwnLease our node deleted, or its podCIDR gone or changed → WEFT_ERR_LEASE_REVOKED
 *
 * Annotation names: `--kube-annotation-prefix` (default `flannel.alpha.coreos.com`) gets a `/`
 * when it has none, then a `-` unless it ends in `/` or `-`; at most one `/` (flannel's rules).
 *
 * Backends that must keep state across restarts (vxlan's VtepMAC) read what this node published
 * last time with `previousBackendData()`: the node's `backend-data` / `backend-v6-data`
 * annotations as they were when the manager opened, before acquireLease rewrites them.
 *
 * A peer node whose annotations or podCIDRs cannot be read is skipped, logged once per distinct
 * content and counted in weft_lease_malformed_total{store="kube"}; if it was a peer before, it
 * is removed (its old data no longer describes a reachable node).
 */
import { readFile } from 'node:fs/promises';
import { WeftError, errorMessage, isWeftError } from '../../common/errors.js';
import { retry, sleep } from '../../common/lifecycle.js';
import { LogOnce, logger, type Logger } from '../../common/log.js';
import {
  containsNet,
  familyOf,
  formatCIDR,
  isAligned,
  parseCIDR,
  type Family,
  type IPNet,
} from '../../common/ip.js';
import { parseNetConfig, type NetConfig } from '../config/net-config.js';
import type { AcquireOptions, SubnetManager } from '../lease/manager.js';
import { makeSubnetKey } from '../lease/subnet-key.js';
import type { Lease, LeaseAttrs, LeaseEvent } from '../lease/types.js';
import { diffLease, diffSnapshots } from '../lease/watcher.js';
import { snapshotPart } from '../lease/snapshot-parts.js';
import {
  KUBE_OPERATIONS,
  type LeaseMetrics,
  countLeaseEvents,
  timedStore,
} from '../metrics/metrics.js';
import { KubeApi, loadKubeConfig, type KubeNode } from './kube-api.js';
import { NodeInformer } from './kube-informer.js';

export const DEFAULT_ANNOTATION_PREFIX = 'flannel.alpha.coreos.com';
/** How long acquireLease waits for the controller manager to assign a podCIDR. */
export const POD_CIDR_WAIT_MS = 60_000;
const POD_CIDR_POLL_MS = 1000;

/** flannel's NodeCondition when it is up. */
export const NETWORK_CONDITION = {
  type: 'NetworkUnavailable',
  status: 'False',
  reason: 'FlannelIsUp',
  message: 'Flannel is running on this node',
} as const;

export interface KubeAnnotations {
  readonly subnetKubeManaged: string;
  readonly backendType: string;
  readonly backendData: string;
  readonly backendV6Data: string;
  readonly publicIP: string;
  readonly publicIPv6: string;
  readonly publicIPOverwrite: string;
  readonly publicIPv6Overwrite: string;
}

const PREFIX_RE = /(?:[a-z0-9_-]+\.)+[a-z0-9_-]+\/(?:[a-z0-9_-]+-)?$/;

/** Annotation names for a prefix; WEFT_ERR_USAGE naming --kube-annotation-prefix when invalid. */
export function kubeAnnotations(prefix: string): KubeAnnotations {
  const slashes = prefix.split('/').length - 1;
  const bad = (rule: string) =>
    new WeftError('WEFT_ERR_USAGE', `--kube-annotation-prefix: ${rule}`, {
      details: { flag: 'kube-annotation-prefix', prefix },
    });
  if (slashes > 1) throw bad('can contain at most one "/"');
  let p = slashes === 0 ? `${prefix}/` : prefix;
  if (!p.endsWith('/') && !p.endsWith('-')) p += '-';
  if (!PREFIX_RE.test(p)) throw bad('must be in the format fqdn/[0-9a-z-_]*');
  return {
    subnetKubeManaged: `${p}kube-subnet-manager`,
    backendType: `${p}backend-type`,
    backendData: `${p}backend-data`,
    backendV6Data: `${p}backend-v6-data`,
    publicIP: `${p}public-ip`,
    publicIPv6: `${p}public-ipv6`,
    publicIPOverwrite: `${p}public-ip-overwrite`,
    publicIPv6Overwrite: `${p}public-ipv6-overwrite`,
  };
}

type Result<T> = { ok: true; value: T } | { ok: false; reason: string };

/** The node's pod CIDRs by family (spec.podCIDRs, else spec.podCIDR); a reason when unreadable. */
export function nodePodCIDRs(node: KubeNode): Result<{ v4: IPNet | null; v6: IPNet | null }> {
  const spec = node.spec ?? {};
  const list =
    Array.isArray(spec.podCIDRs) && spec.podCIDRs.length > 0
      ? spec.podCIDRs
      : typeof spec.podCIDR === 'string' && spec.podCIDR !== ''
        ? [spec.podCIDR]
        : [];
  if (list.length > 2) {
    return { ok: false, reason: 'pod cidrs should be IPv4/IPv6 only or dualstack' };
  }
  let v4: IPNet | null = null;
  let v6: IPNet | null = null;
  for (const text of list) {
    const net = typeof text === 'string' ? parseCIDR(text) : null;
    if (!net || !isAligned(net)) {
      return { ok: false, reason: `podCIDR ${JSON.stringify(text)} is not a network prefix` };
    }
    if (net.family === 4) v4 = net;
    else v6 = net;
  }
  return { ok: true, value: { v4, v6 } };
}

function parseData(text: string | undefined, name: string): Result<unknown> {
  if (text === undefined || text === '' || text === 'null') return { ok: true, value: undefined };
  try {
    return { ok: true, value: JSON.parse(text) };
  } catch {
    return { ok: false, reason: `${name} is not JSON` };
  }
}

/** Whether a node takes part (annotated kube-subnet-manager: "true"). */
export function isManagedNode(node: KubeNode, a: KubeAnnotations): boolean {
  return node.metadata.annotations?.[a.subnetKubeManaged] === 'true';
}

/** One family's half of a peer node's lease: its public address, pod CIDR and backend data. */
function familyHalf(
  ann: Readonly<Record<string, string>>,
  family: Family,
  names: { readonly publicIP: string; readonly backendData: string },
  subnet: IPNet | null,
): Result<{ ip: string; subnet: IPNet; data: unknown }> {
  const ip = ann[names.publicIP] ?? '';
  if (familyOf(ip) !== family) {
    return {
      ok: false,
      reason: `${names.publicIP} ${JSON.stringify(ip)} is not an IPv${family} address`,
    };
  }
  if (!subnet) return { ok: false, reason: `no IPv${family} podCIDR` };
  const d = parseData(ann[names.backendData], names.backendData);
  if (!d.ok) return d;
  return { ok: true, value: { ip, subnet, data: d.value } };
}

/** flannel's nodeToLease: a peer node as a Lease, or a reason it cannot be one. */
export function nodeToLease(node: KubeNode, a: KubeAnnotations, cfg: NetConfig): Result<Lease> {
  const ann = node.metadata.annotations ?? {};
  const cidrs = nodePodCIDRs(node);
  if (!cidrs.ok) return cidrs;
  const v4 = cfg.enableIPv4
    ? familyHalf(ann, 4, { publicIP: a.publicIP, backendData: a.backendData }, cidrs.value.v4)
    : null;
  if (v4 && !v4.ok) return v4;
  const v6 = cfg.enableIPv6
    ? familyHalf(ann, 6, { publicIP: a.publicIPv6, backendData: a.backendV6Data }, cidrs.value.v6)
    : null;
  if (v6 && !v6.ok) return v6;
  const subnet = v4?.value.subnet ?? null;
  const ipv6Subnet = v6?.value.subnet ?? null;
  const backendData = v4?.value.data;
  const backendV6Data = v6?.value.data;
  const attrs: LeaseAttrs = {
    publicIP: v4?.value.ip ?? '0.0.0.0',
    publicIPv6: v6?.value.ip ?? null,
    backendType: ann[a.backendType] ?? '',
    ...(backendData !== undefined ? { backendData } : {}),
    ...(backendV6Data !== undefined ? { backendV6Data } : {}),
  };
  return {
    ok: true,
    value: { key: makeSubnetKey(subnet, ipv6Subnet), subnet, ipv6Subnet, attrs, expiration: null },
  };
}

/** Go's json.Marshal of a RawMessage: "null" when absent (flannel writes that for host-gw). */
function dataText(v: unknown): string {
  return v === undefined || v === null ? 'null' : JSON.stringify(v);
}

/**
 * The annotations our node must carry for `attrs` (flannel's AcquireLease rules): type and
 * managed flag always; IPv4 data and address unless vxlan has no data yet; IPv6 ones when we
 * publish an IPv6 address. A `public-ip(v6)-overwrite` annotation replaces the address.
 */
export function desiredAnnotations(
  node: KubeNode,
  a: KubeAnnotations,
  attrs: LeaseAttrs,
): Record<string, string> {
  const ann = node.metadata.annotations ?? {};
  const out: Record<string, string> = { [a.backendType]: attrs.backendType };
  if (!(attrs.backendType === 'vxlan' && dataText(attrs.backendData) === 'null')) {
    out[a.backendData] = dataText(attrs.backendData);
    out[a.publicIP] = ann[a.publicIPOverwrite] || attrs.publicIP;
  }
  if (attrs.publicIPv6 !== null) {
    out[a.backendV6Data] = dataText(attrs.backendV6Data);
    out[a.publicIPv6] = ann[a.publicIPv6Overwrite] || attrs.publicIPv6;
  }
  out[a.subnetKubeManaged] = 'true';
  return out;
}

export interface KubeManagerOptions {
  readonly api: KubeApi;
  readonly nodeName: string;
  readonly netConfig: NetConfig;
  readonly annotationPrefix?: string;
  /** --set-node-network-unavailable (default true). */
  readonly setNodeNetworkUnavailable?: boolean;
  readonly metrics: LeaseMetrics;
  readonly log?: Logger;
  readonly podCidrWaitMs?: number;
  readonly informer?: { watchTimeoutSeconds?: number; backoffMs?: number; listPageSize?: number };
}

export class KubeManager implements SubnetManager {
  readonly kind = 'kube';
  /** The node's podCIDR is the lease: known before our annotations are written. */
  readonly leaseBeforePublish = true;
  readonly #api: KubeApi;
  readonly #nodeName: string;
  readonly #cfg: NetConfig;
  readonly #ann: KubeAnnotations;
  readonly #setCondition: boolean;
  readonly #metrics: LeaseMetrics;
  readonly #log: Logger;
  readonly #podCidrWaitMs: number;
  readonly #informer: NodeInformer;
  readonly #malformedSeen = new LogOnce();
  /**
   * Each informer node's reading as a peer lease. The informer's nodes are immutable (a change is
   * a new object), so a node read once — by otherLeases at start — is not read again by
   * watchLeases' first batch from the same list: 5,000 real Nodes parsed once, not twice.
   */
  readonly #leaseOf = new WeakMap<KubeNode, Lease | null>();
  #previous: { backendData: unknown; backendV6Data: unknown } | null = null;

  constructor(o: KubeManagerOptions) {
    this.#api = o.api;
    this.#nodeName = o.nodeName;
    this.#cfg = o.netConfig;
    this.#ann = kubeAnnotations(o.annotationPrefix ?? DEFAULT_ANNOTATION_PREFIX);
    this.#setCondition = o.setNodeNetworkUnavailable ?? true;
    this.#metrics = o.metrics;
    this.#log = o.log ?? logger('kube');
    this.#podCidrWaitMs = o.podCidrWaitMs ?? POD_CIDR_WAIT_MS;
    const backoffMs = o.informer?.backoffMs;
    this.#informer = new NodeInformer(o.api, {
      log: this.#log,
      watchTimeoutSeconds: o.informer?.watchTimeoutSeconds,
      listPageSize: o.informer?.listPageSize,
      backoff: backoffMs ? { initialMs: backoffMs, maxMs: backoffMs * 8 } : undefined,
      onRelist: () => this.#metrics.watchResyncs.inc({ store: 'kube' }),
    });
  }

  get nodeName(): string {
    return this.#nodeName;
  }

  get annotations(): KubeAnnotations {
    return this.#ann;
  }

  /**
   * Reads our node once and remembers the backend data it published last time (see
   * previousBackendData). openKubeManager calls it; tests may too.
   */
  async loadPrevious(signal?: AbortSignal): Promise<void> {
    const node = await this.#getOwnNode(signal);
    const ann = node.metadata.annotations ?? {};
    const v4 = parseData(ann[this.#ann.backendData], this.#ann.backendData);
    const v6 = parseData(ann[this.#ann.backendV6Data], this.#ann.backendV6Data);
    this.#previous = {
      backendData: v4.ok ? v4.value : undefined,
      backendV6Data: v6.ok ? v6.value : undefined,
    };
  }

  /**
   * What this node published before we started (`backend-data` / `backend-v6-data`, parsed;
   * undefined when absent or unreadable). vxlan reads `VtepMAC` from it to keep its MAC across
   * restarts, as flannel's GetStoredMacAddresses. Null until loadPrevious ran.
   */
  previousBackendData(): { backendData: unknown; backendV6Data: unknown } | null {
    return this.#previous;
  }

  /** The VtepMACs from previousBackendData, when present and strings. */
  storedVtepMACs(): { v4: string | null; v6: string | null } {
    const mac = (d: unknown) => {
      const m = (d as { VtepMAC?: unknown } | undefined)?.VtepMAC;
      return typeof m === 'string' && m !== '' ? m : null;
    };
    return { v4: mac(this.#previous?.backendData), v6: mac(this.#previous?.backendV6Data) };
  }

  async getNetworkConfig(): Promise<NetConfig> {
    return this.#cfg;
  }

  async #getOwnNode(signal?: AbortSignal): Promise<KubeNode> {
    try {
      return await this.#api.getNode(this.#nodeName, signal);
    } catch (err) {
      if (isWeftError(err, 'WEFT_ERR_STORE_NOT_FOUND')) {
        throw new WeftError('WEFT_ERR_KUBE_NODE', `node "${this.#nodeName}" not found`, {
          cause: err,
          details: { node: this.#nodeName },
        });
      }
      throw err;
    }
  }

  /** GET our node until it has a podCIDR (the controller manager assigns it shortly after join). */
  async #waitForPodCIDR(signal?: AbortSignal): Promise<KubeNode> {
    const deadline = Date.now() + this.#podCidrWaitMs;
    let logged = false;
    for (;;) {
      const node = await this.#getOwnNode(signal);
      const spec = node.spec ?? {};
      if (spec.podCIDR || (spec.podCIDRs?.length ?? 0) > 0) return node;
      if (Date.now() >= deadline) {
        throw new WeftError(
          'WEFT_ERR_KUBE_POD_CIDR',
          `node "${this.#nodeName}" pod cidr not assigned`,
          { details: { node: this.#nodeName } },
        );
      }
      if (!logged) this.#log.info({ node: this.#nodeName }, 'waiting for the node pod cidr');
      logged = true;
      await sleep(Math.min(POD_CIDR_POLL_MS, Math.max(1, deadline - Date.now())), signal);
    }
  }

  #ownSubnets(node: KubeNode): { v4: IPNet | null; v6: IPNet | null } {
    const r = nodePodCIDRs(node);
    const fail = (msg: string) =>
      new WeftError('WEFT_ERR_KUBE_POD_CIDR', `node "${this.#nodeName}" ${msg}`, {
        details: {
          node: this.#nodeName,
          podCIDR: node.spec?.podCIDR,
          podCIDRs: node.spec?.podCIDRs,
        },
      });
    if (!r.ok) throw fail(r.reason);
    const out = { v4: null as IPNet | null, v6: null as IPNet | null };
    for (const [fc, net, family] of [
      [this.#cfg.ipv4, r.value.v4, 'IPv4'],
      [this.#cfg.ipv6, r.value.v6, 'IPv6'],
    ] as const) {
      if (!fc) continue;
      if (!net) throw fail(`has no ${family} podCIDR but the network config enables ${family}`);
      if (!containsNet(fc.network, net)) {
        throw fail(
          `podCIDR ${formatCIDR(net)} is outside the configured network ${formatCIDR(fc.network)}`,
        );
      }
      if (family === 'IPv4') out.v4 = net;
      else out.v6 = net;
    }
    return out;
  }

  async acquireLease(attrs: LeaseAttrs, options: AcquireOptions = {}): Promise<Lease> {
    const { signal } = options;
    const node = await this.#waitForPodCIDR(signal);
    if (this.#previous === null) {
      const ann = node.metadata.annotations ?? {};
      const v4 = parseData(ann[this.#ann.backendData], '');
      const v6 = parseData(ann[this.#ann.backendV6Data], '');
      this.#previous = {
        backendData: v4.ok ? v4.value : undefined,
        backendV6Data: v6.ok ? v6.value : undefined,
      };
    }
    const nets = this.#ownSubnets(node);
    const want = desiredAnnotations(node, this.#ann, attrs);
    const published: LeaseAttrs = {
      ...attrs,
      publicIP: want[this.#ann.publicIP] ?? attrs.publicIP,
      publicIPv6:
        attrs.publicIPv6 === null ? null : (want[this.#ann.publicIPv6] ?? attrs.publicIPv6),
    };
    const lease: Lease = {
      key: makeSubnetKey(nets.v4, nets.v6),
      subnet: nets.v4,
      ipv6Subnet: nets.v6,
      attrs: published,
      expiration: null,
    };
    if (options.publish === false) {
      // a VtepMAC to check: the peers' first list begins now, a latest-state one (the check
      // latest() answers otherwise is made on it as it comes); else it begins with the watch,
      // from the API server's watch cache
      if (options.latestPeers) this.#informer.startLatest();
      this.#log.info(
        { key: lease.key, node: this.#nodeName },
        'lease from node podCIDR (not yet published)',
      );
      return lease;
    }
    const have = node.metadata.annotations ?? {};
    const changed = Object.fromEntries(Object.entries(want).filter(([k, v]) => have[k] !== v));
    if (Object.keys(changed).length > 0) {
      await this.#api.patchNodeStatus(
        this.#nodeName,
        { metadata: { annotations: changed } },
        'strategic',
        signal,
      );
      this.#log.info({ node: this.#nodeName, annotations: Object.keys(changed) }, 'node annotated');
    }
    if (this.#setCondition) {
      const now = new Date().toISOString().replace(/\.\d+Z$/, 'Z');
      await this.#api.patchNodeStatus(
        this.#nodeName,
        {
          status: {
            conditions: [{ ...NETWORK_CONDITION, lastTransitionTime: now, lastHeartbeatTime: now }],
          },
        },
        'strategic',
        signal,
      );
      this.#log.info({ node: this.#nodeName }, 'node condition NetworkUnavailable=False set');
    }
    this.#log.info({ key: lease.key, node: this.#nodeName }, 'lease from node podCIDR');
    return lease;
  }

  /** The node is the lease: nothing lapses, nothing to renew. */
  async renewLease(lease: Lease): Promise<Lease> {
    this.#metrics.renewals.inc({ result: 'ok' });
    return { ...lease, expiration: null };
  }

  /** The podCIDR belongs to the node; flannel leaves the annotations too. Nothing to do. */
  async releaseLease(): Promise<void> {}

  /** A peer node as a lease; null when it is not a peer or is malformed (logged once, counted). */
  #peerLease(node: KubeNode): Lease | null {
    let lease = this.#leaseOf.get(node);
    if (lease === undefined) {
      lease = this.#readPeerLease(node);
      this.#leaseOf.set(node, lease);
    }
    return lease;
  }

  #readPeerLease(node: KubeNode): Lease | null {
    if (node.metadata.name === this.#nodeName || !isManagedNode(node, this.#ann)) return null;
    const r = nodeToLease(node, this.#ann, this.#cfg);
    if (r.ok) return r.value;
    const ann = node.metadata.annotations ?? {};
    const fingerprint = JSON.stringify([node.metadata.name, node.spec ?? null, ann]);
    if (this.#malformedSeen.first(fingerprint)) {
      this.#metrics.malformed.inc({ store: 'kube' });
      this.#log.warn({ node: node.metadata.name, reason: r.reason }, 'skipping malformed node');
    }
    return null;
  }

  /**
   * Every other managed node as a lease (our node is excluded by name), from the latest state
   * (the informer's latest(): rv="", not "any version": this decides which VTEP MACs are taken).
   */
  async otherLeases(_attrs: unknown, signal?: AbortSignal): Promise<Lease[]> {
    const leases: Lease[] = [];
    for (const n of (await this.#informer.latest(signal)).values()) {
      const l = this.#peerLease(n);
      if (l) leases.push(l);
    }
    return leases;
  }

  /**
   * Peer leases: the first batch is the snapshot (every peer node listed), then changes. While
   * the first list is read, its pages come as parts of that snapshot, each marked as continued
   * (snapshot-parts.ts), the sync that ends the list as its last part: the peers of the first
   * pages are checked and programmed while the rest are read. A later relist's pages are plain
   * batches (upserts; what the list no longer holds is removed at its sync).
   */
  async *watchLeases(own: Lease, signal: AbortSignal): AsyncIterable<LeaseEvent[]> {
    const peers = new Map<string, Lease>(); // node name → lease
    let first = true;
    for await (const batch of this.#informer.subscribe(signal)) {
      const events: LeaseEvent[] = [];
      /** Node `name` is now `lease` (null: not a peer, or gone). */
      const put = (name: string, lease: Lease | null) => {
        for (const e of diffLease(peers.get(name), lease, own.key)) events.push(e);
        if (lease) peers.set(name, lease);
        else peers.delete(name);
      };
      if (batch.kind === 'page') {
        for (const node of batch.nodes) put(node.metadata.name, this.#peerLease(node));
      } else if (batch.kind === 'sync') {
        for (const name of [...peers.keys()]) if (!batch.nodes.has(name)) put(name, null);
        for (const [name, node] of batch.nodes) put(name, this.#peerLease(node));
      } else {
        for (const c of batch.changes) {
          put(c.node.metadata.name, c.type === 'delete' ? null : this.#peerLease(c.node));
        }
      }
      // a page of the first list is a part of the snapshot (passed on only with events); the
      // snapshot's end (the first sync) is passed on even when empty
      const part = first && batch.kind === 'page';
      if (events.length === 0 && (part || !first)) continue;
      countLeaseEvents(this.#metrics, events, peers.size);
      if (part) {
        yield snapshotPart(events);
        continue;
      }
      first = false;
      yield events;
    }
  }

  async *watchOwnLease(own: Lease, signal: AbortSignal): AsyncIterable<Lease> {
    const revoked = (why: string) =>
      new WeftError('WEFT_ERR_LEASE_REVOKED', `lease ${own.key} was revoked: ${why}`, {
        details: { key: own.key, node: this.#nodeName },
      });
    let last = own;
    const check = (node: KubeNode | undefined): Lease | null => {
      if (!node) throw revoked(`node "${this.#nodeName}" was deleted`);
      const cidrs = nodePodCIDRs(node);
      const v4 = this.#cfg.enableIPv4 ? (cidrs.ok ? cidrs.value.v4 : null) : null;
      const v6 = this.#cfg.enableIPv6 ? (cidrs.ok ? cidrs.value.v6 : null) : null;
      if ((this.#cfg.enableIPv4 && !v4) || (this.#cfg.enableIPv6 && !v6)) {
        throw revoked(`node "${this.#nodeName}" lost its podCIDR`);
      }
      if (makeSubnetKey(v4, v6) !== own.key) {
        throw revoked(`node "${this.#nodeName}" podCIDR changed to ${makeSubnetKey(v4, v6)}`);
      }
      const r = nodeToLease(node, this.#ann, this.#cfg);
      if (!r.ok) return null;
      const next: Lease = { ...r.value, attrs: r.value.attrs };
      if (diffSnapshots(new Map([[last.key, last]]), new Map([[next.key, next]])).length === 0) {
        return null;
      }
      last = next;
      return next;
    };
    for await (const batch of this.#informer.subscribe(signal)) {
      if (batch.kind === 'page') continue; // (the list's sync follows)
      if (batch.kind === 'sync') {
        const l = check(batch.nodes.get(this.#nodeName));
        if (l) yield l;
        continue;
      }
      for (const c of batch.changes) {
        if (c.node.metadata.name !== this.#nodeName) continue;
        const l = check(c.type === 'delete' ? undefined : c.node);
        if (l) yield l;
      }
    }
  }

  async close(): Promise<void> {
    await this.#informer.close();
  }
}

export interface OpenKubeOptions {
  /** --kube-api-url */
  readonly kubeApiUrl: string;
  /** --kubeconfig-file */
  readonly kubeconfigFile: string;
  /** --kube-annotation-prefix */
  readonly kubeAnnotationPrefix: string;
  /** --net-config-path */
  readonly netConfigPath: string;
  /** --set-node-network-unavailable */
  readonly setNodeNetworkUnavailable: boolean;
  /** Environment (NODE_NAME, POD_NAME, POD_NAMESPACE, KUBERNETES_SERVICE_*); process.env. */
  readonly env?: Readonly<Record<string, string | undefined>>;
  /** In a pod: where the service account's token and ca.crt are (tests; SERVICE_ACCOUNT_DIR). */
  readonly serviceAccountDir?: string;
  readonly signal?: AbortSignal;
  readonly podCidrWaitMs?: number;
}

/**
 * The manager the daemon uses with --kube-subnet-mgr: connection from the flags (in-cluster
 * when neither URL nor kubeconfig), node name from the environment, network config from the
 * file, previous backend data read once. Fails with a WeftError naming what is missing.
 */
export async function openKubeManager(
  o: OpenKubeOptions,
  metrics: LeaseMetrics,
): Promise<KubeManager> {
  const log = logger('kube');
  kubeAnnotations(o.kubeAnnotationPrefix); // a bad --kube-annotation-prefix fails first
  let text: string;
  try {
    text = await readFile(o.netConfigPath, 'utf8');
  } catch (err) {
    throw new WeftError(
      'WEFT_ERR_CONFIG_NOT_FOUND',
      `--net-config-path: cannot read ${o.netConfigPath}: ${errorMessage(err)}`,
      { cause: err, details: { path: o.netConfigPath } },
    );
  }
  const netConfig = parseNetConfig(text);
  const api = timedStore(
    new KubeApi(
      loadKubeConfig({
        apiUrl: o.kubeApiUrl,
        kubeconfigFile: o.kubeconfigFile,
        env: o.env,
        ...(o.serviceAccountDir !== undefined ? { serviceAccountDir: o.serviceAccountDir } : {}),
      }),
    ),
    'kube',
    KUBE_OPERATIONS,
    metrics,
  );
  const nodeName = await resolveNodeName(api, o.env ?? process.env, o.signal);
  const manager = new KubeManager({
    api,
    nodeName,
    netConfig,
    annotationPrefix: o.kubeAnnotationPrefix,
    setNodeNetworkUnavailable: o.setNodeNetworkUnavailable,
    metrics,
    log,
    podCidrWaitMs: o.podCidrWaitMs,
  });
  await retry(() => manager.loadPrevious(o.signal), {
    attempts: 6,
    initialMs: 500,
    maxMs: 8000,
    signal: o.signal,
    // Unreachable or 5xx: the API server may be starting. 401/403 will not fix themselves.
    isRetriable: (err) =>
      isWeftError(err, 'WEFT_ERR_STORE_UNAVAILABLE') &&
      err.details.status !== 401 &&
      err.details.status !== 403,
    onRetry: (err, attempt) =>
      log.warn({ err: errorMessage(err), attempt }, 'kubernetes API not reachable; retrying'),
  });
  log.info({ node: nodeName, server: api.server }, 'kube subnet manager ready');
  return manager;
}

/** NODE_NAME, else the node of pod POD_NAMESPACE/POD_NAME (flannel's order). */
export async function resolveNodeName(
  api: KubeApi,
  env: Readonly<Record<string, string | undefined>>,
  signal?: AbortSignal,
): Promise<string> {
  if (env.NODE_NAME) return env.NODE_NAME;
  const pod = env.POD_NAME;
  const ns = env.POD_NAMESPACE;
  if (!pod || !ns) {
    throw new WeftError(
      'WEFT_ERR_KUBE_NODE',
      'node name unknown: set NODE_NAME, or POD_NAME and POD_NAMESPACE',
    );
  }
  let spec;
  try {
    spec = (await api.getPod(ns, pod, signal)).spec;
  } catch (err) {
    throw new WeftError(
      'WEFT_ERR_KUBE_NODE',
      `error retrieving pod spec for '${ns}/${pod}': ${errorMessage(err)}`,
      { cause: err },
    );
  }
  if (!spec?.nodeName) {
    throw new WeftError('WEFT_ERR_KUBE_NODE', `node name not present in pod spec '${ns}/${pod}'`);
  }
  return spec.nodeName;
}
