/**
 * The API server over HTTPS with its own CA, as a DaemonSet pod reaches it, and credentials that
 * rotate under a running client (kube-api.ts, kube-credentials.ts):
 *
 *   KubeApi ──HTTPS (CA "cluster-ca")──▶ FakeKubeApiServer on 127.0.0.1:<random>
 *     token file / client cert+key files        requires a bearer token, or a client
 *     rewritten by the test                     certificate of CA "client-ca" with a CN
 *
 * Certificates are made by openssl in a temp dir when the suite starts.
 */
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, renameSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { isWeftError } from '../../../../src/common/errors.js';
import { KubeApi, loadKubeConfig } from '../../../../src/control/kube/kube-api.js';
import { openKubeManager } from '../../../../src/control/kube/kube-manager.js';
import { createLeaseMetrics } from '../../../../src/control/metrics/metrics.js';
import { FakeKubeApiServer } from '../../../../src/testbed/kube-apiserver.js';
import { opensslSkipReason } from '../../../helpers/etcd.js';
import { type Pem, issue, makeCa } from '../../../helpers/tls-certs.js';

const skip = opensslSkipReason();
const dir = mkdtempSync(join(tmpdir(), 'weft-kube-tls-'));
let clusterCa: Pem;
let otherCa: Pem;
let clientCa: Pem;
let server127: Pem; // names IP:127.0.0.1 and kubernetes.default.svc
let serverElsewhere: Pem; // names only kubernetes.default.svc

before(() => {
  if (skip) return;
  clusterCa = makeCa(dir, 'cluster-ca');
  otherCa = makeCa(dir, 'other-ca');
  clientCa = makeCa(dir, 'client-ca');
  server127 = issue(dir, clusterCa, 'apiserver', {
    cn: 'kube-apiserver',
    altNames: 'IP:127.0.0.1,DNS:kubernetes.default.svc',
  });
  serverElsewhere = issue(dir, clusterCa, 'apiserver-dns', {
    cn: 'kube-apiserver',
    altNames: 'DNS:kubernetes.default.svc',
  });
});
after(() => rmSync(dir, { recursive: true, force: true }));

/** A service-account mount: ca.crt and token, as the kubelet projects them. */
function mount(name: string, ca: Pem, token: string): string {
  const sa = join(dir, name);
  mkdirSync(sa);
  writeFileSync(join(sa, 'ca.crt'), ca.cert);
  writeFileSync(join(sa, 'token'), token);
  return sa;
}

/** The kubelet's way of replacing a projected file: write aside, rename over (a new inode). */
function replaceFile(path: string, content: string | Buffer): void {
  writeFileSync(`${path}.new`, content);
  renameSync(`${path}.new`, path);
}

function inClusterApi(server: FakeKubeApiServer, sa: string): KubeApi {
  return new KubeApi(
    loadKubeConfig({
      env: { KUBERNETES_SERVICE_HOST: '127.0.0.1', KUBERNETES_SERVICE_PORT: String(server.port) },
      serviceAccountDir: sa,
    }),
  );
}

describe('in a pod: HTTPS with the service account CA and token', { skip }, () => {
  let server: FakeKubeApiServer;
  before(async () => {
    server = await FakeKubeApiServer.start({
      token: 'sa-token-1',
      tls: { cert: server127.cert, key: server127.key },
    });
    server.addNode({ name: 'n1', podCIDR: '10.5.1.0/24' });
  });
  after(() => server?.close());

  test('reaches the API server with the mounted CA and token', async () => {
    const api = inClusterApi(server, mount('sa-ok', clusterCa, 'sa-token-1\n'));
    assert.match(api.server, /^https:\/\/127\.0\.0\.1:/);
    assert.equal((await api.getNode('n1')).metadata.name, 'n1');
  });

  test('a CA that did not sign the server fails with WEFT_ERR_KUBE_TLS naming the CA file', async () => {
    const sa = mount('sa-wrong-ca', otherCa, 'sa-token-1\n');
    const err = await inClusterApi(server, sa)
      .getNode('n1')
      .then(
        () => assert.fail('answered'),
        (e: unknown) => e,
      );
    assert.ok(isWeftError(err, 'WEFT_ERR_KUBE_TLS'), String(err));
    assert.ok(err.message.includes(join(sa, 'ca.crt')), err.message);
    assert.match(err.message, /not signed by the CA/);
  });

  test('a rotated token is used: a new file at once, and after a 401 an in-place rewrite', async () => {
    const sa = mount('sa-rotate', clusterCa, 'sa-token-1\n');
    const api = inClusterApi(server, sa);
    assert.equal((await api.getNode('n1')).metadata.name, 'n1');
    // The kubelet's rotation: a new file renamed over the old one.
    server.setToken('sa-token-2');
    replaceFile(join(sa, 'token'), 'sa-token-2\n');
    assert.equal((await api.getNode('n1')).metadata.name, 'n1');
    // Rewritten in place with the same size and mtime: nothing to see on a stat, so the stale
    // token is sent, refused with 401, and the file read again for the one retry.
    const token = join(sa, 'token');
    const tick = new Date('2026-01-01T00:00:00Z'); // whole seconds: set again exactly below
    utimesSync(token, tick, tick);
    assert.equal((await api.getNode('n1')).metadata.name, 'n1');
    server.setToken('sa-token-3');
    writeFileSync(token, 'sa-token-3\n');
    utimesSync(token, tick, tick);
    const before = server.requests.length;
    assert.equal((await api.getNode('n1')).metadata.name, 'n1');
    assert.equal(server.requests.length - before, 2, 'refused once, then sent again');
  });
});

