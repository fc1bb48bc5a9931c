/**
 * Command-line flags, table-driven and dependency-free, with flanneld's names and defaults.
 *
 * A table maps each flag name (kebab-case, as typed after `--`) to a definition built by one of
 * the helpers below (`str`, `bool`, `int`, `oneOf`, `ip`, `list`). `parseFlags(table, argv, env)`
 * returns the values keyed by camelCase name, typed from the table, frozen. Adding a flag is
 * adding a row: its type, default, env variable and help line all follow from it.
 *
 * Rules (Go's flag package, as flanneld uses it, plus flannel's env fallback):
 * - `-flag` and `--flag` are the same; values as `--flag=value` or `--flag value`.
 * - Booleans: `--ip-masq` means true; `--ip-masq=false` (1/0, t/f, true/false, TRUE/FALSE, as
 *   Go's strconv.ParseBool). A boolean never takes the next argument as its value.
 * - A repeatable flag (`list`) accumulates every occurrence, in order.
 * - Every flag also reads `FLANNELD_<NAME_IN_UPPER_SNAKE>` from the env object; an empty
 *   variable is ignored. Repeatable flags split the variable on commas (unless the row says
 *   otherwise). The command line beats the env, which beats the default.
 * - `-h` is `--help` when the table has `help`.
 * - `--` ends the flags; other non-flag arguments are returned as positionals.
 * Every error is WEFT_ERR_USAGE (exit 2) naming the flag and the rule.
 */
import { isIP } from 'node:net';
import { usageError } from '../../common/errors.js';
import { LOG_FORMATS, LOG_LEVELS } from '../../common/log.js';
import { ENGINE_REQUESTS, offloadListError } from '../../dataplane/index.js';

export const ENV_PREFIX = 'FLANNELD_';

export type FlagKind = 'string' | 'bool' | 'int' | 'enum' | 'ip' | 'list';

/** One row of a flag table. `V` is the parsed value's type. */
export interface FlagDef<V> {
  readonly kind: FlagKind;
  readonly default: V;
  readonly help: string;
  /** For repeatables: whether the env variable is split on commas (default true). */
  readonly envSplit: boolean;
  /** Placeholder in usage text (`URLS`, `N`, `IP`, ...). */
  readonly valueName: string;
  /**
   * Converts one textual value (for a repeatable, one element). Returns the rule broken as a
   * string on failure (e.g. `must be between 1 and 64`).
   */
  readonly convert: (text: string) => { ok: true; value: unknown } | { ok: false; rule: string };
}

export type FlagTable = Readonly<Record<string, FlagDef<unknown>>>;

type CamelCase<S extends string> = S extends `${infer H}-${infer T}`
  ? `${H}${Capitalize<CamelCase<T>>}`
  : S;

/** The parsed values of a table, keyed by camelCase flag name. */
export type FlagValues<T extends FlagTable> = {
  readonly [K in keyof T & string as CamelCase<K>]: T[K] extends FlagDef<infer V> ? V : never;
};

export interface ParsedFlags<T extends FlagTable> {
  readonly values: FlagValues<T>;
  /** Flags set on the command line or through the environment (kebab-case names). */
  readonly explicit: ReadonlySet<keyof T & string>;
  /** Where each explicit flag came from. */
  readonly sources: Readonly<Partial<Record<keyof T & string, 'flag' | 'env'>>>;
  /** Non-flag arguments, in order (everything after `--` included). */
  readonly positionals: readonly string[];
}

// ---------------------------------------------------------------------------------------------
// Row builders

const ok = (value: unknown) => ({ ok: true as const, value });
const fail = (rule: string) => ({ ok: false as const, rule });

/** A string flag; `ruleBroken` (when given) names the rule a value breaks, or returns null. */
export function str(
  dflt: string,
  help: string,
  valueName = 'STRING',
  ruleBroken?: (text: string) => string | null,
): FlagDef<string> {
  const convert = ruleBroken
    ? (text: string) => {
        const rule = ruleBroken(text);
        return rule ? fail(rule) : ok(text);
      }
    : ok;
  return { kind: 'string', default: dflt, help, envSplit: false, valueName, convert };
}

