/**
 * The TUN helper (native/tun-helper/weft-tun.c, built to native/build/weft-tun): the js engine's
 * way to a TUN device when the native addon does not load. Node cannot issue TUNSETIFF; the
 * helper does, then relays packets over its stdio as frames — a 2-byte big-endian length
 * (1..65535) and the raw IP packet. Its first stdout line is the kernel's device name.
 *
 *   openTunHelper(name) → the helper runs, the TUN exists; `packets` get every packet the
 *                         kernel routes into the TUN, `write(pkt)` queues one for the kernel
 *   close()             → stdin closed (the helper exits on EOF), SIGKILL if it lingers; the
 *                         TUN disappears with the helper
 *
 * A helper that exits on its own (crash, device error, killed) is reported once through
 * `onExit` with its status and last stderr line.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { WeftError } from '../common/errors.js';
import { packageRoot } from '../common/native.js';

export const FRAME_HDR_LEN = 2;
export const MAX_FRAME_PAYLOAD = 0xffff;

/** Where the helper is: $WEFT_TUN_HELPER, else native/build/weft-tun under the package root. */
export function tunHelperPath(): string {
  return process.env.WEFT_TUN_HELPER ?? join(packageRoot(), 'native', 'build', 'weft-tun');
}

/** One packet as a frame (length prefix + bytes). */
export function encodeFrame(pkt: Uint8Array): Buffer {
  if (pkt.length === 0 || pkt.length > MAX_FRAME_PAYLOAD) {
    throw new RangeError(`frame payload must be 1..${MAX_FRAME_PAYLOAD} bytes, got ${pkt.length}`);
  }
  const f = Buffer.allocUnsafe(FRAME_HDR_LEN + pkt.length);
  f.writeUInt16BE(pkt.length, 0);
  f.set(pkt, FRAME_HDR_LEN);
  return f;
}

/**
 * Splits a byte stream into frames. `push(chunk)` returns the packets completed by this chunk
 * (each a view into the chunk when it holds the whole frame, else a copy); a frame split across
 * chunks is kept until its last byte arrives. A zero length is a protocol error (throws: the
 * stream cannot be resynchronised).
 */
export class FrameParser {
  #pending: Buffer = Buffer.alloc(0);

  push(chunk: Buffer): Buffer[] {
    let buf = this.#pending.length === 0 ? chunk : Buffer.concat([this.#pending, chunk]);
    const out: Buffer[] = [];
    let off = 0;
    while (buf.length - off >= FRAME_HDR_LEN) {
      const len = buf.readUInt16BE(off);
      if (len === 0) throw new Error('frame of length 0');
      if (buf.length - off - FRAME_HDR_LEN < len) break;
      out.push(buf.subarray(off + FRAME_HDR_LEN, off + FRAME_HDR_LEN + len));
      off += FRAME_HDR_LEN + len;
    }
    buf = buf.subarray(off);
    // Keep the tail as a copy: the chunk it came from is not ours to hold.
    this.#pending = buf.length === 0 ? Buffer.alloc(0) : Buffer.from(buf);
    return out;
  }

  /** Bytes of an incomplete frame held back. */
  get pendingBytes(): number {
    return this.#pending.length;
  }
}

export interface TunHelper {
  readonly name: string;
  readonly pid: number;
  /**
   * Queues one packet for the TUN; false when the helper is gone, its pipe is full or the
   * packet cannot be framed (empty, over 65535 bytes).
   */
  write(pkt: Uint8Array): boolean;
  close(): Promise<void>;
}

export interface TunHelperHandlers {
  onPackets(pkts: Buffer[]): void;
  /** The helper ended without close(): code/signal and its last stderr line. */
  onExit(why: string): void;
}

/** Bytes queued on the helper's stdin beyond which writes are refused (counted as drops). */
const STDIN_HIGH_WATER = 4 << 20;

/** Starts the helper for TUN `name` and resolves once the device exists. */
export async function openTunHelper(name: string, h: TunHelperHandlers): Promise<TunHelper> {
  const path = tunHelperPath();
  if (!existsSync(path)) {
    throw new WeftError(
      'WEFT_ERR_DATAPLANE',
      `tun ${name}: the tun helper ${path} does not exist (build it: node scripts/build-native.mjs)`,
      { details: { path } },
    );
  }
  const child: ChildProcess = spawn(path, [name], { stdio: ['pipe', 'pipe', 'pipe'] });
  let lastErr = '';
  let closing = false;
  let exited = false;
  // The error handler first: a spawn that failed (EMFILE) emits 'error' and has no stdio.
  const exit = new Promise<string>((resolve) => {
    child.once('error', (err) => {
      exited = true;
      resolve(`spawn failed: ${err.message}`);
    });
    child.once('close', (code, sig) => {
      exited = true;
      resolve(`${sig ? `signal ${sig}` : `exit ${code}`}${lastErr ? `: ${lastErr}` : ''}`);
    });
  });
  if (!child.stdin || !child.stdout || !child.stderr) {
    throw new WeftError('WEFT_ERR_DATAPLANE', `tun ${name}: helper ${await exit}`, {
      details: { path },
    });
  }
  child.stderr.on('data', (d: Buffer) => {
    const lines = d.toString().trim().split('\n');
    lastErr = lines[lines.length - 1] ?? lastErr;
  });
  // EPIPE on stdin after the helper died: the exit handler reports it.
  child.stdin.on('error', () => undefined);

  // One reader from the first byte: the name line, then frames.
  const parser = new FrameParser();
  let head: Buffer | null = Buffer.alloc(0);
  let named: (name: string) => void = () => undefined;
  const devName = new Promise<string>((resolve, reject) => {
    named = resolve;
    void exit.then((why) =>
      reject(
        new WeftError('WEFT_ERR_DATAPLANE', `tun ${name}: helper ${why}`, { details: { path } }),
      ),
    );
  });
  child.stdout!.on('data', (d: Buffer) => {
    if (head !== null) {
      head = Buffer.concat([head, d]);
      const nl = head.indexOf(0x0a);
      if (nl < 0) return;
      named(head.subarray(0, nl).toString());
      d = head.subarray(nl + 1);
      head = null;
    }
    let pkts: Buffer[];
    try {
      pkts = parser.push(d);
    } catch (err) {
      // The helper never writes a zero length; if it did, the stream is lost: stop it.
      lastErr = `bad frame from helper: ${(err as Error).message}`;
      child.kill('SIGKILL');
      return;
    }
    if (pkts.length > 0) h.onPackets(pkts);
  });
  const tunName = await devName;
  void exit.then((why) => {
    if (!closing) h.onExit(why);
  });

  return {
    name: tunName,
    pid: child.pid ?? -1,
    write(pkt) {
      if (exited || closing || child.stdin!.writableLength > STDIN_HIGH_WATER) return false;
      if (pkt.length === 0 || pkt.length > MAX_FRAME_PAYLOAD) return false;
      child.stdin!.write(encodeFrame(pkt));
      return true;
    },
    async close() {
      if (closing) return;
      closing = true;
      child.stdin!.end();
      const t = setTimeout(() => child.kill('SIGKILL'), 2000);
      await exit;
      clearTimeout(t);
    },
  };
}
