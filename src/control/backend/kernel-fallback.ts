/**
 * The kernel → userspace handover of the backends with both dataplanes (vxlan, ipip), written
 * once. Backend option `Dataplane`:
 *
 *   "kernel"     the kernel backend, nothing else
 *   "userspace"  the userspace backend the spec names (BackendSpec.fallback, registry.ts)
 *   "auto"       the kernel backend; when its prepare finds the kernel module missing, it closes
 *                and the userspace backend runs instead, told so (Handover.autoPrefers = bpf: the
 *                dataplane's chooseEngine makes `--dataplane-engine=auto` the bpf engine where it
 *                serves the framing, so kernel speed without the module; native otherwise)
 *
 * The two copies this replaces had diverged (issue #30.2), resolved here so:
 * - the bpf preference: vxlan set it, ipip did not. Both hand it over now; whether bpf serves
 *   the framing is the dataplane's knowledge (ENGINE_FORMATS), not the backend's (it serves
 *   IPIP too since its programs frame it, so ipip without its module runs at kernel speed).
 * - a missing module: vxlan matched netlink errnos in its wrapper, ipip a marked error. One rule
 *   now: the kernel backend, which knows what its link kind answers, marks the error with
 *   `details.missing` (what is missing); the handover checks only that mark.
 */
import { WeftError, errorMessage, isWeftError } from '../../common/errors.js';
import type { Backend, BackendContext, BackendFactory } from './backend.js';

export type DataplaneChoice = 'kernel' | 'userspace' | 'auto';

/** Whether `err` is a kernel backend's "the kernel lacks my module" (details.missing). */
export function isMissingModule(err: unknown): boolean {
  return isWeftError(err) && typeof err.details.missing === 'string';
}

export interface KernelFallback {
  /** The backend type (`vxlan`), as logs and messages name it. */
  readonly type: string;
  /** The userspace backend's registered type (`vxlan-userspace`), for the message without it. */
  readonly userspaceType: string;
  /** The Backend block's `Dataplane`. */
  readonly dataplane: DataplaneChoice;
  /** Creates the kernel backend (not yet prepared). */
  readonly kernel: () => Backend;
  /** The userspace backend's factory (registry.ts passes it; null when it is not registered). */
  readonly userspace: BackendFactory | null;
}

function userspaceOf(ctx: BackendContext, f: KernelFallback, auto: boolean): Backend {
  if (!f.userspace) {
    throw new WeftError(
      'WEFT_ERR_BACKEND_UNSUPPORTED',
      `Backend.Dataplane: "userspace" needs the ${f.userspaceType} backend, which is not available in this build`,
    );
  }
  return f.userspace(ctx, auto ? { autoPrefers: 'bpf' } : undefined);
}

/** The backend `Dataplane` asks for (see the top of this file). */
export function kernelOrUserspace(ctx: BackendContext, f: KernelFallback): Backend {
  if (f.dataplane === 'userspace') return userspaceOf(ctx, f, false);
  const kernel = f.kernel();
  if (f.dataplane === 'kernel') return kernel;
  let impl: Backend = kernel;
  return {
    type: f.type,
    isReady: () => impl.isReady?.() ?? true,
    async prepare() {
      try {
        return await kernel.prepare();
      } catch (err) {
        if (!isMissingModule(err)) throw err;
        ctx.log.warn(
          { err: errorMessage(err) },
          `no kernel ${f.type}; using the userspace dataplane`,
        );
        await kernel.close();
        impl = userspaceOf(ctx, f, true);
        return impl.prepare();
      }
    },
    start: (lease) => impl.start(lease),
    run: (events, signal) => impl.run(events, signal),
    get snapshotParts() {
      return impl.snapshotParts ?? false;
    },
    close: (how) => impl.close(how),
  };
}
