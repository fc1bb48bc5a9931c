/**
 * A lock between test files over something the host has only one of. scripts/run-tests.mjs runs
 * two namespace files at once; each works in namespaces and temp dirs of its own, except where
 * a tool insists on a host-wide path (wireguard-go's and `wg`'s UAPI directory,
 * /var/run/wireguard). A test that uses such a path holds the lock named for it, so what it finds
 * there before and leaves there after is its own doing.
 *
 * The lock is a directory made with mkdir (atomic) under the temp dir, holding the holder's pid.
 * The holder's exit releases it; one left by a process that died (SIGKILL) is taken over once
 * its pid is gone.
 */
import { mkdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const WAIT_MS = 100;
/** A lock directory without a pid file this old was left between mkdir and the pid's write. */
const HALF_MADE_MS = 10_000;
/** Longer than any one test file holds a lock. */
const GIVE_UP_MS = 10 * 60_000;

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** Whether the lock at `dir` was left by a process that is gone. */
function abandoned(dir: string): boolean {
  try {
    const pid = Number(readFileSync(join(dir, 'pid'), 'utf8'));
    return Number.isInteger(pid) && pid > 0 && !alive(pid);
  } catch {
    try {
      return Date.now() - statSync(dir).mtimeMs > HALF_MADE_MS;
    } catch {
      return false; // released in between
    }
  }
}

/** Waits for the lock `name` and returns its release (also run at this process's exit). */
export async function hostLock(name: string): Promise<() => void> {
  const dir = join(tmpdir(), `weft-test-lock.${name}`);
  const deadline = Date.now() + GIVE_UP_MS;
  for (;;) {
    try {
      mkdirSync(dir);
      writeFileSync(join(dir, 'pid'), String(process.pid));
      let held = true;
      const release = (): void => {
        if (!held) return;
        held = false;
        process.off('exit', release);
        rmSync(dir, { recursive: true, force: true });
      };
      process.on('exit', release);
      return release;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
    }
    if (abandoned(dir)) rmSync(dir, { recursive: true, force: true });
    else if (Date.now() > deadline) throw new Error(`host lock ${name}: still held after 10 min`);
    await new Promise((r) => setTimeout(r, WAIT_MS));
  }
}
