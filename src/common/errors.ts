/**
 * Every error weft raises on purpose carries one of these stable codes. Codes never change
 * meaning; new ones are added here and documented in docs/errors.md (a test enforces both).
 *
 * `exit` is the process exit code when such an error ends a command: 2 for usage and
 * configuration mistakes (the message names the flag or field and the rule), 1 for runtime
 * failures.
 */
export const ERROR_CODES = {
  WEFT_ERR_USAGE: { exit: 2, summary: 'a command-line flag or argument is invalid' },
  WEFT_ERR_CONFIG_INVALID: { exit: 2, summary: 'the network config (net-conf JSON) breaks a rule' },
  WEFT_ERR_CONFIG_NOT_FOUND: { exit: 1, summary: 'the store holds no network config' },
  WEFT_ERR_LEASE_OUT_OF_SUBNETS: { exit: 1, summary: 'every subnet of the network is leased' },
  WEFT_ERR_LEASE_RACE: { exit: 1, summary: 'lost the race for a subnet more times than allowed' },
  WEFT_ERR_LEASE_REVOKED: { exit: 1, summary: "this node's lease was deleted or expired" },
  WEFT_ERR_LEASE_MALFORMED: { exit: 1, summary: 'a lease key or value cannot be decoded' },
  WEFT_ERR_STORE_UNAVAILABLE: { exit: 1, summary: 'the lease store cannot be reached' },
  WEFT_ERR_STORE_KEY_EXISTS: { exit: 1, summary: 'a create-if-absent found the key taken' },
  WEFT_ERR_STORE_NOT_FOUND: { exit: 1, summary: 'the key is not in the store' },
  WEFT_ERR_STORE_COMPACTED: { exit: 1, summary: 'a watch revision was compacted away' },
  WEFT_ERR_STORE_RESPONSE_TOO_LARGE: {
    exit: 1,
    summary: 'one object, line or response from the store is larger than the cap',
  },
  WEFT_ERR_KUBE_TLS: {
    exit: 1,
    summary: "the API server's certificate fails verification (CA or name), or it refused ours",
  },
  WEFT_ERR_KUBE_NODE: { exit: 1, summary: 'this Kubernetes node cannot be found or named' },
  WEFT_ERR_KUBE_POD_CIDR: {
    exit: 1,
    summary: "the node's podCIDR is unassigned or outside the network",
  },
  WEFT_ERR_SUBNET_ENV: { exit: 1, summary: 'subnet.env cannot be written or read' },
  WEFT_ERR_IFACE: { exit: 2, summary: 'no usable external interface or address' },
  WEFT_ERR_BACKEND_UNSUPPORTED: {
    exit: 2,
    summary: 'the Backend block names an unknown type or option',
  },
  WEFT_ERR_BACKEND: { exit: 1, summary: 'a backend failed to start or to program a peer' },
  WEFT_ERR_NETLINK: { exit: 1, summary: 'a kernel (rtnetlink) operation failed' },
  WEFT_ERR_IPTABLES: { exit: 1, summary: 'iptables-restore or iptables-save failed' },
  WEFT_ERR_NFTABLES: { exit: 1, summary: 'nft failed to list or write the flannel tables' },
  WEFT_ERR_NATIVE_UNAVAILABLE: { exit: 1, summary: 'the native addon is not built or cannot load' },
  WEFT_ERR_DATAPLANE: { exit: 1, summary: 'the packet engine failed' },
  WEFT_ERR_WIREGUARD_UAPI: {
    exit: 1,
    summary: 'the WireGuard UAPI socket (`wg show`) cannot be served',
  },
  WEFT_ERR_WIREGUARD_KEY: {
    exit: 1,
    summary: 'the WireGuard key file cannot be read, parsed or written',
  },
  WEFT_ERR_BPF_UNAVAILABLE: {
    exit: 1,
    summary: 'the bpf engine cannot run here (load, probe or attach failed); native runs instead',
  },
  WEFT_ERR_CNI: { exit: 1, summary: 'the CNI plugin failed' },
  WEFT_ERR_SD_NOTIFY: { exit: 1, summary: 'the readiness message to systemd could not be sent' },
  WEFT_ERR_ABORTED: { exit: 1, summary: 'the operation was cancelled' },
} as const;

export type ErrorCode = keyof typeof ERROR_CODES;

export class WeftError extends Error {
  readonly code: ErrorCode;
  /** Structured context for logs (field path, key, errno, ...). */
  readonly details: Readonly<Record<string, unknown>>;

  constructor(
    code: ErrorCode,
    message: string,
    options: { cause?: unknown; details?: Record<string, unknown> } = {},
  ) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = 'WeftError';
    this.code = code;
    this.details = Object.freeze({ ...options.details });
  }

  get exitCode(): number {
    return ERROR_CODES[this.code].exit;
  }
}

export function isWeftError(err: unknown, code?: ErrorCode): err is WeftError {
  return err instanceof WeftError && (code === undefined || err.code === code);
}

/** A config-file rule broken: the message names the field path and the rule. */
export function configError(field: string, rule: string, details?: Record<string, unknown>) {
  return new WeftError('WEFT_ERR_CONFIG_INVALID', `${field}: ${rule}`, {
    details: { field, ...details },
  });
}

/** A command-line rule broken: the message names the flag and the rule. */
export function usageError(flag: string, rule: string) {
  const name = flag.startsWith('-') || flag === '' ? flag : `--${flag}`;
  return new WeftError('WEFT_ERR_USAGE', name ? `${name}: ${rule}` : rule, { details: { flag } });
}

export function abortError(signal?: AbortSignal): WeftError {
  const reason: unknown = signal?.reason;
  if (reason instanceof WeftError) return reason;
  return new WeftError('WEFT_ERR_ABORTED', 'operation cancelled', { cause: reason });
}

/** The message of any thrown value, for logs. */
export function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
