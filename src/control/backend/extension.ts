/**
 * flannel's `extension` backend (pkg/backend/extension): the network is programmed by commands
 * the operator names in the Backend block; weft runs them at the same moments, with the same
 * environment and stdin as flannel.
 *
 *   PreStartupCommand    prepare, before the lease: its output (stdout + stderr, trimmed)
 *                        becomes our lease's BackendData, a JSON string (none when unset)
 *   PostStartupCommand   start, once the lease is held: env NETWORK, SUBNET, IPV6SUBNET,
 *                        PUBLIC_IP, PUBLIC_IPV6
 *   SubnetAddCommand     per peer lease added or changed (BackendType "extension" only):
 *                        env SUBNET, PUBLIC_IP (+ IPV6SUBNET, PUBLIC_IPV6: weft's own), stdin
 *                        the peer's BackendData string and a newline
 *   SubnetRemoveCommand  per peer lease removed, the same environment and stdin
 *
 * No shell, as flannel since v0.28.2: the string is split on whitespace into argv, each `$NAME`
 * or `${NAME}` in it is replaced by that variable (the daemon's environment plus the ones
 * above; unset → empty), and argv[0] is executed directly, so a variable's value is one
 * argument whatever it holds. Every command's stdin ends with a newline (empty for the two
 * startup commands). The pod MTU is the interface's (no encapsulation of weft's own).
 *
 * What weft adds: a startup command that fails (or does not end within COMMAND_TIMEOUT_MS)
 * stops the daemon with its exit code and output; an add/remove command that fails is logged
 * with its output and the next event goes on (as flannel); one that hangs is killed at the
 * timeout, and the daemon's stop kills the command it waits for. A peer lease whose BackendData
 * is not a JSON string is skipped, logged once and counted (weft_backend_peer_leases_skipped_total).
 * Values absent in a lease (no
 * IPv6, or no IPv4) are empty strings where flannel prints Go's zero values.
 */
import { spawn } from 'node:child_process';
import { WeftError, configError, errorMessage } from '../../common/errors.js';
import { formatCIDR } from '../../common/ip.js';
import { jsonField } from '../../common/json-field.js';
import { LogOnce } from '../../common/log.js';
import type { Lease, LeaseEvent } from '../lease/types.js';
import type { Backend, BackendContext, BackendSpec, PreparedBackend } from './backend.js';
import { clusterNetwork, kernelMetrics } from './kernel-common.js';

export const EXTENSION = 'extension';

/** The four commands, as flannel names them in the Backend block. */
export const EXTENSION_COMMANDS = [
  'PreStartupCommand',
  'PostStartupCommand',
  'SubnetAddCommand',
  'SubnetRemoveCommand',
] as const;
export type ExtensionCommand = (typeof EXTENSION_COMMANDS)[number];

/** How long one command may run before it is killed. */
export const COMMAND_TIMEOUT_MS = 60_000;
/** Output kept per command (the rest is dropped): BackendData travels in every peer's watch. */
export const MAX_OUTPUT_BYTES = 64 * 1024;

/** Each command's argv template (whitespace-split, not yet expanded); null when unset or "". */
export type ExtensionConfig = Readonly<Record<ExtensionCommand, readonly string[] | null>>;

/** Parses the extension Backend block (names matched case-insensitively, as Go's JSON does). */
export function parseExtensionConfig(raw: Readonly<Record<string, unknown>>): ExtensionConfig {
  const out = {} as Record<ExtensionCommand, readonly string[] | null>;
  for (const name of EXTENSION_COMMANDS) {
    const v = jsonField(raw, name);
    if (v === undefined || v === null) {
      out[name] = null;
      continue;
    }
    if (typeof v !== 'string') {
      throw configError(
        `Backend.${name}`,
        'must be a string: a command and its arguments, split on whitespace (no shell)',
      );
    }
    const argv = splitFields(v);
    out[name] = argv.length > 0 ? Object.freeze(argv) : null;
  }
  return Object.freeze(out);
}

/** Go's strings.Fields: the words between runs of whitespace. */
export function splitFields(s: string): string[] {
  return s.split(/\s+/u).filter((w) => w !== '');
}

