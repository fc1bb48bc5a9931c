/**
 * Control-plane scale bench (`npm run bench:scale`, root; never part of `npm test`): ONE real
 * `weft daemon` (compiled, from bin/weft) against a simulated cluster of N peers (default 5,000)
 * whose flannel-format leases are written straight into the store, per store × backend.
 *
 *   ┌──── weft-<pid>-a (node) ────────────┐  veth  ┌──── weft-<pid>-b (store) ─────────────────┐
 *   │ eth0 10.250.0.1/16                   ├────────┤ eth0 10.250.255.254/16                     │
 *   │ weft daemon (vxlan | host-gw | udp)  │        │ etcd :2379  or  fake kube API :6443         │
 *   │ flannel.1 / routes / flannel0 (TUN)  │        │ (bench/scale-store-child.ts writes leases)  │
 *   └──────────────────────────────────────┘        └─────────────────────────────────────────────┘
 *   embedded store: a temp directory the bench writes lease files into directly.
 *   Peers: subnet 10.(16 + i/256).(i%256).0/24, public IP 10.250.(1 + i/256).(i%256) on eth0's /16
 *   (i: 0.. the cluster, 10,000.. the burst, 20,000.. single events, 40,000.. churn adds).
 *
 * Measured per row (what "programmed" means: kernel backends — the peer's route is in the
 * node's main table, as the kernel announces it on rtnetlink, stamped when the bench process
 * receives the notification; udp and
 * vxlan-userspace (`--backends vxlan-userspace`: vxlan with "Dataplane": "userspace", not in the
 * default list) — the daemon's `peer table replaced` / `peer table updated` debug line with the
 * peer count, its own timestamp):
 *   start    daemon spawned with N leases in the store → every peer programmed
 *   event    one lease written → programmed (p50/p99 over --events writes; removals too),
 *            from the moment the write is sent
 *   churn    --churn-rate adds + the same number of removes per second for --churn-seconds:
 *            daemon CPU (user+sys of its process / wall), per-change latency p50/p99
 *   burst    every lease removed, then N leases written as fast as the store takes them →
 *            every peer programmed, measured from the last write's answer
 *   rss      the daemon's RSS right after the burst (N peers), settled (at the end of the idle
 *            window, N peers, nothing changing: after V8's memory reducer and the daemon's own
 *            memory trims, 12 s after the last change and 10 s apart) and its peak (VmHWM)
 *   idle     daemon CPU over --idle-seconds with nothing changing, --idle-settle-seconds (20)
 *            after the burst (so the heap compaction that follows a burst is not counted)
 *   relist   (kube) the daemon's peak RSS once started; then the fake compacts its history and
 *            drops the watch, so the daemon's next watch gets 410 Expired and it lists again:
 *            the time until its new watch opens, the list requests it made, the peak after it.
 *            `--node-size real`: Nodes filled in as a kubelet does (16.7 KB of JSON each).
 * The machine is shared: every figure is one run, under whatever else runs. Output: a table,
 * and JSON (bench/results/scale.json, or --json PATH). `--flanneld PATH` adds flanneld rows for
 * the etcd store (vxlan, host-gw, udp) measured through the same harness. `--node-args '…'`
 * passes Node flags to the weft daemon (a CPU profile: `--cpu-prof --cpu-prof-dir=DIR`), after
 * those of bin/weft's launcher line (the daemon runs as deployed).
 */
