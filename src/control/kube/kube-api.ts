/**
 * The slice of the Kubernetes API the kube subnet manager uses, over plain HTTP(S): get a node
 * or a pod, list nodes, watch nodes (the chunked stream of newline-delimited JSON events), patch
 * a node's status, and the connection itself: a kubeconfig file (its current context: server, CA,
 * client certificate, token, token file or basic auth; exec and auth-provider plugins are
 * refused, naming them), the in-cluster service account, or a bare `--kube-api-url`. The requests
 * are ours (node:http/https), so a watch is one readable stream we parse and cancel, and the
 * Kubernetes client library (~56 MB of a daemon's memory) is not loaded.
 *
 * Errors: every call rejects with a WeftError carrying the HTTP status and the Status reason in
 * `details`: 404 → WEFT_ERR_STORE_NOT_FOUND, 410 (a too-old resourceVersion, as an HTTP status
 * or as a watch ERROR event) → WEFT_ERR_STORE_COMPACTED, anything else (401/403/5xx, refused,
 * reset, a torn stream) → WEFT_ERR_STORE_UNAVAILABLE, a failed TLS handshake (CA, name, expiry,
 * client certificate refused) → WEFT_ERR_KUBE_TLS, `signal` fired → WEFT_ERR_ABORTED, one
 * list item, watch line or plain response over `maxObjectBytes` → WEFT_ERR_STORE_RESPONSE_TOO_LARGE.
 */
import { readFileSync } from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import { dirname, join, resolve } from 'node:path';
import { load as yamlLoad } from 'js-yaml';
import { WeftError, abortError, errorMessage } from '../../common/errors.js';
import { YoungGcPacer } from '../../common/young-gc.js';
import { type KubeConnection, KubeCredentials } from './kube-credentials.js';
import {
  type KeepTree,
  LineSplitter,
  ListScanner,
  MAX_OBJECT_BYTES,
  parseJson,
  tooLarge,
} from './kube-stream.js';

/** The fields of a v1 Node weft reads or writes (the rest is carried along untouched). */
export interface KubeNode {
  readonly apiVersion?: string;
  readonly kind?: string;
  readonly metadata: {
    readonly name: string;
    readonly resourceVersion?: string;
    readonly annotations?: Readonly<Record<string, string>>;
    readonly [k: string]: unknown;
  };
  readonly spec?: { readonly podCIDR?: string; readonly podCIDRs?: readonly string[] };
  readonly status?: {
    readonly conditions?: ReadonlyArray<Readonly<Record<string, unknown>>>;
    readonly [k: string]: unknown;
  };
}

export interface KubePod {
  readonly metadata: { readonly name: string; readonly namespace?: string };
  readonly spec?: { readonly nodeName?: string };
}

export type WatchEventType = 'ADDED' | 'MODIFIED' | 'DELETED' | 'BOOKMARK' | 'ERROR';

export interface WatchEvent<T> {
  readonly type: WatchEventType;
  readonly object: T;
}

/** A `Status` object, as the API server sends with every error. */
export interface KubeStatus {
  readonly kind?: 'Status';
  readonly code?: number;
  readonly reason?: string;
  readonly message?: string;
}

export type PatchType = 'strategic' | 'merge' | 'json';

export const PATCH_CONTENT_TYPES: Readonly<Record<PatchType, string>> = {
  strategic: 'application/strategic-merge-patch+json',
  merge: 'application/merge-patch+json',
  json: 'application/json-patch+json',
};

export interface KubeConnectionOptions {
  /** --kube-api-url: overrides the kubeconfig's server, or alone (no auth) when no kubeconfig. */
  readonly apiUrl?: string;
  /** --kubeconfig-file. Neither set: the in-cluster service account. */
  readonly kubeconfigFile?: string;
  readonly env?: Readonly<Record<string, string | undefined>>;
}

/** Where the in-cluster service account's files are (a pod's mount). */
export const SERVICE_ACCOUNT_DIR = '/var/run/secrets/kubernetes.io/serviceaccount';

export type { KubeConnection } from './kube-credentials.js';

