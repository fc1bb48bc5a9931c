/**
 * Moved to src/testbed/cluster.ts (one cluster builder for the demo, the benches and the
 * tests). This re-export keeps tests written against the old path compiling while they move
 * over; new code imports src/testbed/cluster.ts.
 */
export * from '../../src/testbed/cluster.js';
export * from '../../src/testbed/probes.js';
export { PACKAGE_ROOT as ROOT, CLUSTER_NETWORK as NETWORK } from '../../src/testbed/cluster.js';