import type { ChildProcess } from 'node:child_process';
import {
  mkdirSync,
  mkdtempSync,
  readFileSync,
  renameSync,
  rmSync,
  unlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { encodeLeaseAttrs } from '../src/control/lease/lease-json.js';
import { NativeNetlink } from '../src/control/netlink/native-netlink.js';
import { onEarlyEnd } from '../src/testbed/early-end.js';
import { NetnsScope, ip, isRoot } from '../src/testbed/netns.js';
import { launcherEnv, launcherNodeFlags } from './launcher.js';
import { markdownTable } from './report.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const WEFT_BIN = join(ROOT, 'bin', 'weft');
const CHILD = join(ROOT, 'bench', 'scale-store-child.ts');
const STORE_IP = '10.250.255.254';
const NODE_IP = '10.250.0.1';
const NETWORK = '10.0.0.0/8';
const TICKS = 100; // /proc clock ticks per second (USER_HZ)

type Store = 'etcd' | 'embedded' | 'kube';
/** vxlan-userspace: vxlan with "Dataplane": "userspace" (the udp backend's engine, vxlan frames). */
type BackendName = 'vxlan' | 'host-gw' | 'udp' | 'vxlan-userspace';
/** The backends whose peers live in the userspace engine's table (observed by its log line). */
const userspace = (b: BackendName) => b === 'udp' || b === 'vxlan-userspace';

export interface Row {
  daemon: 'weft' | 'flanneld';
  store: Store;
  backend: BackendName;
  peers: number;
  startMs: number | null;
  /**
   * The daemon's CPU time (user + system, from /proc, 10 ms ticks) from its spawn to every peer
   * programmed: the work of a start, which a busy shared machine stretches less than its time.
   */
  startCpuMs?: number | null;
  eventP50Ms: number | null;
  eventP99Ms: number | null;
  removeP50Ms: number | null;
  removeP99Ms: number | null;
  /** Every single event's latency, in order (adds, then removals): where a p99 comes from. */
  eventsMs?: { add: number[]; remove: number[]; addWrite: number[] };
  churnCpuPct: number | null;
  /** Changes (adds + removes) per second the store actually took during the churn. */
  churnRate: number | null;
  churnP50Ms: number | null;
  churnP99Ms: number | null;
  /** Changes still not programmed when the churn ended + 10 s. */
  churnLost: number | null;
  burstMs: number | null;
  /** RSS right after the burst (N peers; the burst's garbage not yet collected). */
  rssMiB: number | null;
  /** RSS with N peers once quiet: at the end of the idle window. */
  settledRssMiB?: number | null;
  peakRssMiB: number | null;
  /** kube: the peak (VmHWM) once every peer is programmed at start, before anything else. */
  startPeakRssMiB?: number | null;
  /** kube: 410 Expired → the relist done and the watch open again, and the peak after it. */
  relistMs?: number | null;
  relistPeakRssMiB?: number | null;
  /** kube: the list requests of that relist (pages, or 1 when the list comes whole). */
  relistRequests?: number | null;
  idleCpuPct: number | null;
  error?: string;
}

const { values: opt } = parseArgs({
  options: {
    peers: { type: 'string', default: '5000' },
    stores: { type: 'string', default: 'etcd,embedded,kube' },
    backends: { type: 'string', default: 'vxlan,host-gw,udp' },
    events: { type: 'string', default: '30' },
    'churn-rate': { type: 'string', default: '100' },
    'churn-seconds': { type: 'string', default: '20' },
    'idle-seconds': { type: 'string', default: '15' },
    /** Quiet time before the idle window: V8 compacts the heap ~8 s after a burst's garbage. */
    'idle-settle-seconds': { type: 'string', default: '20' },
    flanneld: { type: 'string' },
    /**
     * kube store: `real` fills every Node in as a kubelet does (src/testbed/kube-apiserver.ts
     * realSizedNode: 15 labels, flannel annotations, 50 images, 5 conditions, managedFields;
     * 16.7 KB of JSON each), `small` (the default) only flannel's annotations (~0.6 KB).
     */
    'node-size': { type: 'string', default: 'small' },
    /**
     * kube store: the fake API server sends a list's body at this many MB/s (0, the default: as
     * fast as it can). A real API server is elsewhere and encodes the Nodes itself: with it, this
     * machine's two CPUs are not shared with the server.
     */
    'kube-list-mbps': { type: 'string', default: '0' },
    /** Extra Node flags for the weft daemon (e.g. `--cpu-prof --cpu-prof-dir=/tmp/p`). */
    'node-args': { type: 'string', default: '' },
    json: { type: 'string', default: join(ROOT, 'bench', 'results', 'scale.json') },
  },
});
const N = Number(opt.peers);
const EVENTS = Number(opt.events);
const CHURN_RATE = Number(opt['churn-rate']);
const CHURN_S = Number(opt['churn-seconds']);
const IDLE_S = Number(opt['idle-seconds']);
const IDLE_SETTLE_S = Number(opt['idle-settle-seconds']);
const nodeArgs = opt['node-args'].split(' ').filter((a) => a !== '');
const REAL_NODES = opt['node-size'] === 'real';
const LIST_BPS = Number(opt['kube-list-mbps']) * 1e6;
if (!(LIST_BPS >= 0)) {
  console.error(`--kube-list-mbps: a number of MB/s, 0 or more (got ${opt['kube-list-mbps']})`);
  process.exit(2);
}
if (!['real', 'small'].includes(opt['node-size'])) {
  console.error(`--node-size: real or small (got ${opt['node-size']})`);
  process.exit(2);
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const pct = (xs: number[], p: number): number | null => {
  if (xs.length === 0) return null;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(p * s.length))]!;
};

