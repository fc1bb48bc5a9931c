/**
 * `weft cni` / `bin/weft-cni`: the CNI plugin, a flannel-compatible meta-plugin. It reads the
 * node's subnet.env, renders a delegate config (bridge + host-local by default; delegate.ts),
 * caches it per container and runs the delegate; DEL replays the cache. Configs written for
 * `"type": "flannel"` work as they are with `"type": "weft"`.
 *
 *   runtime ──CNI_COMMAND=ADD, config──▶ weft-cni ──▶ bridge ──▶ host-local
 *                                          │ reads /run/flannel/subnet.env (weft daemon writes it)
 *                                          └ caches <dataDir>/<containerID> for DEL
 *
 * Protocol (CNI spec 1.0, libcni's skel order): env checked first (code 4), then stdin decoded
 * (6), the config checked (7) and its version (1); every failure is a CNI error object on
 * stdout and exit 1. Nothing else is ever written to stdout; logs go to stderr.
 */
import { readFile } from 'node:fs/promises';
import { errorMessage } from '../../common/errors.js';
import { logger } from '../../common/log.js';
import { readCniArgs, type CniArgs, type CniEnv } from './cni-args.js';
import {
  checkVersion,
  CURRENT_VERSION,
  isObject,
  parseCniConfig,
  SUPPORTED_VERSIONS,
  versionAtLeast,
  type CniConfig,
} from './cni-config.js';
import { CNI_ERR, CniError, isCniError } from './cni-error.js';
import { loadDelegate, removeDelegate, saveDelegate } from './cache.js';
import {
  renderDelegate,
  serializeDelegate,
  subnetEnvForCni,
  type CniSubnetEnv,
} from './delegate.js';
import { invokeDelegate } from './invoke.js';

const log = logger('cni');

export interface CniOutput {
  write(chunk: string): unknown;
}

export type CniInput = string | Buffer | AsyncIterable<string | Buffer>;

async function readAll(input: CniInput): Promise<string> {
  if (typeof input === 'string') return input;
  if (Buffer.isBuffer(input)) return input.toString('utf8');
  const parts: Buffer[] = [];
  for await (const c of input) parts.push(typeof c === 'string' ? Buffer.from(c) : c);
  return Buffer.concat(parts).toString('utf8');
}

async function loadSubnetEnv(path: string): Promise<CniSubnetEnv> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') {
      throw new CniError(
        CNI_ERR.TRY_AGAIN_LATER,
        `${path} does not exist (missing FLANNEL_NETWORK, FLANNEL_SUBNET, FLANNEL_MTU, FLANNEL_IPMASQ)`,
        'the node agent writes this file once it holds a subnet lease: is `weft daemon` (or flanneld) running and ready on this node? (subnetFile in the CNI config names another path)',
      );
    }
    throw new CniError(CNI_ERR.IO_FAILURE, `read ${path}: ${errorMessage(err)}`, '', {
      cause: err,
    });
  }
  return subnetEnvForCni(text, path);
}

/** The config's cniVersion, for the error object, even when the rest of the config is bad. */
function peekVersion(text: string): string | null {
  try {
    const v: unknown = JSON.parse(text);
    return isObject(v) && typeof v.cniVersion === 'string' && v.cniVersion !== ''
      ? v.cniVersion
      : null;
  } catch {
    return null;
  }
}

/** A cached delegate config: its text and the plugin type to run. Null when unusable. */
function cachedType(text: string): string | null {
  try {
    const v: unknown = JSON.parse(text);
    return isObject(v) && typeof v.type === 'string' && v.type !== '' ? v.type : null;
  } catch {
    return null;
  }
}

async function cmdAdd(args: CniArgs, conf: CniConfig, env: CniEnv, out: CniOutput): Promise<void> {
  const subnetEnv = await loadSubnetEnv(conf.subnetFile);
  const delegate = renderDelegate(conf, subnetEnv);
  const text = serializeDelegate(delegate);
  log.debug({ containerId: args.containerId, delegate: text }, 'cni add: rendered delegate');
  await saveDelegate(conf.dataDir, args.containerId, text);
  const result = await invokeDelegate('ADD', delegate.type as string, text, env, args.path);
  try {
    JSON.parse(result);
  } catch (err) {
    throw new CniError(
      CNI_ERR.DECODING_FAILURE,
      `delegate ${String(delegate.type)} ADD printed no JSON result`,
      result.slice(0, 1000),
      { cause: err },
    );
  }
  out.write(result.endsWith('\n') ? result : result + '\n');
}

