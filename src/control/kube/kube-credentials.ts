/**
 * The credentials of a connection to the API server that change under a running daemon, kept
 * current as client-go keeps them:
 *
 * - A token file (in a pod the service account's `token`, which the kubelet rotates; a
 *   kubeconfig's `tokenFile`) is read again when its inode, size or mtime changed since the last
 *   read (one stat per request), and after a 401 in any case: a token rewritten in place within
 *   the same mtime tick is picked up by the retry the 401 earns.
 * - A client certificate and key given as files (a kubeconfig's `client-certificate` /
 *   `client-key`, which the kubelet's certificate rotation rewrites) are read again when either
 *   file changed. A new pair that does not match (the certificate written, its key not yet) is
 *   not used until it does; the previous pair stays. When the pair changes, the connections made
 *   with the old one are closed (client-go does the same), so every request after a rotation
 *   presents the new certificate.
 *
 * TLS failures are told apart (WEFT_ERR_KUBE_TLS): a server certificate not signed by the CA in
 * use (the message names the CA file), one that does not name the server (it names the name
 * expected), an expired one, or our client certificate refused (it names the file).
 */
import { stat, readFile } from 'node:fs/promises';
import https from 'node:https';
import { createSecureContext } from 'node:tls';
import { WeftError, errorMessage } from '../../common/errors.js';
import { logger } from '../../common/log.js';

const log = logger('kube');

/**
 * How to reach the API server: its URL, the TLS material, and the auth header of each request
 * (token and certificate files are read again when they change). Built by kube-api.ts's
 * loadKubeConfig, which re-exports it.
 */
export interface KubeConnection {
  readonly server: URL;
  readonly tls: {
    readonly ca?: Buffer;
    readonly cert?: Buffer;
    readonly key?: Buffer;
    readonly servername?: string;
    readonly rejectUnauthorized: boolean;
  };
  /** The file `tls.ca` was read from (named in TLS errors); absent: inline data or the system roots. */
  readonly caFile?: string;
  /** The files `tls.cert` / `tls.key` were read from: re-read when they change. */
  readonly certFile?: string;
  readonly keyFile?: string;
  readonly token?: string;
  readonly tokenFile?: string;
  readonly basic?: { readonly username: string; readonly password: string };
}

/** A file's identity for change detection: inode, size, mtime. */
async function signature(path: string): Promise<string> {
  const st = await stat(path);
  return `${st.ino}:${st.size}:${st.mtimeMs}`;
}

export class KubeCredentials {
  readonly #m: KubeConnection;
  #token: { sig: string; value: string } | null = null;
  #pair: { sig: string; cert: Buffer; key: Buffer } | null = null;
  #agent: https.Agent | null = null;

  constructor(m: KubeConnection) {
    this.#m = m;
    if (m.tls.cert && m.tls.key) this.#pair = { sig: '', cert: m.tls.cert, key: m.tls.key };
  }

  /** The Authorization header of a request (none without credentials). */
  async authorization(): Promise<string | undefined> {
    const m = this.#m;
    if (m.tokenFile !== undefined) return `Bearer ${await this.#readToken(false)}`;
    if (m.token !== undefined) return `Bearer ${m.token}`;
    if (m.basic) {
      return `Basic ${Buffer.from(`${m.basic.username}:${m.basic.password}`).toString('base64')}`;
    }
    return undefined;
  }

