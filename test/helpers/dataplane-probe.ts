/**
 * Starts and stops a native dataplane inside a node namespace and reports, as one JSON line on
 * stdout, what the process holds before, during and after: for the namespace tests of how the
 * dataplane hosts its workers (test/netns/dataplane-engine.test.ts).
 *
 *   ip netns exec NS node --import tsx dataplane-probe.ts <mode>[,<mode>] '<json DataplaneOptions>'
 *
 * mode `pool`:      start, report the queues' threads, close
 *                   → {threadIds, statsWorkers, threads: [before, running, after], fds: [before, after]}
 * mode `no-addon`:  the worker threads cannot load the addon (WEFT_NATIVE_ADDON points nowhere
 *                   after the main thread loaded it), so no queue enters its loop
 *                   → {error: {name, code, message}, tunLeft, threads: [before, after], fds: [...]}
 * The process warms up with one start/close first (threads and fds opened once per process); then
 * each mode given runs in turn (no-addon last: the addon stays unloadable), measuring from what
 * the process holds as it begins, and prints its line. The probe then returns from its module
 * without process.exit: it exits only if nothing is left running.
 */
import { execFileSync } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { startDataplane } from '../../src/dataplane/index.js';
import type { DataplaneOptions } from '../../src/dataplane/index.js';
import { parseMac } from '../../src/dataplane/peer-table.js';

const modes = (process.argv[2] ?? '').split(',');
if (modes.indexOf('no-addon') !== -1 && modes.indexOf('no-addon') !== modes.length - 1) {
  throw new Error('no-addon runs last');
}
const cfg = JSON.parse(process.argv[3] ?? '{}') as Omit<DataplaneOptions, 'vtepMac'> & {
  vtepMac: string;
};
const opts: DataplaneOptions = { ...cfg, engine: 'native', vtepMac: parseMac(cfg.vtepMac)! };

const fds = () => readdirSync('/proc/self/fd').length;
const threads = () => readdirSync('/proc/self/task').length;
const linkExists = (name: string) => {
  try {
    execFileSync('ip', ['link', 'show', name], { stdio: 'pipe' });
    return true;
  } catch {
    return false;
  }
};

await (await startDataplane(opts)).close();

for (const mode of modes) {
  const before = { fds: fds(), threads: threads() };
  if (mode === 'pool') {
    const dp = await startDataplane(opts);
    const running = threads();
    const report = { threadIds: dp.threadIds, statsWorkers: dp.stats().workers.length };
    await dp.close();
    process.stdout.write(
      JSON.stringify({
        ...report,
        threads: [before.threads, running, threads()],
        fds: [before.fds, fds()],
      }) + '\n',
    );
  } else if (mode === 'no-addon') {
    process.env.WEFT_NATIVE_ADDON = '/nonexistent/weft.node';
    let error: { name: string; code: unknown; message: string } | null = null;
    try {
      await (await startDataplane(opts)).close();
    } catch (err) {
      const e = err as Error & { code?: unknown };
      error = { name: e.name, code: e.code, message: e.message };
    }
    process.stdout.write(
      JSON.stringify({
        error,
        tunLeft: linkExists(opts.tunName),
        threads: [before.threads, threads()],
        fds: [before.fds, fds()],
      }) + '\n',
    );
  } else {
    throw new Error(`unknown mode ${mode}`);
  }
}