type Named<T> = { name?: unknown } & T;
interface KubeconfigFile {
  'current-context'?: unknown;
  clusters?: Array<Named<{ cluster?: Record<string, unknown> }>>;
  users?: Array<Named<{ user?: Record<string, unknown> }>>;
  contexts?: Array<Named<{ context?: { cluster?: unknown; user?: unknown } }>>;
}

/** A kubeconfig file's current context → a connection (paths relative to the file's folder). */
function fromKubeconfig(file: string): KubeConnection {
  const doc = yamlLoad(readFileSync(file, 'utf8')) as KubeconfigFile | null;
  if (!doc || typeof doc !== 'object') throw new Error(`${file}: not a kubeconfig`);
  const byName = <T>(list: Array<Named<T>> | undefined, name: unknown, what: string): T => {
    const e = (list ?? []).find((x) => x.name === name);
    if (!e) throw new Error(`${file}: no ${what} named ${JSON.stringify(name)}`);
    return e;
  };
  const current = doc['current-context'];
  if (typeof current !== 'string' || current === '') throw new Error(`${file}: no current-context`);
  const context = byName(doc.contexts, current, 'context').context ?? {};
  const cluster = byName(doc.clusters, context.cluster, 'cluster').cluster ?? {};
  const user =
    context.user === undefined ? {} : (byName(doc.users, context.user, 'user').user ?? {});
  const dir = dirname(file);
  const str = (o: Record<string, unknown>, k: string): string | undefined =>
    typeof o[k] === 'string' && o[k] !== '' ? o[k] : undefined;
  /** `<name>-data` (base64) or `<name>` (a file path, returned too). */
  const material = (o: Record<string, unknown>, name: string): { data?: Buffer; file?: string } => {
    const data = str(o, `${name}-data`);
    if (data !== undefined) return { data: Buffer.from(data, 'base64') };
    const path = str(o, name);
    if (path === undefined) return {};
    const file = resolve(dir, path);
    return { data: readFileSync(file), file };
  };
  for (const plugin of ['exec', 'auth-provider']) {
    if (user[plugin] !== undefined) {
      throw new Error(
        `${file}: user ${JSON.stringify(context.user)} authenticates with an ${plugin} plugin, ` +
          'which weft does not run (use a token, a token file or a client certificate)',
      );
    }
  }
  const server = str(cluster, 'server');
  if (server === undefined) throw new Error(`${file}: cluster has no server`);
  const { data: ca, file: caFile } = material(cluster, 'certificate-authority');
  const { data: cert, file: certFile } = material(user, 'client-certificate');
  const { data: key, file: keyFile } = material(user, 'client-key');
  const servername = str(cluster, 'tls-server-name');
  const token = str(user, 'token');
  const tokenFile = str(user, 'tokenFile');
  const username = str(user, 'username');
  return {
    server: new URL(server),
    tls: {
      ...(ca ? { ca } : {}),
      ...(cert ? { cert } : {}),
      ...(key ? { key } : {}),
      ...(servername ? { servername } : {}),
      rejectUnauthorized: cluster['insecure-skip-tls-verify'] !== true,
    },
    ...(caFile ? { caFile } : {}),
    // Both as files: the pair rotates (kubelet-style); data inline never changes.
    ...(certFile && keyFile ? { certFile, keyFile } : {}),
    ...(token ? { token } : {}),
    ...(tokenFile ? { tokenFile: resolve(dir, tokenFile) } : {}),
    ...(username ? { basic: { username, password: str(user, 'password') ?? '' } } : {}),
  };
}

/** A pod's service account: the API server's service address, its CA and the pod's token. */
function inCluster(host: string, port: string, dir: string): KubeConnection {
  const h = host.includes(':') ? `[${host}]` : host;
  return {
    server: new URL(`https://${h}:${port}`),
    tls: { ca: readFileSync(join(dir, 'ca.crt')), rejectUnauthorized: true },
    caFile: join(dir, 'ca.crt'),
    tokenFile: join(dir, 'token'),
  };
}

