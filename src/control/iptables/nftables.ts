/**
 * nftables mode (`"EnableNFTables": true` in net-conf): flannel's tables `ip flannel-ipv4` and
 * `ip6 flannel-ipv6` (nft-rules.ts has the exact rules), each written whole in one atomic
 * `nft -f` transaction, then re-checked every --iptables-resync seconds: when `nft list table`
 * no longer prints what it printed right after our write (a rule or chain deleted, one added),
 * the table is written whole again. flannel writes them once and never repairs; weft keeps them
 * as it keeps the iptables rules. Neither mode removes its rules on exit (flannel does not);
 * each removes the other mode's at start (flannel's CleanUp of the unused traffic manager).
 */
import { errorMessage, WeftError } from '../../common/errors.js';
import type { Family } from '../../common/ip.js';
import type { Logger } from '../../common/log.js';
import type { CommandRunner } from './command.js';
import {
  NFT_TABLES,
  type NftTableSpec,
  nftFullyRandomProbe,
  nftReplaceScript,
  nftTableName,
} from './nft-rules.js';
import type { RuleKeeper } from './resync.js';

const NFT = 'nft';

export class NftablesKeeper implements RuleKeeper {
  readonly #want: readonly NftTableSpec[];
  readonly #run: CommandRunner;
  readonly #log: Logger;
  /** What `nft list table` printed right after our last write, per table. */
  readonly #listed = new Map<Family, string>();
  /** How many times a table was (re)written; tests read it. */
  applied = 0;

  constructor(want: readonly NftTableSpec[], o: { run: CommandRunner; log: Logger }) {
    this.#want = want;
    this.#run = o.run;
    this.#log = o.log;
  }

  async #list(family: Family): Promise<string | null> {
    try {
      return await this.#run(NFT, ['list', 'table', ...nftTableName(family).split(' ')]);
    } catch (err) {
      // A table that does not exist is for ensure() to create; anything else is a failure.
      if (/No such file or directory/.test(errorMessage(err))) return null;
      throw new WeftError(
        'WEFT_ERR_NFTABLES',
        `nft list table ${nftTableName(family)}: ${errorMessage(err)}`,
        {
          cause: err,
        },
      );
    }
  }

  /** Writes each table whose listing differs from the one after our last write. */
  async ensure(): Promise<number> {
    let n = 0;
    for (const spec of this.#want) {
      const before = await this.#list(spec.family);
      if (before !== null && before === this.#listed.get(spec.family)) continue;
      try {
        await this.#run(NFT, ['-f', '-'], nftReplaceScript(spec));
      } catch (err) {
        throw new WeftError(
          'WEFT_ERR_NFTABLES',
          `nft -f (${nftTableName(spec.family)}): ${errorMessage(err)}`,
          {
            cause: err,
          },
        );
      }
      const after = await this.#list(spec.family);
      if (after !== null) this.#listed.set(spec.family, after);
      n++;
      this.applied++;
      this.#log.info(
        { table: nftTableName(spec.family), repaired: this.#listed.size > 0 && before !== null },
        'nftables rules applied',
      );
    }
    return n;
  }
}

/** Whether `masquerade fully-random` works here (flannel's `nft --check` probe). */
export async function nftSupportsFullyRandom(run: CommandRunner, log: Logger): Promise<boolean> {
  try {
    await run(NFT, ['--check', '-f', '-'], nftFullyRandomProbe());
    return true;
  } catch (err) {
    log.warn({ err: errorMessage(err) }, 'nftables: masquerade fully-random unsupported');
    return false;
  }
}

/** Deletes flannel's nftables tables if they exist (iptables mode starting after nftables mode). */
export async function removeNftTables(run: CommandRunner, log: Logger): Promise<void> {
  let tables: string;
  try {
    tables = await run(NFT, ['list', 'tables']);
  } catch (err) {
    log.debug({ err: errorMessage(err) }, 'nftables: no tables to clean up');
    return;
  }
  for (const family of [4, 6] as const) {
    const t = nftTableName(family);
    if (!tables.split('\n').some((l) => l.trim() === `table ${t}`)) continue;
    try {
      await run(NFT, ['delete', 'table', NFT_TABLES[family].family, NFT_TABLES[family].name]);
      log.info({ table: t }, 'nftables table of an earlier run removed');
    } catch (err) {
      log.warn({ table: t, err: errorMessage(err) }, 'nftables: cannot remove table');
    }
  }
}