// ---- peers ----

const hex = (n: number) => n.toString(16).padStart(2, '0');
function peerSubnet(i: number): string {
  return `10.${16 + (i >> 8)}.${i & 255}.0/24`;
}
function peerKey(i: number): string {
  return peerSubnet(i).replace('/', '-');
}
function peerValue(i: number, backend: BackendName): string {
  const publicIP = `10.250.${1 + (i >> 8)}.${i & 255}`;
  if (backend === 'udp') return encodeLeaseAttrs({ publicIP, publicIPv6: null, backendType: '' });
  if (backend === 'host-gw')
    return encodeLeaseAttrs({ publicIP, publicIPv6: null, backendType: 'host-gw' });
  const VtepMAC = `0a:00:00:${hex(i >> 16)}:${hex((i >> 8) & 255)}:${hex(i & 255)}`;
  return encodeLeaseAttrs({
    publicIP,
    publicIPv6: null,
    backendType: 'vxlan',
    backendData: { VNI: 1, VtepMAC },
  });
}
function kubeNode(i: number, backend: BackendName) {
  const attrs = JSON.parse(peerValue(i, backend)) as Record<string, unknown>;
  const a = 'flannel.alpha.coreos.com/';
  return {
    name: `peer-${i}`,
    podCIDR: peerSubnet(i),
    ...(REAL_NODES ? { realSize: true } : {}),
    annotations: {
      [`${a}kube-subnet-manager`]: 'true',
      [`${a}public-ip`]: attrs.PublicIP as string,
      [`${a}backend-type`]: (attrs.BackendType as string | undefined) ?? '',
      [`${a}backend-data`]: JSON.stringify(attrs.BackendData ?? null),
    },
  };
}

// ---- the store side ----

/** Talks to bench/scale-store-child.ts in the store namespace. */
class StoreChild {
  readonly #p: ChildProcess;
  readonly #pending = new Map<number, (r: { result?: unknown; error?: string }) => void>();
  #id = 0;
  readonly ready: Promise<void>;

  constructor(scope: NetnsScope, ns: string, args: string[]) {
    this.#p = scope.spawn(ns, process.execPath, ['--import', 'tsx', CHILD, ...args], {
      cwd: ROOT,
      stdio: ['pipe', 'pipe', 'inherit'],
    });
    let ready!: () => void;
    this.ready = new Promise((r) => (ready = r));
    createInterface({ input: this.#p.stdout! }).on('line', (line) => {
      const m = JSON.parse(line) as {
        ready?: boolean;
        id?: number;
        result?: unknown;
        error?: string;
      };
      if (m.ready) return ready();
      this.#pending.get(m.id!)?.(m);
      this.#pending.delete(m.id!);
    });
  }

  async call<T>(op: string, ...args: unknown[]): Promise<T> {
    await this.ready;
    const id = ++this.#id;
    const r = await new Promise<{ result?: unknown; error?: string }>((resolve) => {
      this.#pending.set(id, resolve);
      this.#p.stdin!.write(JSON.stringify({ id, op, args }) + '\n');
    });
    if (r.error) throw new Error(`store child ${op}: ${r.error}`);
    return r.result as T;
  }

  stop(): void {
    this.#p.stdin!.end();
  }
}

/** Writes leases into a store; each returns the time the last write was answered (ms epoch). */
interface StoreDriver {
  readonly daemonArgs: string[];
  readonly daemonEnv: Record<string, string>;
  add(ids: readonly number[]): Promise<number>;
  remove(ids: readonly number[]): Promise<number>;
  /** kube: expire the daemon's watch (410) and wait for its relist; the others: undefined. */
  relist?(): Promise<{ ms: number; listRequests: number }>;
  close(): Promise<void>;
}

