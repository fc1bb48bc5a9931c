/**
 * An in-process Kubernetes API server for tests: nodes and pods in memory, on a real HTTP
 * socket, speaking the wire protocol clients (ours, kubectl) expect:
 *
 * - GET /api/v1/nodes → NodeList with metadata.resourceVersion (one global, increasing counter,
 *   as etcd's revision), written item by item; GET /api/v1/nodes/<name>;
 *   GET /api/v1/namespaces/<ns>/pods/<name>. Lists page as the real server's do (by name):
 *   `limit` cuts a page and sets `metadata.continue` (and `remainingItemCount`); `continue`
 *   serves the next page of the same snapshot, or 410 Expired once `compact()` passed its
 *   version; a resourceVersion other than "0" with `continue` is 400. `resourceVersion=0` is
 *   served from the "watch cache", which ignores `limit` (the whole list in one response, as
 *   API servers without cache pagination do; `cachePagesRv0: true` makes it page like the
 *   rest). `listBytesPerSecond` paces a list's body (a server elsewhere, encoding and sending
 *   at that rate: this process then mostly waits). No resourceVersion: the latest state (a
 *   quorum read), paged. `resourceVersion=N`:
 *   not older than N (a 504 Too large resource version when N is in the future); with `limit`
 *   and no `resourceVersionMatch` it is Exact, which the fake serves only at the current
 *   version (410 when compacted).
 * - GET /api/v1/nodes?watch=true&resourceVersion=N → a chunked stream, one JSON event per line
 *   (`{"type":"ADDED|MODIFIED|DELETED|BOOKMARK|ERROR","object":...}`): every change after N
 *   from the history, then live ones. No resourceVersion (or "0"): synthetic ADDED for every
 *   node first. N older than the history (after `compact()`): one ERROR event carrying a
 *   `Status` with code 410 reason Expired, then the stream ends (what the real server does).
 *   `timeoutSeconds` ends the stream; `allowWatchBookmarks` enables `bookmark()`.
 * - PATCH /api/v1/nodes/<name>[/status] with application/strategic-merge-patch+json (maps
 *   merged, null deletes, status.conditions and status.addresses merged by `type`),
 *   application/merge-patch+json (RFC 7386) or application/json-patch+json (RFC 6902); the
 *   status subresource changes only metadata and status, the main resource never status.
 *   A patch that changes nothing bumps no version and sends no event (as etcd's no-op update).
 * - Errors are `Status` objects with the real reasons: NotFound 404, Expired 410, Conflict 409,
 *   UnsupportedMediaType 415, BadRequest 400, Invalid 422, Unauthorized 401.
 * - HTTPS (`tls`: the server's certificate and key, and a client CA to ask for client
 *   certificates): served with node:https on loopback. `setToken()` changes the bearer token it
 *   accepts, `requireClientCn()` the client certificate's CN (401 otherwise): credentials that
 *   rotate under a running client.
 * - Discovery (/api, /apis, /api/v1) so kubectl can talk to it.
 *
 * Test controls: addNode/updateNode/deleteNode/addPod, compact(), dropWatches(), failNext(),
 * bookmark(), and `requests` (every request seen, with its decoded body). `realSizedNode()`
 * fills a node in as a kubelet does (see there for its size).
 *
 * Stored objects are never changed in place (every write stores a new object), so the history
 * and list snapshots share them, and each is encoded to JSON once, when it is stored (as
 * kube-apiserver's watch cache keeps each object's serialization): lists and watches send those
 * bytes, so what a scale bench measures is the client, not this server's encoder.
 */
import http from 'node:http';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import type { TLSSocket } from 'node:tls';

type Obj = Record<string, unknown>;

export interface RecordedRequest {
  readonly method: string;
  readonly path: string;
  readonly query: URLSearchParams;
  readonly contentType: string | undefined;
  readonly body: unknown;
}

interface HistoryEntry {
  readonly rv: number;
  readonly type: 'ADDED' | 'MODIFIED' | 'DELETED';
  readonly object: Obj;
}

/** The items of a paged list, as they were at its first page. */
interface ListSnapshot {
  readonly rv: number;
  readonly items: readonly Obj[];
}

interface Watcher {
  readonly res: http.ServerResponse;
  readonly bookmarks: boolean;
}

const clone = <T>(v: T): T => structuredClone(v);

export function status(code: number, reason: string, message: string, details?: Obj): Obj {
  return {
    kind: 'Status',
    apiVersion: 'v1',
    metadata: {},
    status: 'Failure',
    message,
    reason,
    ...(details ? { details } : {}),
    code,
  };
}

class HttpError extends Error {
  constructor(readonly body: Obj) {
    super(String(body.message));
  }
}

/** PEM material of an HTTPS fake: its certificate and key, and the CA of client certificates. */
export interface FakeTls {
  readonly cert: Buffer;
  readonly key: Buffer;
  readonly clientCa?: Buffer;
}

