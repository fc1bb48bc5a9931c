/**
 * `weft cleanup`: removes what weft's dataplanes leave in the current network namespace once no
 * weft runs there (an uninstall, a node leaving the cluster):
 *
 * - the bpf engine's pinned links (bpf-pins.ts): every pin directory of this namespace under the
 *   pin root (`<root>/<tun>-<netns inode>`), each taken as removeBpfPins does (only `tx`, `rx`,
 *   `bridge`, links detached first, only in a directory root owns and nobody else can write);
 * - its clsact filters (the fallback: never pinned, they outlive the process) at weft's
 *   priority and handle (0x77ef) that run a weft program, on every device;
 * - weft's persistent TUN devices (WEFT_TUN): `flannel0`, `flannel.<VNI>`, `flannel.ipip`,
 *   `flannel-wg` and `flannel-wg-v6` when they are TUNs (a kernel vxlan `flannel.<VNI>`, ipip
 *   `flannel.ipip` or wireguard `flannel-wg` is the kernel's, which flannel leaves too: `ip link
 *   del` removes it);
 * - the wireguard UAPI sockets a killed daemon left (`<uapi dir>/flannel-wg.sock` and
 *   `flannel-wg-v6.sock`, wireguard-uapi.ts), when no process listens on them: `wg show` would
 *   list a dead interface. A live one (a daemon still runs) stays, named in `skipped`.
 *
 * Left on purpose: subnet.env (the CNI plugin reads it; the next daemon rewrites it; flannel
 * leaves it too), the fast-start records beside it (a record whose TUN is gone is never used),
 * and the lease in the store (it expires). iptables rules are the daemon's: it removes them when
 * it stops.
 */
import { execFileSync } from 'node:child_process';
import { lstatSync, readdirSync, statSync, unlinkSync } from 'node:fs';
import { join } from 'node:path';
import { errorMessage } from '../common/errors.js';
import { loadNative } from '../common/native.js';
import { DEFAULT_PIN_ROOT, PIN_DIR_ENV, untrustedDir } from './bpf-pins.js';
import { socketAlive, uapiSocketDir } from './wireguard-uapi.js';

/** The names of the TUNs weft's userspace backends make (udp, vxlan, ipip, wireguard). */
export const WEFT_TUN = /^(flannel0|flannel\.\d+|flannel\.ipip|flannel-wg|flannel-wg-v6)$/;

export interface CleanupReport {
  /** Pin directories emptied and removed, with how many pins each held. */
  readonly pins: { dir: string; pins: number }[];
  /** clsact filters removed, as `<device> <ingress|egress>`. */
  readonly filters: string[];
  /** TUN devices removed. */
  readonly devices: string[];
  /** Stale wireguard UAPI sockets removed. */
  readonly sockets: string[];
  /** What could not be removed, and why. */
  readonly skipped: string[];
}

const run = (cmd: string, args: string[]) =>
  execFileSync(cmd, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });

/** weft's clsact priority and handle (native/src/bpf_loader.cc kTcPriority, kTcHandle). */
const TC_PRIORITY = 0x77ef;

export async function cleanupHost(): Promise<CleanupReport> {
  const report: CleanupReport = { pins: [], filters: [], devices: [], sockets: [], skipped: [] };
  // Pins of this namespace.
  const root = process.env[PIN_DIR_ENV] ?? DEFAULT_PIN_ROOT;
  if (root !== '' && root !== 'off') {
    const ino = statSync('/proc/self/ns/net').ino;
    let names: string[] = [];
    try {
      names = readdirSync(root);
    } catch {
      // no pin root: nothing pinned
    }
    const rootWhy = names.length > 0 ? untrustedDir(root) : null;
    if (rootWhy) report.skipped.push(`pins: ${rootWhy}`);
    else {
      for (const name of names.filter((n) => n.endsWith(`-${ino}`))) {
        const dir = join(root, name);
        const why = untrustedDir(dir);
        if (why) {
          report.skipped.push(`pins: ${why}`);
          continue;
        }
        try {
          report.pins.push({ dir, pins: loadNative().bpfUnpin(dir) });
        } catch (err) {
          report.skipped.push(`pins: ${dir}: ${errorMessage(err)}`);
        }
      }
    }
  }
  // Devices: clsact filters on every one, then weft's TUNs.
  const links = JSON.parse(run('ip', ['-d', '-j', 'link', 'show'])) as {
    ifname: string;
    linkinfo?: { info_kind?: string };
  }[];
  for (const l of links) {
    for (const side of ['ingress', 'egress'] as const) {
      let shown: string;
      try {
        shown = run('tc', ['filter', 'show', 'dev', l.ifname, side]);
      } catch {
        continue; // no clsact qdisc there
      }
      const ours = new RegExp(`pref ${TC_PRIORITY} bpf .*handle 0x77ef weft_(tx|rx)\\b`);
      if (!shown.split('\n').some((line) => ours.test(line))) continue;
      try {
        run('tc', ['filter', 'del', 'dev', l.ifname, side, 'pref', String(TC_PRIORITY)]);
        report.filters.push(`${l.ifname} ${side}`);
      } catch (err) {
        report.skipped.push(`filter ${l.ifname} ${side}: ${errorMessage(err)}`);
      }
    }
  }
  for (const l of links) {
    if (l.linkinfo?.info_kind !== 'tun' || !WEFT_TUN.test(l.ifname)) continue;
    try {
      run('ip', ['link', 'del', 'dev', l.ifname]);
      report.devices.push(l.ifname);
    } catch (err) {
      report.skipped.push(`device ${l.ifname}: ${errorMessage(err)}`);
    }
  }
  // wireguard's UAPI sockets that nobody serves any more.
  for (const dev of ['flannel-wg', 'flannel-wg-v6']) {
    const path = join(uapiSocketDir(), `${dev}.sock`);
    let st;
    try {
      st = lstatSync(path);
    } catch {
      continue;
    }
    if (!st.isSocket()) continue; // not a socket wireguard-uapi.ts made: not ours to remove
    try {
      if (await socketAlive(path)) {
        report.skipped.push(`socket ${path}: a process serves it`);
        continue;
      }
      unlinkSync(path);
      report.sockets.push(path);
    } catch (err) {
      report.skipped.push(`socket ${path}: ${errorMessage(err)}`);
    }
  }
  return report;
}
