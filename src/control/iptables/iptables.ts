/**
 * Keeps flannel's masquerade and forward rules in place (rules.ts has the exact lists):
 * applied with `iptables-restore --noflush` (ip6tables-restore for IPv6) at start — which also
 * removes stale rules of an earlier network or subnet — then re-checked with `iptables-save`
 * every --iptables-resync seconds and re-applied whole when anything differs.
 */
import { type ChildProcess, type SpawnOptions, spawn } from 'node:child_process';
import { WeftError, errorMessage } from '../../common/errors.js';
import type { Family } from '../../common/ip.js';
import { sleep } from '../../common/lifecycle.js';
import { LogOnce, type Logger, logger } from '../../common/log.js';
import type { NetConfig } from '../config/net-config.js';
import type { Lease } from '../lease/types.js';
import {
  type ChainRules,
  forwardRules,
  isInPlace,
  masqRules,
  parseSave,
  restoreScript,
} from './rules.js';

/** Runs a command with optional stdin and returns stdout (rejects with stderr on failure). */
export type CommandRunner = (
  cmd: string,
  args: readonly string[],
  input?: string,
) => Promise<string>;

/** How a command is started (node's `spawn`; tests pass one that fails). */
export type SpawnFn = (
  cmd: string,
  args: readonly string[],
  options: SpawnOptions,
) => Pick<ChildProcess, 'stdin' | 'stdout' | 'stderr' | 'on'>;

/**
 * A CommandRunner over `spawnFn`. A command that cannot be started (EMFILE under fd pressure,
 * ENOENT, …) rejects like one that fails: the 'error' handler is attached before anything else
 * touches the child, and a spawn that throws at once is caught, so neither can crash the process.
 */
export function commandRunner(spawnFn: SpawnFn = spawn): CommandRunner {
  return (cmd, args, input) =>
    new Promise((resolve, reject) => {
      const fail = (err: unknown): void =>
        reject(new Error(`${cmd}: cannot run: ${errorMessage(err)}`, { cause: err }));
      let p: ReturnType<SpawnFn>;
      try {
        p = spawnFn(cmd, args, {
          stdio: [input === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'],
        });
      } catch (err) {
        fail(err);
        return;
      }
      p.on('error', fail);
      let out = '';
      let err = '';
      p.stdout?.setEncoding('utf8').on('data', (d: string) => (out += d));
      p.stderr?.setEncoding('utf8').on('data', (d: string) => (err += d));
      p.on('close', (code) =>
        code === 0
          ? resolve(out)
          : reject(new Error(`${cmd} ${args.join(' ')}: ${err.trim() || `exit ${code}`}`)),
      );
      if (p.stdin) {
        // A command that exits without reading its input must not crash us with EPIPE.
        p.stdin.on('error', () => undefined);
        p.stdin.end(input);
      }
    });
}

export const runCommand: CommandRunner = commandRunner();

const RESOURCE_ERRNOS = new Set(['EMFILE', 'ENFILE', 'EAGAIN', 'ENOMEM']);

/** Whether `err` (or a cause of it) is a process that could not start for want of resources. */
export function isResourceShortage(err: unknown): boolean {
  for (let e = err; e instanceof Error; e = e.cause) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === 'string' && RESOURCE_ERRNOS.has(code)) return true;
  }
  return false;
}

export interface IptablesOptions {
  readonly ipMasq: boolean;
  readonly forwardRules: boolean;
  /** Seconds between checks (--iptables-resync, default 5). */
  readonly resyncSec: number;
  readonly run?: CommandRunner;
  readonly log?: Logger;
}

export interface FamilyRules {
  readonly family: Family;
  readonly chains: readonly ChainRules[];
}

/** The rules this node needs, per family its config enables. */
export function wantedRules(
  cfg: NetConfig,
  lease: Lease,
  o: Pick<IptablesOptions, 'ipMasq' | 'forwardRules'>,
): FamilyRules[] {
  const out: FamilyRules[] = [];
  const fams: Array<[Family, boolean]> = [
    [4, cfg.enableIPv4],
    [6, cfg.enableIPv6],
  ];
  for (const [family, on] of fams) {
    const fc = family === 4 ? cfg.ipv4 : cfg.ipv6;
    const subnet = family === 4 ? lease.subnet : lease.ipv6Subnet;
    if (!on || !fc || !subnet) continue;
    const chains: ChainRules[] = [];
    if (o.ipMasq) chains.push(masqRules(family, fc.network, subnet));
    if (o.forwardRules) chains.push(forwardRules(fc.network));
    if (chains.length > 0) out.push({ family, chains });
  }
  return out;
}