const TRUE_WORDS = new Set(['1', 't', 'T', 'true', 'TRUE', 'True']);
const FALSE_WORDS = new Set(['0', 'f', 'F', 'false', 'FALSE', 'False']);

export function bool(dflt: boolean, help: string): FlagDef<boolean> {
  return {
    kind: 'bool',
    default: dflt,
    help,
    envSplit: false,
    valueName: '',
    convert: (text) => {
      if (TRUE_WORDS.has(text)) return ok(true);
      if (FALSE_WORDS.has(text)) return ok(false);
      return fail(`must be true or false, got "${text}"`);
    },
  };
}

export function int(
  dflt: number,
  help: string,
  range: { min?: number; max?: number } = {},
): FlagDef<number> {
  const { min = Number.MIN_SAFE_INTEGER, max = Number.MAX_SAFE_INTEGER } = range;
  return {
    kind: 'int',
    default: dflt,
    help,
    envSplit: false,
    valueName: 'N',
    convert: (text) => {
      if (!/^[+-]?\d+$/.test(text)) return fail(`must be a whole number, got "${text}"`);
      const n = Number(text);
      if (n < min || n > max) return fail(`must be between ${min} and ${max}, got ${n}`);
      return ok(n);
    },
  };
}

export function oneOf<const C extends readonly string[]>(
  choices: C,
  dflt: C[number],
  help: string,
): FlagDef<C[number]> {
  return {
    kind: 'enum',
    default: dflt,
    help,
    envSplit: false,
    valueName: choices.join('|'),
    convert: (text) =>
      choices.includes(text)
        ? ok(text)
        : fail(`must be one of ${choices.join('|')}, got "${text}"`),
  };
}

/** An address (family 4, 6, or either); "" (the default) means unset. */
export function ip(family: 4 | 6 | 'any', help: string, dflt = ''): FlagDef<string> {
  const what = family === 'any' ? 'an IP address' : `an IPv${family} address`;
  return {
    kind: 'ip',
    default: dflt,
    help,
    envSplit: false,
    valueName: family === 6 ? 'IPV6' : 'IP',
    convert: (text) => {
      const f = isIP(text);
      if (text === '' || (f !== 0 && (family === 'any' || f === family))) return ok(text);
      return fail(`must be ${what}, got "${text}"`);
    },
  };
}

/** A repeatable string flag; every occurrence adds one entry. */
export function list(
  help: string,
  options: { envSplit?: boolean; valueName?: string } = {},
): FlagDef<readonly string[]> {
  return {
    kind: 'list',
    default: Object.freeze([]),
    help,
    envSplit: options.envSplit ?? true,
    valueName: options.valueName ?? 'STRING',
    convert: ok,
  };
}

// ---------------------------------------------------------------------------------------------
// The daemon's flags (flannel's names and defaults, then weft's own)

/** --dataplane-engine's choices: the dataplane's (choose-engine.ts), which decides what they mean. */
export const DATAPLANE_ENGINES = ENGINE_REQUESTS;

