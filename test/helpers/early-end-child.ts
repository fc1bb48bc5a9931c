/**
 * Runs in a child process (`node --import tsx early-end-child.ts`): a namespace with a `sleep`
 * inside, removed by onEarlyEnd, as a bench's testbed is. It prints `ready <namespace> <pid of
 * sleep>` on stdout, then writes a line to stdout every 10 ms until something ends it.
 */
import { onEarlyEnd } from '../../src/testbed/early-end.js';
import { NetnsScope } from '../../src/testbed/netns.js';

const scope = new NetnsScope();
const ns = scope.add();
const sleeper = scope.spawn(ns, 'sleep', ['1000'], { stdio: 'ignore' });
onEarlyEnd('early-end-child', () => scope.cleanup());
process.stdout.write(`ready ${ns} ${sleeper.pid}\n`);
setInterval(() => process.stdout.write('tick\n'), 10);
