/**
 * `weft cleanup`: removes what weft's dataplanes leave in this network namespace (bpf pins and
 * the links they hold, clsact filters, weft's TUN devices; src/dataplane/cleanup.ts says what and
 * what stays). Run it where no weft daemon runs: a running daemon's devices and programs go too.
 * Prints one line per thing removed; exits 1 when something could not be removed.
 */
import { usageError } from '../../common/errors.js';
import { bool, parseFlags, usage } from '../config/flags.js';
import type { Io } from './store-commands.js';

const CLEANUP_FLAGS = {
  json: bool(false, 'print the report as JSON'),
  help: bool(false, 'print this message'),
} as const;

export async function cleanupCommand(argv: readonly string[], io: Io): Promise<number> {
  const parsed = parseFlags(CLEANUP_FLAGS, argv, io.env);
  if (parsed.values.help) {
    io.stdout.write(
      usage(
        CLEANUP_FLAGS,
        'weft cleanup',
        "Remove what weft's dataplanes left in this network namespace (bpf pins and links, clsact filters, weft's TUN devices) and the wireguard UAPI sockets nobody serves. Run it where no weft daemon runs.",
      ),
    );
    return 0;
  }
  if (parsed.positionals.length > 0)
    throw usageError('', `unexpected argument ${JSON.stringify(parsed.positionals[0])}`);
  const { cleanupHost } = await import('../../dataplane/index.js');
  const r = await cleanupHost();
  if (parsed.values.json) io.stdout.write(JSON.stringify(r) + '\n');
  else {
    for (const p of r.pins) io.stdout.write(`removed pins: ${p.dir} (${p.pins})\n`);
    for (const f of r.filters) io.stdout.write(`removed clsact filter: ${f}\n`);
    for (const d of r.devices) io.stdout.write(`removed device: ${d}\n`);
    for (const p of r.sockets) io.stdout.write(`removed socket: ${p}\n`);
    for (const s of r.skipped) io.stdout.write(`not removed: ${s}\n`);
    const removed = r.pins.length + r.filters.length + r.devices.length + r.sockets.length;
    if (removed + r.skipped.length === 0) io.stdout.write('nothing to remove\n');
  }
  return r.skipped.length > 0 ? 1 : 0;
}
