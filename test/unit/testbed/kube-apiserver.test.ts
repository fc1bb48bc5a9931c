/**
 * The fake API server's wire behaviour, checked with raw HTTP and, where installed, against
 * the real client: kubectl (list, watch, strategic/merge/json patches, Status errors).
 */
import { afterEach, beforeEach, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, spawn, spawnSync } from 'node:child_process';
import http from 'node:http';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { FakeKubeApiServer, realSizedNode } from '../../../src/testbed/kube-apiserver.js';

type Obj = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

let server: FakeKubeApiServer;

beforeEach(async () => {
  server = await FakeKubeApiServer.start();
  server.addNode({ name: 'n1', podCIDR: '10.5.1.0/24', annotations: { 'a.example/x': '1' } });
});

afterEach(async () => {
  await server.close();
});

function request(
  method: string,
  path: string,
  body?: unknown,
  contentType = 'application/json',
): Promise<{ status: number; headers: http.IncomingHttpHeaders; body: Obj }> {
  return new Promise((resolve, reject) => {
    const text = body === undefined ? undefined : JSON.stringify(body);
    const req = http.request(
      server.url + path,
      { method, headers: text ? { 'Content-Type': contentType } : {} },
      (res) => {
        let data = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => (data += c));
        res.on('end', () =>
          resolve({ status: res.statusCode ?? 0, headers: res.headers, body: JSON.parse(data) }),
        );
      },
    );
    req.on('error', reject);
    req.end(text);
  });
}

/** Opens a watch and collects its event lines until `count` arrived or the stream ends. */
function watch(
  query: string,
  count: number,
): Promise<{ headers: http.IncomingHttpHeaders; events: Obj[] }> {
  return new Promise((resolve, reject) => {
    const req = http.get(`${server.url}/api/v1/nodes?watch=true&${query}`, (res) => {
      const events: Obj[] = [];
      let buf = '';
      const done = () => {
        req.destroy();
        resolve({ headers: res.headers, events });
      };
      res.setEncoding('utf8');
      res.on('data', (c: string) => {
        buf += c;
        let i;
        while ((i = buf.indexOf('\n')) >= 0) {
          events.push(JSON.parse(buf.slice(0, i)) as Obj);
          buf = buf.slice(i + 1);
        }
        if (events.length >= count) done();
      });
      res.on('end', done);
    });
    req.on('error', reject);
  });
}

describe('reads', () => {
  test('a list carries the current resourceVersion', async () => {
    const r = await request('GET', '/api/v1/nodes');
    assert.equal(r.body.kind, 'NodeList');
    assert.equal(r.body.metadata.resourceVersion, String(server.resourceVersion));
    assert.deepEqual(
      r.body.items.map((n: Obj) => n.metadata.name),
      ['n1'],
    );
  });

  test('a missing node is a 404 Status with reason NotFound', async () => {
    const r = await request('GET', '/api/v1/nodes/nope');
    assert.equal(r.status, 404);
    assert.deepEqual(
      { kind: r.body.kind, reason: r.body.reason, code: r.body.code, status: r.body.status },
      { kind: 'Status', reason: 'NotFound', code: 404, status: 'Failure' },
    );
  });

  test('a pod is readable by namespace and name', async () => {
    server.addPod('ns', 'p', 'n1');
    const r = await request('GET', '/api/v1/namespaces/ns/pods/p');
    assert.equal(r.body.spec.nodeName, 'n1');
  });
});

describe('paged lists', () => {
  const names = async (q: string) => {
    const r = await request('GET', `/api/v1/nodes?${q}`);
    return { r, names: (r.body.items ?? []).map((n: Obj) => n.metadata.name as string) };
  };
  beforeEach(() => {
    for (const n of ['n2', 'n3', 'n4']) server.addNode({ name: n, podCIDR: '10.5.2.0/24' });
  });

  test('limit cuts pages by name; continue serves the rest of the same snapshot', async () => {
    const p1 = await names('limit=3');
    assert.deepEqual(p1.names, ['n1', 'n2', 'n3']);
    assert.equal(p1.r.body.metadata.remainingItemCount, 1);
    server.addNode({ name: 'n0', podCIDR: '10.5.9.0/24' });
    const p2 = await names(`limit=3&continue=${p1.r.body.metadata.continue}`);
    assert.deepEqual(p2.names, ['n4']);
    assert.equal(p2.r.body.metadata.continue, undefined);
    assert.equal(p2.r.body.metadata.resourceVersion, p1.r.body.metadata.resourceVersion);
  });

  test('resourceVersion=0 (the watch cache) ignores limit', async () => {
    const r = await names('limit=2&resourceVersion=0');
    assert.deepEqual(r.names, ['n1', 'n2', 'n3', 'n4']);
    assert.equal(r.r.body.metadata.continue, undefined);
  });

  test('continue with a resourceVersion is 400; after a compaction it is 410 Expired', async () => {
    const p1 = await names('limit=2');
    const token = p1.r.body.metadata.continue as string;
    const bad = await request('GET', `/api/v1/nodes?limit=2&continue=${token}&resourceVersion=5`);
    assert.deepEqual([bad.status, bad.body.reason], [400, 'BadRequest']);
    server.addPod('ns', 'p', 'n1');
    server.compact();
    const gone = await request('GET', `/api/v1/nodes?limit=2&continue=${token}`);
    assert.deepEqual([gone.status, gone.body.reason], [410, 'Expired']);
  });

  test('a real-sized node is 16-18 KB of JSON', () => {
    const n = realSizedNode({
      name: 'node-1234',
      podCIDR: '10.5.1.0/24',
      annotations: {
        'flannel.alpha.coreos.com/kube-subnet-manager': 'true',
        'flannel.alpha.coreos.com/public-ip': '10.250.4.210',
        'flannel.alpha.coreos.com/backend-type': 'vxlan',
        'flannel.alpha.coreos.com/backend-data': '{"VNI":1,"VtepMAC":"0a:00:00:00:04:d2"}',
      },
    }) as Obj;
    const size = JSON.stringify(n).length;
    assert.ok(size >= 16_000 && size <= 18_000, `${size} bytes`);
    assert.equal(n.status.images.length, 50);
    assert.equal(Object.keys(n.metadata.labels).length, 15);
    assert.equal(n.status.conditions.length, 5);
    assert.ok(n.metadata.managedFields.length > 0);
  });
});

