// runCni without a delegate run: protocol, errors and the cache paths that need no plugin. The
// delegate runs for real in test/netns/cni.test.ts (inside namespaces: the bridge plugin
// creates its bridge in the namespace it runs in, so it never runs here).
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { runCni } from '../../../../src/control/cni/main.js';
import { setLogLevel } from '../../../../src/common/log.js';

let root = '';
let emptyBin = '';
let subnetFile = '';
before(async () => {
  setLogLevel('silent');
  root = await mkdtemp(join(tmpdir(), 'weft-cni-main-'));
  emptyBin = join(root, 'bin');
  await mkdir(emptyBin);
  subnetFile = join(root, 'subnet.env');
  await writeFile(
    subnetFile,
    'FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_SUBNET=10.1.17.1/24\nFLANNEL_MTU=1472\nFLANNEL_IPMASQ=true\n',
  );
});
after(async () => {
  await rm(root, { recursive: true, force: true });
});

async function run(
  env: Record<string, string>,
  stdin: unknown,
): Promise<{ code: number; out: string }> {
  let out = '';
  const code = await runCni(env, typeof stdin === 'string' ? stdin : JSON.stringify(stdin), {
    write: (s: string) => (out += s),
  });
  return { code, out };
}

function env(command: string, id = 'c1'): Record<string, string> {
  return {
    CNI_COMMAND: command,
    CNI_CONTAINERID: id,
    CNI_NETNS: '/var/run/netns/none',
    CNI_IFNAME: 'eth0',
    CNI_PATH: emptyBin,
  };
}

function conf(extra: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    name: 'cni-weft',
    type: 'weft',
    cniVersion: '1.0.0',
    subnetFile,
    dataDir: join(root, 'data'),
    ...extra,
  };
}

test('VERSION prints the supported versions', async () => {
  const r = await run({ CNI_COMMAND: 'VERSION' }, '{"cniVersion":"1.0.0"}');
  assert.equal(r.code, 0);
  assert.deepEqual(JSON.parse(r.out), {
    cniVersion: '1.0.0',
    supportedVersions: ['0.3.0', '0.3.1', '0.4.0', '1.0.0'],
  });
});

test('an error is one CNI error object on stdout and exit 1', async () => {
  const r = await run(env('ADD'), '{"cniVersion":"0.4.0","name":"n","delegate":{"name":"x"}}');
  assert.equal(r.code, 1);
  assert.equal(r.out.trim().split('\n').length, 1);
  const e = JSON.parse(r.out) as Record<string, unknown>;
  assert.equal(e.cniVersion, '0.4.0');
  assert.equal(e.code, 7);
  assert.match(String(e.msg), /^delegate.name: /);
});

test('missing env variables are code 4 with no stdin read', async () => {
  const r = await run({ CNI_COMMAND: 'ADD' }, '');
  assert.equal(JSON.parse(r.out).code, 4);
  assert.equal(r.code, 1);
});

test('ADD without subnet.env is code 11 pointing at the daemon, and caches nothing', async () => {
  const r = await run(env('ADD', 'nosubnet'), conf({ subnetFile: join(root, 'absent.env') }));
  assert.equal(r.code, 1);
  const e = JSON.parse(r.out) as Record<string, unknown>;
  assert.equal(e.code, 11);
  assert.match(String(e.msg), /absent\.env does not exist \(missing FLANNEL_NETWORK/);
  assert.match(String(e.details), /weft daemon/);
  await assert.rejects(readFile(join(root, 'data', 'nosubnet')), { code: 'ENOENT' });
});

test('ADD with the delegate missing from CNI_PATH is code 100 and leaves the cache for DEL', async () => {
  const r = await run(env('ADD', 'noplugin'), conf());
  assert.equal(r.code, 1);
  const e = JSON.parse(r.out) as Record<string, unknown>;
  assert.equal(e.code, 100);
  assert.match(String(e.msg), /failed to find plugin "bridge"/);
  const cached = JSON.parse(await readFile(join(root, 'data', 'noplugin'), 'utf8')) as Record<
    string,
    unknown
  >;
  assert.equal(cached.type, 'bridge');
  assert.equal(cached.name, 'cni-weft');
});

test('DEL with no cache entry succeeds, twice', async () => {
  for (let i = 0; i < 2; i++) {
    const r = await run(env('DEL', 'never-added'), conf());
    assert.deepEqual(r, { code: 0, out: '' });
  }
});

test('DEL of an unreadable cache entry succeeds and removes it', async () => {
  const dir = join(root, 'data');
  await mkdir(dir, { recursive: true });
  await writeFile(join(dir, 'garbled'), '{"type":');
  const r = await run(env('DEL', 'garbled'), conf());
  assert.deepEqual(r, { code: 0, out: '' });
  await assert.rejects(readFile(join(dir, 'garbled')), { code: 'ENOENT' });
});

test('CHECK before 0.4.0 is code 1', async () => {
  const r = await run(env('CHECK'), conf({ cniVersion: '0.3.1' }));
  assert.equal(JSON.parse(r.out).code, 1);
});

test('CHECK of a container never added is code 3', async () => {
  const r = await run(env('CHECK', 'never-added'), conf());
  assert.equal(JSON.parse(r.out).code, 3);
});

test('an unsupported cniVersion is code 1 and the error carries that version', async () => {
  const r = await run(env('ADD'), conf({ cniVersion: '0.2.0' }));
  const e = JSON.parse(r.out) as Record<string, unknown>;
  assert.equal(e.code, 1);
  assert.equal(e.cniVersion, '0.2.0');
});
