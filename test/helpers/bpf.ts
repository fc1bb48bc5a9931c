/**
 * What a test's bpf programs left behind, asked about the test's own devices and program ids
 * only: bpf objects are global to the machine, so counting weft's programs everywhere would see
 * another run's (a daemon killed by a test next door, a bench).
 */
import { nativeAddonPath } from '../../src/common/native.js';
import { nsExec } from '../../src/testbed/netns.js';
import { waitFor } from '../../src/testbed/cluster.js';

/** The programs attached with tcx to `dev`'s hook in `ns` (the addon's query); [] without `dev`. */
export function tcxIn(ns: string, dev: string, hook: 'ingress' | 'egress'): number[] {
  if (nsExec(ns, 'ip', ['-o', 'link', 'show']).search(new RegExp(`^\\d+: ${dev}[:@]`, 'm')) < 0) {
    return [];
  }
  const script = `process.stdout.write(JSON.stringify(require(${JSON.stringify(
    nativeAddonPath(),
  )}).bpfTcxProgs(${JSON.stringify(dev)}, '${hook}')))`;
  return JSON.parse(nsExec(ns, process.execPath, ['-e', script])) as number[];
}

/** The ids of the programs in `dev`'s clsact ingress filters in `ns`. */
export function clsactIn(ns: string, dev: string): number[] {
  const out = nsExec(ns, 'tc', ['filter', 'show', 'dev', dev, 'ingress']);
  return [...out.matchAll(/\bid (\d+)\b/g)].map((m) => Number(m[1]));
}

/** Whether no program has this id any more (read from `ns`; ids are global). */
export function progGone(ns: string, id: number): boolean {
  try {
    nsExec(ns, 'bpftool', ['prog', 'show', 'id', String(id)]);
    return false;
  } catch {
    return true;
  }
}

/** Every program on the underlay `under` (tcx ingress, clsact) and the TUN `tun` (tcx egress). */
export function attachedIn(ns: string, under: string, tun: string): number[] {
  return [...tcxIn(ns, under, 'ingress'), ...clsactIn(ns, under), ...tcxIn(ns, tun, 'egress')];
}

/**
 * What is left once an engine is gone: programs still attached to `under` or `tun`, and any of
 * `ids` (the programs it ran) still loaded. A program is freed after its last reference goes,
 * which the kernel finishes in deferred work, so a loaded one is waited for (up to 10 s) first.
 */
export async function leftovers(
  ns: string,
  under: string,
  tun: string,
  ids: readonly number[],
): Promise<string[]> {
  const attached = attachedIn(ns, under, tun).map((id) => `attached: program ${id}`);
  const loaded = () => ids.filter((id) => !progGone(ns, id));
  await waitFor(() => loaded().length === 0, 10_000, 'programs freed').catch(() => undefined);
  return [...attached, ...loaded().map((id) => `still loaded: program ${id}`)];
}
