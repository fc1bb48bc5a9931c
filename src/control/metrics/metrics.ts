/**
 * The daemon's Prometheus registry (prom-client): Node's default process_* and nodejs_*
 * families plus weft's own. Names follow `weft_<subsystem>_<what>_<unit>`; counters end in
 * `_total`; label values come from small fixed sets only, exported at 0 from the start where the
 * set is known (common/metrics.ts). Backends and the dataplane add theirs to the same registry.
 */
import { collectDefaultMetrics } from 'prom-client';
import { VERSION } from '../version.js';
import {
  type Counter,
  type Gauge,
  type Histogram,
  Registry,
  counterOn,
  gaugeOn,
  histogramOn,
} from '../../common/metrics.js';

/**
 * How often Node's event-loop delay histogram samples (ms), behind `nodejs_eventloop_lag_*`:
 * prom-client's default 10 ms wakes an idle daemon 100 times a second (~0.8 % of a core here);
 * once a second costs nothing measurable and still shows a loop blocked for longer.
 */
export const EVENT_LOOP_MONITORING_PRECISION_MS = 1000;

/** The stores weft speaks to, as label values (`store`). */
export const STORES = ['embedded', 'etcd', 'kube'] as const;
export type Store = (typeof STORES)[number];
/** Renewal results (`weft_lease_renewals_total{result}`). */
export const RENEWAL_RESULTS = ['ok', 'error'] as const;
/** Peer lease event types (`weft_lease_events_total{type}`). */
export const LEASE_EVENT_TYPES = ['added', 'removed'] as const;

/** The Registry methods timed as store requests (embedded, etcd). */
export const REGISTRY_OPERATIONS = [
  'getNetworkConfig',
  'setNetworkConfig',
  'listSubnets',
  'getSubnet',
  'createSubnet',
  'updateSubnet',
  'deleteSubnet',
] as const;
/** The Kubernetes API calls timed as store requests (kube). */
export const KUBE_OPERATIONS = ['getNode', 'getPod', 'listNodes', 'patchNodeStatus'] as const;

export interface LeaseMetrics {
  readonly malformed: Counter<'store'>;
  readonly renewals: Counter<'result'>;
  readonly expiration: Gauge;
  readonly peers: Gauge;
  readonly events: Counter<'type'>;
  readonly acquireRetries: Counter;
  readonly watchResyncs: Counter<'store'>;
  /** How long acquiring our lease took (store round trips, lost races and retries included). */
  readonly acquireDuration: Histogram;
  /** How long each renewal of our lease took. */
  readonly renewDuration: Histogram;
  /** Store requests by store and operation. */
  readonly storeRequests: Histogram<'store' | 'operation'>;
}

export interface DaemonMetrics {
  readonly registry: Registry;
  readonly lease: LeaseMetrics;
  readonly ready: Gauge;
}

/**
 * A batch of peer lease events counted (`weft_lease_events_total{type}`) with one labelled
 * increment per type, not one per event (a 5,000-lease snapshot: 5,000 label look-ups took
 * ~7 ms of a start), and the peers known now (`weft_lease_peers`).
 */
export function countLeaseEvents(
  m: LeaseMetrics,
  events: readonly { readonly type: 'added' | 'removed' }[],
  peers: number,
): void {
  let added = 0;
  for (let i = 0; i < events.length; i++) if (events[i]!.type === 'added') added++;
  if (added > 0) m.events.inc({ type: 'added' }, added);
  if (added < events.length) m.events.inc({ type: 'removed' }, events.length - added);
  m.peers.set(peers);
}

