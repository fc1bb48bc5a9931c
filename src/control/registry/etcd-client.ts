/**
 * A small etcd v3 client over etcd's own JSON gateway (the gRPC API served as HTTP/1.1 + JSON on
 * the client URL, `/v3/...`): only the calls the lease store makes. Keys and values travel as
 * base64, int64 fields as decimal strings, fields at their zero value are left out of answers.
 * A watch is one POST whose answer is a stream of JSON objects, one per line.
 *
 * What it owns: failover (each endpoint once per call, starting with the last one that
 * answered), a deadline per unary call, TLS from PEM files, and username/password auth (a token
 * from /v3/auth/authenticate in the Authorization header, fetched again when etcd forgets it,
 * e.g. after a restart; one authentication at a time, however many calls were refused), and a
 * cap on every answer (a unary body, one message of a watch stream): beyond it the call fails
 * with WEFT_ERR_STORE_RESPONSE_TOO_LARGE instead of buffering without bound. Retries with
 * backoff and error wrapping are the caller's (etcd.ts).
 * Compared with a gRPC client it loads no protocol-buffer runtime: a daemon on etcd holds ~15 MB
 * less.
 */
import http from 'node:http';
import https from 'node:https';
import { WeftError } from '../../common/errors.js';

/** One key as etcd returns it; `lease` and `mod_revision` are '0' when etcd leaves them out. */
export interface EtcdKv {
  readonly key: Buffer;
  readonly value: Buffer;
  readonly lease: string;
  readonly mod_revision: string;
}

export interface EtcdHeader {
  readonly revision: string;
}

export interface RangeRequest {
  readonly key: Buffer;
  readonly range_end?: Buffer;
  readonly count_only?: boolean;
}
export interface PutRequest {
  readonly key: Buffer;
  readonly value: Buffer;
  readonly lease?: string;
}
export interface DeleteRangeRequest {
  readonly key: Buffer;
  readonly prev_kv?: boolean;
}
export interface Compare {
  readonly key: Buffer;
  readonly target: 'VERSION' | 'MOD';
  readonly result: 'EQUAL';
  readonly version?: number;
  readonly mod_revision?: string;
}
export type RequestOp =
  | { readonly request_put: PutRequest }
  | { readonly request_range: RangeRequest }
  | { readonly request_delete_range: DeleteRangeRequest };
export interface TxnRequest {
  readonly compare: readonly Compare[];
  readonly success: readonly RequestOp[];
  readonly failure: readonly RequestOp[];
}

export interface RangeResponse {
  readonly header: EtcdHeader;
  readonly kvs: EtcdKv[];
}
export interface TxnResponse {
  readonly succeeded: boolean;
  readonly responses: { readonly response_range?: { readonly kvs: EtcdKv[] } }[];
}
export interface DeleteRangeResponse {
  readonly deleted: string;
  readonly prev_kvs: EtcdKv[];
}

export interface WatchCreate {
  readonly key: Buffer;
  readonly range_end: Buffer;
  readonly start_revision: number;
  readonly progress_notify: boolean;
}
export interface WatchEvent {
  readonly type: 'PUT' | 'DELETE';
  readonly kv: EtcdKv;
}
export interface WatchResponse {
  readonly header: EtcdHeader;
  readonly created: boolean;
  readonly canceled: boolean;
  readonly compact_revision: string;
  readonly cancel_reason: string;
  readonly events: WatchEvent[];
}

/** What a watch stream hands its listener: answers, then one error or end. */
export type WatchItem =
  | { readonly kind: 'data'; readonly res: WatchResponse }
  | { readonly kind: 'error'; readonly err: Error }
  | { readonly kind: 'end' };

export interface WatchStream {
  /** Closes the stream; no item follows. */
  cancel(): void;
}

