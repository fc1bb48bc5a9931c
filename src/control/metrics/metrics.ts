/**
 * The daemon's Prometheus registry (common/prometheus.ts): process_* families plus weft's own metrics.
 * Names follow `weft_<subsystem>_<what>_<unit>`; counters end in `_total`; label values come from
 * small fixed sets only. Backends and the dataplane add theirs to the same registry.
 */
import { VERSION } from '../version.js';
import { registerProcessMetrics } from './process-metrics.js';
import { Counter, Gauge, Registry } from '../../common/prometheus.js';

export interface LeaseMetrics {
  readonly malformed: Counter<'store'>;
  readonly renewals: Counter<'result'>;
  readonly expiration: Gauge;
  readonly peers: Gauge;
  readonly events: Counter<'type'>;
  readonly acquireRetries: Counter;
  readonly watchResyncs: Counter<'store'>;
}

export interface DaemonMetrics {
  readonly registry: Registry;
  readonly lease: LeaseMetrics;
  readonly ready: Gauge;
}

/** Lease metrics on a registry of their own (for unit tests and the store-only commands). */
export function createLeaseMetrics(registry: Registry = new Registry()): LeaseMetrics {
  return {
    malformed: new Counter({
      name: 'weft_lease_malformed_total',
      help: 'Leases from other nodes skipped because their key or value could not be decoded.',
      labelNames: ['store'],
      registers: [registry],
    }),
    renewals: new Counter({
      name: 'weft_lease_renewals_total',
      help: 'Renewals of our own lease, by result (ok, error).',
      labelNames: ['result'],
      registers: [registry],
    }),
    expiration: new Gauge({
      name: 'weft_lease_expiration_timestamp_seconds',
      help: 'When our lease lapses unless renewed (Unix time); 0 for a reservation.',
      registers: [registry],
    }),
    peers: new Gauge({
      name: 'weft_lease_peers',
      help: 'Leases of other nodes currently known.',
      registers: [registry],
    }),
    events: new Counter({
      name: 'weft_lease_events_total',
      help: 'Peer lease events delivered to the backend, by type (added, removed).',
      labelNames: ['type'],
      registers: [registry],
    }),
    acquireRetries: new Counter({
      name: 'weft_lease_acquire_retries_total',
      help: 'Subnet creations lost to another node and retried.',
      registers: [registry],
    }),
    watchResyncs: new Counter({
      name: 'weft_lease_watch_resyncs_total',
      help: 'Times the lease watch re-listed the store (compaction, reconnect).',
      labelNames: ['store'],
      registers: [registry],
    }),
  };
}

export function createDaemonMetrics(): DaemonMetrics {
  const registry = new Registry();
  registerProcessMetrics(registry);
  new Gauge({
    name: 'weft_build_info',
    help: 'Build information; the value is always 1.',
    labelNames: ['version', 'node'],
    registers: [registry],
  }).set({ version: VERSION, node: process.version }, 1);
  const ready = new Gauge({
    name: 'weft_ready',
    help: '1 once the lease is held, subnet.env written and the backend running.',
    registers: [registry],
  });
  return { registry, lease: createLeaseMetrics(registry), ready };
}
