/**
 * The store side of `npm run bench:scale`, run inside the bench's store namespace (the daemon
 * reaches it over the veth; the bench process, in the root namespace, cannot): it writes
 * flannel-format leases straight into etcd (one etcd lease per key, as flanneld writes them),
 * or serves the in-process fake Kubernetes API server and adds/removes annotated nodes.
 *
 *   ip netns exec <store> node --import tsx bench/scale-store-child.ts etcd http://10.250.255.254:2379
 *   ip netns exec <store> node --import tsx bench/scale-store-child.ts kube 10.250.255.254 6443 [list B/s]
 *
 * Control: one JSON request per stdin line `{"id":1,"op":"put","args":[[[key, value], ...]]}`,
 * one reply per stdout line `{"id":1,"result":<ms epoch of the last write's answer>}`. The first
 * stdout line is `{"ready":true}`. Ops: config(text), put(pairs), del(keys) (etcd);
 * addNodes(nodes), deleteNodes(names), relist() (kube: compacts the history and drops the
 * watches, so the daemon's next watch gets 410 Expired and it lists again; answers once a watch
 * from a version after the compaction has come, with the time that took and the list requests
 * seen meanwhile).
 */
import { createInterface } from 'node:readline';
import { EtcdClient } from '../src/control/registry/etcd-client.js';
import { FakeKubeApiServer } from '../src/testbed/kube-apiserver.js';

const [mode, a1 = '', a2 = ''] = process.argv.slice(2);
const PREFIX = '/coreos.com/network';
type Op = (...args: unknown[]) => Promise<unknown>;
let ops: Record<string, Op>;
let closeAll: () => Promise<void>;

/** Runs `fn` over `items` with at most `n` in flight. */
async function pool<T>(items: readonly T[], n: number, fn: (t: T) => Promise<void>): Promise<void> {
  let i = 0;
  await Promise.all(
    Array.from({ length: Math.min(n, items.length) }, async () => {
      while (i < items.length) await fn(items[i++]!);
    }),
  );
}

if (mode === 'etcd') {
  const client = new EtcdClient({ endpoints: [a1], callTimeoutMs: 30_000 });
  ops = {
    config: async (text) => {
      await client.put({
        key: Buffer.from(`${PREFIX}/config`),
        value: Buffer.from(text as string),
      });
      return Date.now();
    },
    put: async (pairs) => {
      await pool(pairs as Array<[string, string]>, 64, async ([key, value]) => {
        const { ID } = await client.leaseGrant(86_400);
        await client.put({
          key: Buffer.from(`${PREFIX}/subnets/${key}`),
          value: Buffer.from(value),
          lease: ID,
        });
      });
      return Date.now();
    },
    del: async (keys) => {
      await pool(keys as string[], 64, async (key) => {
        await client.deleteRange({ key: Buffer.from(`${PREFIX}/subnets/${key}`) });
      });
      return Date.now();
    },
  };
  closeAll = async () => client.close();
} else if (mode === 'kube') {
  const server = await FakeKubeApiServer.start({
    host: a1,
    port: Number(a2),
    listBytesPerSecond: Number(process.argv[5] ?? '0'),
  });
  ops = {
    addNodes: async (nodes) => {
      for (const n of nodes as Parameters<FakeKubeApiServer['addNode']>[0][]) server.addNode(n);
      return Date.now();
    },
    deleteNodes: async (names) => {
      for (const n of names as string[]) server.deleteNode(n);
      return Date.now();
    },
    relist: async () => {
      const from = server.requests.length;
      const t0 = Date.now();
      // a change the daemon does not watch (a pod) moves the version past the daemon's, so
      // the compaction leaves its version behind: its next watch gets 410 Expired
      server.addPod('bench', `relist-${t0}`, 'bench-node');
      server.compact();
      const rv = server.resourceVersion;
      server.dropWatches();
      for (;;) {
        const seen = server.requests.slice(from);
        const watch = seen.find(
          (r) => r.query.get('watch') === 'true' && Number(r.query.get('resourceVersion')) >= rv,
        );
        if (watch) {
          const lists = seen.filter((r) => r.method === 'GET' && r.path === '/api/v1/nodes');
          return {
            ms: Date.now() - t0,
            listRequests: lists.filter((r) => r.query.get('watch') !== 'true').length,
          };
        }
        await new Promise((r) => setTimeout(r, 2));
      }
    },
  };
  closeAll = () => server.close();
} else {
  throw new Error(`usage: scale-store-child.ts etcd URL | kube HOST PORT (got ${mode})`);
}

process.stdout.write(JSON.stringify({ ready: true }) + '\n');
const rl = createInterface({ input: process.stdin });
let chain: Promise<unknown> = Promise.resolve();
rl.on('line', (line) => {
  // Requests run one after another, in the order sent.
  chain = chain.then(async () => {
    let id: unknown = null;
    try {
      const req = JSON.parse(line) as { id: unknown; op: string; args?: unknown[] };
      id = req.id;
      const fn = ops[req.op];
      if (!fn) throw new Error(`unknown op ${req.op}`);
      const result = await fn(...(req.args ?? []));
      process.stdout.write(JSON.stringify({ id, result }) + '\n');
    } catch (err) {
      process.stdout.write(JSON.stringify({ id, error: String(err) }) + '\n');
    }
  });
});
const stop = () => void closeAll().then(() => process.exit(0));
rl.on('close', stop);
process.on('SIGTERM', stop);
