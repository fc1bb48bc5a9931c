/**
 * `npm run bench:footprint` (root): what weft costs a node when it is not moving packets — the
 * start of a short command, an idle daemon's memory, one CNI call — measured, never asserted
 * (issue 13 §1 gives the targets; this prints each figure beside its target).
 *
 *   ┌──── weft-<pid>-0 "node" (lo, veth eth0 10.250.0.1/24)   ───────────────────────────┐
 *   │  node -e 0  ·  weft version               (N runs each, interleaved)              │
 *   │  weft daemon --iface eth0 (one at a time, each in a fresh namespace like this     │
 *   │     one): embedded + host-gw, embedded + vxlan,                                   │
 *   │     etcd + vxlan (etcd on this namespace's 127.0.0.1), Kubernetes API + vxlan     │
 *   │     (the tests' fake API server on 127.0.0.1), embedded + vxlan userspace         │
 *   │     → /readyz 200, 1 s, CPU over IDLE_MS idle, then VmRSS of the daemon           │
 *   │  weft CNI plugin (dist/weft-cni.cjs copied alone as `weft`) ADD/DEL/VERSION       │
 *   │     vs the `bridge` plugin given the same delegate config                         │
 *   │    └─ veth ── eth0 ── pod: weft-<pid>-1                                           │
 *   └───────────────────────────────────────────────────────────────────────────────────┘
 *
 * Wall times come from this process's clock around each run; peak RSS from GNU time's %M (the
 * plugin's own peak; the delegate it runs is much smaller); a daemon's RSS and its anonymous part
 * (RssAnon: its own memory; the rest is file pages, mostly the node binary's, shared by every
 * Node process and reclaimable) from /proc/<pid>/status. Results: bench/results/footprint-
 * latest.{json,md}. Flags: --runs N (default 10), --idle-ms N (default 5000).
 */
