/**
 * A lock file shared by processes on one host (one pid namespace, one filesystem), for the
 * embedded store. Node has no flock(2), so the lock is a directory entry:
 *
 * - Acquire = write `{pid, start, nonce}` to a private temp file, then `link()` it to the lock
 *   path. link fails with EEXIST atomically, so exactly one process holds the entry.
 * - The owner is identified by pid AND the process start time (field 22 of /proc/<pid>/stat),
 *   so a recycled pid does not keep a dead owner's lock alive.
 * - A lock whose owner is dead is broken by renaming it to a unique name and checking that the
 *   renamed inode is the stale one we inspected; if a racing breaker already replaced it with a
 *   live lock, that lock is linked back. (The one window left: a third process acquiring during
 *   those two syscalls of a concurrent break of a crashed owner's lock.)
 * - Release unlinks the entry only if it is still ours (same inode).
 */
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { link, lstat, readFile, rename, unlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { WeftError, abortError } from '../../common/errors.js';
import { sleep } from '../../common/lifecycle.js';

export interface LockOwner {
  readonly pid: number;
  /** Process start time in clock ticks since boot, or 0 when /proc cannot tell. */
  readonly start: number;
  readonly nonce: string;
}

/** Start time of `pid` (clock ticks since boot), null when the process does not exist. */
export function processStartTime(pid: number): number | null {
  let stat: string;
  try {
    stat = readFileSync(`/proc/${pid}/stat`, 'latin1');
  } catch {
    return null;
  }
  // The command name (field 2) may contain spaces and parentheses: parse after the last ')'.
  const rest = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // rest[0] is field 3 (state); field 22 (starttime) is rest[19].
  const start = Number(rest[19]);
  return Number.isFinite(start) ? start : 0;
}

/** Whether the process that wrote `owner` is still running. */
export function ownerAlive(owner: LockOwner): boolean {
  try {
    process.kill(owner.pid, 0);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ESRCH') return false;
  }
  const start = processStartTime(owner.pid);
  if (start === null) return false;
  return owner.start === 0 || start === 0 || start === owner.start;
}

let selfStart: number | undefined;
export function selfOwner(): LockOwner {
  selfStart ??= processStartTime(process.pid) ?? 0;
  return { pid: process.pid, start: selfStart, nonce: randomBytes(8).toString('hex') };
}

/** The pid a temp or lock file name starts with (`<pid>-<start>-...`), for stale-file cleanup. */
export function ownerFromName(name: string): LockOwner | null {
  const m = /^(\d+)-(\d+)-/.exec(name);
  if (!m) return null;
  return { pid: Number(m[1]), start: Number(m[2]), nonce: '' };
}

export function tempName(owner: LockOwner = selfOwner()): string {
  return `${owner.pid}-${owner.start}-${randomBytes(8).toString('hex')}`;
}

function parseOwner(text: string): LockOwner | null {
  try {
    const o = JSON.parse(text) as Partial<LockOwner>;
    if (typeof o.pid !== 'number' || typeof o.start !== 'number' || typeof o.nonce !== 'string') {
      return null;
    }
    return { pid: o.pid, start: o.start, nonce: o.nonce };
  } catch {
    return null;
  }
}

export interface DirLockOptions {
  /** Directory for the temp file (same filesystem as the lock). */
  tmpDir: string;
  /** Give up after this long (default 10 s): WEFT_ERR_STORE_UNAVAILABLE. */
  timeoutMs?: number;
  signal?: AbortSignal;
  /** Called when a dead owner's lock is broken. */
  onBreak?: (owner: LockOwner | null) => void;
}

export interface HeldLock {
  readonly owner: LockOwner;
  release(): Promise<void>;
}

/** Takes the lock at `path`, waiting (polling with jitter) while a live process holds it. */
export async function acquireDirLock(path: string, o: DirLockOptions): Promise<HeldLock> {
  const owner = selfOwner();
  const tmp = join(o.tmpDir, `${tempName(owner)}.lock`);
  await writeFile(tmp, JSON.stringify(owner), { mode: 0o600 });
  const deadline = Date.now() + (o.timeoutMs ?? 10_000);
  let delay = 1;
  try {
    for (;;) {
      if (o.signal?.aborted) throw abortError(o.signal);
      try {
        await link(tmp, path);
        const ino = (await lstat(path)).ino;
        return { owner, release: () => releaseIfOurs(path, ino) };
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      }
      if (await breakIfStale(path, o.tmpDir, o.onBreak)) continue;
      if (Date.now() >= deadline) {
        throw new WeftError(
          'WEFT_ERR_STORE_UNAVAILABLE',
          `lock ${path} held too long by another process`,
          {
            details: { path },
          },
        );
      }
      await sleep(delay + Math.random() * delay, o.signal);
      delay = Math.min(delay * 2, 20);
    }
  } finally {
    await unlink(tmp).catch(() => {});
  }
}

async function releaseIfOurs(path: string, ino: number): Promise<void> {
  try {
    if ((await lstat(path)).ino === ino) await unlink(path);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
  }
}

/** Removes the lock when its owner is dead; true when the caller should retry at once. */
async function breakIfStale(
  path: string,
  tmpDir: string,
  onBreak?: (owner: LockOwner | null) => void,
): Promise<boolean> {
  let ino: number;
  let text: string;
  try {
    ino = (await lstat(path)).ino;
    text = await readFile(path, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return true;
    throw err;
  }
  const owner = parseOwner(text);
  // An unparsable lock cannot come from acquireDirLock (it links complete files): stale.
  if (owner !== null && ownerAlive(owner)) return false;
  const moved = join(tmpDir, `${tempName()}.broken`);
  try {
    await rename(path, moved);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return true;
    throw err;
  }
  // Same inode AND same content: inode numbers are recycled, nonces are not.
  const same = (await lstat(moved)).ino === ino && (await readFile(moved, 'utf8')) === text;
  if (!same) {
    // A racing breaker removed the stale lock first and someone took it: give it back.
    await link(moved, path).catch(() => {});
  } else {
    onBreak?.(owner);
  }
  await unlink(moved).catch(() => {});
  return true;
}
