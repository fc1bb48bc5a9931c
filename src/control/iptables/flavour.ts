/**
 * Which iptables the host uses, legacy (x_tables) or nft (the nftables kernel API through the
 * iptables CLI), detected the way flanneld's image does it (its iptables-wrapper): rules must be
 * written with the flavour the host's other rules (kubelet, kube-proxy, the firewall) use, or
 * their order against ours is undefined.
 *
 *   1. kubelet's marker chain (KUBE-IPTABLES-HINT or KUBE-KUBELET-CANARY) in
 *      `iptables-nft-save -t mangle` (then ip6tables-nft-save)            → nft
 *   2. the same chain anywhere in `iptables-legacy-save` (then ip6…)     → legacy
 *      (no `-t mangle` for legacy: it would create the table)
 *   3. weft's addition for hosts without kubelet: whichever flavour holds more rules; a tie → nft
 *   4. neither flavour's tools installed → `default`: plain iptables-save/-restore
 */
import { errorMessage } from '../../common/errors.js';
import type { Family } from '../../common/ip.js';
import type { Logger } from '../../common/log.js';
import type { CommandRunner } from './command.js';

export type IptablesFlavour = 'legacy' | 'nft' | 'default';

export const IPTABLES_FLAVOURS = ['legacy', 'nft', 'default'] as const;

/** The save/restore commands of one family and flavour. */
export function iptablesTools(
  family: Family,
  flavour: IptablesFlavour,
): { save: string; restore: string } {
  const base = family === 4 ? 'iptables' : 'ip6tables';
  const mid = flavour === 'default' ? '' : `-${flavour}`;
  return { save: `${base}${mid}-save`, restore: `${base}${mid}-restore` };
}

const KUBELET_CHAINS = /^:(KUBE-IPTABLES-HINT|KUBE-KUBELET-CANARY)\b/m;

function ruleCount(save: string): number {
  return save.split('\n').filter((l) => l.startsWith('-')).length;
}

/** Detects the host's flavour (steps above); logs the verdict and why. */
export async function detectFlavour(run: CommandRunner, log: Logger): Promise<IptablesFlavour> {
  const tryRun = async (cmd: string, args: string[]): Promise<string | null> => {
    try {
      return await run(cmd, args);
    } catch (err) {
      log.debug({ cmd, err: errorMessage(err) }, 'iptables flavour probe failed');
      return null;
    }
  };
  const verdict = (flavour: IptablesFlavour, why: string): IptablesFlavour => {
    log.info({ flavour, why }, 'iptables flavour');
    return flavour;
  };
  const nft: Array<string | null> = [];
  for (const family of [4, 6] as const) {
    const out = await tryRun(iptablesTools(family, 'nft').save, ['-t', 'mangle']);
    nft.push(out);
    if (out !== null && KUBELET_CHAINS.test(out)) return verdict('nft', 'kubelet chain in nft');
  }
  const legacy: Array<string | null> = [];
  for (const family of [4, 6] as const) {
    const out = await tryRun(iptablesTools(family, 'legacy').save, []);
    legacy.push(out);
    if (out !== null && KUBELET_CHAINS.test(out)) {
      return verdict('legacy', 'kubelet chain in legacy');
    }
  }
  const haveNft = nft.some((o) => o !== null);
  const haveLegacy = legacy.some((o) => o !== null);
  if (!haveNft && !haveLegacy)
    return verdict('default', 'no iptables-nft or iptables-legacy tools');
  if (!haveNft) return verdict('legacy', 'only iptables-legacy tools');
  if (!haveLegacy) return verdict('nft', 'only iptables-nft tools');
  // Step 3 reads all of nft's tables too, so both counts cover the same ground.
  const nftAll = (await tryRun(iptablesTools(4, 'nft').save, [])) ?? '';
  const nftAll6 = (await tryRun(iptablesTools(6, 'nft').save, [])) ?? '';
  const nLegacy = legacy.reduce((n, o) => n + ruleCount(o ?? ''), 0);
  const nNft = ruleCount(nftAll) + ruleCount(nftAll6);
  return nLegacy > nNft
    ? verdict('legacy', `legacy holds more rules (${nLegacy} > ${nNft})`)
    : verdict('nft', `nft holds as many rules or more (${nNft} ≥ ${nLegacy})`);
}