export class FakeKubeApiServer {
  readonly #server: http.Server;
  readonly #nodes = new Map<string, Obj>();
  readonly #pods = new Map<string, Obj>();
  readonly #history: HistoryEntry[] = [];
  readonly #watchers = new Set<Watcher>();
  #token: string | undefined;
  #clientCn: string | undefined;
  readonly #scheme: 'http' | 'https';
  #rv = 100;
  /** Versions below this were compacted away (the state at it is still readable). */
  #compacted = 0;
  #failures: Array<{ code: number; reason: string }> = [];
  readonly #snapshots = new Map<number, ListSnapshot>();
  #snapshotId = 0;
  readonly #cachePagesRv0: boolean;
  readonly #listRate: number;
  readonly requests: RecordedRequest[] = [];

  private constructor(
    token: string | undefined,
    tls: FakeTls | undefined,
    cachePagesRv0: boolean,
    listRate: number,
  ) {
    this.#token = token;
    this.#cachePagesRv0 = cachePagesRv0;
    this.#listRate = listRate;
    const handle = (req: http.IncomingMessage, res: http.ServerResponse) =>
      void this.#handle(req, res);
    this.#scheme = tls ? 'https' : 'http';
    this.#server = tls
      ? https.createServer(
          {
            cert: tls.cert,
            key: tls.key,
            ...(tls.clientCa
              ? { ca: tls.clientCa, requestCert: true, rejectUnauthorized: true }
              : {}),
          },
          handle,
        )
      : http.createServer(handle);
  }

  static async start(
    o: {
      host?: string;
      port?: number;
      token?: string;
      tls?: FakeTls;
      cachePagesRv0?: boolean;
      /** A list body's pace in bytes per second (0: as fast as the socket takes it). */
      listBytesPerSecond?: number;
    } = {},
  ): Promise<FakeKubeApiServer> {
    const s = new FakeKubeApiServer(
      o.token,
      o.tls,
      o.cachePagesRv0 ?? false,
      o.listBytesPerSecond ?? 0,
    );
    await new Promise<void>((resolve, reject) => {
      s.#server.once('error', reject);
      s.#server.listen(o.port ?? 0, o.host ?? '127.0.0.1', () => resolve());
    });
    return s;
  }

  get url(): string {
    const a = this.#server.address() as AddressInfo;
    const host = a.family === 'IPv6' ? `[${a.address}]` : a.address;
    return `${this.#scheme}://${host}:${a.port}`;
  }

