/**
 * Child process for the interface-selection namespace test (run inside a namespace with
 * `ip netns exec NS node --import tsx`). Each line on stdin is a JSON request
 * {sel: IfaceSelection, families}; each is answered, in order, with one JSON line on stdout:
 * {"ok": ExternalInterface} or {"error": {code, message}}. One process serves a namespace's
 * whole test file (a start through tsx costs seconds on a loaded machine; a selection does not).
 */
import { createInterface } from 'node:readline';
import { isWeftError } from '../../src/common/errors.js';
import { selectExternalInterface } from '../../src/control/iface.js';

for await (const line of createInterface({ input: process.stdin })) {
  if (!line.trim()) continue;
  const { sel, families } = JSON.parse(line) as {
    sel: Parameters<typeof selectExternalInterface>[0];
    families: Parameters<typeof selectExternalInterface>[1];
  };
  try {
    const ext = await selectExternalInterface(sel, families);
    process.stdout.write(JSON.stringify({ ok: ext }) + '\n');
  } catch (err) {
    if (!isWeftError(err)) throw err;
    process.stdout.write(
      JSON.stringify({ error: { code: err.code, message: err.message } }) + '\n',
    );
  }
}