/** flannel's BuildConfigFromFlags(apiUrl, kubeconfig): the three ways to reach the API server. */
export function loadKubeConfig(
  o: KubeConnectionOptions & { serviceAccountDir?: string },
): KubeConnection {
  const env = o.env ?? process.env;
  let c: KubeConnection;
  try {
    if (o.kubeconfigFile) {
      c = fromKubeconfig(o.kubeconfigFile);
    } else if (o.apiUrl) {
      c = { server: new URL(o.apiUrl), tls: { rejectUnauthorized: true } };
    } else if (env.KUBERNETES_SERVICE_HOST && env.KUBERNETES_SERVICE_PORT) {
      c = inCluster(
        env.KUBERNETES_SERVICE_HOST,
        env.KUBERNETES_SERVICE_PORT,
        o.serviceAccountDir ?? SERVICE_ACCOUNT_DIR,
      );
    } else {
      throw new Error(
        'no API server: give --kube-api-url or --kubeconfig-file, or run in a pod ' +
          '(KUBERNETES_SERVICE_HOST is unset)',
      );
    }
    // --kube-api-url with a kubeconfig: its server, the kubeconfig's credentials.
    if (o.apiUrl && o.kubeconfigFile) c = { ...c, server: new URL(o.apiUrl) };
  } catch (err) {
    throw new WeftError('WEFT_ERR_STORE_UNAVAILABLE', `kubernetes config: ${errorMessage(err)}`, {
      cause: err,
      details: { kubeconfigFile: o.kubeconfigFile, apiUrl: o.apiUrl },
    });
  }
  return c;
}

interface RequestOptions {
  readonly body?: unknown;
  readonly contentType?: string;
  readonly query?: Readonly<Record<string, string>>;
  readonly signal?: AbortSignal;
  /** Socket inactivity after which the request fails (default REQUEST_IDLE_MS). */
  readonly idleMs?: number;
}

/** A plain request that sends or receives nothing for this long has failed. */
export const REQUEST_IDLE_MS = 30_000;

/** A young-generation collection after every this many bytes of a list read (young-gc.ts). */
export const LIST_GC_BYTES = 1024 * 1024;

/** How a list is asked for (see listNodes). */
export interface ListOptions {
  /** "0": any version (the watch cache); "": the latest (a quorum read). */
  readonly resourceVersion: '0' | '';
  /** Items per page (`limit`); the next pages follow `metadata.continue`. */
  readonly limit: number;
  readonly signal?: AbortSignal;
  /** What of each Node to parse (the rest arrives as null): see ListScanner. Default: all. */
  readonly keep?: KeepTree;
}

export interface KubeApiLimits {
  /** The largest list item, watch line or plain response read (default MAX_OBJECT_BYTES). */
  readonly maxObjectBytes?: number;
}

export class KubeApi {
  readonly #creds: KubeCredentials;
  readonly #server: URL;
  readonly #maxObject: number;

  constructor(conn: KubeConnection, limits: KubeApiLimits = {}) {
    this.#creds = new KubeCredentials(conn);
    this.#server = conn.server;
    this.#maxObject = limits.maxObjectBytes ?? MAX_OBJECT_BYTES;
  }

  get server(): string {
    return this.#server.toString();
  }

  getNode(name: string, signal?: AbortSignal): Promise<KubeNode> {
    return this.#json('GET', `/api/v1/nodes/${encodeURIComponent(name)}`, { signal });
  }

