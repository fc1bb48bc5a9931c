/**
 * wireguard-go's UAPI on a unix socket, so that `wg show <interface>` (and `wg show ... dump`,
 * `wg showconf`) read the native engine's WireGuard device as they read a wireguard-go or kernel
 * one: `/var/run/wireguard/<interface>.sock` (where wg(8) looks), a stream socket speaking the
 * text protocol of https://www.wireguard.com/xplatform/ and wireguard-go's device/uapi.go:
 *
 *   get=1\n\n  →  private_key=<hex>\n listen_port=N\n (per peer:) public_key=<hex>\n
 *                 preshared_key=<hex>\n protocol_version=1\n endpoint=<a.b.c.d:p | [v6]:p>\n
 *                 last_handshake_time_sec=N\n last_handshake_time_nsec=N\n tx_bytes=N\n
 *                 rx_bytes=N\n persistent_keepalive_interval=N\n allowed_ip=<net/len>\n ...
 *                 errno=0\n\n
 *   set=1\n<key=value lines>\n\n  →  errno=-95\n\n (EOPNOTSUPP: refused, see below)
 *   anything else  →  errno=-22\n\n (EINVAL), then the connection is closed
 *
 * Several requests may follow each other on one connection (wireguard-go's loop). Error numbers
 * are negative, as wireguard-go writes them (wg(8)'s `set` turns -95 into "Operation not
 * supported").
 *
 * Secrets: wg(8) derives the interface's public key from `private_key` (the protocol has no
 * line for it), so `get` must print the private key, as wireguard-go and the kernel (to
 * CAP_NET_ADMIN) give it. The preshared key is printed too, as wireguard-go prints it: with the
 * private key already there it exposes nothing more (it is cluster-wide and in the net-conf
 * anyway), and it keeps `wg show`'s "preshared key: (hidden)" and `wg showconf` true. Both come
 * from this server's options, not from the engine (whose state call copies no secret). The
 * socket is therefore only for its owner: created under umask 077 (mode 0700, as wireguard-go's)
 * in a directory that must be a real directory owned by root (or this process's user) and
 * writable by nobody else.
 *
 * `set` is refused: weft's WireGuard peers come from the leases (the backend), and a change made
 * with `wg set` would be undone by the next lease event or diverge from what the other nodes
 * believe; flannel's own `wg set` calls are the backend's job here.
 *
 * One connection never holds up the daemon: a request is answered from one state copy, written
 * without waiting; while a client does not read, its connection reads no further request
 * (backpressure), idle connections are closed after UAPI_IDLE_MS, at most UAPI_MAX_CONNECTIONS
 * are open, and a request line longer than UAPI_MAX_LINE closes its connection.
 */
import { createPrivateKey, createPublicKey } from 'node:crypto';
import { lstatSync, mkdirSync, unlinkSync } from 'node:fs';
import { type Server, type Socket, connect, createServer } from 'node:net';
import { join } from 'node:path';
import { WeftError, errorMessage } from '../common/errors.js';
import { type Logger, logger } from '../common/log.js';
import { untrustedDir } from './bpf-pins.js';
import type { WireguardState } from './wireguard-peers.js';

/** Where wg(8) and wireguard-go keep the UAPI sockets (one directory for the host). */
export const UAPI_SOCKET_DIR = '/var/run/wireguard';

/** Where the UAPI sockets go instead of UAPI_SOCKET_DIR (the testbed: each node its own). */
export const UAPI_DIR_ENV = 'WEFT_WIREGUARD_UAPI_DIR';

/** The socket directory this process uses: $WEFT_WIREGUARD_UAPI_DIR, else UAPI_SOCKET_DIR. */
export function uapiSocketDir(): string {
  return process.env[UAPI_DIR_ENV] || UAPI_SOCKET_DIR;
}
export const UAPI_IDLE_MS = 30_000;
export const UAPI_MAX_CONNECTIONS = 16;
export const UAPI_MAX_LINE = 4096;

