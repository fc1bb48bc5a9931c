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
 * Nodes are kept cut down to what weft reads (slimNode). Subscribers get a `sync` batch (the
 * whole node map) first and after every relist — they diff against what they knew — and
 * `changes` batches in between (one per received chunk).
 * Guarded state: `#nodes`, `#rv` and `#subs` are written only by the run loop and subscribe().
 */
import { errorMessage, isWeftError } from '../../common/errors.js';
import { backoffDelay, sleep, type BackoffOptions } from '../../common/lifecycle.js';
import { LogOnce, type Logger } from '../../common/log.js';
import type { KubeApi, KubeNode } from './kube-api.js';

export type NodeChange =
  | { readonly type: 'upsert'; readonly node: KubeNode }
  | { readonly type: 'delete'; readonly node: KubeNode };

export type NodeBatch =
  | { readonly kind: 'sync'; readonly nodes: ReadonlyMap<string, KubeNode> }
  | { readonly kind: 'changes'; readonly changes: readonly NodeChange[] };

export interface NodeInformerOptions {
  readonly log: Logger;
  readonly backoff?: BackoffOptions;
  /** Server-side watch timeout; the stream is re-opened from the last version after it. */
  readonly watchTimeoutSeconds?: number;
  /** Called on every relist after the first (410 Expired, or a list after errors). */
  readonly onRelist?: () => void;
}

export const INFORMER_BACKOFF: BackoffOptions = { initialMs: 200, maxMs: 30_000 };

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
  readonly #nodes = new Map<string, KubeNode>();
  readonly #subs = new Set<Subscription>();
  readonly #stop = new AbortController();
  readonly #errorsSeen = new LogOnce();
  #rv: string | null = null;
  #synced = false;
  #lists = 0;
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
        if (isWeftError(err, 'WEFT_ERR_STORE_COMPACTED')) {
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
   * Lists all nodes into the cache, cut down, and emits the sync batch. A method of its own so
   * that the whole list (full Nodes, 10-50 KB each in a real cluster) dies when it returns: a
   * local of #run would stay alive in the suspended run loop for as long as the watch lasts.
   * Returns the list's resourceVersion, where the watch starts.
   */
  async #relist(signal: AbortSignal): Promise<string> {
    const list = await this.#api.listNodes(signal);
    this.#nodes.clear();
    for (const n of list.items) this.#nodes.set(n.metadata.name, slimNode(n));
    this.#rv = list.resourceVersion;
    if (this.#lists++ > 0) this.#o.onRelist?.();
    this.#synced = true;
    this.#emit({ kind: 'sync', nodes: new Map(this.#nodes) });
    this.#o.log.debug({ nodes: this.#nodes.size, resourceVersion: this.#rv }, 'nodes listed');
    return list.resourceVersion;
  }

  async close(): Promise<void> {
    this.#stop.abort();
    for (const s of this.#subs) s.end();
    await this.#running;
  }
}