function tools(family: Family): { save: string; restore: string } {
  return family === 4
    ? { save: 'iptables-save', restore: 'iptables-restore' }
    : { save: 'ip6tables-save', restore: 'ip6tables-restore' };
}

export class IptablesKeeper {
  readonly #want: readonly FamilyRules[];
  readonly #run: CommandRunner;
  readonly #log: Logger;
  readonly #once = new LogOnce();
  /** How many times rules were (re)applied; tests and metrics read it. */
  applied = 0;

  constructor(want: readonly FamilyRules[], o: { run?: CommandRunner; log?: Logger } = {}) {
    this.#want = want;
    this.#run = o.run ?? runCommand;
    this.#log = o.log ?? logger('iptables');
  }

  /** Checks every table; re-applies a table's rules whole when any differs. Returns how many were. */
  async ensure(): Promise<number> {
    let n = 0;
    for (const fr of this.#want) {
      const t = tools(fr.family);
      const tables = new Set(fr.chains.map((c) => c.table));
      for (const table of tables) {
        const chains = fr.chains.filter((c) => c.table === table);
        let save: string;
        try {
          save = await this.#run(t.save, ['-t', table]);
        } catch (err) {
          throw new WeftError('WEFT_ERR_IPTABLES', `${t.save} -t ${table}: ${errorMessage(err)}`, {
            cause: err,
          });
        }
        const lines = parseSave(save).get(table) ?? [];
        const missing = chains.filter((c) => !isInPlace(lines, c));
        if (missing.length === 0) continue;
        const script = chains.map((c) => restoreScript(lines, c)).join('');
        try {
          await this.#run(t.restore, ['-w', '5', '--noflush'], script);
        } catch (err) {
          throw new WeftError(
            'WEFT_ERR_IPTABLES',
            `${t.restore} (${table}): ${errorMessage(err)}`,
            {
              cause: err,
            },
          );
        }
        n++;
        this.applied++;
        this.#log.info(
          { family: fr.family, table, chains: missing.map((c) => c.chain) },
          'iptables rules applied',
        );
      }
    }
    return n;
  }

  /**
   * Ensures now, then every `resyncSec` until `signal` (failures logged once per message). A
   * first failure is fatal, unless the tool could not even be started for want of resources
   * (EMFILE, ENFILE, EAGAIN, ENOMEM): that one is logged and retried on the next resync.
   */
  async run(resyncSec: number, signal: AbortSignal): Promise<void> {
    try {
      await this.ensure();
    } catch (err) {
      if (!isResourceShortage(err)) throw err;
      this.#once.first(errorMessage(err));
      this.#log.warn({ err: errorMessage(err) }, 'iptables rules not applied yet, retrying');
    }
    this.#log.debug({ everySec: resyncSec }, 'iptables resync started');
    try {
      while (!signal.aborted) {
        await sleep(resyncSec * 1000, signal).catch(() => undefined);
        if (signal.aborted) break;
        try {
          await this.ensure();
        } catch (err) {
          if (this.#once.first(errorMessage(err)))
            this.#log.warn({ err: errorMessage(err) }, 'iptables resync failed');
        }
      }
    } finally {
      this.#log.debug('iptables resync stopped');
    }
  }
}

/**
 * The daemon task (DaemonConfig.tasks): keeps the rules until the daemon stops (and, when
 * neither --ip-masq nor --iptables-forward-rules asks for rules, just waits for the stop).
 */
export function iptablesTask(o: IptablesOptions) {
  return async (ctx: {
    lease: Lease;
    netConfig: NetConfig;
    signal: AbortSignal;
  }): Promise<void> => {
    const want = wantedRules(ctx.netConfig, ctx.lease, o);
    if (want.length === 0) {
      // Nothing to keep; a task still runs until the daemon stops (returning early would read
      // as a loop that ended unexpectedly).
      if (!ctx.signal.aborted) {
        await new Promise((resolve) =>
          ctx.signal.addEventListener('abort', resolve, { once: true }),
        );
      }
      return;
    }
    const keeper = new IptablesKeeper(want, {
      ...(o.run ? { run: o.run } : {}),
      ...(o.log ? { log: o.log } : {}),
    });
    await keeper.run(o.resyncSec, ctx.signal);
  };
}