async function cmdDel(args: CniArgs, conf: CniConfig, env: CniEnv): Promise<void> {
  const text = await loadDelegate(conf.dataDir, args.containerId);
  if (text === null) {
    // Never ADDed here, or already deleted: the spec says DEL must then succeed.
    log.debug({ containerId: args.containerId }, 'cni del: no cached delegate');
    return;
  }
  const type = cachedType(text);
  if (type === null) {
    // Nothing can replay it; keeping it would only fail every later DEL the same way.
    log.warn(
      { containerId: args.containerId, dataDir: conf.dataDir },
      'cni del: cached delegate unreadable, removed',
    );
    await removeDelegate(conf.dataDir, args.containerId);
    return;
  }
  // On failure the cache stays, so the runtime's retry replays the same config.
  await invokeDelegate('DEL', type, text, env, args.path);
  await removeDelegate(conf.dataDir, args.containerId);
}

async function cmdCheck(args: CniArgs, conf: CniConfig, env: CniEnv): Promise<void> {
  if (!versionAtLeast(conf.cniVersion, '0.4.0')) {
    throw new CniError(CNI_ERR.INCOMPATIBLE_VERSION, 'config version does not allow CHECK');
  }
  const text = await loadDelegate(conf.dataDir, args.containerId);
  if (text === null) {
    throw new CniError(
      CNI_ERR.UNKNOWN_CONTAINER,
      `no cached delegate for container ${args.containerId} in ${conf.dataDir}: it was never added on this node`,
    );
  }
  const type = cachedType(text);
  if (type === null) {
    throw new CniError(
      CNI_ERR.DECODING_FAILURE,
      `cached delegate for container ${args.containerId} is unreadable`,
    );
  }
  // The delegate checks against the result the runtime recorded, which only the runtime has.
  const cached = JSON.parse(text) as Record<string, unknown>;
  if (conf.prevResult !== undefined) cached.prevResult = conf.prevResult;
  await invokeDelegate('CHECK', type, JSON.stringify(cached), env, args.path);
}

/**
 * Runs one CNI command. `env` is the process environment (CNI_* variables; it is also what the
 * delegate gets), `stdin` the config, `stdout` receives the result or the error object.
 * Returns the exit code: 0, or 1 after printing a CNI error.
 */
export async function runCni(env: CniEnv, stdin: CniInput, stdout: CniOutput): Promise<number> {
  let cniVersion = CURRENT_VERSION;
  try {
    if (!env.CNI_COMMAND) {
      // libcni's skel: a human running the binary by hand gets told what it is.
      process.stderr.write(
        `CNI plugin weft (flannel-compatible)\nCNI protocol versions supported: ${SUPPORTED_VERSIONS.join(', ')}\n`,
      );
      return 0;
    }
    const args = readCniArgs(env);
    if (args.command === 'VERSION') {
      stdout.write(
        JSON.stringify({ cniVersion: CURRENT_VERSION, supportedVersions: SUPPORTED_VERSIONS }) +
          '\n',
      );
      return 0;
    }
    let text: string;
    try {
      text = await readAll(stdin);
    } catch (err) {
      throw new CniError(CNI_ERR.IO_FAILURE, `error reading from stdin: ${errorMessage(err)}`, '', {
        cause: err,
      });
    }
    cniVersion = peekVersion(text) ?? cniVersion;
    const conf = parseCniConfig(text);
    checkVersion(conf.cniVersion);
    switch (args.command) {
      case 'ADD':
        await cmdAdd(args, conf, env, stdout);
        break;
      case 'DEL':
        await cmdDel(args, conf, env);
        break;
      case 'CHECK':
        await cmdCheck(args, conf, env);
        break;
    }
    return 0;
  } catch (err) {
    const e = isCniError(err)
      ? err
      : new CniError(CNI_ERR.INTERNAL, errorMessage(err), '', { cause: err });
    log.error(
      {
        code: e.code,
        cniCode: e.cniCode,
        command: env.CNI_COMMAND,
        containerId: env.CNI_CONTAINERID,
      },
      e.message,
    );
    stdout.write(JSON.stringify(e.toResult(cniVersion)) + '\n');
    return 1;
  }
}
