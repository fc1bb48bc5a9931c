// The extension backend: its Backend block, flannel's variable expansion, commands run without a
// shell, and the backend's four moments (real /bin/sh scripts in a temp dir, no root needed).
import assert from 'node:assert/strict';
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { isWeftError } from '../../../../src/common/errors.js';
import { parseCIDR } from '../../../../src/common/ip.js';
import {
  createExtensionBackend,
  expandVars,
  parseExtensionConfig,
  runCommand,
  splitFields,
} from '../../../../src/control/backend/extension.js';
import { backendFactory } from '../../../../src/control/backend/registry.js';
import type { Lease, LeaseEvent } from '../../../../src/control/lease/types.js';
import { backendContext } from './fixtures.js';

const dir = mkdtempSync(join(tmpdir(), 'weft-ext-unit-'));
after(() => rmSync(dir, { recursive: true, force: true }));

/** A script that appends its argv, the variables and stdin to `log`, then exits `code`. */
function recorder(name: string, code = 0): { path: string; log: string } {
  const path = join(dir, `${name}.sh`);
  const log = join(dir, `${name}.log`);
  writeFileSync(
    path,
    `#!/bin/sh\n{ printf 'argv=%s\\n' "$*"; echo "SUBNET=$SUBNET PUBLIC_IP=$PUBLIC_IP NETWORK=$NETWORK IPV6SUBNET=$IPV6SUBNET PUBLIC_IPV6=$PUBLIC_IPV6"; echo "stdin=$(cat)"; } >> ${log}\necho "out of ${name}"\nexit ${code}\n`,
  );
  chmodSync(path, 0o755);
  return { path, log };
}

function lease(subnet: string, publicIP: string, over: Partial<Lease['attrs']> = {}): Lease {
  return {
    key: subnet.replace('/', '-'),
    subnet: parseCIDR(subnet),
    ipv6Subnet: null,
    attrs: { publicIP, publicIPv6: null, backendType: 'extension', ...over },
    expiration: null,
  };
}

async function* batches(...b: LeaseEvent[][]): AsyncIterable<LeaseEvent[]> {
  yield* b;
}

describe('extension Backend block', () => {
  test('the four commands, split on whitespace; unset or "" is none; names in any case', () => {
    const cfg = parseExtensionConfig({
      Type: 'extension',
      prestartupcommand: '  /bin/echo   a\tb ',
      SubnetAddCommand: '',
    });
    assert.deepEqual(cfg.PreStartupCommand, ['/bin/echo', 'a', 'b']);
    assert.equal(cfg.PostStartupCommand, null);
    assert.equal(cfg.SubnetAddCommand, null);
    assert.equal(cfg.SubnetRemoveCommand, null);
  });

  test('a command that is not a string is refused naming the field', () => {
    assert.throws(
      () => parseExtensionConfig({ Type: 'extension', SubnetAddCommand: ['ip', 'route'] }),
      (e: unknown) =>
        isWeftError(e, 'WEFT_ERR_CONFIG_INVALID') &&
        e.exitCode === 2 &&
        /^Backend\.SubnetAddCommand: must be a string/.test(e.message),
    );
  });

  test('the extension type is registered', () => {
    assert.equal(typeof backendFactory('extension'), 'function');
  });

  test('splitFields is Go’s strings.Fields', () => {
    assert.deepEqual(splitFields(' a  b\n\tc '), ['a', 'b', 'c']);
    assert.deepEqual(splitFields('   '), []);
  });
});

describe('variable expansion (Go’s os.Expand)', () => {
  const vars: Record<string, string> = { SUBNET: '10.5.3.0/24', A_1: 'x', '1': 'one' };
  const lookup = (n: string) => vars[n] ?? '';
  for (const [arg, want] of [
    ['$SUBNET', '10.5.3.0/24'],
    ['${SUBNET}', '10.5.3.0/24'],
    ['dst=${SUBNET},via', 'dst=10.5.3.0/24,via'],
    ['$A_1-$A_1', 'x-x'],
    ['$UNSET.', '.'],
    ['$1x', 'onex'],
    ['cost$', 'cost$'],
    ['5$%', '5$%'],
    ['a${}b', 'ab'],
    ['a${SUBNET', 'aSUBNET'],
  ] as const) {
    test(`${JSON.stringify(arg)} → ${JSON.stringify(want)}`, () => {
      assert.equal(expandVars(arg, lookup), want);
    });
  }
});

