/**
 * An in-process Kubernetes API server for tests: nodes and pods in memory, on a real HTTP
 * socket, speaking the wire protocol clients (ours, kubectl) expect:
 *
 * - GET /api/v1/nodes → NodeList with metadata.resourceVersion (one global, increasing counter,
 *   as etcd's revision); GET /api/v1/nodes/<name>; GET /api/v1/namespaces/<ns>/pods/<name>.
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
 * bookmark(), and `requests` (every request seen, with its decoded body).
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
  /** Versions at or below this were compacted away. */
  #compacted = 0;
  #failures: Array<{ code: number; reason: string }> = [];
  readonly requests: RecordedRequest[] = [];

  private constructor(token: string | undefined, tls: FakeTls | undefined) {
    this.#token = token;
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
    o: { host?: string; port?: number; token?: string; tls?: FakeTls } = {},
  ): Promise<FakeKubeApiServer> {
    const s = new FakeKubeApiServer(o.token, o.tls);
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
  }): Obj {
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
    const e: HistoryEntry = { rv: this.#rv, type, object: clone(object) };
    this.#history.push(e);
    const line = JSON.stringify({ type, object }) + '\n';
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
      const items = [...this.#nodes.values()].sort((a, b) =>
        String((a.metadata as Obj).name).localeCompare(String((b.metadata as Obj).name)),
      );
      return send(res, 200, {
        kind: 'NodeList',
        apiVersion: 'v1',
        metadata: { resourceVersion: String(this.#rv) },
        items,
      });
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

  #watch(url: URL, res: http.ServerResponse): void {
    const rvText = url.searchParams.get('resourceVersion') ?? '';
    const timeout = Number(url.searchParams.get('timeoutSeconds') ?? '0');
    const bookmarks = url.searchParams.get('allowWatchBookmarks') === 'true';
    res.writeHead(200, { 'Content-Type': 'application/json', 'Transfer-Encoding': 'chunked' });
    const out = (type: string, object: unknown) =>
      res.write(JSON.stringify({ type, object }) + '\n');
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