export const DAEMON_FLAGS = {
  'etcd-endpoints': str(
    'http://127.0.0.1:4001,http://127.0.0.1:2379',
    'a comma-delimited list of etcd endpoints',
    'URLS',
  ),
  'etcd-prefix': str('/coreos.com/network', 'etcd prefix', 'PREFIX'),
  'etcd-keyfile': str('', 'SSL key file used to secure etcd communication', 'FILE'),
  'etcd-certfile': str('', 'SSL certification file used to secure etcd communication', 'FILE'),
  'etcd-cafile': str(
    '',
    'SSL Certificate Authority file used to secure etcd communication',
    'FILE',
  ),
  'etcd-username': str('', 'username for BasicAuth to etcd', 'USER'),
  'etcd-password': str('', 'password for BasicAuth to etcd', 'PASSWORD'),
  'kube-subnet-mgr': bool(
    false,
    'contact the Kubernetes API for subnet assignment instead of etcd',
  ),
  'kube-api-url': str('', 'Kubernetes API server URL (not needed when running in a pod)', 'URL'),
  'kubeconfig-file': str('', 'kubeconfig file location (not needed when running in a pod)', 'FILE'),
  'kube-annotation-prefix': str(
    'flannel.alpha.coreos.com',
    'Kubernetes annotation prefix; "/" is appended unless it contains one',
    'PREFIX',
  ),
  'net-config-path': str(
    '/etc/kube-flannel/net-conf.json',
    'path to the network configuration file',
    'FILE',
  ),
  iface: list(
    'interface to use (IP or name) for inter-host communication; repeatable, tried in order',
    { valueName: 'NAME|IP' },
  ),
  'iface-regex': list(
    'regex matching the interface (name or an address) to use; repeatable, tried in order after --iface (the env variable holds one regex, not split on commas)',
    { envSplit: false, valueName: 'REGEX' },
  ),
  'iface-can-reach': ip(
    'any',
    "use the interface the kernel would use to reach this address (as 'ip route get')",
  ),
  'public-ip': ip(4, 'IP accessible by other nodes for inter-host communication'),
  'public-ipv6': ip(6, 'IPv6 accessible by other nodes for inter-host communication'),
  'ip-masq': bool(
    false,
    'setup IP masquerade rule for traffic destined outside of overlay network',
  ),
  'ip-masq-fully-random-disable': bool(false, 'disable fully-random mode for MASQUERADE'),
  'iptables-resync': int(5, 'resync period for iptables rules, in seconds', { min: 1 }),
  'iptables-forward-rules': bool(true, 'add default accept rules to FORWARD chain in iptables'),
  'subnet-file': str(
    '/run/flannel/subnet.env',
    'filename where env variables (subnet, MTU, ...) will be written to',
    'FILE',
  ),
  'subnet-lease-renew-margin': int(
    60,
    'subnet lease renewal margin, in minutes, ranging from 1 to 1439',
    { min: 1, max: 1439 },
  ),
  'healthz-ip': ip('any', 'the IP address for the healthz server to listen on', '0.0.0.0'),
  'healthz-port': int(0, 'the port for the healthz server to listen on (0 to disable)', {
    min: 0,
    max: 65535,
  }),
  'ip-blackhole-route': bool(false, "add a blackhole route for the node's own subnet"),
  'set-node-network-unavailable': bool(true, 'set NetworkUnavailable=False on the node when ready'),
  // flanneld's klog flags: -v sets the log level (when --log-level is not given); the other two
  // have no meaning in weft and are accepted with one warning.
  v: int(0, "log verbosity as flanneld's -v: 0 info, 1-4 debug, 5+ trace (unless --log-level)", {
    min: 0,
    max: 2 ** 31 - 1,
  }),
  vmodule: str('', "flanneld's per-file verbosity; accepted, no meaning in weft", 'PATTERN'),
  log_backtrace_at: str(
    '',
    "flanneld's backtrace location; accepted, no meaning in weft",
    'FILE:N',
  ),
  version: bool(false, 'print version and exit'),
  help: bool(false, 'print this message'),
  'store-dir': str(
    '/var/lib/weft/store',
    'embedded lease store directory (used when neither --etcd-endpoints nor --kube-subnet-mgr is given)',
    'DIR',
  ),
  'log-level': oneOf(LOG_LEVELS, 'info', 'log level'),
  'log-format': oneOf(LOG_FORMATS, 'json', 'log line format: json (one object per line) or text'),
  'release-lease-on-exit': bool(false, 'delete our lease when the daemon stops'),
  'dataplane-engine': oneOf(
    DATAPLANE_ENGINES,
    'auto',
    'userspace packet engine: native (the C++ addon), bpf (TC-BPF encap/decap in the kernel, native as slow path; falls back to native), js (the reference engine), auto (native; bpf for vxlan "auto" on a kernel without vxlan)',
  ),
  'dataplane-offloads': str(
    '',
    'userspace dataplane offloads: all, none, or a comma list of csum,tso4,tso6,uso4,uso6,gro,udp_gso,udp_gro,tap_gso (default: $WEFT_DATAPLANE_OFFLOADS, else all)',
    'LIST',
    offloadListError,
  ),
  'dataplane-busy-poll': int(
    0,
    'µs a userspace dataplane worker polls for more packets after a light burst before sleeping (0: never)',
    { min: 0, max: 10_000 },
  ),
  'dataplane-cpu-affine': bool(
    true,
    "pin userspace dataplane queue k to CPU k, steer TUN packets to the sending CPU's queue and receive on that CPU's socket (needs one queue per CPU; else logged and unpinned; =false: unpinned, the TUN steers by flow)",
  ),
  'dataplane-sched-fifo': int(
    0,
    'run the userspace dataplane loop threads SCHED_FIFO at this priority (1-99; needs CAP_SYS_NICE, else logged; 0: the normal policy)',
    { min: 0, max: 99 },
  ),
  'dataplane-queue-threads': int(
    1,
    'threads per userspace dataplane queue: 1 (moving both directions) or 2 (one per direction)',
    { min: 1, max: 2 },
  ),
  'dataplane-workers': int(
    0,
    'userspace dataplane TUN queues (each with its UDP socket and thread); 0: one per CPU, at most 4',
    { min: 0, max: 64 },
  ),
  'pod-bridge': str(
    'cni0',
    'the pods\' bridge, as the CNI config names it (flannel\'s delegate "bridge", default cni0): the bpf engine hands GSO packets for its pods straight to their ports',
    'NAME',
    linkNameError,
  ),
} as const satisfies FlagTable;

