/**
 * The CNI plugin straight from source, for tests: `node --import tsx test/helpers/cni-plugin.ts`
 * behaves like bin/weft-cni (CNI_* env, config on stdin, result or CNI error on stdout).
 */
import { runCni } from '../../src/control/cni/main.js';

process.exitCode = await runCni(process.env, process.stdin, process.stdout);