  getPod(namespace: string, name: string, signal?: AbortSignal): Promise<KubePod> {
    return this.#json(
      'GET',
      `/api/v1/namespaces/${encodeURIComponent(namespace)}/pods/${encodeURIComponent(name)}`,
      { signal },
    );
  }

  /**
   * Lists nodes in pages of `limit`, following `continue`, handing each node to `each` as soon
   * as its bytes have arrived (a page is read as a stream, never held whole: see kube-stream.ts),
   * so the caller can cut it down before the next one is parsed. The continued pages carry no
   * resourceVersion (the token holds it; the server refuses both). Resolves with the list's
   * resourceVersion (where a watch starts) and the number of pages. A continue token the server
   * has expired is a 410 → WEFT_ERR_STORE_COMPACTED (the caller lists again from the start).
   */
  async listNodes(
    each: (node: KubeNode) => void,
    o: ListOptions,
  ): Promise<{ resourceVersion: string; pages: number }> {
    let cont = '';
    let resourceVersion = '';
    let pages = 0;
    do {
      const query: Record<string, string> = { limit: String(o.limit) };
      if (cont !== '') query.continue = cont;
      else if (o.resourceVersion !== '') query.resourceVersion = o.resourceVersion;
      const meta = await this.#listPage('/api/v1/nodes', query, each, o.signal, o.keep);
      pages++;
      if (typeof meta.resourceVersion === 'string') resourceVersion = meta.resourceVersion;
      cont = typeof meta.continue === 'string' ? meta.continue : '';
    } while (cont !== '');
    return { resourceVersion, pages };
  }

  /** One list page, streamed: its items to `each`, its metadata returned. */
  async #listPage(
    path: string,
    query: Record<string, string>,
    each: (node: KubeNode) => void,
    signal: AbortSignal | undefined,
    keep: KeepTree | undefined,
  ): Promise<{ resourceVersion?: unknown; continue?: unknown }> {
    const res = await this.#send('GET', path, { query, signal });
    const what = `GET ${path}`;
    try {
      if (res.statusCode !== 200) {
        throw statusError(res.statusCode ?? 0, await readAll(res, this.#maxObject, what), what);
      }
      const scanner = new ListScanner(
        (item) => each(parseJson(item, `${what}: an item`) as KubeNode),
        this.#maxObject,
        what,
        keep ?? null,
      );
      // (young-gc.ts: the socket's read buffers, freed only by a collection)
      const pacer = new YoungGcPacer(LIST_GC_BYTES);
      for await (const chunk of res as AsyncIterable<Buffer>) {
        scanner.push(chunk);
        pacer.read(chunk.length);
      }
      scanner.end();
      const meta = scanner.top.metadata;
      return typeof meta === 'object' && meta !== null ? meta : {};
    } catch (err) {
      if (signal?.aborted) throw abortError(signal);
      if (err instanceof WeftError) throw err;
      throw new WeftError(
        'WEFT_ERR_STORE_UNAVAILABLE',
        `kubernetes ${what}: ${errorMessage(err)}`,
        {
          cause: err,
        },
      );
    } finally {
      res.destroy();
    }
  }

  patchNodeStatus(
    name: string,
    patch: unknown,
    type: PatchType,
    signal?: AbortSignal,
  ): Promise<KubeNode> {
    return this.#json('PATCH', `/api/v1/nodes/${encodeURIComponent(name)}/status`, {
      body: patch,
      contentType: PATCH_CONTENT_TYPES[type],
      signal,
    });
  }

  /**
   * Watches nodes from `resourceVersion`, yielding the events of each received chunk as one
   * batch. Ends when the server closes the stream (timeoutSeconds); a 410 (as status or as an
   * ERROR event) rejects WEFT_ERR_STORE_COMPACTED, any other ERROR event or a torn stream
   * WEFT_ERR_STORE_UNAVAILABLE. Bookmarks are asked for (`allowWatchBookmarks`): BOOKMARK
   * events carry only a newer resourceVersion (an object with no name), for the caller to
   * resume from after the stream ends, so a quiet watch does not fall behind the server's
   * history and come back to a 410 and a relist. Lines are split as bytes (one line at most
   * maxObjectBytes), each parsed alone.
   */
  async *watchNodes(
    resourceVersion: string,
    signal: AbortSignal,
    timeoutSeconds = 300,
  ): AsyncIterable<Array<WatchEvent<KubeNode>>> {
    const res = await this.#send('GET', '/api/v1/nodes', {
      query: {
        watch: 'true',
        resourceVersion,
        allowWatchBookmarks: 'true',
        timeoutSeconds: String(timeoutSeconds),
      },
      signal,
      // The server ends the stream after timeoutSeconds; silence well past that is a dead peer.
      idleMs: (timeoutSeconds + 30) * 1000,
    });
    const lines = new LineSplitter(this.#maxObject);
    try {
      if (res.statusCode !== 200) {
        throw statusError(
          res.statusCode ?? 0,
          await readAll(res, this.#maxObject, 'watch'),
          'watch',
        );
      }
      for await (const chunk of res as AsyncIterable<Buffer>) {
        const batch: Array<WatchEvent<KubeNode>> = [];
        for (const bytes of lines.push(chunk)) {
          const line = bytes.toString('utf8');
          if (line.trim() === '') continue;
          const ev = parseWatchLine(line);
          if (ev.type === 'ERROR') {
            if (batch.length > 0) yield batch.splice(0);
            throw statusError((ev.object as KubeStatus).code ?? 500, ev.object, 'watch');
          }
          batch.push(ev);
        }
        if (batch.length > 0) yield batch;
      }
    } catch (err) {
      if (signal.aborted) throw abortError(signal);
      if (err instanceof WeftError) throw err;
      throw new WeftError('WEFT_ERR_STORE_UNAVAILABLE', `kubernetes watch: ${errorMessage(err)}`, {
        cause: err,
      });
    } finally {
      res.destroy();
    }
    if (signal.aborted) throw abortError(signal);
  }

  async #json<T>(method: string, path: string, o: RequestOptions): Promise<T> {
    const res = await this.#send(method, path, o);
    const text = await readAll(res, this.#maxObject, `${method} ${path}`).catch((err: unknown) => {
      if (o.signal?.aborted) throw abortError(o.signal);
      if (err instanceof WeftError) throw err;
      throw new WeftError(
        'WEFT_ERR_STORE_UNAVAILABLE',
        `kubernetes ${method} ${path}: ${errorMessage(err)}`,
        {
          cause: err,
        },
      );
    });
    const status = res.statusCode ?? 0;
    if (status < 200 || status >= 300) throw statusError(status, text, `${method} ${path}`);
    try {
      return JSON.parse(text) as T;
    } catch (err) {
      throw new WeftError(
        'WEFT_ERR_STORE_UNAVAILABLE',
        `kubernetes ${method} ${path}: response is not JSON`,
        { cause: err },
      );
    }
  }

  /** A request; a 401 after which the token file holds another token is sent once more. */
  async #send(method: string, path: string, o: RequestOptions): Promise<http.IncomingMessage> {
    const first = await this.#sendOnce(method, path, o);
    if (
      first.res.statusCode !== 401 ||
      !(await this.#creds.refreshAfterUnauthorized(first.authorization))
    ) {
      return first.res;
    }
    first.res.resume();
    return (await this.#sendOnce(method, path, o)).res;
  }

  /** One request, and the Authorization header it carried. */
  async #sendOnce(
    method: string,
    path: string,
    o: RequestOptions,
  ): Promise<{ res: http.IncomingMessage; authorization: string | undefined }> {
    if (o.signal?.aborted) throw abortError(o.signal);
    const url = new URL(this.#server.pathname.replace(/\/$/, '') + path, this.#server);
    for (const [k, v] of Object.entries(o.query ?? {})) url.searchParams.set(k, v);
    const body = o.body === undefined ? undefined : JSON.stringify(o.body);
    const opts: https.RequestOptions = {
      method,
      headers: {
        Accept: 'application/json',
        'User-Agent': 'weft',
        ...(body !== undefined
          ? {
              'Content-Type': o.contentType ?? 'application/json',
              'Content-Length': Buffer.byteLength(body),
            }
          : {}),
      },
    };
    // The credentials as they are now: a rotated token or client certificate is used at once.
    const credentialsError = (err: unknown) =>
      new WeftError('WEFT_ERR_STORE_UNAVAILABLE', `kubernetes credentials: ${errorMessage(err)}`, {
        cause: err,
        details: { server: this.#server.origin },
      });
    const auth = await this.#creds.authorization().catch((err: unknown) => {
      throw credentialsError(err);
    });
    if (auth !== undefined) (opts.headers as Record<string, string | number>).Authorization = auth;
    if (url.protocol === 'https:') {
      Object.assign(
        opts,
        await this.#creds.tls().catch((err: unknown) => {
          throw credentialsError(err);
        }),
      );
    }
    const mod = url.protocol === 'https:' ? https : http;
    return new Promise((resolve, reject) => {
      const req = mod.request(url, opts, (res) => resolve({ res, authorization: auth }));
      // The signal ends this request, without an error on its socket. (http.request's own
      // `signal` destroys the request with an error, which goes on to the socket: a stop in the
      // moment after a response ended, when the socket is no longer the request's and not yet
      // the agent's, raised it with no one listening, an uncaught exception.) A response being
      // read then ends with an error its reader turns into WEFT_ERR_ABORTED.
      const signal = o.signal;
      if (signal) {
        const abort = () => {
          reject(abortError(signal));
          req.destroy();
        };
        signal.addEventListener('abort', abort, { once: true });
        req.once('close', () => signal.removeEventListener('abort', abort));
      }
      const idleMs = o.idleMs ?? REQUEST_IDLE_MS;
      req.setTimeout(idleMs, () => req.destroy(new Error(`no data for ${idleMs} ms`)));
      req.on('socket', (sock) => sock.setKeepAlive(true, 30_000));
      req.on('error', (err) => {
        if (o.signal?.aborted) reject(abortError(o.signal));
        else
          reject(
            this.#creds.tlsError(err, `${method} ${url.pathname}`) ??
              new WeftError(
                'WEFT_ERR_STORE_UNAVAILABLE',
                `kubernetes ${method} ${url.pathname}: ${errorMessage(err)}`,
                { cause: err, details: { server: this.#server.origin } },
              ),
          );
      });
      req.end(body);
    });
  }
}

