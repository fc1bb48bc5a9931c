/**
 * Every message that crosses the worker-thread boundary, in one place. The main thread sends
 * nothing after start: a worker enters the native loop and stays there until the engine's
 * eventfd says stop; peers and counters go through the engine, not through messages.
 */

/** workerData of a native dataplane worker. */
export interface WorkerStart {
  readonly engineId: number;
  /** The worker's index = its TUN queue and UDP socket. */
  readonly worker: number;
}

export type WorkerMessage =
  /** About to enter the native loop. */
  | { readonly type: 'started'; readonly worker: number }
  /** Left the loop: rc 0 after a stop, else the errno that ended it. */
  | { readonly type: 'stopped'; readonly worker: number; readonly rc: number }
  /** The worker could not run (addon failed to load in the worker, ...). */
  | { readonly type: 'error'; readonly worker: number; readonly message: string };
