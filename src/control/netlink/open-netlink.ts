/**
 * The Netlink the kernel backends use by default: the native one (the addon, libmnl) when the
 * addon loads, else iproute2's `ip`/`bridge` commands (slower, same contract). Which one is in
 * use is logged once per process.
 */
import { LogOnce, logger } from '../../common/log.js';
import { nativeAvailable } from '../../common/native.js';
import { Iproute2Netlink } from './iproute2-netlink.js';
import { NativeNetlink } from './native-netlink.js';
import type { Netlink } from './netlink.js';

const once = new LogOnce();

export function openNetlink(): Netlink {
  if (nativeAvailable()) {
    if (once.first('native')) logger('netlink').debug({ impl: 'native' }, 'netlink implementation');
    return new NativeNetlink();
  }
  if (once.first('iproute2')) {
    logger('netlink').info(
      { impl: 'iproute2' },
      'native addon unavailable: kernel ops go through the ip and bridge commands',
    );
  }
  return new Iproute2Netlink();
}
