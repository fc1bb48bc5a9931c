/**
 * How the benches start weft as it is deployed: bin/weft executed directly reads its first line,
 * `#!/usr/bin/env -S node <flags>` (the daemon's V8 heap sizing). A bench that runs it with
 * Node explicitly (to add flags of its own, or to use this Node) passes the same flags.
 */
import { readFileSync } from 'node:fs';

/** The Node flags on `bin`'s first line (none when it is a plain `#!/usr/bin/env node`). */
export function launcherNodeFlags(bin: string): string[] {
  const first = readFileSync(bin, 'utf8').split('\n', 1)[0] ?? '';
  const m = /^#!\/usr\/bin\/env\s+-S\s+node(\s.*)?$/.exec(first);
  return (m?.[1] ?? '').split(/\s+/).filter((a) => a !== '');
}
