/**
 * Runs in a child process (`node --import tsx emfile-child.ts`): opens files until the process
 * is out of fds (EMFILE), then starts each of weft's child processes the daemon may start — a
 * CNI delegate, an iproute2 command, the TUN helper, a testbed process — and prints one JSON line: for each, the
 * error it rejected with. A spawn whose 'error' went unhandled would crash this process instead.
 */
import { closeSync, openSync } from 'node:fs';
import { execPlugin } from '../../src/control/cni/invoke.js';
import { Iproute2Netlink } from '../../src/control/netlink/iproute2-netlink.js';
import { openTunHelper } from '../../src/dataplane/tun-helper.js';
import { nsSpawn } from '../../src/testbed/netns.js';

const outcome = async (p: () => Promise<unknown>): Promise<string> => {
  try {
    await p();
    return 'resolved';
  } catch (err) {
    return `rejected: ${(err as Error).message}`;
  }
};

const fds: number[] = [];
try {
  for (;;) fds.push(openSync('/dev/null', 'r'));
} catch {
  /* EMFILE: the process is out of fds */
}
const result = {
  cni: await outcome(() => execPlugin('/bin/true', {}, '{}')),
  iproute2: await outcome(() => new Iproute2Netlink().getLink('lo')),
  tunHelper: await outcome(() =>
    openTunHelper('weft-emfile0', { onPackets: () => undefined, onExit: () => undefined }),
  ),
  // The testbed's (demo, bench, tests) spawn inside a namespace; the name is never used.
  nsSpawn: await outcome(async () => nsSpawn('weft-emfile-none', 'true', [])),
};
for (const fd of fds) closeSync(fd);
process.stdout.write(JSON.stringify(result) + '\n');
