/**
 * systemd readiness (sd_notify(3)) for `Type=notify` units: `READY=1` once the daemon is ready,
 * `STOPPING=1` when it begins to stop, each one datagram to the AF_UNIX SOCK_DGRAM socket named
 * by $NOTIFY_SOCKET (a path, or `@name` for an abstract socket).
 *
 * Node has no unix datagram sockets, and spawning `systemd-notify` is not reliable (systemd
 * matches the sender's pid against the unit's main pid, and the helper may be gone before
 * systemd reads the message), so the datagram is sent from this process by the native addon
 * (native/src/sd_notify.cc). Without $NOTIFY_SOCKET (not under systemd) nothing is sent.
 * Without the addon (the js-engine fallback) nothing is sent either: a warning is logged once,
 * and a `Type=notify` unit must then be switched to `Type=simple`.
 */
import { WeftError, errorMessage } from '../common/errors.js';
import { LogOnce, logger } from '../common/log.js';
import { loadNative } from '../common/native.js';
import type { NativeAddon } from '../common/native-addon.js';
import { constants } from 'node:os';

const once = new LogOnce();

type SdNotifyBinding = Pick<NativeAddon, 'sdNotify'>;

export type SdNotifyState = 'READY=1' | 'STOPPING=1' | 'RELOADING=1' | `STATUS=${string}`;

/**
 * Sends `state` (one or more `KEY=VALUE` lines) to $NOTIFY_SOCKET. Returns false when the
 * variable is unset or the addon does not load (logged once), true when sent; throws
 * WEFT_ERR_SD_NOTIFY (with the errno) otherwise. Callers log the error: readiness is not worth a
 * crash.
 */
export function sdNotify(
  state: SdNotifyState | string,
  env: Readonly<Record<string, string | undefined>> = process.env,
  binding?: SdNotifyBinding,
): boolean {
  const socket = env.NOTIFY_SOCKET;
  if (!socket) return false;
  let b = binding;
  if (!b) {
    try {
      b = loadNative();
    } catch (err) {
      if (once.first('no-addon')) {
        logger('sd-notify').warn(
          { socket, err: errorMessage(err) },
          'sd_notify skipped: the native addon is unavailable',
        );
      }
      return false;
    }
  }
  const errno = b.sdNotify(socket, state);
  if (errno !== 0) {
    const name =
      Object.entries(constants.errno).find(([, v]) => v === errno)?.[0] ?? `errno ${errno}`;
    throw new WeftError(
      'WEFT_ERR_SD_NOTIFY',
      `sd_notify ${JSON.stringify(state)} to ${socket}: ${name}`,
      { details: { socket, errno } },
    );
  }
  return true;
}
