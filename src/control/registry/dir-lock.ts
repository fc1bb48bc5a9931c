/**
 * A lock shared by processes on one host (one pid namespace, one filesystem), for the embedded
 * store. Node has no flock(2), so the lock is a chain of generations in a directory, where every
 * state change creates a new name with link()/O_EXCL — atomic, and it never removes a name
 * another process may still be deciding about:
 *
 *   <lockDir>/gen.<n>        holder of generation n: `{pid, start, nonce}` (linked complete)
 *   <lockDir>/released.<n>   generation n was released
 *
 * The newest generation n decides. Acquire: when released.<n> exists, or gen.<n>'s owner is
 * dead, create gen.<n+1> with link(); EEXIST means someone else moved first, so look again.
 * Both facts are final (a release is never undone; a dead process stays dead — the owner is
 * matched by pid AND start time, field 22 of /proc/<pid>/stat, so a recycled pid does not keep
 * a dead owner's lock alive), and link() only succeeds while gen.<n+1> is absent: no
 * check-then-act race, including when two processes break one crashed owner's lock at once.
 * Release: create released.<n>. The holder prunes generations older than n-1; a waiter whose
 * listing was that old can only create a generation below n-1, sees it is not the newest and
 * withdraws it.
 */
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { link, mkdir, readFile, readdir, unlink, writeFile } from 'node:fs/promises';
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

/** The owner a temp file name starts with (`<pid>-<start>-...`), for stale-file cleanup. */
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
  /** Called when a dead owner's lock is taken over. */
  onBreak?: (owner: LockOwner | null) => void;
}

export interface HeldLock {
  readonly owner: LockOwner;
  readonly generation: number;
  release(): Promise<void>;
}

interface LockState {
  /** Newest generation (0 when none yet). */
  readonly newest: number;
  readonly released: boolean;
  /** Generations present, for pruning. */
  readonly gens: readonly number[];
}

async function readState(lockDir: string): Promise<LockState> {
  const gens: number[] = [];
  const released = new Set<number>();
  for (const name of await readdir(lockDir)) {
    const m = /^(gen|released)\.(\d+)$/.exec(name);
    if (!m) continue;
    if (m[1] === 'gen') gens.push(Number(m[2]));
    else released.add(Number(m[2]));
  }
  const newest = gens.length > 0 ? Math.max(...gens) : 0;
  return { newest, released: newest === 0 || released.has(newest), gens };
}

/** The live holder of the lock at `lockDir`, or null when it is free or its holder is dead. */
export async function lockHolder(lockDir: string): Promise<LockOwner | null> {
  let state: LockState;
  try {
    state = await readState(lockDir);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw err;
  }
  if (state.released) return null;
  const owner = await readOwner(lockDir, state.newest);
  return owner && ownerAlive(owner) ? owner : null;
}

async function readOwner(lockDir: string, gen: number): Promise<LockOwner | null> {
  try {
    return parseOwner(await readFile(join(lockDir, `gen.${gen}`), 'utf8'));
  } catch {
    return null;
  }
}

/** Takes the lock at `lockDir`, waiting (polling with jitter) while a live process holds it. */
export async function acquireDirLock(lockDir: string, o: DirLockOptions): Promise<HeldLock> {
  await mkdir(lockDir, { recursive: true, mode: 0o700 });
  const owner = selfOwner();
  const tmp = join(o.tmpDir, `${tempName(owner)}.lock`);
  await writeFile(tmp, JSON.stringify(owner), { mode: 0o600 });
  const deadline = Date.now() + (o.timeoutMs ?? 10_000);
  let delay = 1;
  try {
    for (;;) {
      if (o.signal?.aborted) throw abortError(o.signal);
      const state = await readState(lockDir);
      let free = state.released;
      let dead: LockOwner | null = null;
      if (!free) {
        // An unreadable generation file cannot come from here (it is linked complete): stale.
        dead = await readOwner(lockDir, state.newest);
        free = dead === null || !ownerAlive(dead);
      }
      if (free) {
        const gen = state.newest + 1;
        let linked = false;
        try {
          await link(tmp, join(lockDir, `gen.${gen}`));
          linked = true;
        } catch (err) {
          if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
        }
        if (linked) {
          // Our listing may have been old enough for the generations after it to be pruned.
          if ((await readState(lockDir)).newest === gen) {
            if (!state.released) o.onBreak?.(dead);
            await prune(lockDir, state.gens, gen);
            return { owner, generation: gen, release: () => release(lockDir, gen) };
          }
          await unlink(join(lockDir, `gen.${gen}`)).catch(() => {});
        }
        continue; // someone moved first: look again at once
      }
      if (Date.now() >= deadline) {
        throw new WeftError(
          'WEFT_ERR_STORE_UNAVAILABLE',
          `lock ${lockDir} held too long by pid ${dead?.pid ?? '?'}`,
          { details: { path: lockDir, pid: dead?.pid } },
        );
      }
      await sleep(delay + Math.random() * delay, o.signal);
      delay = Math.min(delay * 2, 20);
    }
  } finally {
    await unlink(tmp).catch(() => {});
  }
}

async function release(lockDir: string, gen: number): Promise<void> {
  await writeFile(join(lockDir, `released.${gen}`), '', { flag: 'wx' }).catch(
    (err: NodeJS.ErrnoException) => {
      if (err.code !== 'EEXIST') throw err;
    },
  );
}

/** Removes generations below `gen - 1` (kept: the newest two, which waiters decide on). */
async function prune(lockDir: string, gens: readonly number[], gen: number): Promise<void> {
  for (const g of gens) {
    if (g >= gen - 1) continue;
    await unlink(join(lockDir, `gen.${g}`)).catch(() => {});
    await unlink(join(lockDir, `released.${g}`)).catch(() => {});
  }
}
