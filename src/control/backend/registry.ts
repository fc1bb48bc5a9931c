/**
 * Backends by type name, as flannel registers them: each backend's one spec (backend.ts
 * BackendSpec: factory, Backend-block parser, options, egress TAP, userspace fallback), listed
 * once here. The only module that knows every backend: backends never import it (a kernel
 * backend receives its userspace fallback's factory from here). options.ts and egress-tap.ts
 * read their answers from these specs.
 */
import { WeftError } from '../../common/errors.js';
import type { BackendFactory, BackendSpec } from './backend.js';
import type { BackendConfig } from '../config/net-config.js';
import { ALLOC_SPEC } from './alloc.js';
import { EXTENSION_SPEC } from './extension.js';
import { HOST_GW_SPEC } from './host-gw.js';
import { IPIP_SPEC } from './ipip.js';
import { IPIP_USERSPACE_SPEC } from './ipip-userspace.js';
import { UDP_SPEC } from './udp.js';
import { VXLAN_SPEC } from './vxlan.js';
import { VXLAN_USERSPACE_SPEC } from './vxlan-userspace.js';
import { WIREGUARD_SPEC } from './wireguard.js';

/** A registration: a spec, or a factory a test registered under a new name (options unknown). */
type Registered = Omit<BackendSpec, 'options'> & { readonly options: readonly string[] | null };

const specs = new Map<string, Registered>(
  [
    ALLOC_SPEC,
    HOST_GW_SPEC,
    VXLAN_SPEC,
    UDP_SPEC,
    IPIP_SPEC,
    VXLAN_USERSPACE_SPEC,
    IPIP_USERSPACE_SPEC,
    WIREGUARD_SPEC,
    EXTENSION_SPEC,
  ].map((s) => [s.type, s]),
);

/**
 * Replaces the factory of `type` (the rest of its spec stays), or registers a new type with
 * only a factory (tests).
 */
export function registerBackend(type: string, factory: BackendFactory): void {
  const create: BackendSpec['create'] = (ctx, handover) => factory(ctx, handover);
  specs.set(type, { ...(specs.get(type) ?? { type, options: null }), create });
}

export function backendFactory(type: string): BackendFactory {
  const spec = specs.get(type.toLowerCase());
  if (!spec) {
    throw new WeftError(
      'WEFT_ERR_BACKEND_UNSUPPORTED',
      `Backend.Type: unknown backend "${type}" (known: ${[...specs.keys()].join(', ')})`,
    );
  }
  // The fallback's factory is looked up per call, so registerBackend can replace it.
  return (ctx, handover) =>
    spec.create(ctx, handover, spec.fallback ? lookUp(spec.fallback) : null);
}

function lookUp(type: string): BackendFactory | null {
  return specs.has(type) ? backendFactory(type) : null;
}

/**
 * The daemon's check of a Backend block (the type is known, its options parse), without
 * creating anything: `weft config set` refuses what every daemon would refuse.
 */
export function checkBackendConfig(backend: BackendConfig): void {
  backendFactory(backend.type);
  specs.get(backend.type.toLowerCase())?.parseConfig?.(backend.raw);
}

export function knownBackends(): string[] {
  return [...specs.keys()];
}

/** The registered specs with their options known (not a test's bare factory). */
export function backendSpecs(): BackendSpec[] {
  return [...specs.values()].filter((s): s is BackendSpec => s.options !== null);
}

/** The spec of `type` (lower case), when it is registered with one. */
export function backendSpec(type: string): BackendSpec | null {
  const s = specs.get(type);
  return s && s.options !== null ? (s as BackendSpec) : null;
}