describe('watch', () => {
  test('the stream is chunked JSON lines of changes after the given version', async () => {
    const rv = server.resourceVersion;
    const pending = watch(`resourceVersion=${rv}`, 2);
    setTimeout(() => {
      server.addNode({ name: 'n2', podCIDR: '10.5.2.0/24' });
      server.deleteNode('n1');
    }, 50);
    const { headers, events } = await pending;
    assert.equal(headers['transfer-encoding'], 'chunked');
    assert.deepEqual(
      events.map((e) => [
        e.type,
        e.object.metadata.name,
        Number(e.object.metadata.resourceVersion),
      ]),
      [
        ['ADDED', 'n2', rv + 1],
        ['DELETED', 'n1', rv + 2],
      ],
    );
  });

  test('history after an old version is replayed', async () => {
    const rv = server.resourceVersion;
    server.updateNode('n1', (n) => (n.metadata.labels = { a: 'b' }));
    const { events } = await watch(`resourceVersion=${rv}`, 1);
    assert.equal(events[0]!.type, 'MODIFIED');
  });

  test('no resourceVersion starts with a synthetic ADDED per node', async () => {
    const { events } = await watch('', 1);
    assert.equal(events[0]!.type, 'ADDED');
    assert.equal(events[0]!.object.metadata.name, 'n1');
  });

  test('a compacted version gets an ERROR event with a 410 Expired Status', async () => {
    const rv = server.resourceVersion;
    server.updateNode('n1', (n) => (n.metadata.labels = { a: 'b' }));
    server.compact();
    const { events } = await watch(`resourceVersion=${rv}`, 2);
    assert.equal(events.length, 1);
    assert.equal(events[0]!.type, 'ERROR');
    assert.equal(events[0]!.object.code, 410);
    assert.equal(events[0]!.object.reason, 'Expired');
  });

  test('timeoutSeconds ends the stream', async () => {
    const t0 = Date.now();
    const { events } = await watch(`resourceVersion=${server.resourceVersion}&timeoutSeconds=1`, 1);
    assert.equal(events.length, 0);
    assert.ok(Date.now() - t0 >= 900);
  });
});

