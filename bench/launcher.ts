/**
 * How the benches start weft as it is deployed: bin/weft executed directly reads its first line,
 * `#!/usr/bin/env -S [NAME=value …] node <flags>` (glibc's malloc arenas and the daemon's V8
 * heap sizing). A bench that runs it with Node explicitly (to add flags of its own, or to use
 * this Node) passes the same environment and flags.
 */
import { readFileSync } from 'node:fs';

/** The words after `env -S` on `bin`'s first line. */
function launcherWords(bin: string): string[] {
  const first = readFileSync(bin, 'utf8').split('\n', 1)[0] ?? '';
  const m = /^#!\/usr\/bin\/env\s+-S\s+(.*)$/.exec(first);
  return (m?.[1] ?? '').split(/\s+/).filter((a) => a !== '');
}

/** The Node flags on `bin`'s first line (none when it is a plain `#!/usr/bin/env node`). */
export function launcherNodeFlags(bin: string): string[] {
  const words = launcherWords(bin);
  const node = words.indexOf('node');
  return node < 0 ? [] : words.slice(node + 1);
}

/** The environment `env -S` sets on `bin`'s first line, before `node`. */
export function launcherEnv(bin: string): Record<string, string> {
  const words = launcherWords(bin);
  const node = words.indexOf('node');
  return Object.fromEntries(
    words
      .slice(0, Math.max(0, node))
      .map((w) => /^([A-Za-z_][A-Za-z0-9_]*)=(.*)$/.exec(w))
      .filter((m): m is RegExpExecArray => m !== null)
      .map((m) => [m[1]!, m[2]!]),
  );
}
