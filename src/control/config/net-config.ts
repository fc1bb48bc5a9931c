/**
 * The network config (flannel's net-conf JSON), parsed and validated once, then frozen.
 * The parser (parseNetConfig) is below the types.
 */
import type { IPNet } from '../../common/ip.js';

/** One address family's allocation space. */
export interface FamilyConfig {
  readonly network: IPNet;
  readonly subnetLen: number;
  /** First and last allocatable subnet network addresses (aligned to subnetLen). */
  readonly subnetMin: bigint;
  readonly subnetMax: bigint;
}

export interface BackendConfig {
  /** Lower-case backend type; `udp` when the config has no Backend block (as flannel). */
  readonly type: string;
  /** The Backend object as written (each backend parses its own options from it). */
  readonly raw: Readonly<Record<string, unknown>>;
}

export interface NetConfig {
  readonly enableIPv4: boolean;
  readonly enableIPv6: boolean;
  /** Present when enableIPv4. */
  readonly ipv4: FamilyConfig | null;
  /** Present when enableIPv6. */
  readonly ipv6: FamilyConfig | null;
  readonly backend: BackendConfig;
  /** The JSON text it was parsed from. */
  readonly text: string;
}
