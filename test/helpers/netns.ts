/**
 * Moved to src/testbed/netns.ts (one module for the demo, the benches and the tests). This
 * re-export keeps tests written against the old path compiling while they move over; new code
 * imports src/testbed/netns.ts.
 */
export * from '../../src/testbed/netns.js';
