/**
 * A dataplane pool task (piscina runs this file's default export in its worker threads): loads
 * the addon (the thread's own per-environment instance), checks that the engine has this queue,
 * says 'started' on the task's port and enters the native loop, where it stays until the engine
 * is stopped. No JS runs in this thread while packets flow.
 */
import { threadId } from 'node:worker_threads';
import { loadDataplaneBinding } from './binding.js';
import { DIRECTIONS } from './messages.js';
import type { WorkerMessage, WorkerResult, WorkerTask } from './messages.js';

export default function runQueue(task: WorkerTask): WorkerResult {
  try {
    const native = loadDataplaneBinding();
    // Throws for an engine that is gone; its counters tell how many queues it has.
    const queues = native.engineCounters(task.engineId).length / native.counterNames().length;
    if (!Number.isInteger(task.worker) || task.worker < 0 || task.worker >= queues) {
      throw new RangeError(`engine ${task.engineId} has no queue ${task.worker} (${queues})`);
    }
    const started: WorkerMessage = {
      type: 'started',
      worker: task.worker,
      direction: task.direction,
      threadId,
    };
    task.port.postMessage(started);
    return native.engineRun(task.engineId, task.worker, DIRECTIONS[task.direction]);
  } finally {
    task.port.close();
  }
}
