/** Whether this kernel can make an ipip device, probed in a namespace of our own. */
import { execFileSync } from 'node:child_process';
import { nsExec, uniqueNs } from '../../src/testbed/netns.js';

/** Why the kernel cannot make an ipip device here (`ip link add type ipip`), or null. */
export function ipipMissing(): string | null {
  const ns = uniqueNs();
  execFileSync('ip', ['netns', 'add', ns]);
  try {
    nsExec(ns, 'ip', ['link', 'add', 'weftprobe', 'type', 'ipip']);
    return null;
  } catch (err) {
    return (err as Error).message.split('\n').pop()!.trim();
  } finally {
    execFileSync('ip', ['netns', 'del', ns]);
  }
}