/** errno.h values the protocol answers with (written negated, as wireguard-go does). */
export const UAPI_EINVAL = 22;
export const UAPI_EIO = 5;
export const UAPI_EOPNOTSUPP = 95;

const ZERO_KEY = Buffer.alloc(32);

/** The secrets `get` prints (see the file comment): the ones the engine was started with. */
export interface UapiSecrets {
  readonly privateKey: Buffer;
  /** The cluster-wide PSK, printed for each peer whose state says hasPsk. */
  readonly psk?: Buffer;
}

/** `a.b.c.d:port`, or `[v6]:port` for an IPv6 address (wireguard-go's DstToString). */
export function uapiEndpoint(address: string, port: number): string {
  return address.includes(':') ? `[${address}]:${port}` : `${address}:${port}`;
}

/**
 * The body of a `get=1` answer (without the `errno` line): the device, then each peer in the
 * order of `state.peers`, the keys in lowercase hex, in wireguard-go's line order.
 */
export function encodeUapiGet(state: WireguardState, secrets: UapiSecrets): string {
  const lines: string[] = [];
  lines.push(`private_key=${secrets.privateKey.toString('hex')}`);
  if (state.listenPort !== 0) lines.push(`listen_port=${state.listenPort}`);
  for (const p of state.peers) {
    lines.push(`public_key=${p.publicKey.toString('hex')}`);
    // A PSK set but not handed to this server: no line (wg then shows none) rather than zeros.
    const psk = p.hasPsk ? secrets.psk : ZERO_KEY;
    if (psk) lines.push(`preshared_key=${psk.toString('hex')}`);
    lines.push('protocol_version=1');
    if (p.endpoint) lines.push(`endpoint=${uapiEndpoint(p.endpoint.address, p.endpoint.port)}`);
    lines.push(`last_handshake_time_sec=${p.lastHandshakeSec}`);
    lines.push(`last_handshake_time_nsec=${p.lastHandshakeNsec}`);
    lines.push(`tx_bytes=${p.txBytes}`);
    lines.push(`rx_bytes=${p.rxBytes}`);
    lines.push(`persistent_keepalive_interval=${p.persistentKeepalive}`);
    for (const a of p.allowedIps) lines.push(`allowed_ip=${a}`);
  }
  return lines.map((l) => l + '\n').join('');
}

/** One request read off a connection. */
export type UapiRequest =
  | { readonly op: 'get' }
  | { readonly op: 'set' }
  | { readonly op: 'invalid'; readonly reason: string };

/**
 * Cuts a connection's bytes into requests: `get=1` + an empty line, `set=1` + lines up to an
 * empty line (read and dropped: set is refused whatever it says), anything else invalid (after
 * which the reader yields nothing more: the connection is to be closed).
 */
export class UapiRequestReader {
  #buf = '';
  #inSet = false;
  #inGet = false;
  #dead = false;

