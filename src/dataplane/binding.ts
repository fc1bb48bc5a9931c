/**
 * The dataplane's door to the addon: its exports are typed once, in src/common/native-addon.ts
 * (NativeAddon, with the boundary's contract); the offload names live in offloads.ts.
 */
import { loadNative } from '../common/native.js';
import type { NativeAddon } from '../common/native-addon.js';

export type {
  NativeAddon,
  NativeCodecConfig,
  NativeEngine,
  NativeEngineConfig,
} from '../common/native-addon.js';

export function loadDataplaneBinding(): NativeAddon {
  return loadNative();
}
