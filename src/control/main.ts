/**
 * weft's entry point: wiring only. Subcommands dispatch to their modules; errors become exit
 * codes (2 for usage/config errors, naming the flag or field; 1 for runtime failures).
 *
 * Each command's module is imported when that command runs, never here: `weft version` loads
 * two small modules, `weft leases` no daemon, `weft cni` no store client (bench:footprint
 * measures it).
 */
import { ERROR_CODES, WeftError, errorMessage, usageError } from '../common/errors.js';
import type { Io } from './cli/store-commands.js';
import { VERSION } from './version.js';

const HELP = `weft ${VERSION} — a flannel-compatible overlay network

usage: weft <command> [flags]

commands:
  daemon            run the node agent (flanneld's flags; --help lists them)
  config set FILE   write the network config (net-conf JSON) to the store
  config get        print the network config from the store
  leases [--json]   list the leases in the store
  cleanup           remove weft's bpf pins, clsact filters and TUN devices here (no daemon running)
  bench             userspace vs kernel dataplanes in namespaces, ratios + chart (root)
  demo [down]       a local cluster in network namespaces, every backend tested (root)
  cni               the CNI plugin (CNI_COMMAND + config on stdin); also bin/weft-cni
  version           print the version
`;

type Command = (argv: readonly string[], io: Io) => Promise<number>;

const COMMANDS: Record<string, Command> = {
  daemon: async (argv, io) => (await import('./cli/daemon-command.js')).daemonCommand(argv, io),
  config: async (argv, io) => (await import('./cli/store-commands.js')).configCommand(argv, io),
  leases: async (argv, io) => (await import('./cli/store-commands.js')).leasesCommand(argv, io),
  cleanup: async (argv, io) => (await import('./cli/cleanup-command.js')).cleanupCommand(argv, io),
  cni: async (_argv, io) => {
    const { runCni } = await import('./cni/main.js');
    return runCni(io.env, process.stdin, io.stdout);
  },
  bench: async (argv) => {
    // The benchmark lives in bench/ (a development tool, run through tsx from a checkout).
    const { spawnSync } = await import('node:child_process');
    const { fileURLToPath } = await import('node:url');
    const script = fileURLToPath(new URL('../../bench/run.ts', import.meta.url));
    const r = spawnSync(process.execPath, ['--import', 'tsx', script, ...argv], {
      stdio: 'inherit',
    });
    if (r.error) process.stderr.write(`weft bench: cannot run ${script}: ${r.error.message}\n`);
    return r.status ?? 1;
  },
  demo: async (argv, io) => (await import('./demo/demo.js')).demoCommand(argv, io),
  version: async (_argv, io) => {
    io.stdout.write(`${VERSION}\n`);
    return 0;
  },
  help: async (_argv, io) => {
    io.stdout.write(HELP);
    return 0;
  },
};

export async function main(argv: readonly string[], io: Io): Promise<number> {
  const [name, ...rest] = argv;
  if (name === '--version' || name === '-version') return COMMANDS.version!(rest, io);
  if (name === '--help' || name === '-h' || name === '-help') return COMMANDS.help!(rest, io);
  if (name === undefined) {
    process.stderr.write(HELP);
    return 2;
  }
  const command = COMMANDS[name];
  try {
    if (!command) throw usageError('', `unknown command ${JSON.stringify(name)}`);
    return await command(rest, io);
  } catch (err) {
    return await reportFailure(name, err);
  }
}

async function reportFailure(command: string, err: unknown): Promise<number> {
  const { logger } = await import('../common/log.js');
  // Every failure is said plainly for a person on stderr, then logged as JSON for machines.
  if (err instanceof WeftError) {
    const hint =
      err.code === 'WEFT_ERR_USAGE' ? `run 'weft help' or 'weft ${command} --help'\n` : '';
    process.stderr.write(`weft ${command}: ${err.message}\n${hint}`);
    logger('main').error({ code: err.code, ...err.details }, err.message);
    return ERROR_CODES[err.code].exit;
  }
  process.stderr.write(`weft ${command}: unexpected failure: ${errorMessage(err)}\n`);
  logger('main').error(
    { err: errorMessage(err), stack: (err as Error)?.stack },
    'unexpected failure',
  );
  return 1;
}

export async function runMain(): Promise<void> {
  const code = await main(process.argv.slice(2), { stdout: process.stdout, env: process.env });
  process.exitCode = code;
}