/** Why `name` cannot name a network device (the kernel's dev_valid_name), or null. */
export function linkNameError(name: string): string | null {
  if (name === '') return 'must not be empty';
  if (Buffer.byteLength(name) > 15) return 'must be at most 15 bytes (IFNAMSIZ - 1)';
  if (name === '.' || name === '..') return 'must not be . or ..';
  if (/[/:\s]/.test(name)) return "must not contain '/', ':' or whitespace";
  return null;
}

export type DaemonFlagTable = typeof DAEMON_FLAGS;

/** flanneld flags weft accepts but cannot honour (klog internals): warned once when given. */
export const IGNORED_FLANNELD_FLAGS = ['vmodule', 'log_backtrace_at'] as const;
export type DaemonOptions = FlagValues<DaemonFlagTable>;

/** The subset a table row list picks out of another table, keeping the rows' types. */
export function pickFlags<T extends FlagTable, const K extends keyof T & string>(
  table: T,
  names: readonly K[],
): Pick<T, K> {
  const out: Partial<Pick<T, K>> = {};
  for (const n of names) out[n] = table[n];
  return Object.freeze(out) as Pick<T, K>;
}

/** Flags of the store-only commands (`weft config set|get`, `weft leases`). */
export const STORE_FLAGS = pickFlags(DAEMON_FLAGS, [
  'etcd-endpoints',
  'etcd-prefix',
  'etcd-keyfile',
  'etcd-certfile',
  'etcd-cafile',
  'etcd-username',
  'etcd-password',
  'kube-subnet-mgr',
  'kube-api-url',
  'kubeconfig-file',
  'kube-annotation-prefix',
  'net-config-path',
  'store-dir',
  'log-level',
  'help',
]);

export type StoreFlagTable = typeof STORE_FLAGS;
export type StoreOptions = FlagValues<StoreFlagTable>;

export type StoreKind = 'kube' | 'etcd' | 'embedded';

/**
 * Which lease store the flags select: `kube` with --kube-subnet-mgr, `etcd` when
 * --etcd-endpoints was given (flag or env), else the embedded store under --store-dir.
 */
export function storeKind(parsed: {
  readonly values: { readonly kubeSubnetMgr: boolean };
  readonly explicit: ReadonlySet<string>;
}): StoreKind {
  if (parsed.values.kubeSubnetMgr) return 'kube';
  if (parsed.explicit.has('etcd-endpoints')) return 'etcd';
  return 'embedded';
}

// ---------------------------------------------------------------------------------------------
// Parsing

export function camelCase(name: string): string {
  return name.replace(/-([a-z0-9])/g, (_, c: string) => c.toUpperCase());
}

export function envName(name: string): string {
  return ENV_PREFIX + name.toUpperCase().replace(/-/g, '_');
}

/** Whether an argument is a flag (and not a lone `-` or a negative number). */
function looksLikeFlag(arg: string): boolean {
  return arg.length > 1 && arg.startsWith('-') && !/^-\d/.test(arg);
}

