/**
 * Test certificates made at test time with the `openssl` CLI (Debian openssl, in
 * scripts/setup.mjs TEST_PACKAGES) into a directory the caller owns and removes: a CA, and
 * leaves it signs for a server (subjectAltName) or a client (CN). EC P-256 keys, valid 2 days.
 */
import { spawnSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

export interface Pem {
  readonly certFile: string;
  readonly keyFile: string;
  readonly cert: Buffer;
  readonly key: Buffer;
}

function openssl(dir: string, args: string[]): void {
  const r = spawnSync('openssl', args, { cwd: dir, encoding: 'utf8' });
  if (r.status !== 0) {
    throw new Error(`openssl ${args.join(' ')} failed: ${r.stderr || r.error?.message}`);
  }
}

const EC = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];

const read = (dir: string, name: string): Pem => ({
  certFile: join(dir, `${name}.crt`),
  keyFile: join(dir, `${name}.key`),
  cert: readFileSync(join(dir, `${name}.crt`)),
  key: readFileSync(join(dir, `${name}.key`)),
});

/** A self-signed CA `<name>.crt` / `<name>.key` in `dir`. */
export function makeCa(dir: string, name: string): Pem {
  openssl(dir, [
    'req',
    '-x509',
    ...EC,
    '-keyout',
    `${name}.key`,
    '-out',
    `${name}.crt`,
    '-days',
    '2',
    '-subj',
    `/CN=${name}`,
  ]);
  return read(dir, name);
}

/**
 * A certificate `<name>.crt` / `<name>.key` signed by `ca`: a server's when `altNames` is given
 * (e.g. `IP:127.0.0.1,DNS:kubernetes.default.svc`), else a client's with CN `cn`.
 */
export function issue(
  dir: string,
  ca: Pem,
  name: string,
  o: { cn: string; altNames?: string },
): Pem {
  const ext = o.altNames
    ? `subjectAltName=${o.altNames}\nextendedKeyUsage=serverAuth\n`
    : 'extendedKeyUsage=clientAuth\n';
  writeFileSync(join(dir, `${name}.ext`), ext);
  openssl(dir, [
    'req',
    ...EC,
    '-keyout',
    `${name}.key`,
    '-out',
    `${name}.csr`,
    '-subj',
    `/CN=${o.cn}`,
  ]);
  openssl(dir, [
    'x509',
    '-req',
    '-in',
    `${name}.csr`,
    '-CA',
    ca.certFile,
    '-CAkey',
    ca.keyFile,
    '-CAcreateserial',
    '-out',
    `${name}.crt`,
    '-days',
    '2',
    '-extfile',
    `${name}.ext`,
  ]);
  return read(dir, name);
}
