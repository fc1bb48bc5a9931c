/**
 * The fault suite (`npm run faults`, root; never part of `npm test`): issue #17's fault campaign
 * against the real daemon and a real etcd, every row on every backend — kernel vxlan, host-gw,
 * udp, vxlan "Dataplane":"userspace", and both with --dataplane-engine=bpf (vxlan-bpf, udp-bpf)
 * — one testbed per backend (bed.ts draws it), the rows in
 * rows.ts. Prints a table (row, backend, figure, goal, verdict) and writes JSON to
 * bench/results/faults/<time>.json; a full run (every row and backend, not --short) also
 * replaces bench/results/faults/latest.{json,md}, which bench/faults/README.md's table comes from.
 *
 * Everything it makes (namespaces, processes, the testbed dirs) is removed on success, failure
 * and Ctrl-C. A row that fails says so in the table; the exit status is 1 when any row did.
 */
import { execFileSync } from 'node:child_process';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { readFileSync, readdirSync, rmSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { bool, int, list, parseFlags, usage } from '../../src/control/config/flags.js';
import { Progress } from '../../src/control/demo/progress.js';
import { PACKAGE_ROOT } from '../../src/testbed/cluster.js';
import { onEarlyEnd } from '../../src/testbed/early-end.js';
import { deleteNamespace, isRoot } from '../../src/testbed/netns.js';
import { saveResults } from '../report.js';
import { PATHS } from '../run.js';
import { BED_PREFIX, Bed, type FaultBackend } from './bed.js';
import { type FaultResult, exitStatus, faultTable, resultOf, tally } from './report.js';
import { ROWS, type RowOptions } from './rows.js';

/**
 * The four backends, the bpf engine on the two userspace framings (vxlan-bpf, udp-bpf:
 * --dataplane-engine=bpf) and wireguard (native engine), as the bench names and configures them.
 */
const DEVICES: Readonly<Record<string, string>> = {
  udp: 'flannel0',
  vxlan: 'flannel.1',
  wireguard: 'flannel-wg',
};
const PORTS: Readonly<Record<string, number>> = { udp: 8285, vxlan: 8472, wireguard: 51820 };

export const BACKENDS: readonly FaultBackend[] = [
  'vxlan',
  'host-gw',
  'udp',
  'vxlan-userspace',
  'vxlan-bpf',
  'udp-bpf',
  'wireguard',
].map((name) => {
  const p = PATHS.find((x) => x.name === name)!;
  const type = String(p.backend!.Type);
  const flags = p.daemonArgs ?? [];
  return {
    name,
    label: p.label,
    backend: p.backend!,
    flags,
    // the bpf engine has the TUN and the UDP socket too (the native engine is its slow path)
    userspace: p.userspace || flags.includes('--dataplane-engine=bpf'),
    dev: DEVICES[type] ?? null,
    port: PORTS[type] ?? null,
    leaseType: type === 'udp' ? '' : type,
  };
});

const FLAGS = {
  rows: list(`rows, comma-separated (default: all: ${ROWS.map((r) => r.id).join(',')})`, {
    valueName: 'LIST',
  }),
  backends: list(`backends, comma-separated (default: ${BACKENDS.map((b) => b.name).join(',')})`, {
    valueName: 'LIST',
  }),
  short: bool(false, 'a short run: etcd down 10 s (unless --etcd-down), shorter floods and holds'),
  'etcd-down': int(60, 'seconds etcd stays stopped in the etcd-down row', { min: 1, max: 600 }),
  help: bool(false, 'print this message'),
} as const;

const RESULTS = fileURLToPath(new URL('../results/faults/', import.meta.url));

/** `a,b` `c` → [a, b, c]; unknown names are an error naming them. */
export function pick<T extends { readonly name?: string; readonly id?: string }>(
  flag: string,
  given: readonly string[],
  all: readonly T[],
): T[] {
  const names = given
    .flatMap((g) => g.split(','))
    .map((g) => g.trim())
    .filter(Boolean);
  if (names.length === 0) return [...all];
  const key = (x: T) => x.name ?? x.id!;
  const unknown = names.filter((n) => !all.some((x) => key(x) === n));
  if (unknown.length)
    throw new Error(`--${flag}: unknown ${unknown.join(', ')} (known: ${all.map(key).join(', ')})`);
  return all.filter((x) => names.includes(key(x)));
}

function commit(): string {
  try {
    const head = execFileSync('git', ['rev-parse', '--short', 'HEAD'], {
      cwd: PACKAGE_ROOT,
      encoding: 'utf8',
    }).trim();
    const dirty = execFileSync('git', ['status', '--porcelain', '--untracked-files=no'], {
      cwd: PACKAGE_ROOT,
      encoding: 'utf8',
    }).trim();
    return dirty ? `${head}+changes` : head;
  } catch {
    return 'unknown';
  }
}

/**
 * What a testbed being built (or torn down) when Ctrl-C came leaves: this process's namespaces
 * and testbed dirs, found by their names (`weft-faults-<pid>-…`).
 */
async function sweep(): Promise<void> {
  const mine = `${BED_PREFIX}-`;
  const names = execFileSync('ip', ['netns', 'list'], { encoding: 'utf8' })
    .split('\n')
    .map((l) => l.split(' ')[0]!)
    .filter((n) => n.startsWith(mine));
  await Promise.all(names.map((n) => deleteNamespace(n)));
  for (const d of readdirSync(tmpdir()))
    if (d.startsWith(mine)) rmSync(join(tmpdir(), d), { recursive: true, force: true });
}

export async function main(argv: readonly string[]): Promise<number> {
  let parsed;
  let rows;
  let backends;
  try {
    parsed = parseFlags(FLAGS, argv, process.env);
    rows = pick('rows', parsed.values.rows, ROWS);
    backends = pick('backends', parsed.values.backends, BACKENDS);
  } catch (err) {
    process.stderr.write(`weft faults: ${(err as Error).message}\n`);
    return 2;
  }
  const o = parsed.values;
  if (o.help) {
    process.stdout.write(
      usage(FLAGS, 'npm run faults --', "issue #17's fault campaign, every backend"),
    );
    return 0;
  }
  if (!isRoot()) {
    process.stderr.write('weft faults: must run as root (it creates network namespaces)\n');
    return 1;
  }
  const ro: RowOptions = {
    short: o.short,
    etcdDownS: o.short && !parsed.explicit.has('etcd-down') ? 10 : o.etcdDown,
  };
  const progress = new Progress();
  const results: FaultResult[] = [];
  // the testbed of the backend under test (one at a time), for the Ctrl-C handler too
  const now: { bed: Bed | null } = { bed: null };
  // An early end (a signal, or an error nothing caught: an EPIPE from a dead helper once left
  // four node namespaces behind) removes the testbed too.
  const early = onEarlyEnd('weft faults', () =>
    (now.bed?.destroy() ?? Promise.resolve()).then(sweep, sweep),
  );
  const started = new Date();
  try {
    for (const b of backends) {
      for (const row of rows) {
        if (early.stopping) break;
        const na = row.notApplicable(b);
        if (na) {
          results.push(resultOf(row, b.name, { notApplicable: na }));
          continue;
        }
        const result = await progress
          .step(
            `${b.name}: ${row.title}`,
            async () => {
              if (now.bed) {
                // a row left the bed sick: heal it, else build a new one
                const sick = now.bed;
                await sick.restore().catch(async (err: Error) => {
                  progress.note(`testbed: ${err.message.split('\n')[0]}; building a new one`);
                  now.bed = null;
                  await sick.destroy();
                });
              }
              now.bed ??= await Bed.build(b);
              return resultOf(row, b.name, { outcome: await row.run(now.bed, ro) });
            },
            (r) => `${r.verdict}: ${r.figure}`,
          )
          .catch((error: unknown) => resultOf(row, b.name, { error }));
        results.push(result);
      }
      await now.bed?.destroy();
      now.bed = null;
    }
  } finally {
    await now.bed?.destroy();
    early.off();
  }
  const table = faultTable(results);
  const meta = {
    started: started.toISOString(),
    commit: commit(),
    kernel: readFileSync('/proc/sys/kernel/osrelease', 'utf8').trim(),
    cpus: cpus().length,
    command: `npm run faults -- ${argv.join(' ')}`.trim(),
    short: ro.short,
    etcdDownS: ro.etcdDownS,
  };
  const json = JSON.stringify({ meta, results }, null, 2) + '\n';
  const full = !o.short && o.rows.length === 0 && o.backends.length === 0;
  const header = `Fault suite, ${meta.started.slice(0, 10)}, commit ${meta.commit}, ${meta.cpus} CPUs, kernel ${meta.kernel}${ro.short ? ' (short)' : ''}: ${tally(results)}\n\n`;
  const saved = saveResults(RESULTS, started, { json, table: header + table }, full);
  process.stdout.write(`\n${header}${table}\nresults: bench/results/faults/${saved[0]}\n`);
  if (!full)
    process.stdout.write('(not a full run: bench/results/faults/latest.* left as they were)\n');
  return exitStatus(results);
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  main(process.argv.slice(2)).then((code) => (process.exitCode = code));
}