/** The embedded store's layout (src/control/registry/embedded.ts), written directly. */
function embeddedDriver(dir: string, backend: BackendName, netConf: string): StoreDriver {
  const store = join(dir, 'store');
  for (const d of ['subnets', 'deleted', 'tmp', 'lock'])
    mkdirSync(join(store, d), { recursive: true });
  writeFileSync(join(store, 'config'), netConf);
  writeFileSync(join(store, 'revision'), '0\n');
  let rev = 0;
  let tmp = 0;
  const replace = (rel: string, data: string) => {
    const t = join(store, 'tmp', `bench-${process.pid}-${++tmp}`);
    writeFileSync(t, data);
    renameSync(t, join(store, rel));
  };
  const bump = () => replace('revision', `${rev}\n`);
  // The daemon writes too (its own lease): continue from the store's revision, not ours.
  const sync = () => {
    rev = Math.max(rev, Number(readFileSync(join(store, 'revision'), 'utf8').trim()) || 0);
  };
  return {
    daemonArgs: ['--store-dir', store],
    daemonEnv: {},
    async add(ids) {
      sync();
      for (const i of ids) {
        const header = JSON.stringify({ revision: ++rev, expiration: Date.now() + 86_400_000 });
        replace(join('subnets', peerKey(i)), `${header}\n${peerValue(i, backend)}`);
      }
      bump();
      return Date.now();
    },
    async remove(ids) {
      sync();
      const at = Date.now();
      for (const i of ids) {
        replace(join('deleted', peerKey(i)), JSON.stringify({ revision: ++rev, at }));
        try {
          unlinkSync(join(store, 'subnets', peerKey(i)));
        } catch {
          // already gone
        }
      }
      bump();
      return Date.now();
    },
    async close() {},
  };
}

async function etcdDriver(
  scope: NetnsScope,
  ns: string,
  dir: string,
  backend: BackendName,
  netConf: string,
): Promise<StoreDriver> {
  const url = `http://${STORE_IP}:2379`;
  const etcd = scope.spawn(
    ns,
    'etcd',
    [
      '--name=bench',
      `--data-dir=${join(dir, 'etcd')}`,
      `--listen-client-urls=${url}`,
      `--advertise-client-urls=${url}`,
      '--listen-peer-urls=http://127.0.0.1:2380',
      '--initial-advertise-peer-urls=http://127.0.0.1:2380',
      '--initial-cluster=bench=http://127.0.0.1:2380',
      '--quota-backend-bytes=4294967296',
    ],
    { stdio: 'ignore' },
  );
  const child = new StoreChild(scope, ns, ['etcd', url]);
  for (let k = 0; ; k++) {
    try {
      await child.call('config', netConf);
      break;
    } catch (err) {
      if (k > 100) throw err;
      await sleep(100);
    }
  }
  const keys = (ids: readonly number[]) => ids.map((i) => peerKey(i));
  return {
    daemonArgs: [`--etcd-endpoints=${url}`],
    daemonEnv: {},
    add: (ids) =>
      child.call(
        'put',
        ids.map((i) => [peerKey(i), peerValue(i, backend)]),
      ),
    remove: (ids) => child.call('del', keys(ids)),
    async close() {
      child.stop();
      etcd.kill('SIGTERM');
    },
  };
}

async function kubeDriver(
  scope: NetnsScope,
  ns: string,
  dir: string,
  backend: BackendName,
  netConf: string,
): Promise<StoreDriver> {
  const child = new StoreChild(scope, ns, ['kube', STORE_IP, '6443', String(LIST_BPS)]);
  await child.call('addNodes', [{ name: 'bench-node', podCIDR: '10.0.1.0/24' }]);
  const confFile = join(dir, 'net-conf.json');
  writeFileSync(confFile, netConf);
  return {
    daemonArgs: [
      '--kube-subnet-mgr',
      `--kube-api-url=http://${STORE_IP}:6443`,
      `--net-config-path=${confFile}`,
    ],
    daemonEnv: { NODE_NAME: 'bench-node' },
    add: (ids) =>
      child.call(
        'addNodes',
        ids.map((i) => kubeNode(i, backend)),
      ),
    remove: (ids) =>
      child.call(
        'deleteNodes',
        ids.map((i) => `peer-${i}`),
      ),
    relist: () => child.call('relist'),
    async close() {
      child.stop();
    },
  };
}

// ---- the node side ----

/** What the daemon has programmed: the peer subnets it routes, and when that was seen. */
interface Observer {
  /** The programmed peer subnets now (kernel: the route table; udp: the last table's size). */
  poll(): Promise<{ at: number; subnets: Set<string> | null; count: number }>;
  /** When a subnet's route last came or went (kernel observers), else undefined. */
  timeOf(dst: string): number | undefined;
  close(): void;
}

