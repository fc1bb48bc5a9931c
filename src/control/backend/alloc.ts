/**
 * flannel's `alloc` backend: it holds a lease and nothing else. Useful when another component
 * programs the network, and the simplest complete backend for the daemon's own tests.
 */
import type { Backend, BackendContext, BackendSpec } from './backend.js';
import type { LeaseEvent } from '../lease/types.js';

export function createAllocBackend(ctx: BackendContext): Backend {
  return {
    type: 'alloc',
    async prepare() {
      return { attrs: { backendType: '' }, mtu: ctx.extIface.mtu };
    },
    async start() {},
    async run(events: AsyncIterable<LeaseEvent[]>) {
      // Drain: peers change nothing for alloc, but the batches are consumed so the watch flows.
      for await (const _batch of events) {
        /* nothing to program */
      }
    },
    async close() {},
  };
}

/** alloc's one registration (registry.ts): no options. */
export const ALLOC_SPEC: BackendSpec = { type: 'alloc', create: createAllocBackend, options: [] };
