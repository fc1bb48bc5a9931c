/** Backends by type name, as flannel registers them. Each backend file adds itself here. */
import { WeftError } from '../../common/errors.js';
import type { BackendFactory } from './backend.js';
import { createAllocBackend } from './alloc.js';
import { createHostGwBackend } from './host-gw.js';
import { createVxlanBackend } from './vxlan.js';
import { createUdpBackend } from './udp.js';
import { createVxlanUserspaceBackend } from './vxlan-userspace.js';

const factories = new Map<string, BackendFactory>([
  ['alloc', createAllocBackend],
  ['host-gw', (ctx) => createHostGwBackend(ctx)],
  ['vxlan', (ctx) => createVxlanBackend(ctx)],
  ['udp', (ctx) => createUdpBackend(ctx)],
  ['vxlan-userspace', (ctx) => createVxlanUserspaceBackend(ctx)],
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