  get port(): number {
    return (this.#server.address() as AddressInfo).port;
  }

  /** From now on only this bearer token is accepted. */
  setToken(token: string): void {
    this.#token = token;
  }

  /** From now on only a client certificate with this CN is accepted (HTTPS with a client CA). */
  requireClientCn(cn: string): void {
    this.#clientCn = cn;
  }

  get resourceVersion(): number {
    return this.#rv;
  }

  get watchCount(): number {
    return this.#watchers.size;
  }

  /** Requests with this method whose path starts with `prefix`. */
  requestsTo(method: string, prefix: string): RecordedRequest[] {
    return this.requests.filter((r) => r.method === method && r.path.startsWith(prefix));
  }

  node(name: string): Obj | undefined {
    const n = this.#nodes.get(name);
    return n ? clone(n) : undefined;
  }

  addNode(node: {
    name: string;
    podCIDR?: string;
    podCIDRs?: string[];
    annotations?: Record<string, string>;
    /** Filled in as a kubelet does: realSizedNode(). */
    realSize?: boolean;
  }): Obj {
    if (node.realSize) return this.#write('ADDED', realSizedNode(node));
    const obj: Obj = {
      kind: 'Node',
      apiVersion: 'v1',
      metadata: {
        name: node.name,
        uid: `uid-${node.name}-${this.#rv}`,
        creationTimestamp: new Date().toISOString().replace(/\.\d+Z$/, 'Z'),
        annotations: { ...node.annotations },
        labels: { 'kubernetes.io/hostname': node.name },
      },
      spec: {
        ...(node.podCIDR !== undefined ? { podCIDR: node.podCIDR } : {}),
        ...(node.podCIDRs !== undefined ? { podCIDRs: node.podCIDRs } : {}),
      },
      status: { conditions: [], addresses: [] },
    };
    return this.#write('ADDED', obj);
  }

  /** Applies `mutate` to a copy of the node and stores it (bumping the version) if it changed. */
  updateNode(name: string, mutate: (n: Obj & { metadata: Obj; spec: Obj }) => void): Obj {
    const cur = this.#nodes.get(name);
    if (!cur) throw new Error(`no node ${name}`);
    const next = clone(cur) as Obj & { metadata: Obj; spec: Obj };
    mutate(next);
    return this.#commit(cur, next);
  }

  deleteNode(name: string): void {
    const cur = this.#nodes.get(name);
    if (!cur) throw new Error(`no node ${name}`);
    this.#nodes.delete(name);
    const obj = clone(cur);
    (obj.metadata as Obj).resourceVersion = String(++this.#rv);
    this.#record('DELETED', obj);
  }

  addPod(namespace: string, name: string, nodeName: string): void {
    this.#pods.set(`${namespace}/${name}`, {
      kind: 'Pod',
      apiVersion: 'v1',
      metadata: { name, namespace, resourceVersion: String(++this.#rv) },
      spec: { nodeName },
    });
  }

  /** Forgets the event history: watches from any version up to now get 410 Expired. */
  compact(): void {
    this.#compacted = this.#rv;
    this.#history.length = 0;
    this.#snapshots.clear();
  }

  /** Ends every open watch stream (an API server restart, a dropped connection). */
  dropWatches(): void {
    for (const w of this.#watchers) w.res.end();
    this.#watchers.clear();
  }

  /** The next `count` requests fail with this status (503 ServiceUnavailable by default). */
  failNext(count: number, code = 503, reason = 'ServiceUnavailable'): void {
    for (let i = 0; i < count; i++) this.#failures.push({ code, reason });
  }

  /** Sends a BOOKMARK at the current version to watches that allowed them. */
  bookmark(): void {
    const ev = {
      type: 'BOOKMARK',
      object: { kind: 'Node', apiVersion: 'v1', metadata: { resourceVersion: String(this.#rv) } },
    };
    for (const w of this.#watchers) if (w.bookmarks) w.res.write(JSON.stringify(ev) + '\n');
  }

  async close(): Promise<void> {
    this.dropWatches();
    this.#server.closeAllConnections();
    await new Promise<void>((r) => this.#server.close(() => r()));
  }

  // -------------------------------------------------------------------------------------------

  #write(type: 'ADDED' | 'MODIFIED', obj: Obj): Obj {
    const stored = clone(obj);
    (stored.metadata as Obj).resourceVersion = String(++this.#rv);
    encoded(stored); // now, not at the first list
    this.#nodes.set((stored.metadata as Obj).name as string, stored);
    this.#record(type, stored);
    return clone(stored);
  }

  #commit(cur: Obj, next: Obj): Obj {
    const strip = (o: Obj) => ({ ...o, metadata: { ...(o.metadata as Obj), resourceVersion: '' } });
    if (JSON.stringify(strip(cur)) === JSON.stringify(strip(next))) return clone(cur);
    return this.#write('MODIFIED', next);
  }

  #record(type: HistoryEntry['type'], object: Obj): void {
    const e: HistoryEntry = { rv: this.#rv, type, object };
    this.#history.push(e);
    const line = eventLine(type, object);
    for (const w of this.#watchers) w.res.write(line);
  }

  async #handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', 'http://fake');
    let body: unknown;
    const raw = await new Promise<string>((resolve) => {
      const parts: Buffer[] = [];
      req.on('data', (c: Buffer) => parts.push(c));
      req.on('end', () => resolve(Buffer.concat(parts).toString('utf8')));
    });
    const contentType = req.headers['content-type']?.split(';')[0]?.trim();
    try {
      if (raw !== '') {
        try {
          body = JSON.parse(raw);
        } catch {
          throw new HttpError(status(400, 'BadRequest', 'the request body is not JSON'));
        }
      }
      this.requests.push({
        method: req.method ?? '',
        path: url.pathname,
        query: url.searchParams,
        contentType,
        body,
      });
      if (this.#token !== undefined && req.headers.authorization !== `Bearer ${this.#token}`) {
        throw new HttpError(status(401, 'Unauthorized', 'Unauthorized'));
      }
      if (this.#clientCn !== undefined) {
        const cn = (req.socket as TLSSocket).getPeerCertificate().subject?.CN;
        if (cn !== this.#clientCn) throw new HttpError(status(401, 'Unauthorized', 'Unauthorized'));
      }
      const fail = this.#failures.shift();
      if (fail) throw new HttpError(status(fail.code, fail.reason, 'injected failure'));
      this.#route(req.method ?? 'GET', url, contentType, body, res);
    } catch (err) {
      const st = err instanceof HttpError ? err.body : status(500, 'InternalError', String(err));
      send(res, st.code as number, st);
    }
  }

  #route(
    method: string,
    url: URL,
    contentType: string | undefined,
    body: unknown,
    res: http.ServerResponse,
  ): void {
    const p = url.pathname.replace(/\/+$/, '');
    let m: RegExpExecArray | null;
    if (method === 'GET' && p === '/api') {
      return send(res, 200, {
        kind: 'APIVersions',
        versions: ['v1'],
        serverAddressByClientCIDRs: [{ clientCIDR: '0.0.0.0/0', serverAddress: '127.0.0.1' }],
      });
    }
    if (method === 'GET' && p === '/apis') {
      return send(res, 200, { kind: 'APIGroupList', apiVersion: 'v1', groups: [] });
    }
    if (method === 'GET' && p === '/api/v1') return send(res, 200, API_RESOURCES);
    if (method === 'GET' && p === '/api/v1/nodes') {
      if (url.searchParams.get('watch') === 'true' || url.searchParams.get('watch') === '1') {
        return this.#watch(url, res);
      }
      return this.#list(url, res);
    }
    if ((m = /^\/api\/v1\/nodes\/([^/]+)(\/status)?$/.exec(p))) {
      const name = decodeURIComponent(m[1]!);
      const cur = this.#nodes.get(name);
      if (!cur) {
        throw new HttpError(
          status(404, 'NotFound', `nodes "${name}" not found`, { name, kind: 'nodes' }),
        );
      }
      if (method === 'GET') return send(res, 200, cur);
      if (method === 'PATCH')
        return send(res, 200, this.#patch(cur, contentType, body, m[2] !== undefined));
      throw new HttpError(status(405, 'MethodNotAllowed', `${method} is not supported here`));
    }
    if ((m = /^\/api\/v1\/namespaces\/([^/]+)\/pods\/([^/]+)$/.exec(p)) && method === 'GET') {
      const pod = this.#pods.get(`${decodeURIComponent(m[1]!)}/${decodeURIComponent(m[2]!)}`);
      if (!pod) {
        throw new HttpError(
          status(404, 'NotFound', `pods "${m[2]}" not found`, { name: m[2], kind: 'pods' }),
        );
      }
      return send(res, 200, pod);
    }
    throw new HttpError(
      status(404, 'NotFound', 'the server could not find the requested resource'),
    );
  }

  #patch(cur: Obj, contentType: string | undefined, body: unknown, statusOnly: boolean): Obj {
    let next: Obj;
    switch (contentType) {
      case 'application/strategic-merge-patch+json':
        next = strategicMerge(cur, body, []) as Obj;
        break;
      case 'application/merge-patch+json':
        next = mergePatch(cur, body) as Obj;
        break;
      case 'application/json-patch+json':
        next = jsonPatch(cur, body);
        break;
      default:
        throw new HttpError(
          status(
            415,
            'UnsupportedMediaType',
            `the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json`,
          ),
        );
    }
    if (typeof next !== 'object' || next === null) {
      throw new HttpError(status(422, 'Invalid', 'the patch does not leave an object'));
    }
    const want = (next.metadata as Obj | undefined)?.resourceVersion;
    const have = (cur.metadata as Obj).resourceVersion;
    if (want !== undefined && want !== have) {
      throw new HttpError(
        status(
          409,
          'Conflict',
          `Operation cannot be fulfilled on nodes "${String((cur.metadata as Obj).name)}": the object has been modified; please apply your changes to the latest version and try again`,
        ),
      );
    }
    // The status subresource keeps spec; the main resource keeps status; names never change.
    next.metadata = {
      ...(next.metadata as Obj),
      name: (cur.metadata as Obj).name,
      resourceVersion: have,
    };
    if (statusOnly) next.spec = clone(cur.spec);
    else next.status = clone(cur.status);
    return this.#commit(cur, next);
  }

  /** A node list page (see the file's comment for the resourceVersion and paging rules). */
  #list(url: URL, res: http.ServerResponse): void {
    const q = url.searchParams;
    const rvText = q.get('resourceVersion') ?? '';
    const match = q.get('resourceVersionMatch') ?? '';
    const limit = Number(q.get('limit') ?? '0');
    const cont = q.get('continue') ?? '';
    if (!Number.isInteger(limit) || limit < 0) {
      throw new HttpError(status(400, 'BadRequest', `invalid limit ${q.get('limit')}`));
    }
    let snap: ListSnapshot;
    let start = 0;
    let paged = limit > 0;
    if (cont !== '') {
      if (rvText !== '' && rvText !== '0') {
        throw new HttpError(
          status(
            400,
            'BadRequest',
            'specifying resource version is not allowed when using continue',
          ),
        );
      }
      let token: { id?: unknown; start?: unknown; rv?: unknown };
      try {
        token = JSON.parse(Buffer.from(cont, 'base64url').toString('utf8')) as typeof token;
      } catch {
        throw new HttpError(status(400, 'BadRequest', 'continue key is not valid'));
      }
      const found = this.#snapshots.get(Number(token.id));
      if (!found || Number(token.rv) < this.#compacted) {
        throw new HttpError(
          status(
            410,
            'Expired',
            'The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.',
          ),
        );
      }
      snap = found;
      start = Number(token.start);
    } else {
      if (rvText !== '' && rvText !== '0') {
        const n = Number(rvText);
        if (!Number.isInteger(n) || n < 0) {
          throw new HttpError(status(400, 'BadRequest', `invalid resourceVersion ${rvText}`));
        }
        if (n > this.#rv) {
          throw new HttpError(
            status(504, 'Timeout', `Too large resource version: ${n}, current: ${this.#rv}`),
          );
        }
        const exact = match === 'Exact' || (match === '' && limit > 0);
        if (exact && n < this.#compacted) {
          throw new HttpError(
            status(410, 'Expired', `too old resource version: ${n} (${this.#compacted + 1})`),
          );
        }
        if (exact && n !== this.#rv) {
          throw new HttpError(
            status(500, 'InternalError', `fake: an Exact list at an older version (${n})`),
          );
        }
      }
      // resourceVersion=0 from the watch cache: no pages (unless told it pages).
      if (rvText === '0' && !this.#cachePagesRv0) paged = false;
      const items = [...this.#nodes.values()].sort((a, b) =>
        String((a.metadata as Obj).name).localeCompare(String((b.metadata as Obj).name)),
      );
      snap = { rv: this.#rv, items };
    }
    const end = paged ? Math.min(snap.items.length, start + limit) : snap.items.length;
    const metadata: Obj = { resourceVersion: String(snap.rv) };
    if (end < snap.items.length) {
      let id = cont !== '' ? (JSON.parse(Buffer.from(cont, 'base64url').toString()) as Obj).id : 0;
      if (cont === '') {
        id = ++this.#snapshotId;
        this.#snapshots.set(id as number, snap);
        // keep a few lists' snapshots, as etcd keeps a window of revisions
        for (const k of this.#snapshots.keys())
          if (this.#snapshots.size > 8) this.#snapshots.delete(k);
      }
      metadata.continue = Buffer.from(JSON.stringify({ id, start: end, rv: snap.rv })).toString(
        'base64url',
      );
      metadata.remainingItemCount = snap.items.length - end;
    }
    void streamList(res, metadata, snap.items, start, end, this.#listRate);
  }

  #watch(url: URL, res: http.ServerResponse): void {
    const rvText = url.searchParams.get('resourceVersion') ?? '';
    const timeout = Number(url.searchParams.get('timeoutSeconds') ?? '0');
    const bookmarks = url.searchParams.get('allowWatchBookmarks') === 'true';
    res.writeHead(200, { 'Content-Type': 'application/json', 'Transfer-Encoding': 'chunked' });
    const out = (type: string, object: Obj) => res.write(eventLine(type, object));
    if (rvText === '' || rvText === '0') {
      for (const n of this.#nodes.values()) out('ADDED', n);
    } else {
      const from = Number(rvText);
      if (!Number.isInteger(from) || from < this.#compacted) {
        out(
          'ERROR',
          status(410, 'Expired', `too old resource version: ${rvText} (${this.#compacted + 1})`),
        );
        res.end();
        return;
      }
      for (const e of this.#history) if (e.rv > from) out(e.type, e.object);
    }
    const w: Watcher = { res, bookmarks };
    this.#watchers.add(w);
    const timer = timeout > 0 ? setTimeout(() => res.end(), timeout * 1000) : null;
    timer?.unref();
    res.on('close', () => {
      this.#watchers.delete(w);
      if (timer) clearTimeout(timer);
    });
  }
}

/** Each stored object's JSON, made when it is stored (see the file's comment). */
const ENCODED = new WeakMap<Obj, string>();

function encoded(obj: Obj): string {
  let text = ENCODED.get(obj);
  if (text === undefined) {
    text = JSON.stringify(obj);
    ENCODED.set(obj, text);
  }
  return text;
}

/** One watch event line, `{"type":…,"object":…}` (the same key order as JSON.stringify's). */
function eventLine(type: string, object: Obj): string {
  return `{"type":${JSON.stringify(type)},"object":${encoded(object)}}\n`;
}

/** Writes a NodeList item by item (as the real server encodes it), waiting when the client is slow. */
async function streamList(
  res: http.ServerResponse,
  metadata: Obj,
  items: readonly Obj[],
  start: number,
  end: number,
  bytesPerSecond = 0,
): Promise<void> {
  res.writeHead(200, { 'Content-Type': 'application/json', 'Transfer-Encoding': 'chunked' });
  let part = `{"kind":"NodeList","apiVersion":"v1","metadata":${JSON.stringify(metadata)},"items":[`;
  const began = performance.now();
  let sent = 0;
  for (let i = start; i < end; i++) {
    part += (i > start ? ',' : '') + encoded(items[i]!);
    if (part.length < 65_536) continue;
    if (bytesPerSecond > 0) {
      // (when this part is due at the pace)
      const wait = began + (sent * 1000) / bytesPerSecond - performance.now();
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
      if (res.destroyed) return;
    }
    sent += part.length;
    const ok = res.write(part);
    part = '';
    if (!ok) {
      const open = await new Promise<boolean>((resolve) => {
        const onDrain = () => {
          res.off('close', onClose);
          resolve(true);
        };
        const onClose = () => {
          res.off('drain', onDrain);
          resolve(false);
        };
        res.once('drain', onDrain);
        res.once('close', onClose);
      });
      if (!open) return;
    }
  }
  res.end(part + ']}');
}

function send(res: http.ServerResponse, code: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(code, {
    'Content-Type': 'application/json',
    'Content-Length': Buffer.byteLength(text),
  });
  res.end(text);
}

const API_RESOURCES = {
  kind: 'APIResourceList',
  groupVersion: 'v1',
  resources: [
    {
      name: 'nodes',
      singularName: 'node',
      namespaced: false,
      kind: 'Node',
      verbs: ['get', 'list', 'patch', 'watch'],
      shortNames: ['no'],
    },
    {
      name: 'nodes/status',
      singularName: '',
      namespaced: false,
      kind: 'Node',
      verbs: ['get', 'patch'],
    },
    {
      name: 'pods',
      singularName: 'pod',
      namespaced: true,
      kind: 'Pod',
      verbs: ['get'],
      shortNames: ['po'],
    },
  ],
};

const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);

/** RFC 7386 JSON merge patch. */
export function mergePatch(target: unknown, patch: unknown): unknown {
  if (!isObj(patch)) return clone(patch);
  const out: Obj = isObj(target) ? clone(target) : {};
  for (const [k, v] of Object.entries(patch)) {
    if (v === null) delete out[k];
    else out[k] = mergePatch(out[k], v);
  }
  return out;
}

/** Lists a Node merges by a key field (patchMergeKey in the Node's Go types). */
const MERGE_KEYS: Readonly<Record<string, string>> = {
  'status.conditions': 'type',
  'status.addresses': 'type',
  'spec.taints': 'key',
};

/** Strategic merge patch for Node: a merge patch whose keyed lists merge by their key. */
export function strategicMerge(target: unknown, patch: unknown, path: string[]): unknown {
  if (!isObj(patch)) {
    const key = MERGE_KEYS[path.join('.')];
    if (key && Array.isArray(patch) && Array.isArray(target)) {
      const out = clone(target) as Obj[];
      for (const item of patch as unknown[]) {
        if (!isObj(item)) continue;
        const i = out.findIndex((o) => isObj(o) && o[key] === item[key]);
        if (item.$patch === 'delete') {
          if (i >= 0) out.splice(i, 1);
        } else if (i >= 0) {
          out[i] = mergePatch(out[i], item) as Obj;
        } else {
          out.push(clone(item));
        }
      }
      return out;
    }
    return clone(patch);
  }
  const out: Obj = isObj(target) ? clone(target) : {};
  for (const [k, v] of Object.entries(patch)) {
    if (v === null) delete out[k];
    else out[k] = strategicMerge(out[k], v, [...path, k]);
  }
  return out;
}

function pointer(path: unknown): string[] {
  if (typeof path !== 'string' || (path !== '' && !path.startsWith('/'))) {
    throw new HttpError(status(422, 'Invalid', `invalid JSON pointer ${JSON.stringify(path)}`));
  }
  return path === ''
    ? []
    : path
        .slice(1)
        .split('/')
        .map((s) => s.replace(/~1/g, '/').replace(/~0/g, '~'));
}

/** RFC 6902 JSON patch: add, remove, replace, move, copy, test. */
export function jsonPatch(target: Obj, ops: unknown): Obj {
  if (!Array.isArray(ops))
    throw new HttpError(status(400, 'BadRequest', 'a JSON patch must be an array'));
  const doc = { root: clone(target) } as Obj;
  const invalid = (msg: string) => new HttpError(status(422, 'Invalid', msg));
  const parentOf = (parts: string[]): [Obj | unknown[], string] => {
    let cur: unknown = doc.root;
    for (const p of parts.slice(0, -1)) {
      if (Array.isArray(cur)) cur = cur[Number(p)];
      else if (isObj(cur)) cur = cur[p];
      else cur = undefined;
      if (cur === undefined) throw invalid(`path ${parts.join('/')} does not exist`);
    }
    if (!isObj(cur) && !Array.isArray(cur)) throw invalid(`path ${parts.join('/')} does not exist`);
    return [cur, parts[parts.length - 1]!];
  };
  const get = (parts: string[]): unknown => {
    if (parts.length === 0) return doc.root;
    const [parent, last] = parentOf(parts);
    const v = Array.isArray(parent) ? parent[Number(last)] : parent[last];
    if (v === undefined) throw invalid(`path /${parts.join('/')} does not exist`);
    return v;
  };
  const remove = (parts: string[]): unknown => {
    const v = get(parts);
    const [parent, last] = parentOf(parts);
    if (Array.isArray(parent)) parent.splice(Number(last), 1);
    else delete parent[last];
    return v;
  };
  const add = (parts: string[], value: unknown) => {
    if (parts.length === 0) {
      doc.root = clone(value);
      return;
    }
    const [parent, last] = parentOf(parts);
    if (Array.isArray(parent)) {
      const i = last === '-' ? parent.length : Number(last);
      if (!Number.isInteger(i) || i < 0 || i > parent.length)
        throw invalid(`bad array index ${last}`);
      parent.splice(i, 0, clone(value));
    } else {
      parent[last] = clone(value);
    }
  };
  for (const raw of ops as unknown[]) {
    if (!isObj(raw)) throw invalid('a JSON patch operation must be an object');
    const path = pointer(raw.path);
    switch (raw.op) {
      case 'add':
        add(path, raw.value);
        break;
      case 'remove':
        remove(path);
        break;
      case 'replace':
        get(path);
        remove(path);
        add(path, raw.value);
        break;
      case 'move':
        add(path, remove(pointer(raw.from)));
        break;
      case 'copy':
        add(path, get(pointer(raw.from)));
        break;
      case 'test':
        if (JSON.stringify(get(path)) !== JSON.stringify(raw.value)) {
          throw invalid(`testing value /${path.join('/')} failed`);
        }
        break;
      default:
        throw invalid(`unknown JSON patch op ${JSON.stringify(raw.op)}`);
    }
  }
  if (!isObj(doc.root)) throw invalid('the patch does not leave an object');
  return doc.root;
}

// ---- real-sized Nodes ----

const hex64 = (seed: number): string => {
  let x = (seed * 2654435761) >>> 0;
  let out = '';
  while (out.length < 64) {
    x = (Math.imul(x ^ (x >>> 15), 2246822507) + 0x9e3779b9) >>> 0;
    out += x.toString(16).padStart(8, '0');
  }
  return out;
};

/** A kubelet's 50 images (the most it reports): a digest and a tag each, shared by every node. */
const IMAGES: readonly Obj[] = Array.from({ length: 50 }, (_, i) => {
  const repo = `europe-docker.pkg.dev/platform/team-${i % 7}/service-${i}`;
  return {
    names: [`${repo}@sha256:${hex64(i + 1)}`, `${repo}:v1.${i}.${(i * 7) % 13}`],
    sizeBytes: 10_000_000 + i * 1_234_567,
  };
});

const MANAGED_FIELDS_KUBELET = {
  'f:metadata': {
    'f:annotations': {
      '.': {},
      'f:node.alpha.kubernetes.io/ttl': {},
      'f:volumes.kubernetes.io/controller-managed-attach-detach': {},
    },
    'f:labels': Object.fromEntries(
      [
        '.',
        'beta.kubernetes.io/arch',
        'beta.kubernetes.io/os',
        'kubernetes.io/arch',
        'kubernetes.io/hostname',
        'kubernetes.io/os',
        'node.kubernetes.io/instance-type',
        'topology.kubernetes.io/region',
        'topology.kubernetes.io/zone',
      ].map((k) => [k === '.' ? k : `f:${k}`, {}]),
    ),
  },
  'f:spec': { 'f:providerID': {} },
  'f:status': {
    'f:conditions': Object.fromEntries(
      ['MemoryPressure', 'DiskPressure', 'PIDPressure', 'Ready'].map((t) => [
        `k:{"type":"${t}"}`,
        {
          '.': {},
          'f:lastHeartbeatTime': {},
          'f:lastTransitionTime': {},
          'f:message': {},
          'f:reason': {},
          'f:status': {},
          'f:type': {},
        },
      ]),
    ),
    'f:allocatable': { 'f:cpu': {}, 'f:ephemeral-storage': {}, 'f:memory': {}, 'f:pods': {} },
    'f:capacity': { 'f:cpu': {}, 'f:ephemeral-storage': {}, 'f:memory': {}, 'f:pods': {} },
    'f:daemonEndpoints': { 'f:kubeletEndpoint': { 'f:Port': {} } },
    'f:images': {},
    'f:nodeInfo': {
      'f:architecture': {},
      'f:bootID': {},
      'f:containerRuntimeVersion': {},
      'f:kernelVersion': {},
      'f:kubeProxyVersion': {},
      'f:kubeletVersion': {},
      'f:machineID': {},
      'f:operatingSystem': {},
      'f:osImage': {},
      'f:systemUUID': {},
    },
  },
};

/**
 * A Node as a kubelet, the node controller and flannel fill it in on a real cluster: 15 labels,
 * the flannel annotations and the kubelet's, four managedFields entries, taints and a
 * providerID, 5 conditions, addresses, capacity, node info and 50 images (two names each). As
 * JSON, ~17 KB: 16.7 KB with flannel's four vxlan annotations (`JSON.stringify(...).length`;
 * a unit test checks 16-18 KB), of which the images are 10.7 KB and managedFields 2.6 KB. The images and the managedFields' field sets are shared by every node (the
 * fake never changes a stored object in place).
 */
export function realSizedNode(node: {
  name: string;
  podCIDR?: string;
  podCIDRs?: string[];
  annotations?: Record<string, string>;
}): Obj {
  const t = '2026-11-01T08:00:00Z';
  const n = node.name;
  const idx = [...n].reduce((h, c) => (h * 31 + c.charCodeAt(0)) >>> 0, 7);
  const labels: Record<string, string> = {
    'beta.kubernetes.io/arch': 'amd64',
    'beta.kubernetes.io/instance-type': 'm5.2xlarge',
    'beta.kubernetes.io/os': 'linux',
    'failure-domain.beta.kubernetes.io/region': 'eu-west-1',
    'failure-domain.beta.kubernetes.io/zone': `eu-west-1${'abc'[idx % 3]}`,
    'kubernetes.io/arch': 'amd64',
    'kubernetes.io/hostname': n,
    'kubernetes.io/os': 'linux',
    'node.kubernetes.io/instance-type': 'm5.2xlarge',
    'topology.kubernetes.io/region': 'eu-west-1',
    'topology.kubernetes.io/zone': `eu-west-1${'abc'[idx % 3]}`,
    'node-role.kubernetes.io/worker': '',
    'eks.amazonaws.com/nodegroup': `workers-${idx % 4}`,
    'eks.amazonaws.com/capacityType': 'ON_DEMAND',
    'k8s.io/cloud-provider-aws': hex64(idx).slice(0, 32),
  };
  const cond = (type: string, status: string, reason: string, message: string) => ({
    type,
    status,
    lastHeartbeatTime: t,
    lastTransitionTime: t,
    reason,
    message,
  });
  const pods = node.podCIDRs ?? (node.podCIDR !== undefined ? [node.podCIDR] : undefined);
  return {
    kind: 'Node',
    apiVersion: 'v1',
    metadata: {
      name: n,
      uid: `${hex64(idx).slice(0, 8)}-${hex64(idx).slice(8, 12)}-4${hex64(idx).slice(13, 16)}-8${hex64(idx).slice(17, 20)}-${hex64(idx).slice(20, 32)}`,
      creationTimestamp: t,
      labels,
      annotations: {
        'node.alpha.kubernetes.io/ttl': '0',
        'volumes.kubernetes.io/controller-managed-attach-detach': 'true',
        'csi.volume.kubernetes.io/nodeid': JSON.stringify({
          'ebs.csi.aws.com': `i-${hex64(idx).slice(0, 17)}`,
        }),
        ...node.annotations,
      },
      managedFields: [
        {
          manager: 'kubelet',
          operation: 'Update',
          apiVersion: 'v1',
          time: t,
          fieldsType: 'FieldsV1',
          fieldsV1: MANAGED_FIELDS_KUBELET,
        },
        {
          manager: 'kube-controller-manager',
          operation: 'Update',
          apiVersion: 'v1',
          time: t,
          fieldsType: 'FieldsV1',
          fieldsV1: {
            'f:metadata': { 'f:annotations': { 'f:node.alpha.kubernetes.io/ttl': {} } },
            'f:spec': {
              'f:podCIDR': {},
              'f:podCIDRs': { '.': {}, [`v:"${pods?.[0] ?? ''}"`]: {} },
            },
          },
        },
        {
          manager: 'flanneld',
          operation: 'Update',
          apiVersion: 'v1',
          time: t,
          fieldsType: 'FieldsV1',
          fieldsV1: {
            'f:metadata': {
              'f:annotations': Object.fromEntries(
                Object.keys(node.annotations ?? {}).map((k) => [`f:${k}`, {}]),
              ),
            },
            'f:status': { 'f:conditions': { 'k:{"type":"NetworkUnavailable"}': { '.': {} } } },
          },
          subresource: 'status',
        },
        {
          manager: 'aws-cloud-controller-manager',
          operation: 'Update',
          apiVersion: 'v1',
          time: t,
          fieldsType: 'FieldsV1',
          fieldsV1: { 'f:status': { 'f:addresses': {} } },
          subresource: 'status',
        },
      ],
    },
    spec: {
      ...(node.podCIDR !== undefined ? { podCIDR: node.podCIDR } : {}),
      ...(pods !== undefined ? { podCIDRs: pods } : {}),
      providerID: `aws:///eu-west-1a/i-${hex64(idx).slice(0, 17)}`,
      taints: [{ key: 'dedicated', value: 'workers', effect: 'PreferNoSchedule' }],
    },
    status: {
      capacity: {
        cpu: '8',
        'ephemeral-storage': '104845292Ki',
        'hugepages-1Gi': '0',
        'hugepages-2Mi': '0',
        memory: '32386544Ki',
        pods: '110',
      },
      allocatable: {
        cpu: '7910m',
        'ephemeral-storage': '95551679124',
        'hugepages-1Gi': '0',
        'hugepages-2Mi': '0',
        memory: '31369712Ki',
        pods: '110',
      },
      conditions: [
        cond('NetworkUnavailable', 'False', 'FlannelIsUp', 'Flannel is running on this node'),
        cond(
          'MemoryPressure',
          'False',
          'KubeletHasSufficientMemory',
          'kubelet has sufficient memory available',
        ),
        cond('DiskPressure', 'False', 'KubeletHasNoDiskPressure', 'kubelet has no disk pressure'),
        cond(
          'PIDPressure',
          'False',
          'KubeletHasSufficientPID',
          'kubelet has sufficient PID available',
        ),
        cond('Ready', 'True', 'KubeletReady', 'kubelet is posting ready status'),
      ],
      addresses: [
        { type: 'InternalIP', address: `10.200.${(idx >> 8) & 255}.${idx & 255}` },
        {
          type: 'InternalDNS',
          address: `ip-10-200-${(idx >> 8) & 255}-${idx & 255}.eu-west-1.compute.internal`,
        },
        { type: 'Hostname', address: n },
      ],
      daemonEndpoints: { kubeletEndpoint: { Port: 10250 } },
      nodeInfo: {
        machineID: hex64(idx + 1).slice(0, 32),
        systemUUID: `ec2${hex64(idx + 2).slice(0, 29)}`,
        bootID: hex64(idx + 3).slice(0, 36),
        kernelVersion: '6.1.112-122.189.amzn2023.x86_64',
        osImage: 'Amazon Linux 2023.6.20241031',
        containerRuntimeVersion: 'containerd://1.7.22',
        kubeletVersion: 'v1.31.2-eks-94953ac',
        kubeProxyVersion: 'v1.31.2-eks-94953ac',
        operatingSystem: 'linux',
        architecture: 'amd64',
      },
      images: IMAGES,
    },
  };
}
