/**
 * Which packet engine runs: the one place that decides it (issue #30.1). Two steps, both here:
 *
 *   chooseEngine(ask)      → before anything starts: `auto` resolved (native, or bpf when the
 *                            caller says it has no kernel device to do better than), the framing
 *                            checked against the engine (ENGINE_FORMATS), the addon probed for
 *                            the engines that need it; a refusal is an error naming the way out
 *   startChosen(opts, s)   → the start: bpf falls back to native where its programs cannot
 *                            load, probe or attach here, or do not serve the framing (one warn
 *                            line, with the reason); any other engine first removes what a bpf
 *                            engine left pinned on the TUN, so no earlier program goes on
 *                            forwarding in front of it with an old peer table
 *
 * Both take their effects (the addon probe, the engine starters) as arguments, so the decision
 * table is tested with fakes (test/unit/dataplane/choose-engine.test.ts).
 */
import { WeftError, errorMessage } from '../common/errors.js';
import { type Logger, logger } from '../common/log.js';
import { loadNative } from '../common/native.js';
import type { Dataplane, DataplaneEngine, DataplaneFormat, DataplaneOptions } from './engine.js';

/** What --dataplane-engine takes: an engine, or `auto` (see chooseEngine). */
export const ENGINE_REQUESTS = ['auto', 'native', 'bpf', 'js'] as const;
export type EngineRequest = (typeof ENGINE_REQUESTS)[number];

/**
 * The framings each engine serves. native: all (IPIP on raw IPPROTO_IPIP sockets). bpf: udp,
 * vxlan and IPIP (the native engine under it keeps the sockets as the slow path), on IPv4, IPv6
 * and dual-stack underlays alike (IPIP: IPv4, as flannel's), not WireGuard
 * (its programs have no such framing; asked for it, the native engine runs). js: not IPIP (Node
 * has no raw sockets) nor WireGuard (no crypto per packet in JS); asked for one, refused.
 */
export const ENGINE_FORMATS: Readonly<Record<DataplaneEngine, readonly DataplaneFormat[]>> =
  Object.freeze({
    native: ['udp', 'vxlan', 'ipip', 'wireguard'],
    bpf: ['udp', 'vxlan', 'ipip'],
    js: ['udp', 'vxlan'],
  });

export interface EngineAsk {
  /** --dataplane-engine. */
  readonly requested: EngineRequest;
  readonly format: DataplaneFormat;
  /** Who asks, as messages name it: the backend type (`udp`, `vxlan`, `ipip`). */
  readonly who: string;
  /**
   * The engine `auto` means: native (the default), or bpf where the caller stands in for a
   * kernel device this node lacks ("Dataplane": "auto" without the kernel module: kernel speed
   * without the module) and bpf serves the framing (else native); bpf itself falls back to
   * native where its programs cannot run.
   */
  readonly autoPrefers?: 'native' | 'bpf';
}

export interface ChooseEngineDeps {
  // (default: the real addon, common/native.ts loadNative)
  /** Loads the native addon; throws (with the reason) when it cannot. */
  readonly probeAddon: () => void;
}

/**
 * The engine to start for `ask`, or a WeftError: WEFT_ERR_BACKEND_UNSUPPORTED for js with a
 * framing it cannot send, WEFT_ERR_NATIVE_UNAVAILABLE when native or bpf is wanted and the addon
 * does not load (naming --dataplane-engine=js as the way out).
 */
export function chooseEngine(
  ask: EngineAsk,
  deps: ChooseEngineDeps = { probeAddon: loadNative },
): DataplaneEngine {
  // auto: the preferred engine where it serves the framing, else native
  const preferred = ask.autoPrefers ?? 'native';
  const engine: DataplaneEngine =
    ask.requested !== 'auto'
      ? ask.requested
      : ENGINE_FORMATS[preferred].includes(ask.format)
        ? preferred
        : 'native';
  if (engine === 'js') {
    if (!ENGINE_FORMATS.js.includes(ask.format)) {
      throw new WeftError(
        'WEFT_ERR_BACKEND_UNSUPPORTED',
        ask.format === 'wireguard'
          ? `${ask.who}: --dataplane-engine=js has no WireGuard framing; use native`
          : `${ask.who}: --dataplane-engine=js cannot send ${ask.format.toUpperCase()} (Node has no raw sockets); use native`,
      );
    }
    return engine;
  }
  try {
    deps.probeAddon();
  } catch (err) {
    throw new WeftError(
      'WEFT_ERR_NATIVE_UNAVAILABLE',
      `${ask.who}: the native dataplane engine cannot run (${errorMessage(err)}); ` +
        'start with --dataplane-engine=js to use the js engine instead',
      { cause: err },
    );
  }
  return engine;
}

/** How each engine starts, and how a bpf engine's pins go (index.ts passes the real ones). */
export interface EngineStarters {
  readonly native: (o: DataplaneOptions) => Promise<Dataplane>;
  readonly bpf: (o: DataplaneOptions) => Promise<Dataplane>;
  readonly js: (o: DataplaneOptions) => Promise<Dataplane>;
  readonly removeBpfPins: (tunName: string, log: Logger) => void;
}

function bpfUnavailable(why: string): WeftError {
  return new WeftError('WEFT_ERR_BPF_UNAVAILABLE', `bpf engine unavailable (${why})`);
}

/**
 * Starts the engine `opts.engine` names (as chooseEngine chose it). `bpf` falls back to
 * `native` when it throws WEFT_ERR_BPF_UNAVAILABLE or does not serve the framing (logged once,
 * with the reason); the result's `engine` says which runs.
 */
export async function startChosen(opts: DataplaneOptions, s: EngineStarters): Promise<Dataplane> {
  const log = opts.log ?? logger('dataplane');
  if (opts.engine === 'js') {
    s.removeBpfPins(opts.tunName, log);
    return s.js(opts);
  }
  if (opts.engine === 'bpf') {
    try {
      if (!ENGINE_FORMATS.bpf.includes(opts.format)) {
        throw bpfUnavailable(`its programs have no ${opts.format.toUpperCase()} framing`);
      }
      return await s.bpf(opts);
    } catch (err) {
      if (!(err instanceof WeftError) || err.code !== 'WEFT_ERR_BPF_UNAVAILABLE') throw err;
      log.warn(
        { err: errorMessage(err), code: err.code },
        'bpf engine unavailable; the native engine runs instead',
      );
    }
  }
  s.removeBpfPins(opts.tunName, log);
  return s.native({ ...opts, engine: 'native' });
}
