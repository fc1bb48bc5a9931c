/**
 * A dataplane worker thread: loads the addon (its own per-environment instance), enters the
 * native loop for its queue and stays there until the engine is stopped. No JS runs in this
 * thread while packets flow.
 */
import { parentPort, workerData } from 'node:worker_threads';
import { errorMessage } from '../common/errors.js';
import { loadDataplaneBinding } from './binding.js';
import type { WorkerMessage, WorkerStart } from './messages.js';

const start = workerData as WorkerStart;
const post = (m: WorkerMessage) => parentPort?.postMessage(m);

try {
  const native = loadDataplaneBinding();
  post({ type: 'started', worker: start.worker });
  const rc = native.engineRun(start.engineId, start.worker);
  post({ type: 'stopped', worker: start.worker, rc });
} catch (err) {
  post({ type: 'error', worker: start.worker, message: errorMessage(err) });
}
