/**
 * The fake Kubernetes API server (src/testbed/kube-apiserver.ts) as its own process, so a test
 * can run it inside a network namespace (`ip netns exec <underlay> node --import tsx <this>
 * <host> <port>`) and let daemons in other namespaces reach it over the underlay.
 *
 * Control: one JSON request per stdin line, `{"id":1,"op":"addNode","args":[{...}]}`; one reply
 * per stdout line, `{"id":1,"result":...}` or `{"id":1,"error":"..."}`. The first stdout line is
 * `{"listening":"http://host:port"}`. Ops: addNode (`realSize: true` fills the node in as a
 * kubelet does, ~17 KB), deleteNode, node, setPodCIDR, patches, compact, dropWatches, bookmark.
 * Lists page (`limit`/`continue`) and rv=0 is served whole, as the fake serves them.
 */
import { createInterface } from 'node:readline';
import { FakeKubeApiServer } from '../../src/testbed/kube-apiserver.js';

const [host = '127.0.0.1', port = '0'] = process.argv.slice(2);
const server = await FakeKubeApiServer.start({ host, port: Number(port) });

type Args = unknown[];
const ops: Record<string, (...a: Args) => unknown> = {
  addNode: (n) => server.addNode(n as Parameters<FakeKubeApiServer['addNode']>[0]),
  deleteNode: (name) => server.deleteNode(name as string),
  node: (name) => server.node(name as string) ?? null,
  setPodCIDR: (name, cidr) =>
    server.updateNode(name as string, (n) => {
      if (cidr === null) n.spec = {};
      else n.spec.podCIDR = cidr as string;
    }),
  compact: () => server.compact(),
  dropWatches: () => server.dropWatches(),
  bookmark: () => server.bookmark(),
  /** PATCH requests seen for one node (path and body), to count annotation writes. */
  patches: (name) =>
    server
      .requestsTo('PATCH', `/api/v1/nodes/${name as string}`)
      .map((r) => ({ path: r.path, body: r.body })),
};

process.stdout.write(JSON.stringify({ listening: server.url }) + '\n');
const rl = createInterface({ input: process.stdin });
rl.on('line', (line) => {
  let id: unknown = null;
  try {
    const req = JSON.parse(line) as { id: unknown; op: string; args?: Args };
    id = req.id;
    const fn = ops[req.op];
    if (!fn) throw new Error(`unknown op ${req.op}`);
    process.stdout.write(JSON.stringify({ id, result: fn(...(req.args ?? [])) ?? null }) + '\n');
  } catch (err) {
    process.stdout.write(JSON.stringify({ id, error: String(err) }) + '\n');
  }
});
rl.on('close', () => void server.close().then(() => process.exit(0)));
process.on('SIGTERM', () => void server.close().then(() => process.exit(0)));