export interface EtcdClientOptions {
  /** `http://host:port` or `https://host:port`. */
  readonly endpoints: readonly string[];
  /** PEM contents for TLS: a CA bundle (Node's roots when absent), a client certificate + key. */
  readonly tls?: { readonly ca?: Buffer; readonly cert?: Buffer; readonly key?: Buffer };
  readonly auth?: { readonly username: string; readonly password: string };
  /** Deadline of one unary call, ms. */
  readonly callTimeoutMs: number;
  /** Largest answer accepted: a unary body, or one message of a watch (default 64 MiB). */
  readonly maxResponseBytes?: number;
}

/**
 * The default cap of one answer. etcd refuses requests over 1.5 MiB (--max-request-bytes), so a
 * 5,000-lease range is ~2 MB; 64 MiB leaves room for far larger networks and still bounds what a
 * broken or hostile endpoint can make the daemon buffer.
 */
export const DEFAULT_MAX_RESPONSE_BYTES = 64 * 1024 * 1024;

/** The error of an answer over the cap (not recoverable: the same read would be as large). */
export function tooLargeError(what: string, bytes: number, max: number): WeftError {
  return new WeftError(
    'WEFT_ERR_STORE_RESPONSE_TOO_LARGE',
    `etcd ${what}: answer larger than ${max} bytes (${bytes} bytes read or announced)`,
    { details: { what, bytes, maxBytes: max } },
  );
}

/**
 * An error answered by etcd (`code`: the gRPC status code it carries) or met on the way
 * (`code` undefined: refused, reset, timed out). `recoverable`: another endpoint or a later
 * attempt may succeed.
 */
export class EtcdError extends Error {
  constructor(
    message: string,
    readonly code: number | undefined,
    readonly recoverable: boolean,
  ) {
    super(message);
    this.name = 'EtcdError';
  }
}

/** gRPC codes worth another try: Unknown (etcd's "leader changed"…), DeadlineExceeded,
 * ResourceExhausted, Aborted, Internal, Unavailable. */
const RECOVERABLE_CODES = new Set([2, 4, 8, 10, 13, 14]);
const UNAUTHENTICATED = 16;
/** Tokens etcd no longer knows (a restart drops simple tokens) or none sent. */
const TOKEN_REFUSED = /invalid auth token|user name is empty|auth token/;

export function isRecoverable(err: unknown): boolean {
  return err instanceof EtcdError && err.recoverable;
}

const b64 = (b: Buffer) => b.toString('base64');

/** Buffers as base64, recursively: a request as the gateway reads it. */
function toWire(v: unknown): unknown {
  if (Buffer.isBuffer(v)) return b64(v);
  if (Array.isArray(v)) return v.map(toWire);
  if (v !== null && typeof v === 'object') {
    return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, toWire(x)]));
  }
  return v;
}

interface WireKv {
  key?: string;
  value?: string;
  lease?: string;
  mod_revision?: string;
}

function fromWireKv(kv: WireKv): EtcdKv {
  return {
    key: Buffer.from(kv.key ?? '', 'base64'),
    value: Buffer.from(kv.value ?? '', 'base64'),
    lease: kv.lease ?? '0',
    mod_revision: kv.mod_revision ?? '0',
  };
}

const kvsOf = (kvs: WireKv[] | undefined): EtcdKv[] => (kvs ?? []).map(fromWireKv);

interface WireWatch {
  header?: { revision?: string };
  created?: boolean;
  canceled?: boolean;
  compact_revision?: string;
  cancel_reason?: string;
  events?: { type?: string; kv?: WireKv }[];
}

export function fromWireWatch(r: WireWatch): WatchResponse {
  return {
    header: { revision: r.header?.revision ?? '0' },
    created: r.created === true,
    canceled: r.canceled === true,
    compact_revision: r.compact_revision ?? '0',
    cancel_reason: r.cancel_reason ?? '',
    events: (r.events ?? []).map((e) => ({
      type: e.type === 'DELETE' ? 'DELETE' : 'PUT',
      kv: fromWireKv(e.kv ?? {}),
    })),
  };
}

