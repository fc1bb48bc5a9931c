// The pool's task file when weft runs from its .ts sources under tsx (tests, bench): piscina's
// threads do not get tsx's ESM loader (an inherited `--import tsx` only hooks require(), which
// leaks the loader's cache fds on every pool stop), so this registers it in the thread and
// hands piscina worker.ts's task. From dist/ the pool loads worker.js itself and never this file.
//
// Under `npm test` (WEFT_TEST_LAUNCHER=dist: the runner has just built dist/ from these same
// sources) the thread takes dist/'s worker.js instead: registering tsx and loading worker.ts
// through it costs ~0.5 CPU-s a thread (four threads: 2.3 CPU-s against 0.45 from dist/), and
// the suite starts engines of up to six threads again and again (dataplane-engine.test.ts: 151
// → 127 CPU-s). The native addon is the same file either way (one per process).
const fromDist = process.env.WEFT_TEST_LAUNCHER === 'dist';
let runQueue;
if (fromDist) {
  ({ default: runQueue } = await import('../../dist/dataplane/worker.js'));
} else {
  const { register } = await import('tsx/esm/api');
  register();
  ({ default: runQueue } = await import('./worker.ts'));
}
export default runQueue;
