/**
 * Backends by type name, as flannel registers them. The only module that knows every backend:
 * backends never import it (vxlan receives its userspace implementation from here).
 */
import { WeftError } from '../../common/errors.js';
import type { BackendFactory } from './backend.js';
import { createAllocBackend } from './alloc.js';
import { EXTENSION, createExtensionBackend, parseExtensionConfig } from './extension.js';
import { createHostGwBackend } from './host-gw.js';
import type { BackendConfig } from '../config/net-config.js';
import { IPIP_USERSPACE, createIpipBackend, parseIpipConfig } from './ipip.js';
import { createIpipUserspaceBackend } from './ipip-userspace.js';
import { VXLAN_USERSPACE, createVxlanBackend, parseVxlanConfig } from './vxlan.js';
import { createUdpBackend, parseUdpConfig } from './udp.js';
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
  ['ipip', (ctx) => createIpipBackend(ctx, { userspace: factories.get(IPIP_USERSPACE) ?? null })],
  [VXLAN_USERSPACE, (ctx) => createVxlanUserspaceBackend(ctx)],
  [IPIP_USERSPACE, (ctx) => createIpipUserspaceBackend(ctx)],
  [EXTENSION, (ctx) => createExtensionBackend(ctx)],
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

/** Each type's Backend-block parser: what its factory runs first, before it creates anything. */
const blockParsers = new Map<string, (raw: Readonly<Record<string, unknown>>) => unknown>([
  ['vxlan', parseVxlanConfig],
  [VXLAN_USERSPACE, parseVxlanConfig],
  ['udp', parseUdpConfig],
  ['ipip', parseIpipConfig],
  [IPIP_USERSPACE, parseIpipConfig],
  [EXTENSION, parseExtensionConfig],
]);

/**
 * The daemon's check of a Backend block (the type is known, its options parse), without
 * creating anything: `weft config set` refuses what every daemon would refuse.
 */
export function checkBackendConfig(backend: BackendConfig): void {
  backendFactory(backend.type);
  blockParsers.get(backend.type.toLowerCase())?.(backend.raw);
}

export function knownBackends(): string[] {
  return [...factories.keys()];
}
