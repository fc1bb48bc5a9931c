/**
 * Keeps flannel's masquerade and forward rules in place (rules.ts has the exact lists):
 * applied with `iptables-restore --noflush` (ip6tables-restore for IPv6) at start — which also
 * removes stale rules of an earlier network or subnet — then re-checked with `iptables-save`
 * every --iptables-resync seconds and re-applied whole when anything differs.
 */
import { WeftError, errorMessage } from '../../common/errors.js';
import type { Family } from '../../common/ip.js';
import { type Logger, logger } from '../../common/log.js';
import type { NetConfig } from '../config/net-config.js';

export {
  type CommandRunner,
  type SpawnFn,
  commandRunner,
  isResourceShortage,
  runCommand,
} from './command.js';
import type { Lease } from '../lease/types.js';
import { type CommandRunner, runCommand } from './command.js';
import { type IptablesFlavour, detectFlavour, iptablesTools } from './flavour.js';
import { NftablesKeeper, nftSupportsFullyRandom, removeNftTables } from './nftables.js';
import type { NftTableSpec } from './nft-rules.js';
import { type RuleKeeper, keepRules } from './resync.js';
import {
  type ChainRules,
  forwardRules,
  isInPlace,
  masqRules,
  OUR_CHAINS,
  parseSave,
  removalScript,
  restoreScript,
} from './rules.js';

export interface IptablesOptions {
  readonly ipMasq: boolean;
  readonly forwardRules: boolean;
  /** Seconds between checks (--iptables-resync, default 5). */
  readonly resyncSec: number;
  /** `MASQUERADE --random-fully` / `masquerade fully-random` (off: --ip-masq-fully-random-disable). */
  readonly fullyRandom?: boolean;
  /** Which iptables binaries (default: detected as flanneld's image does, see flavour.ts). */
  readonly flavour?: IptablesFlavour;
  /**
   * The egress TAP the backend's userspace engine may send through, for this config (null:
   * none): its frames get a FORWARD accept. The daemon passes backend/egress-tap.ts's.
   */
  readonly egressTapOf?: (cfg: NetConfig) => string | null;
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
  o: Pick<IptablesOptions, 'ipMasq' | 'forwardRules' | 'fullyRandom' | 'egressTapOf'>,
): FamilyRules[] {
  const egressTap = o.egressTapOf?.(cfg) ?? null;
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
    if (o.ipMasq) chains.push(masqRules(family, fc.network, subnet, o.fullyRandom ?? true));
    if (o.forwardRules) chains.push(forwardRules(fc.network, egressTap));
    if (chains.length > 0) out.push({ family, chains });
  }
  return out;
}

/** The nftables mode's tables for this node: both always (flannel's Init), chains as asked. */
export function wantedNftTables(
  cfg: NetConfig,
  lease: Lease,
  o: Pick<IptablesOptions, 'ipMasq' | 'forwardRules' | 'egressTapOf'> & {
    readonly fullyRandom: boolean;
  },
): NftTableSpec[] {
  const egressTap = o.egressTapOf?.(cfg) ?? null;
  return ([4, 6] as const).map((family) => {
    const on = family === 4 ? cfg.enableIPv4 : cfg.enableIPv6;
    const fc = family === 4 ? cfg.ipv4 : cfg.ipv6;
    const subnet = family === 4 ? lease.subnet : lease.ipv6Subnet;
    return {
      family,
      fullyRandom: o.fullyRandom,
      ...(on && fc && subnet && o.ipMasq ? { masq: { network: fc.network, subnet } } : {}),
      ...(on && fc && o.forwardRules ? { forward: { network: fc.network, egressTap } } : {}),
    };
  });
}

/**
 * Removes our iptables chains and the jumps into them (nftables mode starting after an
 * iptables-mode run, as flannel's CleanUp of the unused manager). Best effort: logged, never
 * fatal; a host without the iptables tools has nothing to remove.
 */
export async function removeIptablesRules(
  run: CommandRunner,
  log: Logger,
  flavour: IptablesFlavour = 'default',
): Promise<void> {
  for (const family of [4, 6] as const) {
    const t = iptablesTools(family, flavour);
    for (const id of OUR_CHAINS) {
      try {
        const lines = parseSave(await run(t.save, ['-t', id.table])).get(id.table) ?? [];
        const script = removalScript(lines, id);
        if (script === null) continue;
        await run(t.restore, ['-w', '5', '--noflush'], script);
        log.info(
          { family, table: id.table, chain: id.chain },
          'iptables rules of an earlier run removed',
        );
      } catch (err) {
        log.debug({ family, table: id.table, err: errorMessage(err) }, 'iptables: nothing removed');
      }
    }
  }
}

export class IptablesKeeper implements RuleKeeper {
  readonly #want: readonly FamilyRules[];
  readonly #flavour: IptablesFlavour;
  readonly #run: CommandRunner;
  readonly #log: Logger;
  /** How many times rules were (re)applied; tests and metrics read it. */
  applied = 0;

  constructor(
    want: readonly FamilyRules[],
    o: { run?: CommandRunner; log?: Logger; flavour?: IptablesFlavour } = {},
  ) {
    this.#want = want;
    this.#flavour = o.flavour ?? 'default';
    this.#run = o.run ?? runCommand;
    this.#log = o.log ?? logger('iptables');
  }

  /** Checks every table; re-applies a table's rules whole when any differs. Returns how many were. */
  async ensure(): Promise<number> {
    let n = 0;
    for (const fr of this.#want) {
      const t = iptablesTools(fr.family, this.#flavour);
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

  /** Ensures now, then every `resyncSec` until `signal` (keepRules). */
  run(resyncSec: number, signal: AbortSignal): Promise<void> {
    return keepRules(this, { resyncSec, signal, log: this.#log });
  }
}

/**
 * The daemon task (DaemonConfig.tasks): keeps the rules until the daemon stops. With
 * `"EnableNFTables": true` the nftables tables (nftables.ts), else the iptables chains; either
 * way the other mode's leftovers are removed first. In iptables mode, when neither --ip-masq nor
 * --iptables-forward-rules asks for rules, it just waits for the stop.
 */
export function iptablesTask(o: IptablesOptions) {
  return async (ctx: {
    lease: Lease;
    netConfig: NetConfig;
    signal: AbortSignal;
  }): Promise<void> => {
    const run = o.run ?? runCommand;
    const log = o.log ?? logger('iptables');
    const keep = { resyncSec: o.resyncSec, signal: ctx.signal, log };
    if (ctx.netConfig.enableNFTables) {
      await removeIptablesRules(run, log, o.flavour ?? (await detectFlavour(run, log)));
      const fullyRandom =
        (o.fullyRandom ?? true) && (!o.ipMasq || (await nftSupportsFullyRandom(run, log)));
      const want = wantedNftTables(ctx.netConfig, ctx.lease, { ...o, fullyRandom });
      await keepRules(new NftablesKeeper(want, { run, log }), keep);
      return;
    }
    await removeNftTables(run, log);
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
    const flavour = o.flavour ?? (await detectFlavour(run, log));
    await keepRules(new IptablesKeeper(want, { run, log, flavour }), keep);
  };
}
