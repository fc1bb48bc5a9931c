/**
 * A node informer: list, then watch from the list's resourceVersion, forever, sharing one cache
 * between any number of subscribers. The 1.x client's informer does not restart itself after an
 * error; this one does:
 *
 *   list ──► sync batch ──► watch(rv) ──► change batches ... ──► stream ends (timeout)
 *     ▲                        │  ▲                                  │
 *     │ 410 Expired            │  └──────── re-watch from last rv ◄──┘
 *     └────────────────────────┘            other error: backoff, re-watch (list if none yet)
 *
 * Nodes are kept cut down to what weft reads (slimNode), each as it is parsed: a list comes in
 * pages (`limit`, `continue`) and each page is read as a stream, so memory never holds a whole
 * list of real Nodes (10-50 KB each), only one at a time. Subscribers get a `sync` batch (the
 * whole node map) first and after every relist — they diff against what they knew — and
 * `changes` batches in between (one per received chunk). While a list is read, every
 * LIST_PAGE_SIZE nodes listed are also handed on as a `page` batch (nodes as listed so far:
 * newer than what a subscriber knew, but not the whole set: nothing may be taken as deleted
 * until the `sync`), so that a subscriber can act on the first nodes of 5,000 while the rest
 * are still being read (issue #28: a kernel backend programs them meanwhile).
 * Guarded state: `#nodes`, `#rv` and `#subs` are written only by the run loop and subscribe().
 */
import { WeftError, errorMessage, isWeftError } from '../../common/errors.js';
import { backoffDelay, sleep, type BackoffOptions } from '../../common/lifecycle.js';
import { LogOnce, type Logger } from '../../common/log.js';
import type { KubeApi, KubeNode } from './kube-api.js';
import type { KeepTree } from './kube-stream.js';

export type NodeChange =
  | { readonly type: 'upsert'; readonly node: KubeNode }
  | { readonly type: 'delete'; readonly node: KubeNode };

export type NodeBatch =
  | { readonly kind: 'sync'; readonly nodes: ReadonlyMap<string, KubeNode> }
  /** Nodes of a list still being read (the `sync` that ends it follows). */
  | { readonly kind: 'page'; readonly nodes: readonly KubeNode[] }
  | { readonly kind: 'changes'; readonly changes: readonly NodeChange[] };

export interface NodeInformerOptions {
  readonly log: Logger;
  readonly backoff?: BackoffOptions;
  /** Server-side watch timeout; the stream is re-opened from the last version after it. */
  readonly watchTimeoutSeconds?: number;
  /** Called on every relist after the first (410 Expired, or a list after errors). */
  readonly onRelist?: () => void;
  /** Nodes per list page (default LIST_PAGE_SIZE). */
  readonly listPageSize?: number;
}

export const INFORMER_BACKOFF: BackoffOptions = { initialMs: 200, maxMs: 30_000 };

/** Nodes per list page (client-go's pager default). */
export const LIST_PAGE_SIZE = 500;

/**
 * What the informer keeps of a node: its name, resourceVersion, annotations and pod CIDRs, all
 * that weft reads. A real Node is mostly status (images, conditions, addresses, node info),
 * labels and managedFields, 10-50 KB each: 5,000 of them held whole would be most of a daemon's
 * memory.
 */
export function slimNode(n: KubeNode): KubeNode {
  const { name, resourceVersion, annotations } = n.metadata;
  const metadata = {
    name,
    ...(resourceVersion !== undefined ? { resourceVersion } : {}),
    ...(annotations !== undefined ? { annotations } : {}),
  };
  if (!n.spec) return { metadata };
  const { podCIDR, podCIDRs } = n.spec;
  const spec = {
    ...(podCIDR !== undefined ? { podCIDR } : {}),
    ...(podCIDRs !== undefined ? { podCIDRs } : {}),
  };
  return { metadata, spec };
}

/**
 * The same cut, made before a list's Node is parsed (ListScanner): every other object or array
 * in a Node's first two levels (status, labels, managedFields, taints, ...) reaches JSON.parse
 * as null. Whatever slimNode reads must be kept here (a unit test checks the two agree); its
 * strings (name, resourceVersion, podCIDR) are never cut.
 */
export const NODE_KEEP: KeepTree = {
  metadata: { annotations: true },
  spec: { podCIDRs: true },
};

class Subscription {
  readonly #queue: NodeBatch[] = [];
  #wake: (() => void) | null = null;
  #ended = false;

  push(b: NodeBatch): void {
    this.#queue.push(b);
    this.#wake?.();
  }

  end(): void {
    this.#ended = true;
    this.#wake?.();
  }

