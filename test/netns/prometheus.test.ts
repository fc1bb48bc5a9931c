/**
 * The real Prometheus server (Debian's `prometheus`) scraping a two-node weft cluster with traffic
 * between its pods, and every query of the Grafana dashboard (deploy/grafana/weft.json) run on it
 * through its HTTP API. Node A runs kernel vxlan and node B userspace vxlan (the same wire format,
 * one kube store, each node its own net-conf), so the kernel backends' and the userspace engine's
 * families both carry data.
 *
 *        underlay weft-<pid>-0: br0 10.250.0.254/24 ── fake API server :6443
 *                               prometheus on 127.0.0.1:9090 (scrapes every 1 s, temp TSDB dir)
 *            u0 ┌────────────────────────┴─ u1 ─────────────────┐
 *   ┌─ eth0 10.250.0.1 ────────┐              ┌─ eth0 10.250.0.2 ────────┐
 *   │ A: vxlan, kernel         │  ◄── vxlan ──►│ B: vxlan, userspace      │
 *   │ /metrics 0.0.0.0:10281   │              │ /metrics 0.0.0.0:10281   │
 *   └──┬───────────────────────┘              └──┬───────────────────────┘
 *    pod A  ───────── ping, iperf3 both ways ──  pod B
 *
 * Prometheus starts before the daemons, and B only once A has been scraped, so what A does when
 * B's lease arrives (the kernel batch, lease event → peer programmed) falls between two scrapes
 * and shows in rate(). Each query is polled until it returns a finite value (Prometheus scrapes
 * on its own clock); what a healthy cluster cannot produce is listed below with the reason.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { after, before, describe, test } from 'node:test';
import {
  Cluster,
  type ClusterNode,
  HEALTH_PORT,
  PACKAGE_ROOT,
  waitFor,
} from '../../src/testbed/cluster.js';
import { isRoot, nsExecAsync } from '../../src/testbed/netns.js';
import { iperf } from '../../src/testbed/probes.js';

const KUBE_APISERVER = join(PACKAGE_ROOT, 'test', 'helpers', 'kube-apiserver-child.ts');
const PROMETHEUS_ADDR = '127.0.0.1:9090';
const skip = !isRoot()
  ? 'needs root (network namespaces)'
  : spawnSync('prometheus', ['--version']).error
    ? 'the prometheus server is not installed (Debian package prometheus; npm run setup)'
    : false;

const BACKENDS = [
  { Type: 'vxlan', Dataplane: 'kernel' },
  { Type: 'vxlan', Dataplane: 'userspace' },
];

/**
 * Queries a healthy cluster leaves without any series: data only a fault produces (or, for the
 * lease expiry, a store this cluster does not use). Keyed by a metric the query names.
 */
const NO_DATA_ON_A_HEALTHY_CLUSTER: Readonly<Record<string, string>> = {
  weft_dataplane_dropped_packets_total:
    'drops by reason, filtered to reasons with a non-zero rate (`> 0`): a healthy cluster drops nothing',
  weft_lease_expiration_timestamp_seconds:
    "the kube store's leases are the nodes' podCIDRs and never lapse (the gauge is 0, filtered out); etcd and embedded leases show",
};

/** Quantiles that stay NaN (series, but no observation) unless a fault or hours pass. */
const NAN_ON_A_HEALTHY_CLUSTER: Readonly<Record<string, string>> = {
  weft_lease_renew_duration_seconds:
    'a renewal comes TTL − margin after the lease was taken (23 h by default); kube leases are never renewed',
  weft_backend_kernel_recheck_duration_seconds:
    "a re-check runs when someone else changes weft's kernel entries (a fault) or every 5 minutes",
};

interface Panel {
  targets?: Array<{ expr: string }>;
  panels?: Panel[];
}
const dashboard = JSON.parse(
  readFileSync(resolve(PACKAGE_ROOT, 'deploy/grafana/weft.json'), 'utf8'),
) as { panels: Panel[] };
const EXPRS = dashboard.panels
  .flatMap((p) => [p, ...(p.panels ?? [])])
  .flatMap((p) => (p.targets ?? []).map((t) => t.expr));

/** Grafana's variables as the test runs them: every node, a window longer than the test. */
const expand = (expr: string) =>
  expr.replaceAll('$__rate_interval', '5m').replaceAll('$instance', '.*');

interface Sample {
  readonly metric: Record<string, string>;
  readonly value: [number, string];
}

/** Instant queries on the Prometheus API (from inside the underlay namespace), in one process. */
async function query(ns: string, exprs: readonly string[]): Promise<Sample[][]> {
  const script = `
    const exprs = JSON.parse(process.argv[1]);
    Promise.all(exprs.map(async (q) => {
      const r = await fetch('http://${PROMETHEUS_ADDR}/api/v1/query?query=' + encodeURIComponent(q));
      const body = await r.json();
      if (body.status !== 'success') throw new Error(q + ': ' + JSON.stringify(body));
      return body.data.result;
    })).then((all) => process.stdout.write(JSON.stringify(all)));`;
  const out = await nsExecAsync(ns, process.execPath, ['-e', script, JSON.stringify(exprs)]);
  return JSON.parse(out) as Sample[][];
}

