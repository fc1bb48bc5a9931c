/**
 * Every message that crosses the worker-thread boundary, in one place. A dataplane worker is a
 * piscina pool thread running one task per TUN queue: the task enters the native loop and stays
 * there until the engine's eventfd says stop; peers and counters go through the engine, not
 * through messages. The only message is the task's 'started', on a port the task carries.
 */
import type { MessagePort } from 'node:worker_threads';

/**
 * What one loop of a queue moves (native Direction): both ways, or TUN → UDP / UDP → TUN only.
 * A queue runs one 'both' loop or a 'tx' and an 'rx' loop on two threads.
 */
export const DIRECTIONS = { both: 0, tx: 1, rx: 2 } as const;
export type Direction = keyof typeof DIRECTIONS;

/** One pool task = one loop of a queue (worker.ts runs it). Its port is transferred with it. */
export interface WorkerTask {
  readonly engineId: number;
  /** The worker's index = its TUN queue and UDP socket. */
  readonly worker: number;
  readonly direction: Direction;
  /** Carries one WorkerMessage back, then is closed by the worker. */
  readonly port: MessagePort;
}

/**
 * What a task resolves with: the native loop's rc, 0 after a stop, else the errno that ended it.
 * A task that could not enter the loop (the addon does not load in the thread, the engine is
 * gone, ...) rejects instead.
 */
export type WorkerResult = number;

/**
 * Sent on the task's port once the addon is loaded in the thread and the engine has this queue,
 * right before the thread enters the native loop.
 */
export interface WorkerStarted {
  readonly type: 'started';
  readonly worker: number;
  readonly direction: Direction;
  /** worker_threads threadId of the pool thread that runs this loop. */
  readonly threadId: number;
}

export type WorkerMessage = WorkerStarted;