describe('patch', () => {
  test('strategic merge merges conditions by type and maps by key', async () => {
    server.updateNode('n1', (n) => {
      n.status = { conditions: [{ type: 'Ready', status: 'True' }] };
    });
    const r = await request(
      'PATCH',
      '/api/v1/nodes/n1/status',
      {
        metadata: { annotations: { 'a.example/y': '2' } },
        status: { conditions: [{ type: 'NetworkUnavailable', status: 'False' }] },
      },
      'application/strategic-merge-patch+json',
    );
    assert.equal(r.status, 200);
    assert.deepEqual(r.body.metadata.annotations, { 'a.example/x': '1', 'a.example/y': '2' });
    assert.deepEqual(
      r.body.status.conditions.map((c: Obj) => c.type),
      ['Ready', 'NetworkUnavailable'],
    );
  });

  test('merge patch deletes a key set to null', async () => {
    const r = await request(
      'PATCH',
      '/api/v1/nodes/n1',
      { metadata: { annotations: { 'a.example/x': null } } },
      'application/merge-patch+json',
    );
    assert.deepEqual(r.body.metadata.annotations, {});
  });

  test('JSON patch applies ops and a failed test is 422 Invalid', async () => {
    const ok = await request(
      'PATCH',
      '/api/v1/nodes/n1',
      [{ op: 'add', path: '/metadata/annotations/b.example~1z', value: 'v' }],
      'application/json-patch+json',
    );
    assert.equal(ok.body.metadata.annotations['b.example/z'], 'v');
    const bad = await request(
      'PATCH',
      '/api/v1/nodes/n1',
      [{ op: 'test', path: '/spec/podCIDR', value: '10.9.0.0/24' }],
      'application/json-patch+json',
    );
    assert.equal(bad.status, 422);
    assert.equal(bad.body.reason, 'Invalid');
  });

  test('an unknown content type is 415 UnsupportedMediaType', async () => {
    const r = await request('PATCH', '/api/v1/nodes/n1', {}, 'application/json');
    assert.equal(r.status, 415);
    assert.equal(r.body.reason, 'UnsupportedMediaType');
  });

  test('the status subresource does not change spec', async () => {
    const r = await request(
      'PATCH',
      '/api/v1/nodes/n1/status',
      { spec: { podCIDR: '10.9.9.0/24' } },
      'application/merge-patch+json',
    );
    assert.equal(r.body.spec.podCIDR, '10.5.1.0/24');
  });

  test('a patch that changes nothing bumps no version', async () => {
    const rv = server.resourceVersion;
    await request(
      'PATCH',
      '/api/v1/nodes/n1/status',
      { metadata: { annotations: { 'a.example/x': '1' } } },
      'application/strategic-merge-patch+json',
    );
    assert.equal(server.resourceVersion, rv);
  });

  test('a stale resourceVersion in the patch is 409 Conflict', async () => {
    const r = await request(
      'PATCH',
      '/api/v1/nodes/n1',
      { metadata: { resourceVersion: '1', labels: { a: 'b' } } },
      'application/merge-patch+json',
    );
    assert.equal(r.status, 409);
    assert.equal(r.body.reason, 'Conflict');
  });
});

const hasKubectl = spawnSync('kubectl', ['version', '--client'], { stdio: 'ignore' }).status === 0;

describe('against kubectl', { skip: hasKubectl ? false : 'kubectl is not installed' }, () => {
  let dir: string;
  const run = promisify(execFile);
  const kubectl = (...args: string[]) =>
    run('kubectl', args, { env: { ...process.env, KUBECONFIG: join(dir, 'config'), HOME: dir } });

  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), 'weft-kubectl-'));
    await writeFile(
      join(dir, 'config'),
      [
        'apiVersion: v1',
        'kind: Config',
        `clusters: [{name: f, cluster: {server: "${server.url}"}}]`,
        'users: [{name: u, user: {}}]',
        'contexts: [{name: f, context: {cluster: f, user: u}}]',
        'current-context: f',
        '',
      ].join('\n'),
    );
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  test('kubectl get reads the node', async () => {
    const { stdout } = await kubectl('get', 'node', 'n1', '-o', 'jsonpath={.spec.podCIDR}');
    assert.equal(stdout, '10.5.1.0/24');
  });

  test('kubectl annotate and a strategic status patch are applied', async () => {
    await kubectl('annotate', 'node', 'n1', 'b.example/k=v');
    await kubectl(
      'patch',
      'node',
      'n1',
      '--subresource=status',
      '--type=strategic',
      '-p',
      '{"status":{"conditions":[{"type":"NetworkUnavailable","status":"False"}]}}',
    );
    const n = server.node('n1') as Obj;
    assert.equal(n.metadata.annotations['b.example/k'], 'v');
    assert.equal(n.status.conditions[0].type, 'NetworkUnavailable');
  });

  test('kubectl prints the Status of an error as it does for a real server', async () => {
    await assert.rejects(kubectl('get', 'node', 'nope'), (e: { stderr: string }) => {
      assert.match(e.stderr, /Error from server \(NotFound\): nodes "nope" not found/);
      return true;
    });
  });

  test('kubectl get --watch follows the stream from the list version', async () => {
    const child = spawn(
      'kubectl',
      ['get', 'nodes', '--watch', '--output-watch-events', '-o', 'json'],
      { env: { ...process.env, KUBECONFIG: join(dir, 'config'), HOME: dir } },
    );
    try {
      let out = '';
      const types: string[] = [];
      const seen = new Promise<void>((resolve) => {
        child.stdout.on('data', (c: Buffer) => {
          out += c.toString();
          const found = [...out.matchAll(/"type":\s*"(ADDED|MODIFIED|DELETED)"/g)].map(
            (m) => m[1]!,
          );
          types.splice(0, types.length, ...found);
          if (found.length === 1) server.updateNode('n1', (n) => (n.metadata.labels = { w: '1' }));
          if (found.length >= 2) resolve();
        });
      });
      await Promise.race([
        seen,
        new Promise((_, reject) =>
          setTimeout(() => reject(new Error(`kubectl saw: ${out}`)), 8000),
        ),
      ]);
      assert.deepEqual(types, ['ADDED', 'MODIFIED']);
    } finally {
      child.kill();
    }
  });
});
