/**
 * The VtepMAC policy, once for both vxlan dataplanes (kernel device and userspace TUN).
 *
 * A node's VtepMAC is random, unicast, locally administered, and kept across restarts in a file
 * of its own beside its subnet file: `<subnet file>.<dev>.vtep-mac`
 * (`/run/flannel/subnet.env.flannel.1.vtep-mac`), so daemons whose subnet files share one
 * directory never share a MAC (issue #12.1: the file used to be `<dir>/weft-<dev>.vtep-mac`, one
 * per directory). The MAC chosen at start is the first usable one of
 *
 *   1. the existing device's (kernel vxlan: kept even when the device is recreated),
 *   2. the one the store still publishes for us (kube: our node's backend-data annotation),
 *   3. our file's,
 *   4. the old per-directory file's, claimed by renaming it to ours (one node at most takes it),
 *   5. a new random one,
 *
 * where "usable" also means that no other node's lease holds it (`inUse`, read from the store at
 * start): a MAC another node publishes is never adopted. The result is written to our file.
 */
import { randomBytes } from 'node:crypto';
import { mkdir, readFile, rename, writeFile } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { errorMessage } from '../../common/errors.js';
import { jsonField } from '../../common/json-field.js';
import type { Logger } from '../../common/log.js';
import type { Lease } from '../lease/types.js';

const MAC_RE = /^[0-9a-f]{2}(:[0-9a-f]{2}){5}$/i;

/** Whether `mac` is a MAC address text (any kind). */
export function isMacText(mac: unknown): mac is string {
  return typeof mac === 'string' && MAC_RE.test(mac);
}

/** A unicast, non-zero MAC address text (the only kind a VTEP may use). */
export function usableVtepMAC(mac: string | null | undefined): mac is string {
  return isMacText(mac) && unicastNonZero(mac);
}

/** For a MAC address text (either case): unicast and not all zeros. */
function unicastNonZero(mac: string): boolean {
  return (parseInt(mac.slice(0, 2), 16) & 1) === 0 && mac !== '00:00:00:00:00:00';
}

/** A random unicast, locally administered MAC, none of `avoid`. */
export function randomVtepMAC(avoid: ReadonlySet<string> = new Set()): string {
  for (;;) {
    const b = randomBytes(6);
    b[0] = (b[0]! & 0xfe) | 0x02;
    const mac = [...b].map((x) => x.toString(16).padStart(2, '0')).join(':');
    if (!avoid.has(mac)) return mac;
  }
}

/** The peer's VtepMAC from its BackendData (lower case), or a reason it is unusable. */
export function peerVtepMAC(data: unknown): { mac: string } | { reason: string } {
  if (typeof data !== 'object' || data === null || Array.isArray(data)) {
    return { reason: 'BackendData is not an object' };
  }
  const mac = jsonField(data as Record<string, unknown>, 'VtepMAC');
  if (!isMacText(mac)) {
    return { reason: `VtepMAC ${JSON.stringify(mac)} is not a MAC address` };
  }
  const lower = mac.toLowerCase();
  if (!unicastNonZero(lower)) {
    return { reason: `VtepMAC ${JSON.stringify(mac)} is not a unicast address` };
  }
  return { mac: lower };
}

/** Every VtepMAC a lease publishes (BackendData and BackendV6Data). */
export function leaseVtepMACs(lease: Lease): string[] {
  const out: string[] = [];
  for (const data of [lease.attrs.backendData, lease.attrs.backendV6Data]) {
    const m = peerVtepMAC(data);
    if ('mac' in m && !out.includes(m.mac)) out.push(m.mac);
  }
  return out;
}

/** Our VtepMAC file for `dev` beside `subnetFile`, and the old per-directory one. */
export interface VtepMacFiles {
  readonly file: string;
  /** `<dir>/weft-<dev>.vtep-mac` (before #12.1: shared by every subnet file in the directory). */
  readonly legacy: string;
}

export function vtepMacFiles(subnetFile: string, dev: string): VtepMacFiles {
  const dir = dirname(subnetFile);
  return {
    file: join(dir, `${basename(subnetFile)}.${dev}.vtep-mac`),
    legacy: join(dir, `weft-${dev}.vtep-mac`),
  };
}

async function readMac(path: string): Promise<string | null> {
  try {
    const text = (await readFile(path, 'utf8')).trim().toLowerCase();
    return usableVtepMAC(text) ? text : null;
  } catch {
    return null;
  }
}

/**
 * Takes the old per-directory file as ours by renaming it (atomic: of the daemons sharing the
 * directory, one at most gets it; the others find it gone). Null when absent or already ours.
 */
async function claimLegacy(f: VtepMacFiles): Promise<string | null> {
  try {
    await rename(f.legacy, f.file);
  } catch {
    return null;
  }
  return readMac(f.file);
}

export type VtepMacSource = 'device' | 'store' | 'file' | 'legacy-file' | 'new';

export interface ChooseVtepMAC {
  readonly dev: string;
  /** The subnet file the MAC file sits beside; null: the MAC is not persisted. */
  readonly subnetFile: string | null;
  /** The MAC of the device that exists already (kernel vxlan), if any. */
  readonly device?: string | null;
  /** The MAC the store still publishes for this node (kube annotation), if any. */
  readonly stored?: string | null;
  /** MACs other nodes' leases hold (never adopted). */
  readonly inUse: ReadonlySet<string>;
  readonly log: Logger;
}

/** Picks our VtepMAC (see the file comment for the order) and persists it. */
export async function chooseVtepMAC(
  o: ChooseVtepMAC,
): Promise<{ mac: string; source: VtepMacSource }> {
  const files = o.subnetFile ? vtepMacFiles(o.subnetFile, o.dev) : null;
  const candidates: Array<[VtepMacSource, () => Promise<string | null>]> = [
    ['device', async () => o.device ?? null],
    ['store', async () => o.stored ?? null],
    ['file', async () => (files ? readMac(files.file) : null)],
    ['legacy-file', async () => (files ? claimLegacy(files) : null)],
  ];
  let chosen: { mac: string; source: VtepMacSource } | null = null;
  for (const [source, get] of candidates) {
    const raw = await get();
    const mac = raw?.toLowerCase() ?? null;
    if (!usableVtepMAC(mac)) continue;
    if (o.inUse.has(mac)) {
      o.log.warn(
        { dev: o.dev, mac, from: source },
        'VtepMAC held by another node lease; not adopting it',
      );
      continue;
    }
    chosen = { mac, source };
    break;
  }
  chosen ??= { mac: randomVtepMAC(o.inUse), source: 'new' };
  if (files) await saveVtepMAC(files.file, chosen.mac, o.log);
  return chosen;
}

/** Writes `mac` to `file` (a failure is logged: the MAC then only lasts this run). */
export async function saveVtepMAC(file: string, mac: string, log: Logger): Promise<void> {
  try {
    await mkdir(dirname(file), { recursive: true });
    await writeFile(file, mac + '\n', { mode: 0o644 });
  } catch (err) {
    log.warn({ file, err: errorMessage(err) }, 'cannot persist the VtepMAC');
  }
}
