/**
 * A real etcd (Debian etcd-server, /usr/bin/etcd) for integration tests: one member on
 * 127.0.0.1 with random free client and peer ports and a temp data dir, in the caller's
 * namespace or (`netns`) inside a test namespace, etcdctl with it. Optional TLS (a CA,
 * server and client certificate made with openssl in the temp dir, client certs required) and
 * password auth (`enableAuth`).
 *
 * When the etcd binary is missing, `etcdSkipReason()` returns why, so a suite can skip; under
 * CI (`CI=true`) it throws instead: CI must run these tests.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import {
  accessSync,
  constants,
  mkdtempSync,
  openSync,
  closeSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export const ETCD_BIN = process.env.WEFT_ETCD_BIN ?? '/usr/bin/etcd';
export const ETCDCTL_BIN = process.env.WEFT_ETCDCTL_BIN ?? '/usr/bin/etcdctl';

function executable(path: string): boolean {
  try {
    accessSync(path, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

/** Why etcd tests cannot run here (undefined when they can); throws under CI. */
export function etcdSkipReason(): string | undefined {
  const missing = [ETCD_BIN, ETCDCTL_BIN].filter((p) => !executable(p));
  if (missing.length === 0) return undefined;
  const reason = `${missing.join(' and ')} not found (install Debian etcd-server and etcd-client)`;
  if (process.env.CI === 'true') throw new Error(`CI requires etcd: ${reason}`);
  return reason;
}

/** Why the TLS variant cannot run (openssl missing), undefined when it can. */
export function opensslSkipReason(): string | undefined {
  const r = spawnSync('openssl', ['version'], { encoding: 'utf8' });
  if (r.status === 0) return undefined;
  const reason = 'openssl not found (install Debian openssl)';
  if (process.env.CI === 'true') throw new Error(`CI requires openssl: ${reason}`);
  return reason;
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.unref();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const addr = s.address();
      const port = typeof addr === 'object' && addr ? addr.port : 0;
      s.close(() => resolve(port));
    });
  });
}

export interface EtcdTls {
  readonly caFile: string;
  readonly certFile: string;
  readonly keyFile: string;
}

export interface TestEtcd {
  /** `http://127.0.0.1:<port>` or `https://...` with TLS. */
  readonly endpoint: string;
  readonly dataDir: string;
  /** Client certificate, key and CA when started with TLS. */
  readonly tls: EtcdTls | null;
  /**
   * Runs etcdctl against this member (v3 API); returns stdout, throws on failure. Uses the
   * credentials given to `enableAuth` unless `auth` says otherwise.
   */
  ctl(args: string[], auth?: { username: string; password: string }): string;
  /** Credentials etcdctl uses from now on (enableAuth sets them). */
  useAuth(auth: { username: string; password: string } | null): void;
  /** Stops and starts the member again on the same ports and data. */
  restart(): Promise<void>;
  /** Kills etcd and removes the temp dir. */
  stop(): Promise<void>;
}

function run(cmd: string, args: string[], cwd?: string): string {
  const r = spawnSync(cmd, args, { cwd, encoding: 'utf8' });
  if (r.status !== 0) {
    throw new Error(
      `${cmd} ${args.join(' ')} failed (${r.status ?? r.signal}): ${r.stderr || r.error?.message}`,
    );
  }
  return r.stdout;
}

/** A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files in `dir`. */
function makeCertificates(
  dir: string,
): { ca: string; serverCert: string; serverKey: string } & EtcdTls {
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
  run(
    'openssl',
    [
      'req',
      '-x509',
      ...ec,
      '-keyout',
      'ca.key',
      '-out',
      'ca.crt',
      '-days',
      '2',
      '-subj',
      '/CN=weft-test-ca',
    ],
    dir,
  );
  const sign = (name: string, cn: string, ext: string) => {
    writeFileSync(join(dir, `${name}.ext`), ext);
    run(
      'openssl',
      ['req', ...ec, '-keyout', `${name}.key`, '-out', `${name}.csr`, '-subj', `/CN=${cn}`],
      dir,
    );
    run(
      'openssl',
      [
        'x509',
        '-req',
        '-in',
        `${name}.csr`,
        '-CA',
        'ca.crt',
        '-CAkey',
        'ca.key',
        '-CAcreateserial',
        '-out',
        `${name}.crt`,
        '-days',
        '2',
        '-extfile',
        `${name}.ext`,
      ],
      dir,
    );
  };
  sign(
    'server',
    '127.0.0.1',
    'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n',
  );
  sign('client', 'weft-client', 'extendedKeyUsage=clientAuth\n');
  return {
    ca: join(dir, 'ca.crt'),
    serverCert: join(dir, 'server.crt'),
    serverKey: join(dir, 'server.key'),
    caFile: join(dir, 'ca.crt'),
    certFile: join(dir, 'client.crt'),
    keyFile: join(dir, 'client.key'),
  };
}

function waitExit(p: ChildProcess, ms: number): Promise<boolean> {
  if (p.exitCode !== null || p.signalCode !== null) return Promise.resolve(true);
  return new Promise((resolve) => {
    const t = setTimeout(() => resolve(false), ms);
    p.once('exit', () => {
      clearTimeout(t);
      resolve(true);
    });
  });
}

