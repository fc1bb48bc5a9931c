/**
 * A bpffs for tests and benches of the bpf engine's pinned links (src/dataplane/bpf-pins.ts),
 * seen by nothing on the host: it is mounted in a mount namespace of its own, held by one
 * process, and daemons enter that namespace before `ip netns exec` (which keeps every mount but
 * /sys). Pins there outlive the daemons that made them, as on a host with /sys/fs/bpf, and die
 * with the holder: close() (or the test process dying: the holder exits when its stdin closes)
 * takes the bpffs and everything pinned in it away, links detached with it.
 *
 *   root mount ns:   <dir>  (an empty directory)
 *   holder's ns:     <dir>  bpffs (propagation slave: it sees the host's later mounts, such as
 *                    new /run/netns entries; the host never sees its mounts)
 */
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export class PrivateBpffs {
  private constructor(
    /** The mount point (the same path in the holder's namespace). */
    readonly dir: string,
    private readonly holder: ChildProcess,
    /** A temp directory made for it (inTempDir), removed by close(). */
    private readonly tempRoot?: string,
  ) {}

  /** Mounts a bpffs at `dir` (created) in a new mount namespace. */
  /** Mounts one at `<a new temp dir>/bpffs`; close() removes the temp dir too. */
  static async inTempDir(): Promise<PrivateBpffs> {
    const tmp = mkdtempSync(join(tmpdir(), 'weft-bpffs-'));
    try {
      const fs = await PrivateBpffs.create(join(tmp, 'bpffs'));
      return new PrivateBpffs(fs.dir, fs.holder, tmp);
    } catch (err) {
      rmSync(tmp, { recursive: true, force: true });
      throw err;
    }
  }

  static async create(dir: string): Promise<PrivateBpffs> {
    mkdirSync(dir, { recursive: true });
    const holder = spawn(
      'unshare',
      [
        '--mount',
        '--propagation',
        'slave',
        'sh',
        '-c',
        'mount -t bpf weft-test "$0" && echo mounted && exec cat >/dev/null',
        dir,
      ],
      { stdio: ['pipe', 'pipe', 'pipe'] },
    );
    let err = '';
    holder.stderr!.on('data', (d: Buffer) => (err += d.toString()));
    await new Promise<void>((resolve, reject) => {
      holder.stdout!.once('data', () => resolve());
      holder.once('exit', (code) => reject(new Error(`bpffs holder exited ${code}: ${err}`)));
    });
    return new PrivateBpffs(dir, holder);
  }

  /**
   * argv that runs the rest in the holder's mount namespace (nsSpawn's `via`), in directory `cwd`
   * (entering a mount namespace starts at its root).
   */
  via(cwd: string): string[] {
    return ['nsenter', `--mount=/proc/${this.holder.pid}/ns/mnt`, `--wd=${cwd}`, '--'];
  }

  /** `path` (inside the bpffs) as this process reaches it: through the holder's root. */
  view(path: string): string {
    return join(`/proc/${this.holder.pid}/root`, path);
  }

  /** Whether the host's own mount table shows it (it never should). */
  static hostSees(dir: string): boolean {
    return execFileSync('findmnt', ['-rn', '-o', 'TARGET'], { encoding: 'utf8' })
      .split('\n')
      .includes(dir);
  }

  /** Ends the holder: the namespace, the bpffs and every pin in it go. */
  async close(): Promise<void> {
    const h = this.holder;
    if (h.exitCode === null && h.signalCode === null) {
      const gone = new Promise((r) => h.once('exit', r));
      h.stdin!.end();
      h.kill('SIGKILL');
      await gone;
    }
    if (this.tempRoot) rmSync(this.tempRoot, { recursive: true, force: true });
  }
}
