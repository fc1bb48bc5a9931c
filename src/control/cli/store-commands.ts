/**
 * Store-only commands: `weft config set FILE`, `weft config get`, `weft leases [--json]`.
 * Same store flags as the daemon (embedded by default, --etcd-endpoints, ...).
 */
import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { WeftError, usageError } from '../../common/errors.js';
import { formatCIDR } from '../../common/ip.js';
import {
  bool,
  parseFlags,
  storeKind,
  STORE_FLAGS,
  usage,
  type ParsedFlags,
} from '../config/flags.js';
import { parseNetConfig } from '../config/net-config.js';
import { decodeLease } from '../lease/lease-json.js';
import { openRegistry } from '../registry/open.js';

export interface Io {
  readonly stdout: { write(s: string): unknown };
  readonly env: Readonly<Record<string, string | undefined>>;
}

export const LEASES_FLAGS = { ...STORE_FLAGS, json: bool(false, 'print the leases as JSON') };

async function readConfigFromFlags(parsed: ParsedFlags<typeof STORE_FLAGS>): Promise<string> {
  try {
    return await readFile(parsed.values.netConfigPath, 'utf8');
  } catch (err) {
    throw new WeftError(
      'WEFT_ERR_CONFIG_NOT_FOUND',
      `read ${parsed.values.netConfigPath}: ${(err as Error).message}`,
    );
  }
}

export async function configCommand(argv: readonly string[], io: Io): Promise<number> {
  const parsed = parseFlags(STORE_FLAGS, argv, io.env);
  const [action, file, ...extra] = parsed.positionals;
  if (parsed.values.help || !action) {
    io.stdout.write(
      usage(
        STORE_FLAGS,
        'weft config set FILE | weft config get',
        'Write or read the network config in the store.',
      ),
    );
    return parsed.values.help ? 0 : 2;
  }
  if (extra.length > 0) throw usageError('', `unexpected argument ${JSON.stringify(extra[0])}`);
  const kube = storeKind({ values: parsed.values, explicit: parsed.explicit }) === 'kube';
  if (action === 'get') {
    if (file !== undefined) throw usageError('', 'config get takes no argument');
    if (kube) {
      io.stdout.write(await readConfigFromFlags(parsed));
      return 0;
    }
    const reg = await openForReading(parsed);
    try {
      const text = await reg.getNetworkConfig();
      io.stdout.write(text.endsWith('\n') ? text : text + '\n');
    } finally {
      await reg.close();
    }
    return 0;
  }
  if (action === 'set') {
    if (file === undefined) throw usageError('', 'config set needs a FILE (use - for stdin)');
    const text = file === '-' ? await readStdin() : await readConfigFile(file);
    // refuse to store a config the daemons would reject: theirs are the same checks (the
    // backends load only here, not for `config get` or `leases`)
    const { checkBackendConfig } = await import('../backend/registry.js');
    checkBackendConfig(parseNetConfig(text).backend);
    if (kube)
      throw usageError('kube-subnet-mgr', 'in kube mode the config is the net-conf.json ConfigMap');
    const reg = await openRegistry(parsed);
    try {
      await reg.setNetworkConfig(text.trim());
    } finally {
      await reg.close();
    }
    return 0;
  }
  throw usageError('', `unknown config action ${JSON.stringify(action)} (set or get)`);
}

async function readConfigFile(file: string): Promise<string> {
  try {
    return await readFile(file, 'utf8');
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    const why = code === 'ENOENT' ? 'no such file' : code === 'EISDIR' ? 'a directory' : code;
    throw usageError('', `config set: cannot read ${file}: ${why ?? (err as Error).message}`);
  }
}

/**
 * The store for a read-only command: it must exist (a mistyped --store-dir is an error, not an
 * empty list), and reading it creates nothing.
 */
async function openForReading<T extends typeof STORE_FLAGS>(parsed: ParsedFlags<T>) {
  const v = parsed.values as ParsedFlags<typeof STORE_FLAGS>['values'];
  const kind = storeKind({ values: v, explicit: parsed.explicit as ReadonlySet<string> });
  const dir = v.storeDir;
  if (kind === 'embedded' && !existsSync(join(dir, 'subnets'))) {
    throw usageError(
      'store-dir',
      `${dir} holds no embedded store (the daemon or 'weft config set' creates one)`,
    );
  }
  return openRegistry(parsed, { readOnly: true });
}

async function readStdin(): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const c of process.stdin) chunks.push(c as Buffer);
  return Buffer.concat(chunks).toString('utf8');
}

export async function leasesCommand(argv: readonly string[], io: Io): Promise<number> {
  const parsed = parseFlags(LEASES_FLAGS, argv, io.env);
  if (parsed.values.help) {
    io.stdout.write(usage(LEASES_FLAGS, 'weft leases', 'List the leases in the store.'));
    return 0;
  }
  if (parsed.positionals.length > 0)
    throw usageError('', `unexpected argument ${JSON.stringify(parsed.positionals[0])}`);
  const reg = await openForReading(parsed);
  let list;
  try {
    list = await reg.listSubnets(undefined, { expirations: true });
  } finally {
    await reg.close();
  }
  const rows = [...list.leases].sort((a, b) => a.key.localeCompare(b.key, 'en', { numeric: true }));
  if (parsed.values.json) {
    const out = rows.map((s) => {
      const d = decodeLease(s);
      if (!d.ok) return { key: s.key, malformed: d.reason, value: s.value };
      const l = d.value;
      return {
        key: l.key,
        subnet: l.subnet && formatCIDR(l.subnet),
        ipv6Subnet: l.ipv6Subnet && formatCIDR(l.ipv6Subnet),
        publicIP: l.attrs.publicIP,
        publicIPv6: l.attrs.publicIPv6,
        backendType: l.attrs.backendType,
        backendData: l.attrs.backendData ?? null,
        expiration: l.expiration?.toISOString() ?? null,
      };
    });
    io.stdout.write(JSON.stringify(out, null, 2) + '\n');
    return 0;
  }
  const table = [['SUBNET', 'IPV6 SUBNET', 'PUBLIC IP', 'BACKEND', 'EXPIRES']];
  for (const s of rows) {
    const d = decodeLease(s);
    if (!d.ok) {
      table.push([s.key, '-', '-', '-', `malformed: ${d.reason}`]);
      continue;
    }
    const l = d.value;
    table.push([
      l.subnet ? formatCIDR(l.subnet) : '-',
      l.ipv6Subnet ? formatCIDR(l.ipv6Subnet) : '-',
      [l.attrs.publicIP !== '0.0.0.0' ? l.attrs.publicIP : '', l.attrs.publicIPv6 ?? '']
        .filter(Boolean)
        .join(' '),
      l.attrs.backendType || '-',
      l.expiration ? l.expiration.toISOString() : 'never (reservation)',
    ]);
  }
  const widths = table[0]!.map((_, i) => Math.max(...table.map((r) => r[i]!.length)));
  for (const r of table)
    io.stdout.write(
      r
        .map((c, i) => c.padEnd(widths[i]!))
        .join('  ')
        .trimEnd() + '\n',
    );
  return 0;
}
