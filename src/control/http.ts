/**
 * The daemon's HTTP endpoint (--healthz-ip, --healthz-port; port 0 disables it):
 *   GET /healthz  200 while the process is serving
 *   GET /readyz   200 once the lease is held, subnet.env written and the backend running; else 503
 *   GET /metrics  Prometheus text format (prom-client's registry; collect hooks run per scrape)
 *
 * It must never take the daemon down: at most HTTP_MAX_CONNECTIONS connections are served at
 * once (more are accepted and closed at once, so a flood of clients cannot use up the fds the
 * dataplane and the control loops need), slow clients are cut after HTTP_REQUEST_TIMEOUT_MS, and
 * an accept error (EMFILE when the process is out of fds) is logged once and survived.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Registry } from '../common/metrics.js';
import { errorMessage } from '../common/errors.js';
import { LogOnce, logger } from '../common/log.js';

/** Connections served at once; Prometheus and the kubelet's probes need a few. */
export const HTTP_MAX_CONNECTIONS = 64;
/** A request must arrive whole within this (a slow client cannot hold a slot). */
export const HTTP_REQUEST_TIMEOUT_MS = 10_000;

export interface HealthServer {
  readonly port: number;
  close(): Promise<void>;
}

export async function startHealthServer(o: {
  host: string;
  port: number;
  metrics: Registry;
  isReady: () => boolean;
  /** Default HTTP_MAX_CONNECTIONS (tests lower it). */
  maxConnections?: number;
}): Promise<HealthServer> {
  const log = logger('http');
  const once = new LogOnce();
  const options = { requestTimeout: HTTP_REQUEST_TIMEOUT_MS, connectionsCheckingInterval: 1000 };
  const server: Server = createServer(options, (req, res) => {
    const path = (req.url ?? '/').split('?')[0];
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.writeHead(405, { allow: 'GET, HEAD' }).end();
      return;
    }
    if (path === '/healthz') {
      res.writeHead(200, { 'content-type': 'text/plain' }).end('ok\n');
    } else if (path === '/readyz') {
      const ready = o.isReady();
      res.writeHead(ready ? 200 : 503, { 'content-type': 'text/plain' });
      res.end(ready ? 'ready\n' : 'not ready\n');
    } else if (path === '/metrics') {
      o.metrics.metrics().then(
        (text) => res.writeHead(200, { 'content-type': o.metrics.contentType }).end(text),
        (err: unknown) => res.writeHead(500).end(String(err)),
      );
    } else {
      res.writeHead(404, { 'content-type': 'text/plain' }).end('not found\n');
    }
  });
  server.keepAliveTimeout = 1000;
  server.headersTimeout = HTTP_REQUEST_TIMEOUT_MS;
  server.maxConnections = o.maxConnections ?? HTTP_MAX_CONNECTIONS;
  server.on('drop', (d?: { remoteAddress?: string }) => {
    if (once.first('drop')) {
      log.warn(
        { maxConnections: server.maxConnections, remote: d?.remoteAddress },
        'http: too many connections; closing new ones until some end',
      );
    }
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(o.port, o.host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  // After listen, an error is an accept failure (EMFILE, ENFILE, ...): the server keeps
  // listening and the next connection is tried anew.
  server.on('error', (err) => {
    const code = (err as NodeJS.ErrnoException).code ?? 'error';
    if (once.first(`error:${code}`))
      log.warn({ err: errorMessage(err), code }, 'http: accept failed');
  });
  return {
    port: (server.address() as AddressInfo).port,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
