/**
 * Where the bpf engine pins its tcx links, so that they outlive the process (bpf_loader.h):
 *
 *   <WEFT_BPF_PIN_DIR, default /sys/fs/bpf/weft>/<tun>-<network namespace inode>/{tx,rx,bridge}
 *
 * (a '.' in the TUN's name becomes '_': bpffs refuses dots in names, e.g. flannel_1-4026531840)
 * One directory per TUN and network namespace (a bpffs may be shared by every namespace of the
 * host). Pinned links keep the programs attached, and through them the maps with the last peer
 * table, after a kill -9: traffic keeps flowing with no process, and the next bpf engine takes
 * the links over (bpf-engine.ts). The pins follow the persistent TUN's lifetime: a stop that
 * keeps the TUN keeps them; whatever removes the TUN (a released or revoked lease, another
 * backend) or starts another engine on it calls removeBpfPins. Pinning needs a bpffs at (or
 * above) the pin directory; there is none inside `ip netns exec` nor where nobody mounted one,
 * and then nothing is pinned (logged once by the engine). `WEFT_BPF_PIN_DIR=off` turns it off.
 *
 * Trust: a bpffs mounted without `mode=` is 1777, so anyone may have created the pin root or a
 * pin directory before weft. Both must be real directories (not symlinks) owned by root and
 * writable by nobody else, or nothing is pinned, adopted or removed there (the reason logged).
 * Only the names `tx`, `rx` and `bridge` are ever opened, adopted or removed in a pin directory
 * (bpf_loader.cc; a symlink under those names is removed, never followed); any other entry stays,
 * and so does the directory then.
 */
import { existsSync, lstatSync, mkdirSync, statSync, statfsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { errorMessage } from '../common/errors.js';
import type { Logger } from '../common/log.js';
import { loadNative } from '../common/native.js';

export const PIN_DIR_ENV = 'WEFT_BPF_PIN_DIR';
export const DEFAULT_PIN_ROOT = '/sys/fs/bpf/weft';
const BPF_FS_MAGIC = 0xcafe4a11;

/** The name of the pin directory of `tunName` in the network namespace of inode `netnsIno`. */
export function pinDirName(tunName: string, netnsIno: number): string {
  return `${tunName.replaceAll('.', '_')}-${netnsIno}`;
}

/** The pin directory of `tunName` in this network namespace; null when pinning is off. */
export function bpfPinDir(tunName: string): string | null {
  const root = process.env[PIN_DIR_ENV] ?? DEFAULT_PIN_ROOT;
  if (root === '' || root === 'off') return null;
  return join(root, pinDirName(tunName, statSync('/proc/self/ns/net').ino));
}

/**
 * Why `path` is not a directory weft may trust with its pins (null: it is): it must be a
 * directory, not a symlink, owned by root (or one of `owners`), and not writable by group or
 * others.
 */
export function untrustedDir(path: string, owners: readonly number[] = [0]): string | null {
  let st;
  try {
    st = lstatSync(path);
  } catch (err) {
    return `${path}: ${errorMessage(err)}`;
  }
  if (st.isSymbolicLink()) return `${path} is a symlink`;
  if (!st.isDirectory()) return `${path} is not a directory`;
  if (!owners.includes(st.uid))
    return `${path} is owned by uid ${st.uid}, not ${owners.map((u) => (u === 0 ? 'root' : `uid ${u}`)).join(' or ')}`;
  if ((st.mode & 0o022) !== 0)
    return `${path} is writable by ${st.mode & 0o002 ? 'others' : 'its group'} (mode ${(st.mode & 0o7777).toString(8)})`;
  return null;
}

/** Creates `dir` (mode 0700) unless it exists; then checks it (untrustedDir). */
function trustedDir(dir: string): string | null {
  try {
    mkdirSync(dir, { mode: 0o700 });
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') return `${dir}: ${errorMessage(err)}`;
  }
  return untrustedDir(dir);
}

/**
 * Creates `tunName`'s pin directory and returns it, or says why it cannot be: pinning off, no
 * bpffs at the pin root (nothing is created outside a bpffs), or a pin root or directory weft
 * cannot trust (untrustedDir: someone else made it).
 */
export function preparePinDir(tunName: string): { dir: string } | { why: string } {
  const dir = bpfPinDir(tunName);
  if (!dir) return { why: `${PIN_DIR_ENV}=off` };
  let existing = dir;
  while (!existsSync(existing) && dirname(existing) !== existing) existing = dirname(existing);
  try {
    if (statfsSync(existing).type !== BPF_FS_MAGIC)
      return { why: `${existing} is not on a bpffs (mount -t bpf bpf /sys/fs/bpf)` };
  } catch (err) {
    return { why: `${dir}: ${errorMessage(err)}` };
  }
  const why = trustedDir(dirname(dir)) ?? trustedDir(dir);
  return why ? { why: `not pinned: ${why}` } : { dir };
}

/**
 * Removes what a bpf engine left pinned for `tunName` in this namespace (links detached first):
 * the TUN goes, or another engine takes it. Returns how many pins went; never throws (logged).
 */
export function removeBpfPins(tunName: string, log?: Logger): number {
  let dir: string | null;
  try {
    dir = bpfPinDir(tunName);
    if (!dir || !existsSync(dir)) return 0;
    const why = untrustedDir(dirname(dir)) ?? untrustedDir(dir);
    if (why) {
      log?.warn({ tun: tunName, dir, why }, 'pinned bpf programs not removed: untrusted directory');
      return 0;
    }
    const n = loadNative().bpfUnpin(dir);
    log?.info({ tun: tunName, dir, pins: n }, 'pinned bpf programs removed');
    return n;
  } catch (err) {
    log?.warn({ tun: tunName, err: errorMessage(err) }, 'cannot remove pinned bpf programs');
    return 0;
  }
}
