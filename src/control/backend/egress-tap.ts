import { egressTapName } from '../../dataplane/index.js';
import type { NetConfig } from '../config/net-config.js';
import { UDP_TUN } from './udp.js';
import { parseVxlanConfig, vxlanDeviceName } from './vxlan.js';

/**
 * The egress TAP (tap_gso) the userspace engine of this config's backend may send through —
 * udp, or vxlan with Dataplane userspace or auto — or null: the FORWARD accept for its frames
 * (iptables.ts and nftables mode take it as IptablesOptions.egressTapOf).
 */
export function egressTapOf(cfg: NetConfig): string | null {
  if (cfg.backend.type === 'udp') return egressTapName(UDP_TUN);
  if (cfg.backend.type !== 'vxlan') return null;
  try {
    const v = parseVxlanConfig(cfg.backend.raw);
    return v.dataplane === 'kernel' ? null : egressTapName(vxlanDeviceName(4, v.vni));
  } catch {
    return null; // the backend refuses this config itself
  }
}
