/**
 * `weft demo` end to end, as a user runs it: the real bin/weft, real namespaces, the real CNI
 * plugins through weft-cni, real daemons; then nothing of it may be left behind.
 *
 *   underlay ns (br0) ── node 0 (weft daemon, cni0 ── pod) ── node 1 (weft daemon, cni0 ── pod)
 *   per backend: a fresh cluster; pods ping across nodes and iperf3 runs between them
 *
 * The table names the engine: kernel, native, and bpf for the bpf rows (`vxlan-bpf`,
 * `udp-bpf`); where the bpf engine cannot run (forced here with WEFT_BPF_PROBE_FAIL, inherited
 * by the daemons) the row says why and the demo still succeeds.
 *
 * `--keep`: the command returns 0 with the cluster up and detached (each daemon leads its own
 * session), recorded in a state file; `weft demo down` removes exactly that, and leaves alone a
 * `weft-demo-*` namespace (with a process in it) that another demo could own.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type KeptState, processStart } from '../../src/control/demo/demo.js';
import { ping } from '../../src/testbed/probes.js';
import { NetnsScope, deleteNamespace, isRoot } from '../../src/testbed/netns.js';
import { runWeft, startWeft } from '../helpers/daemon.js';

const skip = isRoot() ? false : 'needs root (network namespaces)';

/** The namespaces of the demo run by process `pid` (`weft-demo-<pid>-<n>`): other demos may run. */
function demoNamespaces(pid: number | undefined): string[] {
  try {
    return readdirSync('/run/netns').filter((n) => n.startsWith(`weft-demo-${pid}-`));
  } catch {
    return [];
  }
}

test(
  'weft demo: pods on two nodes reach each other through weft-cni and the daemons, then everything is gone',
  { skip },
  async () => {
    const p = startWeft([
      'demo',
      '--nodes',
      '2',
      '--backend',
      'host-gw,vxlan-userspace',
      '--iperf-seconds',
      '1',
    ]);
    const code = await p.exited;
    const r = { stdout: p.stdout(), stderr: p.stderr() };
    assert.equal(code, 0, `${r.stdout}\n${r.stderr.slice(-3000)}`);
    const rows = r.stdout.split('\n').filter((l) => /^(host-gw|vxlan-userspace)\s/.test(l));
    assert.equal(rows.length, 2, r.stdout);
    const engines = new Map([
      ['host-gw', 'kernel'],
      ['vxlan-userspace', 'native'],
    ]);
    for (const row of rows) {
      const [backend, engine, reach, gbps] = row.split(/\s{2,}/);
      assert.equal(engine, engines.get(backend!), row);
      assert.equal(reach, '2/2', row);
      assert.match(gbps!, /^\d+\.\d+ Gbit\/s$/, row);
    }
    assert.deepEqual(demoNamespaces(p.proc.pid), []);
  },
);

test(
  'weft demo: the bpf rows (vxlan and udp with --dataplane-engine=bpf) run on the bpf engine, named in the table',
  { skip },
  async () => {
    const p = startWeft([
      'demo',
      '--nodes',
      '2',
      '--backend',
      'vxlan-bpf,udp-bpf',
      '--iperf-seconds',
      '1',
    ]);
    const code = await p.exited;
    const out = p.stdout();
    assert.equal(code, 0, `${out}\n${p.stderr().slice(-3000)}`);
    const rows = out.split('\n').filter((l) => /^(vxlan-bpf|udp-bpf)\s/.test(l));
    assert.equal(rows.length, 2, out);
    for (const row of rows) {
      const [, engine, reach, gbps] = row.split(/\s{2,}/);
      assert.equal(engine, 'bpf', row);
      assert.equal(reach, '2/2', row);
      assert.match(gbps!, /^\d+\.\d+ Gbit\/s$/, row);
    }
    assert.deepEqual(demoNamespaces(p.proc.pid), []);
  },
);

test(
  'weft demo: where the bpf engine cannot run, its row says why and the demo still succeeds',
  { skip },
  async () => {
    const p = startWeft(
      ['demo', '--nodes', '2', '--backend', 'udp-bpf,udp', '--iperf-seconds', '1'],
      {
        env: { WEFT_BPF_PROBE_FAIL: '1' },
      },
    );
    const code = await p.exited;
    const out = p.stdout();
    assert.equal(code, 0, `${out}\n${p.stderr().slice(-3000)}`);
    const row = out.split('\n').find((l) => /^udp-bpf\s/.test(l));
    assert.ok(row, out);
    const [, engine, reach, gbps] = row.split(/\s{2,}/);
    assert.equal(engine, 'native', row);
    assert.equal(reach, 'unavailable', row);
    assert.equal(gbps, '-', row);
    assert.match(
      out,
      /udp-bpf: the bpf engine cannot run on this machine \(bpf engine unavailable \(probe forced to fail by WEFT_BPF_PROBE_FAIL\)\)/,
    );
    // the other rows are measured as usual
    const udp = out.split('\n').find((l) => /^udp\s/.test(l));
    assert.match(udp ?? '', /^udp\s+native\s+2\/2\s/, out);
    assert.deepEqual(demoNamespaces(p.proc.pid), []);
  },
);

test('weft demo refuses an unknown backend with exit 2 naming the flag', { skip }, async () => {
  const r = await runWeft(['demo', '--backend', 'carrier-pigeon']);
  assert.equal(r.code, 2);
  assert.match(r.stderr, /--backend: unknown backend "carrier-pigeon"/);
});

/** The session id of process `pid` (/proc/<pid>/stat field 6), or null if it is gone. */
function sessionOf(pid: number): number | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[3]);
  } catch {
    return null;
  }
}