const finite = (s: readonly Sample[]) => s.some((x) => Number.isFinite(Number(x.value[1])));
const listedIn = (table: Readonly<Record<string, string>>, expr: string) =>
  Object.keys(table).find((m) => expr.includes(m));

describe('the real Prometheus scraping a two-node cluster with traffic', { skip }, () => {
  let c: Cluster;
  let A: ClusterNode, B: ClusterNode;
  /** Each dashboard query's last result. */
  const results = new Map<string, Sample[]>();

  before(async () => {
    c = await Cluster.build({
      store: 'kube',
      kubeApiServer: KUBE_APISERVER,
      backend: BACKENDS,
      flags: ['--healthz-ip=0.0.0.0'],
    });
    [A, B] = c.nodes as [ClusterNode, ClusterNode];
    const config = join(c.dir, 'prometheus.yml');
    // (JSON is YAML)
    writeFileSync(
      config,
      JSON.stringify({
        global: { scrape_interval: '1s', scrape_timeout: '1s', evaluation_interval: '1s' },
        scrape_configs: [
          {
            job_name: 'weft',
            static_configs: [{ targets: c.nodes.map((n) => `${n.ip}:${HEALTH_PORT}`) }],
          },
        ],
      }),
    );
    const prometheus = c.scope.spawn(
      c.underlay,
      'prometheus',
      [
        `--config.file=${config}`,
        `--storage.tsdb.path=${join(c.dir, 'prometheus')}`,
        `--web.listen-address=${PROMETHEUS_ADDR}`,
        '--log.level=warn',
      ],
      { stdio: ['ignore', 'ignore', 'ignore'] },
    );
    await waitFor(
      async () => {
        if (prometheus.exitCode !== null)
          throw new Error(`prometheus exited ${prometheus.exitCode}`);
        await nsExecAsync(c.underlay, process.execPath, [
          '-e',
          `fetch('http://${PROMETHEUS_ADDR}/-/ready').then((r) => process.exit(r.ok ? 0 : 1))`,
        ]);
        return true;
      },
      30_000,
      'prometheus ready in the underlay namespace',
    );
    await c.startDaemon(0);
    await waitFor(
      async () =>
        (await query(c.underlay, [`up{instance="${A.ip}:${HEALTH_PORT}"} == 1`]))[0]!.length > 0,
      30_000,
      'prometheus scraping node A',
    );
    await c.startDaemon(1);
    await c.addPods(1);
    const [a, b] = [A.pods[0]!, B.pods[0]!];
    await nsExecAsync(a.ns, 'ping', ['-c', '3', '-i', '0.2', '-w', '20', b.ip], 30_000);
    await nsExecAsync(b.ns, 'ping', ['-c', '3', '-i', '0.2', '-w', '20', a.ip], 30_000);
    const args = ['-t', '1'];
    assert.ok((await iperf(c.scope, b.ns, b.ip, a.ns, args)).bitsPerSecond > 0, 'iperf3 A → B');
    assert.ok((await iperf(c.scope, a.ns, a.ip, b.ns, args)).bitsPerSecond > 0, 'iperf3 B → A');
    // until every query expected to carry data does (at least two scrapes after the traffic)
    const expected = EXPRS.filter(
      (e) => !listedIn(NO_DATA_ON_A_HEALTHY_CLUSTER, e) && !listedIn(NAN_ON_A_HEALTHY_CLUSTER, e),
    );
    await waitFor(
      async () => {
        const all = await query(c.underlay, EXPRS.map(expand));
        EXPRS.forEach((e, i) => results.set(e, all[i]!));
        return expected.every((e) => finite(results.get(e)!));
      },
      40_000,
      'every dashboard query to return data',
    ).catch(() => undefined); // the tests below say which did not
  });

  after(async () => {
    await c?.destroy();
  });

  test('every target is up', async () => {
    const [up] = await query(c.underlay, ['up']);
    assert.deepEqual(
      up!.map((s) => `${s.metric.instance} ${s.value[1]}`).sort(),
      c.nodes.map((n) => `${n.ip}:${HEALTH_PORT} 1`),
    );
  });

  test('every dashboard query returns data, or is listed with the reason', () => {
    assert.ok(EXPRS.length > 40, `${EXPRS.length} queries`);
    const missing: string[] = [];
    const listed: string[] = [];
    for (const expr of EXPRS) {
      const r = results.get(expr);
      assert.ok(r, `${expr}: never queried`);
      const noData = listedIn(NO_DATA_ON_A_HEALTHY_CLUSTER, expr);
      const nan = listedIn(NAN_ON_A_HEALTHY_CLUSTER, expr);
      if (noData) listed.push(`${expr}: ${NO_DATA_ON_A_HEALTHY_CLUSTER[noData]}`);
      else if (nan) {
        // the series are there; only the quantile waits for an observation
        if (r.length === 0) missing.push(`${expr} (no series at all)`);
        listed.push(`${expr}: NaN, ${NAN_ON_A_HEALTHY_CLUSTER[nan]}`);
      } else if (!finite(r)) missing.push(expr);
    }
    process.stderr.write(
      `# prometheus: ${EXPRS.length - listed.length} of ${EXPRS.length} queries returned data; listed:\n` +
        listed.map((l) => `#   ${l}\n`).join(''),
    );
    assert.deepEqual(missing, [], `queries without data:\n${missing.join('\n')}`);
  });
});