/** Lease metrics on `registry` (a registry of their own for unit tests and the store-only commands). */
export function createLeaseMetrics(registry: Registry = new Registry()): LeaseMetrics {
  return {
    malformed: counterOn(registry, {
      name: 'weft_lease_malformed_total',
      help: 'Leases from other nodes skipped because their key or value could not be decoded.',
      labelNames: ['store'],
    }),
    renewals: counterOn(registry, {
      name: 'weft_lease_renewals_total',
      help: 'Renewals of our own lease, by result (ok, error).',
      labelNames: ['result'],
      known: { result: RENEWAL_RESULTS },
    }),
    expiration: gaugeOn(registry, {
      name: 'weft_lease_expiration_timestamp_seconds',
      help: 'When our lease lapses unless renewed (Unix time); 0 for a reservation.',
    }),
    peers: gaugeOn(registry, {
      name: 'weft_lease_peers',
      help: 'Leases of other nodes currently known.',
    }),
    events: counterOn(registry, {
      name: 'weft_lease_events_total',
      help: 'Peer lease events delivered to the backend, by type (added, removed).',
      labelNames: ['type'],
      known: { type: LEASE_EVENT_TYPES },
    }),
    acquireRetries: counterOn(registry, {
      name: 'weft_lease_acquire_retries_total',
      help: 'Subnet creations lost to another node and retried.',
    }),
    watchResyncs: counterOn(registry, {
      name: 'weft_lease_watch_resyncs_total',
      help: 'Times the lease watch re-listed the store (compaction, reconnect).',
      labelNames: ['store'],
    }),
    acquireDuration: histogramOn(registry, {
      name: 'weft_lease_acquire_duration_seconds',
      help: 'How long acquiring our lease took, lost races and retries included.',
    }),
    renewDuration: histogramOn(registry, {
      name: 'weft_lease_renew_duration_seconds',
      help: 'How long each renewal of our lease took (failed ones included).',
    }),
    storeRequests: histogramOn(registry, {
      name: 'weft_store_request_duration_seconds',
      help: 'Requests to the lease store by store and operation (etcd and embedded: the Registry calls; kube: the API calls), failed ones included.',
      labelNames: ['store', 'operation'],
    }),
  };
}

/**
 * Exports the `store`-labelled series of the daemon's one store at 0: malformed leases, watch
 * re-lists and every request operation (called once the store is chosen).
 */
export function exportStore(m: LeaseMetrics, store: Store): void {
  m.malformed.inc({ store }, 0);
  m.watchResyncs.inc({ store }, 0);
  const ops: readonly string[] = store === 'kube' ? KUBE_OPERATIONS : REGISTRY_OPERATIONS;
  for (const operation of ops) m.storeRequests.zero({ store, operation });
}

/**
 * `target` with its `operations` (async methods) timed into `weft_store_request_duration_seconds`
 * as `{store, operation}`; every other property is the target's own. `this` stays the target
 * (its #private fields work).
 */
export function timedStore<T extends object>(
  target: T,
  store: Store,
  operations: readonly string[],
  m: LeaseMetrics,
): T {
  exportStore(m, store);
  const timed = new Set(operations);
  return new Proxy(target, {
    get(t, prop) {
      const v: unknown = Reflect.get(t, prop, t);
      if (typeof v !== 'function') return v;
      const fn = v as (...args: unknown[]) => unknown;
      if (typeof prop !== 'string' || !timed.has(prop)) return fn.bind(t);
      return (...args: unknown[]) => {
        const end = m.storeRequests.startTimer({ store, operation: prop });
        const r = fn.apply(t, args);
        if (r instanceof Promise) return r.finally(() => end());
        end();
        return r;
      };
    },
  });
}

/**
 * prom-client's gauges named like counters (`promtool check metrics`: "non-counter metrics
 * should not have _total suffix"); `sum(nodejs_active_handles)` etc. give the same totals.
 */
export const DROPPED_DEFAULT_METRICS = [
  'nodejs_active_handles_total',
  'nodejs_active_requests_total',
  'nodejs_active_resources_total',
] as const;

export function createDaemonMetrics(): DaemonMetrics {
  const registry = new Registry();
  collectDefaultMetrics({
    register: registry,
    eventLoopMonitoringPrecision: EVENT_LOOP_MONITORING_PRECISION_MS,
  });
  for (const name of DROPPED_DEFAULT_METRICS) registry.removeSingleMetric(name);
  gaugeOn(registry, {
    name: 'weft_build_info',
    help: 'Build information; the value is always 1.',
    labelNames: ['version', 'node'],
  }).set({ version: VERSION, node: process.version }, 1);
  const ready = gaugeOn(registry, {
    name: 'weft_ready',
    help: '1 once the lease is held, subnet.env written and the backend running.',
  });
  return { registry, lease: createLeaseMetrics(registry), ready };
}