export function parseFlags<T extends FlagTable>(
  table: T,
  argv: readonly string[],
  env: Readonly<Record<string, string | undefined>> = {},
): ParsedFlags<T> {
  type Name = keyof T & string;
  const values = new Map<Name, unknown>();
  const sources: Partial<Record<Name, 'flag' | 'env'>> = {};
  const positionals: string[] = [];

  const lookup = (name: string): FlagDef<unknown> | undefined =>
    Object.hasOwn(table, name) ? table[name] : undefined;

  const store = (name: Name, def: FlagDef<unknown>, text: string, shown: string) => {
    const r = def.convert(text);
    if (!r.ok) throw usageError(shown, r.rule);
    if (def.kind === 'list') {
      const prev = (values.get(name) as string[] | undefined) ?? [];
      values.set(name, [...prev, r.value as string]);
    } else {
      values.set(name, r.value);
    }
  };

  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === '--') {
      positionals.push(...argv.slice(i + 1));
      break;
    }
    if (!looksLikeFlag(arg)) {
      positionals.push(arg);
      continue;
    }
    const body = arg.startsWith('--') ? arg.slice(2) : arg.slice(1);
    const eq = body.indexOf('=');
    // `-h` is help, as in Go's flag package.
    const name = body === 'h' && lookup('help') ? 'help' : eq >= 0 ? body.slice(0, eq) : body;
    const shown = `--${name}`;
    const def = lookup(name);
    if (def === undefined || name === '') throw usageError(arg.split('=')[0]!, 'unknown flag');
    let text: string;
    if (eq >= 0) {
      text = body.slice(eq + 1);
    } else if (def.kind === 'bool') {
      text = 'true';
    } else {
      const next = argv[i + 1];
      if (next === undefined || looksLikeFlag(next)) throw usageError(shown, 'needs a value');
      text = next;
      i++;
    }
    store(name as Name, def, text, shown);
    sources[name as Name] = 'flag';
  }

  for (const name of Object.keys(table) as Name[]) {
    if (sources[name] !== undefined) continue;
    const def = table[name]!;
    const variable = envName(name);
    const raw = env[variable];
    if (raw === undefined || raw === '') continue;
    const shown = `--${name} (from ${variable})`;
    const parts = def.kind === 'list' && def.envSplit ? raw.split(',').map((s) => s.trim()) : [raw];
    for (const part of parts) if (part !== '') store(name, def, part, shown);
    sources[name] = 'env';
  }

  const out: Record<string, unknown> = {};
  for (const name of Object.keys(table) as Name[]) {
    const v = values.has(name) ? values.get(name) : table[name]!.default;
    out[camelCase(name)] = Array.isArray(v) ? Object.freeze([...(v as unknown[])]) : v;
  }
  return Object.freeze({
    values: Object.freeze(out) as FlagValues<T>,
    explicit: new Set(Object.keys(sources) as Name[]) as ReadonlySet<Name>,
    sources: Object.freeze(sources),
    positionals: Object.freeze(positionals),
  });
}

// ---------------------------------------------------------------------------------------------
// Help text

/** The --help text: one entry per flag with its value, default and env variable. */
export function usage(table: FlagTable, command = 'weft daemon', summary = ''): string {
  const lines = [`Usage: ${command} [OPTION]...`];
  if (summary) lines.push('', summary);
  lines.push('', 'Options:');
  for (const [name, def] of Object.entries(table)) {
    const head = def.kind === 'bool' ? `--${name}` : `--${name}=${def.valueName}`;
    lines.push(`  ${head}`);
    const extras: string[] = [];
    if (def.kind === 'list') extras.push('repeatable');
    else if (def.kind === 'bool') extras.push(`default ${String(def.default)}`);
    else if (def.default !== '') extras.push(`default ${JSON.stringify(def.default)}`);
    extras.push(`env ${envName(name)}`);
    lines.push(`      ${def.help} (${extras.join('; ')})`);
  }
  lines.push(
    '',
    'Flags are also spelled -flag; values as --flag=value or --flag value.',
    'The command line beats the environment, which beats the default.',
  );
  return lines.join('\n') + '\n';
}