  async *iterate(signal: AbortSignal): AsyncIterable<NodeBatch> {
    const onAbort = () => this.end();
    signal.addEventListener('abort', onAbort, { once: true });
    try {
      for (;;) {
        const b = this.#queue.shift();
        if (b) {
          yield b;
          continue;
        }
        if (this.#ended || signal.aborted) return;
        await new Promise<void>((r) => (this.#wake = r));
        this.#wake = null;
      }
    } finally {
      signal.removeEventListener('abort', onAbort);
    }
  }
}

export class NodeInformer {
  readonly #api: KubeApi;
  readonly #o: NodeInformerOptions;
  #nodes = new Map<string, KubeNode>();
  readonly #subs = new Set<Subscription>();
  readonly #stop = new AbortController();
  readonly #errorsSeen = new LogOnce();
  #rv: string | null = null;
  #synced = false;
  #lists = 0;
  /** The first list asks for the latest state (rv=""): see latest() and startLatest(). */
  #firstListLatest = false;
  /** The nodes of the list being read (null: none is), for a subscriber that comes mid-list. */
  #listing: KubeNode[] | null = null;
  #running: Promise<void> | null = null;

  constructor(api: KubeApi, options: NodeInformerOptions) {
    this.#api = api;
    this.#o = options;
  }

  /** Whether the first list has completed. */
  get synced(): boolean {
    return this.#synced;
  }

  /** The cached node, if the informer has seen it. */
  get(name: string): KubeNode | undefined {
    return this.#nodes.get(name);
  }

  /** Node batches until `signal` fires or the informer closes; starts the informer if needed. */
  subscribe(signal: AbortSignal): AsyncIterable<NodeBatch> {
    const sub = new Subscription();
    if (this.#synced) sub.push({ kind: 'sync', nodes: new Map(this.#nodes) });
    if (this.#listing !== null && this.#listing.length > 0) {
      sub.push({ kind: 'page', nodes: [...this.#listing] });
    }
    this.#subs.add(sub);
    this.#start();
    const subs = this.#subs;
    return (async function* () {
      try {
        yield* sub.iterate(signal);
      } finally {
        subs.delete(sub);
      }
    })();
  }

  /**
   * Every node as of now: the latest state, not "any version", for a decision a lagging watch
   * cache would get wrong (kube-manager's otherLeases: which VTEP MACs are taken, where a node
   * just added must not be missed). Before the informer has started, its first list is made a
   * latest-state one (rv="", a quorum read) and its result is the answer — so a daemon that
   * needs this at start lists once, not twice (on 5,000 real-sized Nodes each list is ~84 MB to
   * read). Once started, the cache may lag: a list of its own, at rv="".
   */
  async latest(signal?: AbortSignal): Promise<ReadonlyMap<string, KubeNode>> {
    if (this.#running === null && !this.#stop.signal.aborted) {
      this.#firstListLatest = true;
      for await (const b of this.subscribe(signal ?? new AbortController().signal)) {
        if (b.kind === 'sync') return b.nodes;
      }
      if (signal?.aborted) throw signal.reason;
      throw new WeftError('WEFT_ERR_STORE_UNAVAILABLE', 'kubernetes: the node informer closed');
    }
    const nodes = new Map<string, KubeNode>();
    await this.#api.listNodes(
      (n) => {
        const name = n.metadata?.name;
        if (typeof name === 'string') nodes.set(name, slimNode(n));
      },
      {
        resourceVersion: '',
        limit: this.#o.listPageSize ?? LIST_PAGE_SIZE,
        signal,
        keep: NODE_KEEP,
      },
    );
    return nodes;
  }

  /**
   * Starts the informer with a latest-state first list (rv="", as latest() would make it) without
   * waiting for it: for a daemon that checks its VtepMAC against the peers as their first list
   * comes in (the check latest() answers otherwise). Nothing when it has started already.
   */
  startLatest(): void {
    if (this.#running !== null || this.#stop.signal.aborted) return;
    this.#firstListLatest = true;
    this.#start();
  }

  #start(): void {
    if (this.#running || this.#stop.signal.aborted) return;
    this.#running = this.#run(this.#stop.signal).catch((err: unknown) => {
      this.#o.log.error({ err: errorMessage(err) }, 'node informer stopped');
    });
  }

  #emit(b: NodeBatch): void {
    for (const s of this.#subs) s.push(b);
  }

  async #run(signal: AbortSignal): Promise<void> {
    const log = this.#o.log;
    const backoff = this.#o.backoff ?? INFORMER_BACKOFF;
    log.debug('node informer started');
    let failures = 0;
    while (!signal.aborted) {
      try {
        const from = this.#rv ?? (await this.#relist(signal));
        const timeout = this.#o.watchTimeoutSeconds ?? 300 + Math.floor(Math.random() * 300);
        for await (const events of this.#api.watchNodes(from, signal, timeout)) {
          const changes: NodeChange[] = [];
          for (const ev of events) {
            const rv = ev.object.metadata?.resourceVersion;
            if (rv) this.#rv = rv;
            if (ev.type === 'BOOKMARK') continue;
            const name = ev.object.metadata?.name;
            if (typeof name !== 'string') continue;
            const node = slimNode(ev.object);
            if (ev.type === 'DELETED') {
              this.#nodes.delete(name);
              changes.push({ type: 'delete', node });
            } else {
              this.#nodes.set(name, node);
              changes.push({ type: 'upsert', node });
            }
          }
          failures = 0;
          if (changes.length > 0) this.#emit({ kind: 'changes', changes });
        }
      } catch (err) {
        if (signal.aborted) break;
        // A watch's 410: relist now. A list's own 410 (its continue token expired between
        // pages) is retried like any failure, with backoff: it lists again from the start.
        if (isWeftError(err, 'WEFT_ERR_STORE_COMPACTED') && this.#rv !== null) {
          log.info({ resourceVersion: this.#rv }, 'node watch expired; relisting');
          this.#rv = null;
          continue;
        }
        const msg = errorMessage(err);
        if (this.#errorsSeen.first(msg)) log.warn({ err: msg }, 'node watch failed; retrying');
        else log.debug({ err: msg }, 'node watch failed; retrying');
        await sleep(backoffDelay(failures++, backoff), signal).catch(() => undefined);
      }
    }
    log.debug('node informer stopped');
  }

  /**
   * Lists all nodes into the cache, cut down one by one as they are parsed (no full Node
   * outlives its own parse), and emits the sync batch. Returns the list's resourceVersion,
   * where the watch starts.
   *
   * Which version the list asks for (client-go's reflector does the same, for the same
   * reasons):
   * - The first list: resourceVersion=0, "any version" (unless latest() or startLatest() asked
   *   for the latest state before the informer started: then rv="", see there) — served from
   *   the API server's watch cache instead of a quorum read through to etcd (5,000 daemons
   *   starting together would otherwise each read every Node from etcd). The watch cache may
   *   ignore `limit` for rv=0 (API servers without cache pagination send the whole list in one
   *   response, with no `continue`): that is why each page is parsed as a stream — the memory
   *   bound holds whether or not the server pages.
   * - Every later list (after a 410 Expired/Gone, or a continue token that expired): NOT
   *   rv=0. We have already seen versions up to the expired one, and "any version" may be
   *   answered by an API server whose cache lags behind it (another replica behind the load
   *   balancer, one just restarted): the cache would go back in time. It lists with
   *   resourceVersion="" (the latest state, a quorum read, which etcd pages by `limit`), as
   *   client-go relists with rv="" when its last version is gone. A relist after a 410 is
   *   rare, so the etcd read it costs is acceptable; it is bounded in memory the same way.
   */
  async #relist(signal: AbortSignal): Promise<string> {
    const fresh = new Map<string, KubeNode>();
    const pageSize = this.#o.listPageSize ?? LIST_PAGE_SIZE;
    // the nodes of this list so far, and where the next page batch starts in them
    const listing: KubeNode[] = [];
    let from = 0;
    this.#listing = listing;
    let list: { resourceVersion: string; pages: number };
    try {
      list = await this.#api.listNodes(
        (n) => {
          const name = n.metadata?.name;
          if (typeof name !== 'string') return;
          const node = slimNode(n);
          fresh.set(name, node);
          listing.push(node);
          if (listing.length - from < pageSize) return;
          this.#emit({ kind: 'page', nodes: listing.slice(from) });
          from = listing.length;
        },
        {
          resourceVersion: this.#lists === 0 && !this.#firstListLatest ? '0' : '',
          limit: pageSize,
          signal,
          keep: NODE_KEEP,
        },
      );
    } finally {
      this.#listing = null;
    }
    this.#nodes = fresh;
    this.#rv = list.resourceVersion;
    if (this.#lists++ > 0) this.#o.onRelist?.();
    this.#synced = true;
    this.#emit({ kind: 'sync', nodes: new Map(this.#nodes) });
    this.#o.log.debug(
      { nodes: this.#nodes.size, pages: list.pages, resourceVersion: this.#rv },
      'nodes listed',
    );
    return list.resourceVersion;
  }

  async close(): Promise<void> {
    this.#stop.abort();
    for (const s of this.#subs) s.end();
    await this.#running;
  }
}
