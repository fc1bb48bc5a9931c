/**
 * The CNI environment: what the runtime passes in CNI_* variables, checked the way libcni's
 * skel checks it (required variables per command, container ID and interface name rules), so
 * weft rejects exactly what other plugins reject, with the same codes.
 */
import { CNI_ERR, CniError } from './cni-error.js';

export type CniCommand = 'ADD' | 'DEL' | 'CHECK' | 'VERSION';

export interface CniArgs {
  command: CniCommand;
  containerId: string;
  netns: string;
  ifName: string;
  /** CNI_ARGS, passed through to the delegate untouched */
  args: string;
  /** CNI_PATH split on ':' (empty entries dropped) */
  path: string[];
}

const COMMANDS: readonly CniCommand[] = ['ADD', 'DEL', 'CHECK', 'VERSION'];

const REQUIRED: Readonly<Record<string, readonly CniCommand[]>> = {
  CNI_CONTAINERID: ['ADD', 'DEL', 'CHECK'],
  CNI_NETNS: ['ADD', 'CHECK'],
  CNI_IFNAME: ['ADD', 'DEL', 'CHECK'],
  CNI_PATH: ['ADD', 'DEL', 'CHECK'],
};

/** libcni's rule for container IDs and network names; it also keeps the cache path inside dataDir. */
export const CNI_NAME_RE = /^[a-zA-Z0-9][a-zA-Z0-9_.-]*$/;

/** Linux IFNAMSIZ − 1 */
export const MAX_IFNAME_LEN = 15;

export function validateIfName(name: string): string | null {
  if (name.length > MAX_IFNAME_LEN) return `interface name is too long (max ${MAX_IFNAME_LEN})`;
  if (name === '.' || name === '..') return 'interface name is . or ..';
  if (/[/:\s]/.test(name)) return 'interface name contains / or : or whitespace';
  return null;
}

export type CniEnv = Readonly<Record<string, string | undefined>>;

/** Reads and checks the CNI_* variables; throws a CniError with code 4 naming the culprits. */
export function readCniArgs(env: CniEnv): CniArgs {
  const raw = env.CNI_COMMAND ?? '';
  const missing: string[] = [];
  if (!raw) missing.push('CNI_COMMAND');
  const command = raw as CniCommand;
  for (const [name, cmds] of Object.entries(REQUIRED)) {
    if (!env[name] && cmds.includes(command)) missing.push(name);
  }
  if (missing.length > 0) {
    throw new CniError(
      CNI_ERR.INVALID_ENV,
      `required env variables [${missing.join(',')}] missing`,
    );
  }
  if (!COMMANDS.includes(command)) {
    throw new CniError(CNI_ERR.INVALID_ENV, `unknown CNI_COMMAND: ${raw}`);
  }
  const args: CniArgs = {
    command,
    containerId: env.CNI_CONTAINERID ?? '',
    netns: env.CNI_NETNS ?? '',
    ifName: env.CNI_IFNAME ?? '',
    args: env.CNI_ARGS ?? '',
    path: (env.CNI_PATH ?? '').split(':').filter((p) => p !== ''),
  };
  if (command !== 'VERSION') {
    if (!CNI_NAME_RE.test(args.containerId)) {
      throw new CniError(
        CNI_ERR.INVALID_ENV,
        `CNI_CONTAINERID: invalid characters in container ID ${JSON.stringify(args.containerId)}`,
      );
    }
    const bad = validateIfName(args.ifName);
    if (bad) throw new CniError(CNI_ERR.INVALID_ENV, `CNI_IFNAME: ${bad}`);
  }
  return args;
}