/** A whole (small) response body; over `maxBytes` the response is dropped and refused. */
function readAll(res: http.IncomingMessage, maxBytes: number, what: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const parts: Buffer[] = [];
    let len = 0;
    res.on('data', (c: Buffer) => {
      len += c.length;
      if (len > maxBytes) {
        res.destroy();
        reject(tooLarge(`${what}: the response`, maxBytes));
        return;
      }
      parts.push(c);
    });
    res.on('end', () => resolve(Buffer.concat(parts).toString('utf8')));
    res.on('error', reject);
  });
}

function parseWatchLine(line: string): WatchEvent<KubeNode> {
  let ev: unknown;
  try {
    ev = JSON.parse(line);
  } catch (err) {
    throw new WeftError('WEFT_ERR_STORE_UNAVAILABLE', 'kubernetes watch: event is not JSON', {
      cause: err,
    });
  }
  const e = ev as Partial<WatchEvent<KubeNode>>;
  const known = ['ADDED', 'MODIFIED', 'DELETED', 'BOOKMARK', 'ERROR'];
  if (typeof e !== 'object' || e === null || !known.includes(e.type ?? '') || !e.object) {
    throw new WeftError('WEFT_ERR_STORE_UNAVAILABLE', 'kubernetes watch: malformed event');
  }
  return e as WatchEvent<KubeNode>;
}

/** An HTTP error status (and its Status body, text or parsed) as a WeftError. */
export function statusError(status: number, body: unknown, what: string): WeftError {
  let st: KubeStatus = {};
  if (typeof body === 'string') {
    try {
      st = JSON.parse(body) as KubeStatus;
    } catch {
      st = { message: body.slice(0, 200) };
    }
  } else if (typeof body === 'object' && body !== null) {
    st = body as KubeStatus;
  }
  const code = st.code ?? status;
  const message = `kubernetes ${what}: ${code} ${st.reason ?? ''}${st.message ? `: ${st.message}` : ''}`;
  const details = { status: code, reason: st.reason };
  if (code === 404) return new WeftError('WEFT_ERR_STORE_NOT_FOUND', message, { details });
  if (code === 410) return new WeftError('WEFT_ERR_STORE_COMPACTED', message, { details });
  return new WeftError('WEFT_ERR_STORE_UNAVAILABLE', message, { details });
}