describe('runCommand', () => {
  test('no shell: a variable holding shell syntax is one literal argument', async () => {
    const r = await runCommand(['/bin/echo', '$V', ';', 'id'], { V: '$(id) `id` a b' }, '');
    assert.equal(r.code, 0);
    assert.equal(r.output, '$(id) `id` a b ; id');
  });

  test('stdin carries the text and a newline; stdout and stderr are both the output, trimmed', async () => {
    // (no `$` in the script: flannel's expansion would take it, as it does here)
    const r = await runCommand(['/bin/sh', '-c', 'cat; echo err >&2'], {}, 'x y');
    assert.equal(r.code, 0);
    assert.match(r.output, /^x y\nerr$|^err\nx y$/);
  });

  test('a command that cannot start rejects (ENOENT)', async () => {
    await assert.rejects(runCommand([join(dir, 'missing')], {}, ''), /ENOENT/);
  });

  test('a command is killed when the signal fires', async () => {
    const ac = new AbortController();
    const p = runCommand(['/bin/sleep', '30'], {}, '', { signal: ac.signal });
    ac.abort();
    const r = await p;
    assert.equal(r.signal, 'SIGKILL');
  });

  test('a command that outlives its timeout is killed and says so', async () => {
    const r = await runCommand(['/bin/sleep', '30'], {}, '', { timeoutMs: 50 });
    assert.equal(r.timedOut, true);
    assert.equal(r.code, null);
  });
});

describe('extension backend', () => {
  test('PreStartupCommand’s output is the lease’s BackendData; the MTU is the interface’s', async () => {
    const b = createExtensionBackend(
      backendContext({ Type: 'extension', PreStartupCommand: '/bin/echo vtep  data' }),
    );
    const p = await b.prepare();
    assert.deepEqual(p.attrs, { backendType: 'extension', backendData: 'vtep data' });
    assert.equal(p.mtu, 1500);
  });

  test('without PreStartupCommand the lease has no BackendData', async () => {
    const p = await createExtensionBackend(backendContext({ Type: 'extension' })).prepare();
    assert.deepEqual(p.attrs, { backendType: 'extension' });
  });

  test('a failing PreStartupCommand stops prepare, naming it, its exit code and output', async () => {
    const { path } = recorder('pre-fails', 3);
    const b = createExtensionBackend(
      backendContext({ Type: 'extension', PreStartupCommand: path }),
    );
    await assert.rejects(
      b.prepare(),
      (e: unknown) =>
        isWeftError(e, 'WEFT_ERR_BACKEND') &&
        e.message.includes('Backend.PreStartupCommand') &&
        e.message.includes('exited 3') &&
        e.message.includes('out of pre-fails'),
    );
  });

  test('PostStartupCommand gets NETWORK, SUBNET, IPV6SUBNET, PUBLIC_IP, PUBLIC_IPV6 and an empty line', async () => {
    const { path, log } = recorder('post');
    const b = createExtensionBackend(
      backendContext({ Type: 'extension', PostStartupCommand: `${path} $SUBNET` }),
    );
    const own: Lease = {
      key: '10.5.1.0-24&fc00:0:0:1::-64',
      subnet: parseCIDR('10.5.1.0/24'),
      ipv6Subnet: parseCIDR('fc00:0:0:1::/64'),
      attrs: {
        publicIP: '192.168.1.11',
        publicIPv6: '2001:db8:1::11',
        backendType: 'extension',
      },
      expiration: null,
    };
    await b.start(own);
    assert.equal(
      readFileSync(log, 'utf8'),
      'argv=10.5.1.0/24\n' +
        'SUBNET=10.5.1.0/24 PUBLIC_IP=192.168.1.11 NETWORK=10.5.0.0/16 IPV6SUBNET=fc00:0:0:1::/64 PUBLIC_IPV6=2001:db8:1::11\n' +
        'stdin=\n',
    );
  });

  test('peer add and remove run in order with the peer’s SUBNET, PUBLIC_IP and BackendData on stdin; others are skipped; a failure does not stop the next', async () => {
    const add = recorder('add', 1);
    const del = recorder('del');
    const ctx = backendContext({
      Type: 'extension',
      SubnetAddCommand: add.path,
      SubnetRemoveCommand: del.path,
    });
    const b = createExtensionBackend(ctx);
    const a = lease('10.5.7.0/24', '192.168.1.7', { backendData: 'data of a' });
    const bb = lease('10.5.8.0/24', '192.168.1.8');
    await b.run(
      batches(
        [
          { type: 'added', lease: a },
          { type: 'added', lease: lease('10.5.9.0/24', '192.168.1.9', { backendType: 'vxlan' }) },
          { type: 'added', lease: lease('10.5.10.0/24', '192.168.1.10', { backendData: {} }) },
        ],
        [
          { type: 'added', lease: bb },
          { type: 'removed', lease: a },
        ],
      ),
      new AbortController().signal,
    );
    const line = (s: string, p: string) =>
      `argv=\nSUBNET=${s} PUBLIC_IP=${p} NETWORK= IPV6SUBNET= PUBLIC_IPV6=\n`;
    assert.equal(
      readFileSync(add.log, 'utf8'),
      line('10.5.7.0/24', '192.168.1.7') +
        'stdin=data of a\n' +
        line('10.5.8.0/24', '192.168.1.8') +
        'stdin=\n',
    );
    assert.equal(
      readFileSync(del.log, 'utf8'),
      line('10.5.7.0/24', '192.168.1.7') + 'stdin=data of a\n',
    );
    // the lease whose BackendData is not a string: counted once, as the other backends count
    assert.match(await ctx.metrics.metrics(), /^weft_backend_peer_leases_skipped_total 1$/m);
  });
});
