/**
 * Backends by type name, as flannel registers them. The only module that knows every backend:
 * backends never import it (vxlan receives its userspace implementation from here).
 */
import { WeftError } from '../../common/errors.js';
import type { BackendFactory } from './backend.js';
import { createAllocBackend } from './alloc.js';
import { createHostGwBackend } from './host-gw.js';
import { VXLAN_USERSPACE, createVxlanBackend } from './vxlan.js';
import { createUdpBackend } from './udp.js';
import { createVxlanUserspaceBackend } from './vxlan-userspace.js';

const factories: Map<string, BackendFactory> = new Map<string, BackendFactory>([
  ['alloc', createAllocBackend],
  ['host-gw', (ctx) => createHostGwBackend(ctx)],
  // The userspace implementation is looked up per call so registerBackend can replace it.
  [
    'vxlan',
    (ctx) => createVxlanBackend(ctx, { userspace: factories.get(VXLAN_USERSPACE) ?? null }),
  ],
  ['udp', (ctx) => createUdpBackend(ctx)],
  [VXLAN_USERSPACE, (ctx) => createVxlanUserspaceBackend(ctx)],
]);

export function registerBackend(type: string, factory: BackendFactory): void {
  factories.set(type, factory);
}

export function backendFactory(type: string): BackendFactory {
  const f = factories.get(type.toLowerCase());
  if (!f) {
    throw new WeftError(
      'WEFT_ERR_BACKEND_UNSUPPORTED',
      `Backend.Type: unknown backend "${type}" (known: ${[...factories.keys()].join(', ')})`,
    );
  }
  return f;
}

export function knownBackends(): string[] {
  return [...factories.keys()];
}
