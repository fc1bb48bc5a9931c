/**
 * The delegate cache: ADD stores the rendered delegate config at `<dataDir>/<containerID>` so
 * DEL replays exactly what ADD ran, even after subnet.env or the plugin config changed (or the
 * node agent is gone). Same place and format as flannel's plugin (dir 0700, file 0600), so a
 * node switched from flannel to weft still tears down the pods flannel set up.
 *
 * Writes are atomic (temp file, fsync, rename): a crash mid-write leaves the old file or none,
 * never half a config that DEL could not parse. The container ID was checked against
 * CNI_NAME_RE before it gets here, so the path stays inside dataDir.
 */
import { mkdir, readFile, unlink } from 'node:fs/promises';
import { join } from 'node:path';
import { writeFileAtomic } from '../subnet-env.js';
import { CNI_ERR, CniError } from './cni-error.js';

export const CACHE_DIR_MODE = 0o700;
export const CACHE_FILE_MODE = 0o600;

export function cachePath(dataDir: string, containerId: string): string {
  return join(dataDir, containerId);
}

function ioError(op: string, path: string, err: unknown): CniError {
  return new CniError(CNI_ERR.IO_FAILURE, `${op} ${path}: ${(err as Error).message}`, '', {
    cause: err,
  });
}

export async function saveDelegate(
  dataDir: string,
  containerId: string,
  config: string,
): Promise<void> {
  const path = cachePath(dataDir, containerId);
  try {
    await mkdir(dataDir, { recursive: true, mode: CACHE_DIR_MODE });
    await writeFileAtomic(path, config, CACHE_FILE_MODE);
  } catch (err) {
    throw ioError('write delegate cache', path, err);
  }
}

/** The cached config text, or null when there is none (never ADDed, or already DELeted). */
export async function loadDelegate(dataDir: string, containerId: string): Promise<string | null> {
  const path = cachePath(dataDir, containerId);
  try {
    return await readFile(path, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw ioError('read delegate cache', path, err);
  }
}

/** Removes the cache entry; a missing one is fine (DEL must be idempotent). */
export async function removeDelegate(dataDir: string, containerId: string): Promise<void> {
  const path = cachePath(dataDir, containerId);
  try {
    await unlink(path);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return;
    throw ioError('remove delegate cache', path, err);
  }
}
