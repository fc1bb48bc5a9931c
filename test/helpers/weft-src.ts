/**
 * `weft` run from the TypeScript sources (through tsx), so namespace tests exercise the current
 * code without a `dist/` build: `node --import tsx test/helpers/weft-src.ts <command> [flags]`.
 */
import { runMain } from '../../src/control/main.js';

await runMain();
