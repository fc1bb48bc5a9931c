/**
 * A host tool's output where the tool may be missing or refuse (another firewall backend, no
 * privileges): what it printed, or null. For reading host state that is optional to know; a
 * command whose failure matters runs where its error is handled.
 */
import { execFileSync } from 'node:child_process';

export function outputOf(cmd: string, args: readonly string[], timeoutMs = 10_000): string | null {
  try {
    return execFileSync(cmd, args, {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'ignore'],
      timeout: timeoutMs,
    });
  } catch {
    return null; // not installed, not allowed, or no such backend here
  }
}
