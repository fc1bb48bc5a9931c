/**
 * A loopback TCP proxy for tests of dead connections:
 *
 *   client ──▶ 127.0.0.1:<proxy port> ──▶ 127.0.0.1:<target port>
 *
 * `freeze()` stops forwarding on every connection open at that moment without closing it
 * (both sockets paused, nothing read, nothing written, no FIN, no RST): to the client the
 * connection is alive and silent, as a half-open connection or a stuck middlebox. Connections
 * made later are forwarded as usual. `count(text)` counts the client→target occurrences of a
 * byte string (e.g. an HTTP request line), across chunk boundaries.
 */
import { type Server, type Socket, connect, createServer } from 'node:net';

export interface TcpProxy {
  readonly port: number;
  readonly url: string;
  /** Stops forwarding on every current connection, leaving them open. */
  freeze(): void;
  /** How many times `text` went from a client to the target so far. */
  count(text: string): number;
  close(): Promise<void>;
}

export async function startTcpProxy(targetPort: number, scheme = 'http'): Promise<TcpProxy> {
  const pairs = new Set<{ client: Socket; upstream: Socket }>();
  const seen: Buffer[] = [];
  const server: Server = createServer((client) => {
    const upstream = connect(targetPort, '127.0.0.1');
    const pair = { client, upstream };
    pairs.add(pair);
    const end = () => {
      pairs.delete(pair);
      client.destroy();
      upstream.destroy();
    };
    client.on('data', (c: Buffer) => seen.push(c));
    client.pipe(upstream);
    upstream.pipe(client);
    client.on('error', end);
    upstream.on('error', end);
    client.on('close', end);
    upstream.on('close', end);
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve());
  });
  const port = (server.address() as { port: number }).port;
  return {
    port,
    url: `${scheme}://127.0.0.1:${port}`,
    freeze: () => {
      for (const { client, upstream } of pairs) {
        client.unpipe(upstream);
        upstream.unpipe(client);
        client.removeAllListeners('data');
        client.pause();
        upstream.pause();
      }
    },
    count: (text) => {
      const all = Buffer.concat(seen).toString('latin1');
      return all.split(text).length - 1;
    },
    close: async () => {
      for (const { client, upstream } of pairs) {
        client.destroy();
        upstream.destroy();
      }
      pairs.clear();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}