describe('the kube subnet manager in a pod (as the DaemonSet starts it)', { skip }, () => {
  let server: FakeKubeApiServer;
  before(async () => {
    server = await FakeKubeApiServer.start({
      token: 'sa-token',
      tls: { cert: server127.cert, key: server127.key },
    });
    server.addNode({ name: 'n1', podCIDR: '10.5.1.0/24' });
    writeFileSync(
      join(dir, 'net-conf.json'),
      JSON.stringify({ Network: '10.5.0.0/16', Backend: { Type: 'vxlan' } }),
    );
  });
  after(() => server?.close());

  const open = (sa: string) =>
    openKubeManager(
      {
        kubeApiUrl: '',
        kubeconfigFile: '',
        kubeAnnotationPrefix: 'flannel.alpha.coreos.com',
        netConfigPath: join(dir, 'net-conf.json'),
        setNodeNetworkUnavailable: true,
        env: {
          NODE_NAME: 'n1',
          KUBERNETES_SERVICE_HOST: '127.0.0.1',
          KUBERNETES_SERVICE_PORT: String(server.port),
        },
        serviceAccountDir: sa,
      },
      createLeaseMetrics(),
    );

  test('starts over HTTPS with the service account', async () => {
    const m = await open(mount('sa-manager', clusterCa, 'sa-token\n'));
    try {
      assert.equal(m.nodeName, 'n1');
    } finally {
      await m.close();
    }
  });

  test('a wrong CA stops it at start with WEFT_ERR_KUBE_TLS naming the CA file', async () => {
    const sa = mount('sa-manager-wrong-ca', otherCa, 'sa-token\n');
    const before = server.requests.length;
    await assert.rejects(
      open(sa),
      (e) => isWeftError(e, 'WEFT_ERR_KUBE_TLS') && e.message.includes(join(sa, 'ca.crt')),
    );
    assert.equal(server.requests.length, before, 'no request got past the handshake');
  });
});

describe('a server certificate that does not name the address', { skip }, () => {
  let server: FakeKubeApiServer;
  before(async () => {
    server = await FakeKubeApiServer.start({
      tls: { cert: serverElsewhere.cert, key: serverElsewhere.key },
    });
    server.addNode({ name: 'n1', podCIDR: '10.5.1.0/24' });
  });
  after(() => server?.close());

  test('fails with WEFT_ERR_KUBE_TLS naming the name expected', async () => {
    const sa = mount('sa-wrong-name', clusterCa, 'tok\n');
    const err = await inClusterApi(server, sa)
      .getNode('n1')
      .then(
        () => assert.fail('answered'),
        (e: unknown) => e,
      );
    assert.ok(isWeftError(err, 'WEFT_ERR_KUBE_TLS'), String(err));
    assert.match(err.message, /does not name "127\.0\.0\.1"/);
    assert.match(err.message, /kubernetes\.default\.svc/);
  });

  test("the kubeconfig's tls-server-name is the name checked instead", async () => {
    writeFileSync(join(dir, 'cluster-ca.pem'), clusterCa.cert);
    const kc = join(dir, 'kubeconfig-server-name');
    writeFileSync(
      kc,
      [
        'current-context: c',
        'clusters:',
        '- name: k',
        '  cluster:',
        `    server: ${server.url}`,
        '    certificate-authority: cluster-ca.pem',
        '    tls-server-name: kubernetes.default.svc',
        'contexts: [{name: c, context: {cluster: k}}]',
      ].join('\n') + '\n',
    );
    const api = new KubeApi(loadKubeConfig({ kubeconfigFile: kc }));
    assert.equal((await api.getNode('n1')).metadata.name, 'n1');
  });
});

describe('a kubeconfig client certificate that rotates', { skip }, () => {
  let server: FakeKubeApiServer;
  before(async () => {
    server = await FakeKubeApiServer.start({
      tls: { cert: server127.cert, key: server127.key, clientCa: clientCa.cert },
    });
    server.addNode({ name: 'n1', podCIDR: '10.5.1.0/24' });
  });
  after(() => server?.close());

  test('the new certificate and key are presented once the files change', async () => {
    const first = issue(dir, clientCa, 'node-1', { cn: 'system:node:n1:1' });
    const second = issue(dir, clientCa, 'node-2', { cn: 'system:node:n1:2' });
    const certFile = join(dir, 'kubelet-client.crt');
    const keyFile = join(dir, 'kubelet-client.key');
    writeFileSync(certFile, first.cert);
    writeFileSync(keyFile, first.key);
    const kc = join(dir, 'kubeconfig-rotating');
    writeFileSync(
      kc,
      [
        'current-context: c',
        'clusters:',
        '- name: k',
        '  cluster:',
        `    server: ${server.url}`,
        '    certificate-authority: cluster-ca.crt',
        'users:',
        '- name: u',
        '  user: {client-certificate: kubelet-client.crt, client-key: kubelet-client.key}',
        'contexts: [{name: c, context: {cluster: k, user: u}}]',
      ].join('\n') + '\n',
    );
    const api = new KubeApi(loadKubeConfig({ kubeconfigFile: kc }));
    server.requireClientCn('system:node:n1:1');
    assert.equal((await api.getNode('n1')).metadata.name, 'n1');

    // The server now takes only the new certificate; the client's pooled connection still
    // carries the old one.
    server.requireClientCn('system:node:n1:2');
    await assert.rejects(api.getNode('n1'), /401/);
    // Half a rotation (the certificate written, its key not yet): the old pair stays in use.
    replaceFile(certFile, second.cert);
    await assert.rejects(api.getNode('n1'), /401/);
    replaceFile(keyFile, second.key);
    assert.equal((await api.getNode('n1')).metadata.name, 'n1');
  });
});
