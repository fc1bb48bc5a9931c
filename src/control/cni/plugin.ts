/**
 * The CNI plugin executable's entry point: `scripts/build-cni.mjs` bundles this file and what
 * it imports into one self-contained file, `dist/weft-cni.cjs` (Node built-ins only, no
 * node_modules), which is what gets installed into a CNI bin dir. See main.ts for the protocol.
 */
import { runCni } from './main.js';

void runCni(process.env, process.stdin, process.stdout).then((code) => {
  process.exitCode = code;
});