/** Starts etcd and waits until `etcdctl endpoint health` passes (15 s at most). */
export async function startEtcd(
  options: { tls?: boolean; netns?: string } = {},
): Promise<TestEtcd> {
  const reason = etcdSkipReason();
  if (reason) throw new Error(reason);
  const root = mkdtempSync(join(tmpdir(), 'weft-etcd-'));
  const dataDir = join(root, 'data');
  const logFile = join(root, 'etcd.log');
  // Inside a namespace: `ip netns exec NS cmd ...` (it execs cmd, so the pid stays etcd's).
  const inNs = (cmd: string, args: string[]): [string, string[]] =>
    options.netns ? ['ip', ['netns', 'exec', options.netns, cmd, ...args]] : [cmd, args];
  try {
    const [clientPort, peerPort] = [await freePort(), await freePort()];
    const certs = options.tls ? makeCertificates(root) : null;
    const scheme = certs ? 'https' : 'http';
    const endpoint = `${scheme}://127.0.0.1:${clientPort}`;
    const peer = `http://127.0.0.1:${peerPort}`;
    const args = [
      '--name=weft-test',
      `--data-dir=${dataDir}`,
      `--listen-client-urls=${endpoint}`,
      `--advertise-client-urls=${endpoint}`,
      `--listen-peer-urls=${peer}`,
      `--initial-advertise-peer-urls=${peer}`,
      `--initial-cluster=weft-test=${peer}`,
      '--initial-cluster-state=new',
      '--logger=zap',
      '--log-level=warn',
      ...(certs
        ? [
            `--cert-file=${certs.serverCert}`,
            `--key-file=${certs.serverKey}`,
            `--trusted-ca-file=${certs.ca}`,
            '--client-cert-auth',
          ]
        : []),
    ];
    const tls: EtcdTls | null = certs
      ? { caFile: certs.caFile, certFile: certs.certFile, keyFile: certs.keyFile }
      : null;
    const ctlBase = [
      `--endpoints=${endpoint}`,
      '--dial-timeout=2s',
      '--command-timeout=5s',
      ...(tls ? [`--cacert=${tls.caFile}`, `--cert=${tls.certFile}`, `--key=${tls.keyFile}`] : []),
    ];
    let defaultAuth: { username: string; password: string } | null = null;
    const ctl = (a: string[], given?: { username: string; password: string }): string => {
      const auth = given ?? defaultAuth;
      const r = spawnSync(
        ...inNs(ETCDCTL_BIN, [
          ...ctlBase,
          ...(auth ? [`--user=${auth.username}:${auth.password}`] : []),
          ...a,
        ]),
        {
          encoding: 'utf8',
          env: { ...process.env, ETCDCTL_API: '3' },
        },
      );
      if (r.status !== 0)
        throw new Error(`etcdctl ${a.join(' ')}: ${r.stderr || r.error?.message}`);
      return r.stdout;
    };

    let proc: ChildProcess | undefined;
    const launch = async () => {
      const fd = openSync(logFile, 'a');
      const p = spawn(...inNs(ETCD_BIN, args), { stdio: ['ignore', fd, fd] });
      proc = p;
      closeSync(fd);
      const deadline = Date.now() + 15_000;
      for (;;) {
        if (p.exitCode !== null)
          throw new Error(`etcd exited ${p.exitCode}:\n${readFileSync(logFile, 'utf8')}`);
        try {
          ctl(['endpoint', 'health']);
          return;
        } catch (err) {
          if (Date.now() > deadline) {
            throw new Error(
              `etcd not healthy within 15 s: ${(err as Error).message}\n${readFileSync(logFile, 'utf8')}`,
            );
          }
        }
        await new Promise((r) => setTimeout(r, 100));
      }
    };
    const kill = async () => {
      if (!proc || proc.exitCode !== null || proc.signalCode !== null) return;
      proc.kill('SIGTERM');
      if (!(await waitExit(proc, 5000))) {
        proc.kill('SIGKILL');
        await waitExit(proc, 5000);
      }
    };
    await launch().catch(async (err: unknown) => {
      await kill();
      throw err;
    });
    return {
      endpoint,
      dataDir,
      tls,
      ctl,
      useAuth: (auth) => {
        defaultAuth = auth;
      },
      restart: async () => {
        await kill();
        await launch();
      },
      stop: async () => {
        await kill();
        rmSync(root, { recursive: true, force: true });
      },
    };
  } catch (err) {
    rmSync(root, { recursive: true, force: true });
    throw err;
  }
}

/** Adds user `root` with `password` and turns authentication on. */
export function enableAuth(
  etcd: TestEtcd,
  password: string,
): { username: string; password: string } {
  etcd.ctl(['user', 'add', `root:${password}`, '--interactive=false']);
  try {
    etcd.ctl(['user', 'grant-role', 'root', 'root']);
  } catch {
    // etcd grants the root role to root on its own in some versions
  }
  etcd.ctl(['auth', 'enable']);
  const creds = { username: 'root', password };
  etcd.useAuth(creds);
  return creds;
}