test(
  'weft demo --keep returns 0 with the cluster up and detached; demo down removes exactly what it recorded',
  { skip },
  async () => {
    const stateDir = mkdtempSync(join(tmpdir(), 'weft-demo-state-'));
    // Another demo's namespace, as far as a name can tell, with a process living in it.
    const scope = new NetnsScope(`weft-demo-${process.pid}x`);
    const foreign = scope.add();
    const squatter = scope.spawn(foreign, 'sleep', ['600'], { stdio: 'ignore' });
    let state: KeptState | null = null;
    try {
      const p = startWeft([
        'demo',
        '--keep',
        '--nodes',
        '2',
        '--backend',
        'host-gw',
        '--iperf-seconds',
        '1',
        '--state-dir',
        stateDir,
      ]);
      // Before the fix the command never returned: fail (and stop it) instead of hanging.
      const hung = setTimeout(() => p.proc.kill('SIGKILL'), 120_000);
      const code = await p.exited;
      clearTimeout(hung);
      assert.equal(code, 0, `${p.stdout()}\n${p.stderr().slice(-3000)}`);
      assert.match(p.stdout(), /The cluster is still up/);

      const files = readdirSync(stateDir).filter((f) => f.endsWith('.json'));
      assert.equal(files.length, 1, files.join(', '));
      state = JSON.parse(readFileSync(join(stateDir, files[0]!), 'utf8')) as KeptState;
      assert.equal(state.processes.length, 2, JSON.stringify(state.processes));
      for (const proc of state.processes) {
        // Detached: each daemon leads its own session, so the terminal's Ctrl-C never reaches it.
        assert.equal(sessionOf(proc.pid), proc.pid, `${proc.what} (pid ${proc.pid})`);
      }
      for (const ns of state.namespaces) assert.ok(existsSync(`/run/netns/${ns}`), ns);
      for (const n of state.nodes) assert.ok(n.log.startsWith(stateDir), n.log);
      const [a, b] = state.pods;
      assert.ok(a && b, JSON.stringify(state.pods));
      assert.equal((await ping(a.ns, b.ip, 2)).received, 2, `${a.name} → ${b.name}`);
      assert.equal((await ping(b.ns, a.ip, 2)).received, 2, `${b.name} → ${a.name}`);

      const down = await runWeft(['demo', 'down', '--state-dir', stateDir]);
      assert.equal(down.code, 0, down.stderr);
      assert.match(down.stdout, new RegExp(`removed ${state.id}: 2 process\\(es\\)`));
      for (const proc of state.processes) assert.equal(sessionOf(proc.pid), null, proc.what);
      for (const ns of state.namespaces) assert.equal(existsSync(`/run/netns/${ns}`), false, ns);
      assert.equal(existsSync(state.dir), false, state.dir);
      assert.deepEqual(readdirSync(stateDir), []);
      assert.ok(existsSync(`/run/netns/${foreign}`), `${foreign} was removed by demo down`);
      assert.equal(squatter.exitCode, null, 'the process in the foreign namespace was killed');
      assert.equal(squatter.signalCode, null, 'the process in the foreign namespace was killed');
    } finally {
      // Whatever a failure left: the recorded cluster, then the test's own namespace and dir.
      await runWeft(['demo', 'down', '--state-dir', stateDir]);
      for (const proc of state?.processes ?? []) {
        try {
          if (sessionOf(proc.pid) === proc.pid) process.kill(proc.pid, 'SIGKILL');
        } catch {
          /* gone */
        }
      }
      for (const ns of state?.namespaces ?? []) await deleteNamespace(ns);
      await scope.cleanup();
      rmSync(stateDir, { recursive: true, force: true });
    }
  },
);

test(
  'weft demo down stops a recorded pid only while it is the same process, and skips a broken record',
  { skip },
  async () => {
    const stateDir = mkdtempSync(join(tmpdir(), 'weft-demo-state-'));
    const scope = new NetnsScope(`weft-demo-${process.pid}y`);
    try {
      const ns = scope.add();
      const ours = scope.spawn(ns, 'sleep', ['600'], { stdio: 'ignore' });
      // A recorded pid whose process is not the recorded one any more (pid reused).
      const stranger = scope.spawn(scope.add(), 'sleep', ['600'], { stdio: 'ignore' });
      const dir = mkdtempSync(join(stateDir, 'cluster-'));
      const state: KeptState = {
        id: 'weft-demo-test',
        dir,
        namespaces: [ns],
        processes: [
          { pid: ours.pid!, start: processStart(ours.pid!), what: 'ours' },
          { pid: stranger.pid!, start: '1', what: 'reused pid' },
        ],
        nodes: [],
        pods: [],
      };
      writeFileSync(join(stateDir, 'weft-demo-test.json'), JSON.stringify(state));
      writeFileSync(join(stateDir, 'weft-demo-broken.json'), '{"dir":');
      const exited = new Promise((r) => ours.once('exit', r));
      const r = await runWeft(['demo', 'down', '--state-dir', stateDir]);
      assert.equal(r.code, 1, 'a skipped record is reported in the exit code');
      assert.match(r.stderr, /skipping .*weft-demo-broken\.json/);
      assert.match(r.stdout, /removed weft-demo-test: 1 process\(es\), 1 namespace\(s\)/);
      await exited;
      assert.equal(existsSync(`/run/netns/${ns}`), false);
      assert.equal(existsSync(dir), false);
      assert.equal(stranger.exitCode, null, 'the process behind a reused pid was killed');
      assert.equal(stranger.signalCode, null, 'the process behind a reused pid was killed');
      assert.deepEqual(readdirSync(stateDir), ['weft-demo-broken.json']);
    } finally {
      await scope.cleanup();
      rmSync(stateDir, { recursive: true, force: true });
    }
  },
);