  /**
   * After a 401 to a request that carried `used`: reads the token file again; true when it now
   * holds another token (the request is worth sending once more).
   */
  async refreshAfterUnauthorized(used: string | undefined): Promise<boolean> {
    if (this.#m.tokenFile === undefined) return false;
    const now = await this.#readToken(true).catch(() => undefined);
    return now !== undefined && `Bearer ${now}` !== used;
  }

  async #readToken(force: boolean): Promise<string> {
    const file = this.#m.tokenFile!;
    let sig: string;
    let value: string;
    try {
      sig = await signature(file);
      if (!force && this.#token?.sig === sig) return this.#token.value;
      value = (await readFile(file, 'utf8')).trim();
    } catch (err) {
      // Gone for a moment while it is replaced: the token read last is still the best guess.
      if (this.#token === null) throw err;
      log.debug({ file, err: errorMessage(err) }, 'token file unreadable; using the last token');
      return this.#token.value;
    }
    if (this.#token !== null && this.#token.value !== value) {
      log.info({ file }, 'kubernetes token file changed; using the new token');
    }
    this.#token = { sig, value };
    return value;
  }

  /**
   * The TLS options and agent of an HTTPS request: the client certificate and key as they are
   * on disk now (see the head of the file).
   */
  async tls(): Promise<https.RequestOptions> {
    const m = this.#m;
    if (m.certFile !== undefined && m.keyFile !== undefined) {
      await this.#reloadPair().catch((err: unknown) => {
        // Unreadable for a moment while replaced: keep the pair in use (there is one from start).
        if (this.#pair === null) throw err;
        log.debug(
          { certFile: m.certFile, err: errorMessage(err) },
          'client certificate unreadable',
        );
      });
    }
    // As Node's global agent (what these requests used before they had one of their own).
    this.#agent ??= new https.Agent({ keepAlive: true, scheduling: 'lifo', timeout: 5000 });
    return {
      ...m.tls,
      ...(this.#pair ? { cert: this.#pair.cert, key: this.#pair.key } : {}),
      agent: this.#agent,
    };
  }

  async #reloadPair(): Promise<void> {
    const certFile = this.#m.certFile!;
    const keyFile = this.#m.keyFile!;
    const sig = `${await signature(certFile)}/${await signature(keyFile)}`;
    if (this.#pair?.sig === sig) return;
    const [cert, key] = await Promise.all([readFile(certFile), readFile(keyFile)]);
    if (this.#pair && this.#pair.cert.equals(cert) && this.#pair.key.equals(key)) {
      this.#pair = { ...this.#pair, sig };
      return;
    }
    try {
      createSecureContext({ cert, key }); // throws when the key does not match the certificate
    } catch (err) {
      if (this.#pair === null) throw err;
      log.debug(
        { certFile, keyFile, err: errorMessage(err) },
        'client certificate and key do not match (mid-rotation?); keeping the previous pair',
      );
      return;
    }
    const had = this.#pair !== null;
    this.#pair = { sig, cert, key };
    if (had) log.info({ certFile }, 'kubernetes client certificate changed; reconnecting with it');
    this.#agent?.destroy(); // the connections made with the old certificate
    this.#agent = null;
  }

  /** A TLS failure of a request as WEFT_ERR_KUBE_TLS naming what to check; else undefined. */
  tlsError(err: unknown, what: string): WeftError | undefined {
    const e = err as NodeJS.ErrnoException & { host?: string; cert?: { subjectaltname?: string } };
    const code = typeof e?.code === 'string' ? e.code : '';
    const m = this.#m;
    const origin = m.server.origin;
    const details = { server: origin, tlsCode: code };
    const ca =
      m.caFile ?? (m.tls.ca ? 'the inline certificate-authority-data' : "the system's roots");
    let message: string | undefined;
    if (code === 'ERR_TLS_CERT_ALTNAME_INVALID') {
      const expected = m.tls.servername ?? m.server.hostname.replace(/^\[|\]$/g, '');
      message =
        `the API server's certificate does not name ${JSON.stringify(expected)} ` +
        `(it names ${e.cert?.subjectaltname ?? 'nothing'}); set tls-server-name to a name it ` +
        'carries, or use the address the certificate was issued for';
      Object.assign(details, { expectedName: expected });
    } else if (
      /^(UNABLE_TO_VERIFY_LEAF_SIGNATURE|SELF_SIGNED_CERT_IN_CHAIN|DEPTH_ZERO_SELF_SIGNED_CERT|UNABLE_TO_GET_ISSUER_CERT(_LOCALLY)?|CERT_SIGNATURE_FAILURE|CERT_UNTRUSTED)$/.test(
        code,
      )
    ) {
      message = `the API server's certificate is not signed by the CA in ${ca} (${code})`;
      Object.assign(details, { caFile: m.caFile });
    } else if (code === 'CERT_HAS_EXPIRED' || code === 'CERT_NOT_YET_VALID') {
      message = `the API server's certificate is not valid now (${code})`;
    } else if (
      /ALERT_(BAD_CERTIFICATE|CERTIFICATE_REQUIRED|UNKNOWN_CA|CERTIFICATE_EXPIRED|CERTIFICATE_UNKNOWN|CERTIFICATE_REVOKED)/.test(
        code,
      )
    ) {
      message = `the API server refused our client certificate ${m.certFile ?? '(inline client-certificate-data)'} (${code})`;
      Object.assign(details, { certFile: m.certFile });
    }
    if (message === undefined) return undefined;
    return new WeftError('WEFT_ERR_KUBE_TLS', `kubernetes ${what}: ${origin}: ${message}`, {
      cause: err,
      details,
    });
  }
}