const NAME_CHAR = /[A-Za-z0-9_]/;
/** Go's os.Expand one-character names after `$`: shell specials and digits. */
const SPECIAL = /[*#$@!?\-0-9]/;

/**
 * Go's os.Expand over one argument: `${NAME}` and `$NAME` (letters, digits, underscore; or one
 * shell special character) are replaced by `lookup(NAME)`; a `$` followed by no name stays.
 */
export function expandVars(arg: string, lookup: (name: string) => string): string {
  let out = '';
  let i = 0;
  while (i < arg.length) {
    const c = arg[i]!;
    if (c !== '$' || i + 1 >= arg.length) {
      out += c;
      i++;
      continue;
    }
    const next = arg[i + 1]!;
    if (next === '{') {
      const end = arg.indexOf('}', i + 2);
      if (end === -1 || end === i + 2) {
        // bad syntax: os.Expand drops the "${" (no closing brace) or the empty "${}"
        i = end === -1 ? i + 2 : end + 1;
        continue;
      }
      out += lookup(arg.slice(i + 2, end));
      i = end + 1;
    } else if (SPECIAL.test(next)) {
      out += lookup(next);
      i += 2;
    } else if (NAME_CHAR.test(next)) {
      let j = i + 1;
      while (j < arg.length && NAME_CHAR.test(arg[j]!)) j++;
      out += lookup(arg.slice(i + 1, j));
      i = j;
    } else {
      out += c;
      i++;
    }
  }
  return out;
}

export interface CommandResult {
  /** Exit code; null when killed by a signal (or by the timeout). */
  readonly code: number | null;
  readonly signal: NodeJS.Signals | null;
  /** stdout and stderr as they came, trimmed (flannel's CombinedOutput, TrimSpace). */
  readonly output: string;
  readonly timedOut: boolean;
}

/**
 * Runs one command without a shell: argv expanded against the daemon's environment plus
 * `vars`, which the command also receives in its environment; `stdin` and a newline written
 * to it. Rejects only when the command cannot start (no such file, not executable).
 */
export function runCommand(
  argv: readonly string[],
  vars: Readonly<Record<string, string>>,
  stdin: string,
  opts: { signal?: AbortSignal; timeoutMs?: number } = {},
): Promise<CommandResult> {
  const env: Record<string, string | undefined> = { ...process.env, ...vars };
  const [file, ...args] = argv.map((a) => expandVars(a, (name) => env[name] ?? ''));
  return new Promise((resolve, reject) => {
    const child = spawn(file!, args, { env, stdio: ['pipe', 'pipe', 'pipe'] });
    const chunks: Buffer[] = [];
    let kept = 0;
    const collect = (d: Buffer) => {
      if (kept >= MAX_OUTPUT_BYTES) return;
      const part = d.subarray(0, MAX_OUTPUT_BYTES - kept);
      chunks.push(part);
      kept += part.length;
    };
    child.stdout.on('data', collect);
    child.stderr.on('data', collect);
    // a command that does not read its stdin closes the pipe: not an error
    child.stdin.on('error', () => undefined);
    child.stdin.end(`${stdin}\n`);
    let timedOut = false;
    const kill = () => child.kill('SIGKILL');
    const timer = setTimeout(() => {
      timedOut = true;
      kill();
    }, opts.timeoutMs ?? COMMAND_TIMEOUT_MS);
    opts.signal?.addEventListener('abort', kill, { once: true });
    const done = () => {
      clearTimeout(timer);
      opts.signal?.removeEventListener('abort', kill);
    };
    child.once('error', (err) => {
      done();
      reject(err);
    });
    child.once('close', (code, signal) => {
      done();
      resolve({
        code,
        signal,
        output: Buffer.concat(chunks).toString('utf8').trim(),
        timedOut,
      });
    });
  });
}

function describe(r: CommandResult): string {
  if (r.timedOut) return `did not end within ${COMMAND_TIMEOUT_MS / 1000} s`;
  return r.code === null ? `killed by ${r.signal}` : `exited ${r.code}`;
}

const cidrOrEmpty = (n: Lease['subnet']): string => (n ? formatCIDR(n) : '');

/** The environment of SubnetAddCommand / SubnetRemoveCommand for one peer lease. */
export function peerVars(lease: Lease): Record<string, string> {
  return {
    SUBNET: cidrOrEmpty(lease.subnet),
    PUBLIC_IP: lease.attrs.publicIP,
    IPV6SUBNET: cidrOrEmpty(lease.ipv6Subnet),
    PUBLIC_IPV6: lease.attrs.publicIPv6 ?? '',
  };
}

export function createExtensionBackend(ctx: BackendContext): Backend {
  const cfg = parseExtensionConfig(ctx.netConfig.backend.raw);
  const log = ctx.log;
  const skipped = new LogOnce();
  // a peer lease whose BackendData is unusable is counted as the other backends count theirs
  const skippedPeers = kernelMetrics(ctx.metrics).skipped;

  /** A startup command: its output, or a WEFT_ERR_BACKEND naming it when it fails. */
  const startup = async (
    name: ExtensionCommand,
    argv: readonly string[],
    vars: Record<string, string>,
  ): Promise<string> => {
    let r: CommandResult;
    try {
      r = await runCommand(argv, vars, '', { signal: ctx.signal });
    } catch (err) {
      throw new WeftError(
        'WEFT_ERR_BACKEND',
        `extension: Backend.${name} ${JSON.stringify(argv.join(' '))} cannot start: ${errorMessage(err)}`,
        { cause: err },
      );
    }
    if (r.code !== 0) {
      throw new WeftError(
        'WEFT_ERR_BACKEND',
        `extension: Backend.${name} ${JSON.stringify(argv.join(' '))} ${describe(r)}: ${r.output}`,
        { details: { command: name, code: r.code, output: r.output } },
      );
    }
    log.info({ command: name, output: r.output }, 'ran extension command');
    return r.output;
  };

  /** One peer event's command; failures are logged and the next event goes on. */
  const peerCommand = async (ev: LeaseEvent, signal: AbortSignal): Promise<void> => {
    const name: ExtensionCommand = ev.type === 'added' ? 'SubnetAddCommand' : 'SubnetRemoveCommand';
    const argv = cfg[name];
    const lease = ev.lease;
    if (lease.attrs.backendType !== EXTENSION) {
      if (skipped.first(`${lease.key}/type`))
        log.warn(
          { lease: lease.key, backendType: lease.attrs.backendType },
          'ignoring a peer lease that is not of type extension',
        );
      return;
    }
    if (!argv) return;
    const data = lease.attrs.backendData ?? '';
    if (typeof data !== 'string') {
      skippedPeers.inc();
      if (skipped.first(`${lease.key}/data`))
        log.error(
          { lease: lease.key, backendData: data },
          'skipping a peer lease: its BackendData is not a JSON string',
        );
      return;
    }
    const vars = peerVars(lease);
    try {
      const r = await runCommand(argv, vars, data, { signal });
      if (r.code === 0)
        log.info({ command: name, lease: lease.key, output: r.output }, 'ran extension command');
      else
        log.error(
          { command: name, lease: lease.key, output: r.output, code: r.code },
          `extension command ${describe(r)}`,
        );
    } catch (err) {
      log.error(
        { command: name, lease: lease.key, err: errorMessage(err) },
        'extension command cannot start',
      );
    }
  };

  return {
    type: EXTENSION,
    async prepare(): Promise<PreparedBackend> {
      const pre = cfg.PreStartupCommand;
      const data = pre ? await startup('PreStartupCommand', pre, {}) : undefined;
      return {
        attrs: { backendType: EXTENSION, ...(data === undefined ? {} : { backendData: data }) },
        mtu: ctx.extIface.mtu,
      };
    },
    async start(lease: Lease) {
      const post = cfg.PostStartupCommand;
      if (!post) return;
      const v4 = clusterNetwork(ctx.netConfig, 4);
      await startup('PostStartupCommand', post, {
        NETWORK: v4 ? formatCIDR(v4) : '',
        SUBNET: cidrOrEmpty(lease.subnet),
        IPV6SUBNET: cidrOrEmpty(lease.ipv6Subnet),
        PUBLIC_IP: lease.attrs.publicIP,
        PUBLIC_IPV6: lease.attrs.publicIPv6 ?? '',
      });
    },
    async run(events: AsyncIterable<LeaseEvent[]>, signal: AbortSignal) {
      // In order, one command at a time (as flannel): a remove never overtakes its add.
      for await (const batch of events) {
        for (const ev of batch) {
          if (signal.aborted) return;
          await peerCommand(ev, signal);
        }
      }
    },
    async close() {},
  };
}

/** extension's one registration (registry.ts): its options are the commands. */
export const EXTENSION_SPEC: BackendSpec = {
  type: EXTENSION,
  create: (ctx) => createExtensionBackend(ctx),
  parseConfig: parseExtensionConfig,
  options: EXTENSION_COMMANDS,
};