  /** The requests `chunk` completes (bytes are latin1: the protocol is ASCII). */
  feed(chunk: string): UapiRequest[] {
    if (this.#dead) return [];
    this.#buf += chunk;
    const out: UapiRequest[] = [];
    for (;;) {
      const nl = this.#buf.indexOf('\n');
      if (nl < 0) {
        if (this.#buf.length > UAPI_MAX_LINE) out.push(this.#fail('line too long'));
        return out;
      }
      if (nl > UAPI_MAX_LINE) {
        out.push(this.#fail('line too long'));
        return out;
      }
      const line = this.#buf.slice(0, nl);
      this.#buf = this.#buf.slice(nl + 1);
      if (this.#inGet) {
        this.#inGet = false;
        if (line !== '') {
          out.push(this.#fail('get=1 not followed by an empty line'));
          return out;
        }
        out.push({ op: 'get' });
      } else if (this.#inSet) {
        if (line === '') {
          this.#inSet = false;
          out.push({ op: 'set' });
        } else if (!line.includes('=')) {
          out.push(this.#fail(`set: a line without '='`));
          return out;
        }
      } else if (line === 'get=1') {
        this.#inGet = true;
      } else if (line === 'set=1') {
        this.#inSet = true;
      } else {
        out.push(this.#fail(`unknown operation ${JSON.stringify(line.slice(0, 64))}`));
        return out;
      }
    }
  }

  #fail(reason: string): UapiRequest {
    this.#dead = true;
    this.#buf = '';
    return { op: 'invalid', reason };
  }
}

/** The answer to one request, and whether the connection closes after it. */
export function uapiAnswer(
  req: UapiRequest,
  state: () => WireguardState,
  secrets: UapiSecrets,
): { text: string; close: boolean } {
  if (req.op === 'invalid') return { text: `errno=-${UAPI_EINVAL}\n\n`, close: true };
  if (req.op === 'set') return { text: `errno=-${UAPI_EOPNOTSUPP}\n\n`, close: false };
  let body: string;
  try {
    body = encodeUapiGet(state(), secrets);
  } catch {
    return { text: `errno=-${UAPI_EIO}\n\n`, close: false };
  }
  return { text: `${body}errno=0\n\n`, close: false };
}

export interface WireguardUapiOptions {
  /** The interface `wg show` names: the engine's TUN (flannel-wg). */
  readonly interfaceName: string;
  /** The device's state now (Dataplane.wireguardState). */
  readonly state: () => WireguardState;
  readonly secrets: UapiSecrets;
  /** The socket directory (default UAPI_SOCKET_DIR; tests use their own). */
  readonly dir?: string;
  readonly log?: Logger;
}

export interface WireguardUapi {
  /** The socket's path. */
  readonly path: string;
  /** Stops serving: open connections are closed, the socket file removed (if still ours). */
  close(): Promise<void>;
}

/** The X25519 public key of a 32-byte private key (wg(8) derives it the same way). */
export function x25519PublicKey(privateKey: Buffer): Buffer {
  const pkcs8 = Buffer.concat([Buffer.from('302e020100300506032b656e04220420', 'hex'), privateKey]);
  const pub = createPublicKey(createPrivateKey({ key: pkcs8, format: 'der', type: 'pkcs8' }));
  return pub.export({ format: 'der', type: 'spki' }).subarray(-32);
}

const uapiError = (message: string, details: Record<string, unknown>, cause?: unknown) =>
  new WeftError('WEFT_ERR_WIREGUARD_UAPI', message, {
    details,
    ...(cause === undefined ? {} : { cause }),
  });

/** Whether a unix socket at `path` has a live listener (false: connection refused). */
export function socketAlive(path: string): Promise<boolean> {
  return new Promise((resolve, reject) => {
    const s = connect(path);
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', (err: NodeJS.ErrnoException) => {
      s.destroy();
      if (err.code === 'ECONNREFUSED') resolve(false);
      else reject(err);
    });
  });
}

/**
 * Serves the UAPI for `interfaceName` until close(). Throws WEFT_ERR_WIREGUARD_UAPI (naming the
 * path and the rule) when the name, the directory, the socket path or the key is not as the
 * file comment says; a socket left by a crashed process (nobody listening) is replaced.
 */
export async function startWireguardUapi(opts: WireguardUapiOptions): Promise<WireguardUapi> {
  const log = opts.log ?? logger('wireguard-uapi');
  const name = opts.interfaceName;
  // wg(8) refuses names with '/'; IFNAMSIZ is 16 with the NUL.
  if (!/^[A-Za-z0-9_.=+-]{1,15}$/.test(name) || name === '.' || name === '..')
    throw uapiError(`interface name ${JSON.stringify(name)} is not one wg(8) can name`, { name });
  if (opts.secrets.privateKey.length !== 32)
    throw uapiError('privateKey must be 32 bytes', { name });
  if (opts.secrets.psk && opts.secrets.psk.length !== 32)
    throw uapiError('psk must be 32 bytes', { name });
  const state = opts.state();
  if (!x25519PublicKey(opts.secrets.privateKey).equals(state.publicKey))
    throw uapiError('privateKey is not the engine key (its public key differs)', { name });

  const dir = opts.dir ?? UAPI_SOCKET_DIR;
  const path = join(dir, `${name}.sock`);
  try {
    mkdirSync(dir, { mode: 0o755 }); // as wireguard-go creates it
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST')
      throw uapiError(`${dir}: ${errorMessage(err)}`, { dir }, err);
  }
  const owners = process.geteuid ? [0, process.geteuid()] : [0];
  const why = untrustedDir(dir, owners);
  if (why) throw uapiError(`untrusted socket directory: ${why}`, { dir });

  let st;
  try {
    st = lstatSync(path);
  } catch {
    st = null;
  }
  if (st) {
    if (st.isSymbolicLink()) throw uapiError(`${path} is a symlink`, { path });
    if (!st.isSocket()) throw uapiError(`${path} exists and is not a socket`, { path });
    let alive: boolean;
    try {
      alive = await socketAlive(path);
    } catch (err) {
      throw uapiError(`${path}: ${errorMessage(err)}`, { path }, err);
    }
    if (alive) throw uapiError(`${path} is served by another process`, { path });
    unlinkSync(path);
    log.info({ path }, 'stale wireguard uapi socket replaced');
  }

  const secrets = opts.secrets;
  const conns = new Set<Socket>();
  const server: Server = createServer({ allowHalfOpen: false }, (sock) => {
    conns.add(sock);
    sock.once('close', () => conns.delete(sock));
    serveConnection(sock, opts.state, secrets, log);
  });
  server.maxConnections = UAPI_MAX_CONNECTIONS;
  server.on('error', (err) =>
    log.warn({ path, err: errorMessage(err) }, 'wireguard uapi server error'),
  );
  const listening = new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.once('listening', () => {
      server.off('error', reject);
      resolve();
    });
  });
  // Bound under umask 077, so the socket is its owner's alone from its first moment (mode 0700,
  // as wireguard-go's). listen() binds a path synchronously: the umask is back before any other
  // code of this process creates a file.
  const umask = process.umask(0o077);
  try {
    server.listen(path);
  } finally {
    process.umask(umask);
  }
  try {
    await listening;
  } catch (err) {
    throw uapiError(`${path}: ${errorMessage(err)}`, { path }, err);
  }
  const ours = lstatSync(path);
  log.debug({ path }, 'wireguard uapi serving');

  let closed: Promise<void> | null = null;
  return {
    path,
    close() {
      closed ??= (async () => {
        for (const s of conns) s.destroy();
        await new Promise<void>((r) => server.close(() => r()));
        // Node removes the socket file on close; one that is still there and still ours goes.
        try {
          const now = lstatSync(path);
          if (now.ino === ours.ino && now.dev === ours.dev) unlinkSync(path);
        } catch {
          // gone already
        }
        log.debug({ path }, 'wireguard uapi stopped');
      })();
      return closed;
    },
  };
}

/**
 * Answers one connection's requests in order; never waits on the client while answering. While
 * an answer is not taken up by the client (the socket's buffer is full), no further request of
 * it is answered or read: one connection holds at most one answer of memory beyond its socket.
 */
function serveConnection(
  sock: Socket,
  state: () => WireguardState,
  secrets: UapiSecrets,
  log: Logger,
): void {
  const reader = new UapiRequestReader();
  const pending: UapiRequest[] = [];
  let backedUp = false;
  const pump = () => {
    while (!backedUp && pending.length > 0) {
      const req = pending.shift()!;
      if (req.op === 'invalid') log.debug({ reason: req.reason }, 'wireguard uapi request refused');
      const a = uapiAnswer(req, state, secrets);
      if (a.close) {
        pending.length = 0;
        sock.end(a.text);
        return;
      }
      if (!sock.write(a.text)) {
        backedUp = true;
        sock.pause();
        sock.once('drain', () => {
          backedUp = false;
          sock.resume();
          pump();
        });
      }
    }
  };
  sock.setEncoding('latin1');
  sock.setTimeout(UAPI_IDLE_MS, () => sock.destroy());
  sock.on('error', () => sock.destroy());
  sock.on('data', (chunk: string) => {
    pending.push(...reader.feed(chunk));
    pump();
  });
}
