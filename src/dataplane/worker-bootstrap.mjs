// The pool's task file when weft runs from its .ts sources under tsx (tests, bench): piscina's
// threads do not get tsx's ESM loader (an inherited `--import tsx` only hooks require(), which
// leaks the loader's cache fds on every pool stop), so this registers it in the thread and
// hands piscina worker.ts's task. From dist/ the pool loads worker.js itself and never this file.
import { register } from 'tsx/esm/api';

register();
const { default: runQueue } = await import('./worker.ts');
export default runQueue;