/** An error body of the gateway (`{"error","message","code"}`, or in a stream `{"error":{…}}`). */
export function errorFromBody(status: number, body: unknown): EtcdError {
  const b = (body ?? {}) as {
    message?: string;
    error?: string | { message?: string; grpc_code?: number };
    code?: number;
  };
  const inner = typeof b.error === 'object' ? b.error : undefined;
  const message =
    inner?.message ?? b.message ?? (typeof b.error === 'string' ? b.error : undefined);
  const code = inner?.grpc_code ?? b.code;
  const recoverable = code === undefined ? status >= 500 : RECOVERABLE_CODES.has(code);
  return new EtcdError(message ?? `HTTP ${status}`, code, recoverable);
}

/**
 * Splits a byte stream into newline-separated JSON objects (chunks may cut an object, or a
 * UTF-8 character, anywhere).
 */
export class JsonLines {
  #pending: Buffer = Buffer.alloc(0);
  readonly #maxLine: number;

  /** `maxLine`: the longest object accepted (bytes); a longer one throws tooLargeError. */
  constructor(maxLine = Infinity) {
    this.#maxLine = maxLine;
  }

  push(chunk: Buffer): unknown[] {
    this.#pending = this.#pending.length ? Buffer.concat([this.#pending, chunk]) : chunk;
    const out: unknown[] = [];
    let nl: number;
    while ((nl = this.#pending.indexOf(0x0a)) >= 0) {
      if (nl > this.#maxLine) throw tooLargeError('watch message', nl, this.#maxLine);
      const line = this.#pending.subarray(0, nl).toString('utf8').trim();
      this.#pending = this.#pending.subarray(nl + 1);
      if (line !== '') out.push(JSON.parse(line));
    }
    if (this.#pending.length > this.#maxLine) {
      throw tooLargeError('watch message', this.#pending.length, this.#maxLine);
    }
    return out;
  }

  /** What is left at the end of the stream: a last object without its newline, if any. */
  end(): unknown[] {
    const line = this.#pending.toString('utf8').trim();
    this.#pending = Buffer.alloc(0);
    return line === '' ? [] : [JSON.parse(line)];
  }
}

/** The headers of one call and the token promise they came from (null without auth). */
interface AuthHeader {
  readonly headers: Record<string, string>;
  readonly token: Promise<string> | null;
}

interface Endpoint {
  readonly url: URL;
  readonly agent: http.Agent;
  readonly mod: typeof http | typeof https;
}

export class EtcdClient {
  readonly #endpoints: readonly Endpoint[];
  readonly #auth: EtcdClientOptions['auth'];
  readonly #callTimeoutMs: number;
  /** The endpoint that answered last: calls start there. */
  #current = 0;
  /** The token of every call; refused, it is replaced once (single flight), see #authHeader. */
  #token: Promise<string> | null = null;
  readonly #maxResponseBytes: number;
  #closed = false;

  constructor(options: EtcdClientOptions) {
    this.#auth = options.auth;
    this.#callTimeoutMs = options.callTimeoutMs;
    this.#maxResponseBytes = options.maxResponseBytes ?? DEFAULT_MAX_RESPONSE_BYTES;
    this.#endpoints = options.endpoints.map((e) => {
      const url = new URL(e);
      if (url.protocol !== 'http:' && url.protocol !== 'https:') {
        throw new Error(`${e}: an endpoint is http://host:port or https://host:port`);
      }
      const secure = url.protocol === 'https:';
      // A few sockets per endpoint: 5,000 lease look-ups at once queue instead of 5,000 connects.
      const common = { keepAlive: true, maxSockets: 16 };
      const agent = secure
        ? new https.Agent({
            ...common,
            ...(options.tls?.ca ? { ca: options.tls.ca } : {}),
            ...(options.tls?.cert ? { cert: options.tls.cert } : {}),
            ...(options.tls?.key ? { key: options.tls.key } : {}),
          })
        : new http.Agent(common);
      return { url, agent, mod: secure ? https : http };
    });
  }

  // ---- the calls ----

  async range(req: RangeRequest, signal?: AbortSignal): Promise<RangeResponse> {
    const r = (await this.#unary('/v3/kv/range', req, signal)) as {
      header?: { revision?: string };
      kvs?: WireKv[];
    };
    return { header: { revision: r.header?.revision ?? '0' }, kvs: kvsOf(r.kvs) };
  }

  async put(req: PutRequest, signal?: AbortSignal): Promise<void> {
    await this.#unary('/v3/kv/put', req, signal);
  }

  async txn(req: TxnRequest, signal?: AbortSignal): Promise<TxnResponse> {
    const r = (await this.#unary('/v3/kv/txn', req, signal)) as {
      succeeded?: boolean;
      responses?: { response_range?: { kvs?: WireKv[] } }[];
    };
    return {
      succeeded: r.succeeded === true,
      responses: (r.responses ?? []).map((x) =>
        x.response_range ? { response_range: { kvs: kvsOf(x.response_range.kvs) } } : {},
      ),
    };
  }

  async deleteRange(req: DeleteRangeRequest, signal?: AbortSignal): Promise<DeleteRangeResponse> {
    const r = (await this.#unary('/v3/kv/deleterange', req, signal)) as {
      deleted?: string;
      prev_kvs?: WireKv[];
    };
    return { deleted: r.deleted ?? '0', prev_kvs: kvsOf(r.prev_kvs) };
  }

  async leaseGrant(ttlSeconds: number, signal?: AbortSignal): Promise<{ ID: string; TTL: string }> {
    const r = (await this.#unary('/v3/lease/grant', { TTL: ttlSeconds }, signal)) as {
      ID?: string;
      TTL?: string;
      error?: string;
    };
    if (r.error) throw new EtcdError(`lease grant: ${r.error}`, undefined, false);
    return { ID: r.ID ?? '0', TTL: r.TTL ?? '0' };
  }

  async leaseRevoke(id: string, signal?: AbortSignal): Promise<void> {
    await this.#unary('/v3/lease/revoke', { ID: id }, signal);
  }

  /** TTL left in seconds (-1: the lease is gone) and, with `keys`, the keys attached to it. */
  async leaseTimeToLive(
    id: string,
    keys: boolean,
    signal?: AbortSignal,
  ): Promise<{ TTL: string; keys: Buffer[] }> {
    const r = (await this.#unary('/v3/lease/timetolive', { ID: id, keys }, signal)) as {
      TTL?: string;
      keys?: string[];
    };
    return { TTL: r.TTL ?? '0', keys: (r.keys ?? []).map((k) => Buffer.from(k, 'base64')) };
  }

  /**
   * Opens a watch on the current endpoint (the next one when it cannot connect) and hands
   * `onItem` its answers. Resolves once etcd has answered the POST (status 200), so a refused
   * or failed open rejects here and the caller backs off.
   */
  async watch(create: WatchCreate, onItem: (item: WatchItem) => void): Promise<WatchStream> {
    const body = JSON.stringify({ create_request: toWire(create) });
    let last: unknown;
    for (let i = 0; i < this.#endpoints.length; i++) {
      const ep = this.#endpoints[(this.#current + i) % this.#endpoints.length]!;
      let token: Promise<string> | null = null;
      try {
        const auth = await this.#authHeader();
        token = auth.token;
        const stream = await this.#openWatch(ep, body, auth, onItem);
        this.#current = this.#endpoints.indexOf(ep);
        return stream;
      } catch (err) {
        last = err;
        this.#forgetTokenIfRefused(err, token);
        if (!isRecoverable(err)) throw err;
      }
    }
    throw last;
  }

  close(): void {
    this.#closed = true;
    for (const ep of this.#endpoints) ep.agent.destroy();
  }

  // ---- plumbing ----

  #openWatch(
    ep: Endpoint,
    body: string,
    { headers, token }: AuthHeader,
    onItem: (item: WatchItem) => void,
  ): Promise<WatchStream> {
    return new Promise((resolve, reject) => {
      let open = false;
      let done = false;
      const finish = (item: WatchItem) => {
        if (done) return;
        done = true;
        onItem(item);
      };
      const req = ep.mod.request(new URL('/v3/watch', ep.url), {
        method: 'POST',
        agent: ep.agent,
        headers: { 'content-type': 'application/json', ...headers },
      });
      const stream: WatchStream = {
        cancel: () => {
          done = true;
          req.destroy();
        },
      };
      // Connecting is bounded like a unary call; once open the stream lives as long as etcd.
      const connectTimer = setTimeout(
        () => req.destroy(new EtcdError('watch: no answer (deadline exceeded)', 4, true)),
        this.#callTimeoutMs,
      );
      req.on('error', (err) => {
        clearTimeout(connectTimer);
        const e = asEtcdError(err);
        if (!open) reject(e);
        else finish({ kind: 'error', err: e });
      });
      req.on('response', (res) => {
        clearTimeout(connectTimer);
        if (res.statusCode !== 200) {
          collect(res, this.#maxResponseBytes, 'watch').then(
            (text) => reject(errorFromBody(res.statusCode ?? 0, parseOrEmpty(text))),
            (err: unknown) => reject(asEtcdError(err)),
          );
          return;
        }
        open = true;
        resolve(stream);
        const lines = new JsonLines(this.#maxResponseBytes);
        const deliver = (objs: unknown[]) => {
          for (const o of objs) {
            if (done) return;
            const m = o as { result?: WireWatch; error?: unknown };
            if (m.error !== undefined) {
              const err = errorFromBody(200, m);
              this.#forgetTokenIfRefused(err, token);
              finish({ kind: 'error', err });
              req.destroy();
              return;
            }
            onItem({ kind: 'data', res: fromWireWatch(m.result ?? {}) });
          }
        };
        res.on('data', (chunk: Buffer) => {
          try {
            deliver(lines.push(chunk));
          } catch (err) {
            finish({
              kind: 'error',
              err:
                err instanceof WeftError
                  ? err
                  : new EtcdError(`watch: ${String(err)}`, undefined, true),
            });
            req.destroy();
          }
        });
        res.on('end', () => {
          try {
            deliver(lines.end());
          } catch {
            // a cut last line: the stream ended anyway
          }
          finish({ kind: 'end' });
        });
        res.on('error', (err) => finish({ kind: 'error', err: asEtcdError(err) }));
      });
      req.end(body);
    });
  }

  /** One unary call: each endpoint once, starting with the last that answered. */
  async #unary(path: string, req: unknown, signal?: AbortSignal): Promise<unknown> {
    if (this.#closed) throw new EtcdError('etcd client closed', undefined, false);
    const body = JSON.stringify(toWire(req));
    let refreshed = false;
    let last: unknown;
    for (let i = 0; i < this.#endpoints.length; i++) {
      const ep = this.#endpoints[(this.#current + i) % this.#endpoints.length]!;
      let token: Promise<string> | null = null;
      try {
        const auth = await this.#authHeader();
        token = auth.token;
        const out = await this.#post(ep, path, body, auth.headers, signal);
        this.#current = this.#endpoints.indexOf(ep);
        return out;
      } catch (err) {
        last = err;
        if (this.#forgetTokenIfRefused(err, token) && !refreshed) {
          refreshed = true; // the same endpoint again, with a new token
          i--;
          continue;
        }
        if (!isRecoverable(err) || signal?.aborted) throw err;
      }
    }
    throw last;
  }

  #post(
    ep: Endpoint,
    path: string,
    body: string,
    headers: Record<string, string>,
    signal?: AbortSignal,
  ): Promise<unknown> {
    return new Promise((resolve, reject) => {
      const req = ep.mod.request(new URL(path, ep.url), {
        method: 'POST',
        agent: ep.agent,
        headers: { 'content-type': 'application/json', ...headers },
        ...(signal ? { signal } : {}),
      });
      const timer = setTimeout(
        () => req.destroy(new EtcdError(`${path}: deadline exceeded`, 4, true)),
        this.#callTimeoutMs,
      );
      req.on('error', (err) => {
        clearTimeout(timer);
        reject(asEtcdError(err));
      });
      req.on('response', (res) => {
        collect(res, this.#maxResponseBytes, path).then(
          (text) => {
            clearTimeout(timer);
            const parsed = parseOrEmpty(text);
            if (res.statusCode === 200) resolve(parsed);
            else reject(errorFromBody(res.statusCode ?? 0, parsed));
          },
          (err: unknown) => {
            clearTimeout(timer);
            reject(asEtcdError(err));
          },
        );
      });
      req.end(body);
    });
  }

  /**
   * The Authorization header. Every call in flight shares one token promise: when etcd refuses
   * the token, the first refusal drops it and the next call starts the one authentication that
   * all of them await (each is a bcrypt check on etcd).
   */
  async #authHeader(): Promise<AuthHeader> {
    if (!this.#auth) return { headers: {}, token: null };
    const token = (this.#token ??= this.#authenticate(this.#auth));
    try {
      return { headers: { authorization: await token }, token };
    } catch (err) {
      if (this.#token === token) this.#token = null;
      throw err;
    }
  }

  async #authenticate(auth: { username: string; password: string }): Promise<string> {
    let last: unknown;
    for (let i = 0; i < this.#endpoints.length; i++) {
      const ep = this.#endpoints[(this.#current + i) % this.#endpoints.length]!;
      try {
        const body = JSON.stringify({ name: auth.username, password: auth.password });
        const r = (await this.#post(ep, '/v3/auth/authenticate', body, {})) as { token?: string };
        if (!r.token) throw new EtcdError('authenticate: no token in the answer', undefined, false);
        return r.token;
      } catch (err) {
        last = err;
        if (!isRecoverable(err)) throw err;
      }
    }
    throw last;
  }

  /**
   * On a refused token: true (the call may try again), and the token `used` is dropped unless
   * another refused call already replaced it, so concurrent refusals authenticate once.
   */
  #forgetTokenIfRefused(err: unknown, used: Promise<string> | null): boolean {
    if (
      this.#auth &&
      err instanceof EtcdError &&
      (err.code === UNAUTHENTICATED || err.code === 3) &&
      TOKEN_REFUSED.test(err.message)
    ) {
      if (this.#token === used) this.#token = null;
      return true;
    }
    return false;
  }
}

/** A whole body, at most `max` bytes (a longer one, or one announced longer, rejects). */
function collect(res: http.IncomingMessage, max: number, what: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const announced = Number(res.headers['content-length'] ?? NaN);
    if (announced > max) {
      res.destroy();
      reject(tooLargeError(what, announced, max));
      return;
    }
    const chunks: Buffer[] = [];
    let size = 0;
    res.on('data', (c: Buffer) => {
      size += c.length;
      if (size > max) {
        res.destroy();
        reject(tooLargeError(what, size, max));
        return;
      }
      chunks.push(c);
    });
    res.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    res.on('error', reject);
    res.on('close', () => reject(new EtcdError(`${what}: answer cut short`, undefined, true)));
  });
}

function parseOrEmpty(text: string): unknown {
  try {
    return text.trim() === '' ? {} : JSON.parse(text);
  } catch {
    return { message: text.slice(0, 200) };
  }
}

/** A socket-level failure (refused, reset, TLS refused, deadline) as a recoverable EtcdError. */
function asEtcdError(err: unknown): EtcdError | WeftError {
  if (err instanceof EtcdError || err instanceof WeftError) return err;
  const e = err as NodeJS.ErrnoException;
  if (e?.name === 'AbortError') return new EtcdError('aborted', 1, false);
  return new EtcdError(
    e?.code ? `${e.code}: ${e.message}` : String(e?.message ?? e),
    undefined,
    true,
  );
}