/**
 * Kernel backends: the node's peer routes as rtnetlink announces them, each change stamped as
 * its notification arrives (this process is idle meanwhile, so within ~1 ms of the kernel
 * change). A dump seeds the set after the watch is open, and again if notifications were lost.
 * (It used to dump all 5,000 routes every few ms and stamp the dump's end: the dump's own
 * time, and the CPU it took from the daemon on this 2-CPU machine, were in every latency.)
 */
function kernelObserver(ns: string, backend: BackendName): Observer {
  const nl = new NativeNetlink({ netns: ns });
  const dev = backend === 'vxlan' ? 'flannel.1' : 'eth0';
  const isPeer = (dst: string) =>
    dst.startsWith('10.') && dst.endsWith('/24') && Number(dst.split('.')[1]) >= 16;
  const subnets = new Set<string>();
  const changedAt = new Map<string, number>();
  let at = Date.now();
  let failed: Error | null = null;
  const seed = async () => {
    const routes = await nl.listRoutes({ family: 4, dev });
    at = Date.now();
    subnets.clear();
    for (const r of routes) if (isPeer(r.dst)) subnets.add(r.dst);
  };
  const watch = nl.watch(
    (b) => {
      const now = Date.now();
      for (const c of b.changes) {
        if (c.kind !== 'route' || c.dev !== dev || c.table !== 254 || !isPeer(c.dst)) continue;
        if (c.deleted) subnets.delete(c.dst);
        else subnets.add(c.dst);
        changedAt.set(c.dst, now);
        at = now;
      }
      if (b.overflowed) void seed();
    },
    (err) => (failed = err),
  );
  const seeded = seed();
  return {
    async poll() {
      await seeded;
      if (failed) throw failed;
      return { at, subnets, count: subnets.size };
    },
    timeOf: (dst) => changedAt.get(dst),
    close: () => {
      watch.close();
      nl.close();
    },
  };
}

/**
 * udp: the daemon logs `peer table replaced {peers}` (a whole table) or `peer table updated
 * {peers}` (a delta) at debug level, with its time.
 */
const TABLE_LINES = new Set(['peer table replaced', 'peer table updated']);

function logObserver(lines: Array<{ time: number; msg: string; peers?: number }>): Observer {
  return {
    async poll() {
      for (let k = lines.length - 1; k >= 0; k--) {
        const l = lines[k]!;
        if (TABLE_LINES.has(l.msg)) return { at: l.time, subnets: null, count: l.peers ?? 0 };
      }
      return { at: Date.now(), subnets: null, count: 0 };
    },
    timeOf: () => undefined,
    close() {},
  };
}

function cpuTicks(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return Number(f[11]) + Number(f[12]); // utime + stime (fields 14, 15)
}

function memKiB(pid: number, field: 'VmRSS' | 'VmHWM'): number {
  const m = new RegExp(`${field}:\\s+(\\d+)`).exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) : 0;
}

async function until(
  obs: Observer,
  done: (s: Awaited<ReturnType<Observer['poll']>>) => boolean,
  timeoutMs: number,
  what: string,
): Promise<number> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const s = await obs.poll();
    if (done(s)) return s.at;
    if (Date.now() > deadline)
      throw new Error(`${what}: not reached in ${timeoutMs} ms (${s.count})`);
    await sleep(3);
  }
}

