/**
 * Child process for the interface-selection namespace test (run inside a namespace with
 * `ip netns exec NS node --import tsx`). Argument: JSON {sel: IfaceSelection, families}.
 * Prints one JSON line on stdout: {"ok": ExternalInterface} or {"error": {code, message}}.
 */
import { isWeftError } from '../../src/common/errors.js';
import { selectExternalInterface } from '../../src/control/iface.js';

const arg = process.argv[2];
if (!arg) throw new Error('usage: iface-probe <json>');
const { sel, families } = JSON.parse(arg) as {
  sel: Parameters<typeof selectExternalInterface>[0];
  families: Parameters<typeof selectExternalInterface>[1];
};
try {
  const ext = await selectExternalInterface(sel, families);
  process.stdout.write(JSON.stringify({ ok: ext }) + '\n');
} catch (err) {
  if (!isWeftError(err)) throw err;
  process.stdout.write(JSON.stringify({ error: { code: err.code, message: err.message } }) + '\n');
}