import { spawnSync, type ChildProcess } from 'node:child_process';
import {
  copyFileSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { createInterface } from 'node:readline';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { onEarlyEnd } from '../src/testbed/early-end.js';
import { NetnsScope, isRoot, nsExecAsync } from '../src/testbed/netns.js';
import { launcherEnv, launcherNodeFlags } from './launcher.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const WEFT = join(ROOT, 'bin', 'weft');
/** bin/weft with its launcher's Node flags, as it runs when executed directly. */
const WEFT_CMD = [...launcherNodeFlags(WEFT), WEFT];
const BUNDLE = join(ROOT, 'dist', 'weft-cni.cjs');
const CNI_PLUGINS = '/usr/lib/cni';
const GNU_TIME = '/usr/bin/time';
const HEALTHZ_PORT = 8471;
const ETCD_CLIENT = 'http://127.0.0.1:23790';
const KUBE_API = 'http://127.0.0.1:23791';
// the fake API server of the tests, run as its own process (as test/netns/kube.test.ts does)
const KUBE_APISERVER = join(ROOT, 'test', 'helpers', 'kube-apiserver-child.ts');

function flag(name: string, dflt: number): number {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : dflt;
}
const RUNS = flag('runs', 10);
const IDLE_MS = flag('idle-ms', 5000);

interface Row {
  what: string;
  timeMs: number | null;
  rssMB: number;
  /** A daemon's anonymous RSS (RssAnon): its own memory, without the file pages it shares. */
  anonMB?: number;
  /** A daemon's CPU over its idle window, % of one core (every thread, from schedstat). */
  idleCpuPct?: number;
  target: string;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** One run of `cmd` in `ns` under GNU time: wall ms (our clock), peak RSS MB, stdout. */
function timed(ns: string, cmd: string[], input = '', env: NodeJS.ProcessEnv = process.env) {
  const rssFile = join(tmp, 'rss');
  const t0 = process.hrtime.bigint();
  const r = spawnSync('ip', ['netns', 'exec', ns, GNU_TIME, '-f', '%M', '-o', rssFile, ...cmd], {
    input,
    env,
    encoding: 'utf8',
  });
  const ms = Number(process.hrtime.bigint() - t0) / 1e6;
  if (r.status !== 0) throw new Error(`${cmd.join(' ')}: exit ${r.status}: ${r.stdout}${r.stderr}`);
  return { ms, rssMB: Number(readFileSync(rssFile, 'utf8').trim()) / 1024, stdout: r.stdout };
}

/** `runs` interleaved rounds of each command: median wall time, peak RSS. */
function compare(ns: string, cmds: Record<string, string[]>): Record<string, Row> {
  const times: Record<string, number[]> = {};
  const rss: Record<string, number> = {};
  for (let i = 0; i < RUNS; i++) {
    for (const [name, cmd] of Object.entries(cmds)) {
      const r = timed(ns, cmd);
      (times[name] ??= []).push(r.ms);
      rss[name] = Math.max(rss[name] ?? 0, r.rssMB);
    }
  }
  return Object.fromEntries(
    Object.keys(cmds).map((n) => [
      n,
      { what: n, timeMs: median(times[n]!), rssMB: rss[n]!, target: '' },
    ]),
  );
}

async function readyz(ns: string): Promise<boolean> {
  const probe = `exec 3<>/dev/tcp/127.0.0.1/${HEALTHZ_PORT} && printf 'GET /readyz HTTP/1.0\\r\\n\\r\\n' >&3 && head -1 <&3`;
  try {
    return / 200 /.test(await nsExecAsync(ns, 'bash', ['-c', probe]));
  } catch {
    return false;
  }
}

/** CPU time of every thread of `pid` so far, in ns (/proc/<pid>/task/<tid>/schedstat). */
function cpuNs(pid: number): number {
  let ns = 0;
  for (const tid of readdirSync(`/proc/${pid}/task`)) {
    try {
      ns += Number(readFileSync(`/proc/${pid}/task/${tid}/schedstat`, 'utf8').split(' ')[0]);
    } catch {
      /* the thread ended */
    }
  }
  return ns;
}

/** A field of /proc/<pid>/status in MB (VmRSS: all resident pages; RssAnon: the private ones). */
function statusMB(pid: number, field: 'VmRSS' | 'RssAnon'): number {
  const m = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(
    readFileSync(`/proc/${pid}/status`, 'utf8'),
  );
  return Number(m![1]) / 1024;
}

/** Starts a daemon in `ns`, waits for /readyz, idles, samples its RSS, stops it. */
async function idleDaemon(
  nets: NetnsScope,
  ns: string,
  what: string,
  netConf: object,
  storeFlags: string[],
): Promise<Row & { readyMs: number }> {
  const dir = mkdtempSync(join(tmp, 'daemon-'));
  const conf = join(dir, 'net-conf.json');
  writeFileSync(conf, JSON.stringify(netConf));
  if (storeFlags.includes('--kube-subnet-mgr')) storeFlags.push(`--net-config-path=${conf}`);
  else await nsExecAsync(ns, process.execPath, [WEFT, 'config', 'set', conf, ...storeFlags]);
  const t0 = Date.now();
  const daemon: ChildProcess = nets.spawn(
    ns,
    process.execPath,
    [
      ...WEFT_CMD,
      'daemon',
      ...storeFlags,
      '--iface=eth0',
      `--subnet-file=${join(dir, 'subnet.env')}`,
      '--healthz-ip=127.0.0.1',
      `--healthz-port=${HEALTHZ_PORT}`,
      '--log-level=warn',
    ],
    { env: { ...process.env, ...launcherEnv(WEFT), NODE_NAME: 'footprint' } },
  );
  let stderr = '';
  daemon.stderr?.on('data', (d: Buffer) => (stderr += d.toString()));
  try {
    while (!(await readyz(ns))) {
      if (daemon.exitCode !== null) throw new Error(`${what}: daemon exited: ${stderr}`);
      if (Date.now() - t0 > 60_000) throw new Error(`${what}: not ready in 60 s: ${stderr}`);
      await sleep(200);
    }
    const readyMs = Date.now() - t0;
    // (settle 1 s after ready, then the idle window: the daemon's CPU while nothing happens)
    await sleep(1000);
    const cpu0 = cpuNs(daemon.pid!);
    const idle0 = performance.now();
    await sleep(IDLE_MS);
    const idleCpuPct = ((cpuNs(daemon.pid!) - cpu0) / 1e6 / (performance.now() - idle0)) * 100;
    let rssMB = 0;
    let anonMB = 0;
    for (let i = 0; i < 5; i++) {
      rssMB = Math.max(rssMB, statusMB(daemon.pid!, 'VmRSS'));
      anonMB = Math.max(anonMB, statusMB(daemon.pid!, 'RssAnon'));
      await sleep(200);
    }
    return { what, timeMs: null, rssMB, anonMB, idleCpuPct, target: '', readyMs };
  } finally {
    daemon.kill('SIGTERM');
    await new Promise((r) => (daemon.exitCode !== null ? r(null) : daemon.once('exit', r)));
  }
}

const tmp = mkdtempSync(join(tmpdir(), 'weft-footprint-'));

/** The fake Kubernetes API server on the namespace's loopback, holding node `footprint`. */
async function startKube(nets: NetnsScope, ns: string): Promise<ChildProcess> {
  const api = nets.spawn(
    ns,
    process.execPath,
    ['--import', 'tsx', KUBE_APISERVER, '127.0.0.1', '23791'],
    {
      stdio: ['pipe', 'pipe', 'inherit'],
      cwd: ROOT,
    },
  );
  const lines = createInterface({ input: api.stdout! })[Symbol.asyncIterator]();
  await lines.next(); // {"listening": ...}
  api.stdin!.write(
    JSON.stringify({
      id: 1,
      op: 'addNode',
      args: [{ name: 'footprint', podCIDR: '10.5.1.0/24' }],
    }) + '\n',
  );
  const reply = await lines.next();
  if (!String(reply.value).includes('"result"')) throw new Error(`fake API server: ${reply.value}`);
  return api;
}

/** A one-member etcd on the namespace's loopback, once it answers. */
async function startEtcd(nets: NetnsScope, ns: string): Promise<ChildProcess> {
  const etcd = nets.spawn(ns, 'etcd', [
    '--name=footprint',
    `--data-dir=${join(tmp, 'etcd')}`,
    `--listen-client-urls=${ETCD_CLIENT}`,
    `--advertise-client-urls=${ETCD_CLIENT}`,
    '--listen-peer-urls=http://127.0.0.1:23800',
    '--initial-advertise-peer-urls=http://127.0.0.1:23800',
    '--initial-cluster=footprint=http://127.0.0.1:23800',
  ]);
  for (let i = 0; ; i++) {
    try {
      await nsExecAsync(ns, 'etcdctl', [`--endpoints=${ETCD_CLIENT}`, 'endpoint', 'health']);
      return etcd;
    } catch (err) {
      if (i > 150) throw err;
      await sleep(200);
    }
  }
}

/** A namespace with lo and eth0 (one end of a veth pair, the other end beside it) up. */
async function nodeNamespace(nets: NetnsScope): Promise<string> {
  const ns = await nets.add();
  await nsExecAsync(ns, 'ip', ['link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'eth0p']);
  await nsExecAsync(ns, 'ip', ['addr', 'add', '10.250.0.1/24', 'dev', 'eth0']);
  await nsExecAsync(ns, 'ip', ['link', 'set', 'eth0p', 'up']);
  await nsExecAsync(ns, 'ip', ['link', 'set', 'eth0', 'up']);
  return ns;
}

async function main(): Promise<void> {
  if (!isRoot()) throw new Error('bench:footprint needs root (it works in network namespaces)');
  const nets = new NetnsScope();
  const removeAll = async () => {
    await nets.cleanup();
    rmSync(tmp, { recursive: true, force: true });
  };
  const early = onEarlyEnd('bench:footprint', removeAll);
  const rows: Row[] = [];
  const daemons: Array<Row & { readyMs: number }> = [];
  try {
    const node = await nodeNamespace(nets);
    const pod = await nets.add();

    // 1. a short command's start
    const start = compare(node, {
      'node -e 0': [process.execPath, '-e', '0'],
      'weft version': [process.execPath, ...WEFT_CMD, 'version'],
    });
    const base = start['node -e 0']!;
    const version = start['weft version']!;
    rows.push(base, {
      ...version,
      target: `≤ 3× node -e 0 (${(version.timeMs! / base.timeMs!).toFixed(2)}×)`,
    });

    // 2. idle daemons, one at a time
    const cases: Array<[string, object, 'embedded' | 'etcd' | 'kube']> = [
      ['embedded store + host-gw', { Type: 'host-gw' }, 'embedded'],
      ['embedded store + vxlan (kernel)', { Type: 'vxlan' }, 'embedded'],
      ['etcd + vxlan (kernel)', { Type: 'vxlan' }, 'etcd'],
      ['Kubernetes API + vxlan (kernel), as the DaemonSet runs', { Type: 'vxlan' }, 'kube'],
      [
        'embedded store + vxlan userspace (native engine)',
        { Type: 'vxlan', Dataplane: 'userspace' },
        'embedded',
      ],
    ];
    for (const [what, backend, store] of cases) {
      const ns = await nodeNamespace(nets);
      const netConf = { Network: '10.5.0.0/16', SubnetLen: 24, Backend: backend };
      const server =
        store === 'etcd'
          ? await startEtcd(nets, ns)
          : store === 'kube'
            ? await startKube(nets, ns)
            : null;
      const flags =
        store === 'etcd'
          ? [`--etcd-endpoints=${ETCD_CLIENT}`, '--etcd-prefix=/footprint']
          : store === 'kube'
            ? ['--kube-subnet-mgr', `--kube-api-url=${KUBE_API}`]
            : [`--store-dir=${join(tmp, `store-${daemons.length}`)}`];
      daemons.push(await idleDaemon(nets, ns, `daemon idle: ${what}`, netConf, flags));
      server?.kill('SIGTERM');
    }
    for (const d of daemons)
      d.target = d.what.includes('userspace')
        ? '≤ 80 MB'
        : d.what.includes('Kubernetes')
          ? 'none (kube mode)'
          : '≤ 64 MB';
    rows.push(...daemons);

    // 3. the CNI plugin per call, against the bridge plugin with the same delegate config
    const bin = join(tmp, 'cni-bin');
    mkdirSync(bin);
    copyFileSync(BUNDLE, join(bin, 'weft'));
    spawnSync('chmod', ['0755', join(bin, 'weft')]);
    const subnetFile = join(tmp, 'subnet.env');
    writeFileSync(
      subnetFile,
      'FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET=10.5.38.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n',
    );
    const dataDir = join(tmp, 'cni-data');
    const conf = JSON.stringify({
      cniVersion: '1.0.0',
      name: 'footprint',
      type: 'weft',
      subnetFile,
      dataDir,
      ipam: { dataDir: join(tmp, 'ipam') },
    });
    const env = (command: string, id: string) => ({
      PATH: process.env.PATH,
      CNI_COMMAND: command,
      CNI_CONTAINERID: id,
      CNI_NETNS: `/var/run/netns/${pod}`,
      CNI_IFNAME: 'eth0',
      CNI_PATH: CNI_PLUGINS,
    });
    const calls: Record<string, { ms: number[]; rss: number }> = {};
    const record = (name: string, r: { ms: number; rssMB: number }) => {
      const c = (calls[name] ??= { ms: [], rss: 0 });
      c.ms.push(r.ms);
      c.rss = Math.max(c.rss, r.rssMB);
    };
    for (let i = 0; i < RUNS; i++) {
      const id = `footprint-${i}`;
      record('weft VERSION', timed(node, [join(bin, 'weft')], conf, env('VERSION', id)));
      record(
        'bridge VERSION',
        timed(node, [join(CNI_PLUGINS, 'bridge')], conf, env('VERSION', id)),
      );
      record(
        'weft ADD (runs bridge + host-local)',
        timed(node, [join(bin, 'weft')], conf, env('ADD', id)),
      );
      const delegate = readFileSync(join(dataDir, id), 'utf8');
      record(
        'weft DEL (runs bridge + host-local)',
        timed(node, [join(bin, 'weft')], conf, env('DEL', id)),
      );
      record(
        'bridge ADD (runs host-local)',
        timed(node, [join(CNI_PLUGINS, 'bridge')], delegate, env('ADD', id)),
      );
      record(
        'bridge DEL (runs host-local)',
        timed(node, [join(CNI_PLUGINS, 'bridge')], delegate, env('DEL', id)),
      );
    }
    for (const [what, c] of Object.entries(calls))
      rows.push({ what: `CNI ${what}`, timeMs: median(c.ms), rssMB: c.rss, target: '' });
  } finally {
    early.off();
    await removeAll();
  }

  const lines = [
    '| what | time (median ms) | peak RSS (MB) | of it anonymous (MB) | idle CPU (%) | target |',
    '|---|---|---|---|---|---|',
    ...rows.map(
      (r) =>
        `| ${r.what} | ${r.timeMs === null ? ('readyMs' in r ? `ready in ${r.readyMs}` : '-') : r.timeMs.toFixed(0)} | ${r.rssMB.toFixed(1)} | ${r.anonMB?.toFixed(1) ?? '-'} | ${r.idleCpuPct?.toFixed(2) ?? '-'} | ${r.target} |`,
    ),
  ];
  const table = lines.join('\n') + '\n';
  process.stdout.write(table);
  const out = join(ROOT, 'bench', 'results');
  mkdirSync(out, { recursive: true });
  const meta = {
    date: new Date().toISOString(),
    runs: RUNS,
    idleMs: IDLE_MS,
    node: process.version,
  };
  writeFileSync(
    join(out, 'footprint-latest.json'),
    JSON.stringify({ ...meta, rows }, null, 2) + '\n',
  );
  writeFileSync(
    join(out, 'footprint-latest.md'),
    `${RUNS} runs, daemons idle ${IDLE_MS} ms after /readyz, ${meta.date}, Node ${meta.node}\n\n${table}`,
  );
}

main().catch((err) => {
  console.error(`bench:footprint: ${err instanceof Error ? err.message : String(err)}`);
  process.exitCode = 1;
});