async function measure(
  daemon: 'weft' | 'flanneld',
  store: Store,
  backend: BackendName,
): Promise<Row> {
  const row: Row = {
    daemon,
    store,
    backend,
    peers: N,
    startMs: null,
    eventP50Ms: null,
    eventP99Ms: null,
    removeP50Ms: null,
    removeP99Ms: null,
    churnCpuPct: null,
    churnRate: null,
    churnP50Ms: null,
    churnP99Ms: null,
    churnLost: null,
    burstMs: null,
    rssMiB: null,
    peakRssMiB: null,
    idleCpuPct: null,
  };
  const scope = new NetnsScope();
  const dir = mkdtempSync(join(tmpdir(), 'weft-scale-'));
  live = { scope, dir };
  let driver: StoreDriver | null = null;
  let obs: Observer | null = null;
  let p: ChildProcess | null = null;
  try {
    const node = scope.add();
    const storeNs = scope.add();
    scope.vethBetween(node, 'eth0', storeNs, 'eth0');
    for (const [ns, addr] of [
      [node, `${NODE_IP}/16`],
      [storeNs, `${STORE_IP}/16`],
    ] as const) {
      ip(ns, 'addr', 'add', addr, 'dev', 'eth0');
      ip(ns, 'link', 'set', 'eth0', 'up');
      ip(ns, 'link', 'set', 'lo', 'up');
    }
    const netConf = JSON.stringify({
      Network: NETWORK,
      SubnetLen: 24,
      Backend:
        backend === 'vxlan-userspace'
          ? { Type: 'vxlan', Dataplane: 'userspace' }
          : { Type: backend },
    });
    driver =
      store === 'embedded'
        ? embeddedDriver(dir, backend, netConf)
        : store === 'etcd'
          ? await etcdDriver(scope, storeNs, dir, backend, netConf)
          : await kubeDriver(scope, storeNs, dir, backend, netConf);
    const ids = Array.from({ length: N }, (_, i) => i);
    await driver.add(ids);

    const lines: Array<{ time: number; msg: string; peers?: number }> = [];
    const args =
      daemon === 'weft'
        ? [
            ...launcherNodeFlags(WEFT_BIN),
            ...nodeArgs,
            WEFT_BIN,
            'daemon',
            ...driver.daemonArgs,
            '--iface=eth0',
          ]
        : [...driver.daemonArgs, '--iface=eth0'];
    args.push(`--subnet-file=${join(dir, 'subnet.env')}`, '--iptables-forward-rules=false');
    if (daemon === 'weft' && userspace(backend)) args.push('--log-level=debug');
    const cmd = daemon === 'weft' ? process.execPath : opt.flanneld!;
    const t0 = Date.now();
    p = scope.spawn(node, cmd, args, {
      cwd: ROOT,
      env: {
        ...process.env,
        ...(daemon === 'weft' ? launcherEnv(WEFT_BIN) : {}),
        ...driver.daemonEnv,
      },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let tail = '';
    createInterface({ input: p.stderr! }).on('line', (line) => {
      tail = (tail + line + '\n').slice(-4000);
      if (!line.startsWith('{')) return;
      try {
        const l = JSON.parse(line) as { time: number | string; msg: string; peers?: number };
        if (TABLE_LINES.has(l.msg))
          lines.push({ time: new Date(l.time).getTime(), msg: l.msg, peers: l.peers });
      } catch {
        // not a log line
      }
    });
    const exited = new Promise<void>((r) => p!.once('exit', () => r()));
    void exited.then(() => {
      if (p) tail += `\n(daemon exited ${p.exitCode})`;
    });
    obs = userspace(backend) ? logObserver(lines) : kernelObserver(node, backend);
    const o = obs;
    const pid = p.pid!;
    const withTail = async <T>(what: string, f: () => Promise<T>): Promise<T> => {
      try {
        return await f();
      } catch (err) {
        throw new Error(`${what}: ${(err as Error).message}\n${tail}`);
      }
    };

    // start → every peer programmed
    const started = await withTail('start', () => until(o, (s) => s.count >= N, 120_000, 'start'));
    row.startMs = started - t0;
    row.startCpuMs = (cpuTicks(pid) * 1000) / TICKS;

    if (driver.relist) {
      // kube: the peak of the start (the list), then a relist after 410 Expired and its peak
      row.startPeakRssMiB = memKiB(pid, 'VmHWM') / 1024;
      const r = await withTail('relist', () => driver!.relist!());
      row.relistMs = r.ms;
      row.relistRequests = r.listRequests;
      row.relistPeakRssMiB = memKiB(pid, 'VmHWM') / 1024;
      const still = await o.poll();
      if (still.count < N) throw new Error(`relist: ${still.count} of ${N} peers programmed`);
    }

    // one event at a time
    const add: number[] = [];
    const del: number[] = [];
    /** How long each add's write took to be answered (the store's share of `add`). */
    const addWrite: number[] = [];
    for (let k = 0; k < EVENTS; k++) {
      const i = 20_000 + k;
      const dst = peerSubnet(i);
      const w = Date.now(); // a store may show a change before its write is answered
      await driver.add([i]);
      addWrite.push(Date.now() - w);
      const at = await until(
        o,
        (s) => (s.subnets ? s.subnets.has(dst) : s.count >= N + 1 && s.at >= w),
        10_000,
        'event',
      );
      add.push(Math.max(0, (o.timeOf(dst) ?? at) - w));
      const w2 = Date.now();
      await driver.remove([i]);
      const at2 = await until(
        o,
        (s) => (s.subnets ? !s.subnets.has(dst) : s.count <= N && s.at >= w2),
        10_000,
        'removal',
      );
      del.push(Math.max(0, (o.timeOf(dst) ?? at2) - w2));
    }
    row.eventsMs = { add, remove: del, addWrite };
    row.eventP50Ms = pct(add, 0.5);
    row.eventP99Ms = pct(add, 0.99);
    row.removeP50Ms = pct(del, 0.5);
    row.removeP99Ms = pct(del, 0.99);

    // churn: CHURN_RATE adds and CHURN_RATE removes per second
    const live = [...ids];
    let nextId = 40_000;
    const pendingAdd = new Map<string, number>();
    const pendingDel = new Map<string, number>();
    const churnLat: number[] = [];
    const cpu0 = cpuTicks(pid);
    const c0 = Date.now();
    let writing = true;
    let written = 0;
    let writeEnd = 0;
    const writer = (async () => {
      const tickMs = 20;
      const perTick = Math.max(1, Math.round((CHURN_RATE * tickMs) / 1000));
      const end = c0 + CHURN_S * 1000;
      let t = c0;
      while (Date.now() < end) {
        const adds = Array.from({ length: perTick }, () => nextId++);
        const dels = live.splice(0, perTick);
        const wa = Date.now();
        await driver!.add(adds);
        for (const i of adds) pendingAdd.set(peerSubnet(i), wa);
        const wd = Date.now();
        await driver!.remove(dels);
        for (const i of dels) pendingDel.set(peerSubnet(i), wd);
        written += adds.length + dels.length;
        live.push(...adds);
        t += tickMs;
        await sleep(Math.max(0, t - Date.now()));
      }
      writing = false;
      writeEnd = Date.now();
    })();
    let lastTable = -1;
    while (writing || pendingAdd.size + pendingDel.size > 0) {
      if (Date.now() > c0 + CHURN_S * 1000 + 10_000) break;
      const s = await o.poll();
      if (s.subnets) {
        for (const [dst, w] of pendingAdd)
          if (s.subnets.has(dst)) {
            churnLat.push(Math.max(0, (o.timeOf(dst) ?? s.at) - w));
            pendingAdd.delete(dst);
          }
        for (const [dst, w] of pendingDel)
          if (!s.subnets.has(dst)) {
            churnLat.push(Math.max(0, (o.timeOf(dst) ?? s.at) - w));
            pendingDel.delete(dst);
          }
      } else if (s.at !== lastTable) {
        // udp: a table replaced after a write carries it (the next one at the latest).
        lastTable = s.at;
        for (const m of [pendingAdd, pendingDel])
          for (const [dst, w] of m)
            if (s.at >= w) {
              churnLat.push(s.at - w);
              m.delete(dst);
            }
      }
      await sleep(10); // the dumps cost CPU on the same machine: not too often
    }
    await writer;
    const c1 = Date.now();
    row.churnCpuPct = ((cpuTicks(pid) - cpu0) / TICKS / ((c1 - c0) / 1000)) * 100;
    row.churnRate = written / ((writeEnd - c0) / 1000);
    row.churnP50Ms = pct(churnLat, 0.5);
    row.churnP99Ms = pct(churnLat, 0.99);
    row.churnLost = pendingAdd.size + pendingDel.size;

    // burst: all removed, then N written at once
    await driver.remove(live);
    await withTail('drain', () => until(o, (s) => s.count === 0, 60_000, 'drain'));
    const burst = Array.from({ length: N }, (_, i) => 10_000 + i);
    const last = await driver.add(burst);
    const all = await withTail('burst', () => until(o, (s) => s.count >= N, 120_000, 'burst'));
    row.burstMs = Math.max(0, all - last);
    row.rssMiB = memKiB(pid, 'VmRSS') / 1024;
    row.peakRssMiB = memKiB(pid, 'VmHWM') / 1024;

    // idle: after the burst's tail (V8's memory reducer runs a few mark-compacts ~8 s after the
    // allocation stops), what nothing changing costs
    await sleep(IDLE_SETTLE_S * 1000);
    const i0 = cpuTicks(pid);
    const it0 = Date.now();
    await sleep(IDLE_S * 1000);
    row.idleCpuPct = ((cpuTicks(pid) - i0) / TICKS / ((Date.now() - it0) / 1000)) * 100;
    row.settledRssMiB = memKiB(pid, 'VmRSS') / 1024;
  } catch (err) {
    row.error = (err as Error).message.slice(0, 3000);
  } finally {
    obs?.close();
    if (p && p.exitCode === null) {
      p.kill('SIGTERM');
      await Promise.race([new Promise((r) => p!.once('exit', r)), sleep(5000)]);
      if (p.exitCode === null) p.kill('SIGKILL');
    }
    await driver?.close().catch(() => undefined);
    await scope.cleanup();
    rmSync(dir, { recursive: true, force: true });
    live = null;
  }
  return row;
}

/** The measurement under way: what an early end must remove (its daemon, store, namespaces). */
let live: { scope: NetnsScope; dir: string } | null = null;

async function removeLive(): Promise<void> {
  const l = live;
  if (!l) return;
  try {
    await l.scope.cleanup();
  } finally {
    rmSync(l.dir, { recursive: true, force: true });
  }
}

const fmt = (v: number | null, digits = 0) => (v === null ? '-' : v.toFixed(digits));

function table(rows: readonly Row[]): string {
  const head = [
    'daemon',
    'store',
    'backend',
    'start ms (CPU ms)',
    'burst ms',
    'event p50/p99 ms',
    'churn /s, CPU %',
    'churn p50/p99 ms',
    'RSS burst / settled (peak) MiB',
    'idle CPU %',
    'kube: start peak MiB; 410 relist ms (lists) peak MiB',
  ];
  const body = rows.map((r) =>
    r.error
      ? [r.daemon, r.store, r.backend, `error: ${r.error.split('\n')[0]!.slice(0, 80)}`]
      : [
          r.daemon,
          r.store,
          r.backend,
          `${fmt(r.startMs)} (${fmt(r.startCpuMs ?? null)})`,
          fmt(r.burstMs),
          `${fmt(r.eventP50Ms, 1)} / ${fmt(r.eventP99Ms, 1)}`,
          `${fmt(r.churnRate)}, ${fmt(r.churnCpuPct, 1)}`,
          `${fmt(r.churnP50Ms, 1)} / ${fmt(r.churnP99Ms, 1)}${r.churnLost ? ` (${r.churnLost} late)` : ''}`,
          `${fmt(r.rssMiB)} / ${fmt(r.settledRssMiB ?? null)} (${fmt(r.peakRssMiB)})`,
          fmt(r.idleCpuPct, 2),
          r.relistMs === undefined
            ? '-'
            : `${fmt(r.startPeakRssMiB ?? null)}; ${fmt(r.relistMs ?? null)} (${fmt(r.relistRequests ?? null)}) ${fmt(r.relistPeakRssMiB ?? null)}`,
        ],
  );
  return markdownTable(head, body).trimEnd();
}

async function main(): Promise<void> {
  if (!isRoot()) {
    console.error('bench:scale needs root (network namespaces)');
    process.exit(2);
  }
  const early = onEarlyEnd('bench:scale', removeLive);
  const stores = opt.stores.split(',') as Store[];
  const backends = opt.backends.split(',') as BackendName[];
  const rows: Row[] = [];
  for (const store of stores) {
    for (const backend of backends) {
      process.stderr.write(`bench:scale ${store} × ${backend}, ${N} peers ...\n`);
      const r = await measure('weft', store, backend);
      rows.push(r);
      process.stderr.write(`${table([r])}\n${r.error ? r.error + '\n' : ''}`);
    }
  }
  if (opt.flanneld) {
    for (const backend of backends) {
      if (!stores.includes('etcd')) break;
      if (backend === 'vxlan-userspace') continue; // flanneld has no such dataplane
      process.stderr.write(`bench:scale flanneld etcd × ${backend} ...\n`);
      rows.push(await measure('flanneld', 'etcd', backend));
    }
  }
  early.off();
  console.log(table(rows));
  mkdirSync(join(opt.json, '..'), { recursive: true });
  writeFileSync(
    opt.json,
    JSON.stringify(
      {
        date: new Date().toISOString(),
        peers: N,
        churnRate: CHURN_RATE,
        nodeSize: opt['node-size'],
        kubeListMBps: LIST_BPS / 1e6,
        rows,
      },
      null,
      2,
    ) + '\n',
  );
  console.log(`JSON: ${opt.json}`);
}

await main();
