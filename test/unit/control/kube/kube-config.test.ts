/** How weft reaches the API server without a Kubernetes client library (kube-api.ts). */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync, mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { isWeftError } from '../../../../src/common/errors.js';
import { KubeApi, loadKubeConfig } from '../../../../src/control/kube/kube-api.js';
import { FakeKubeApiServer } from '../../../../src/testbed/kube-apiserver.js';

const dir = mkdtempSync(join(tmpdir(), 'weft-kubeconfig-'));
after(() => rmSync(dir, { recursive: true, force: true }));

function kubeconfig(name: string, lines: string[]): string {
  const f = join(dir, name);
  writeFileSync(f, lines.join('\n') + '\n');
  return f;
}

describe('loadKubeConfig', () => {
  test("a kubeconfig's current context: CA file beside it, client certificate data, TLS name", () => {
    writeFileSync(join(dir, 'ca.pem'), 'CA PEM');
    const f = kubeconfig('tls', [
      'apiVersion: v1',
      'kind: Config',
      'current-context: b',
      'clusters:',
      '- name: one',
      '  cluster: {server: "https://10.0.0.1:6443"}',
      '- name: two',
      '  cluster:',
      '    server: https://10.0.0.2:6443',
      '    certificate-authority: ca.pem',
      '    tls-server-name: api.example',
      'users:',
      '- name: u',
      '  user:',
      `    client-certificate-data: ${Buffer.from('CERT').toString('base64')}`,
      `    client-key-data: ${Buffer.from('KEY').toString('base64')}`,
      'contexts:',
      '- {name: a, context: {cluster: one, user: u}}',
      '- {name: b, context: {cluster: two, user: u}}',
    ]);
    const c = loadKubeConfig({ kubeconfigFile: f });
    assert.equal(c.server.href, 'https://10.0.0.2:6443/');
    assert.equal(c.tls.ca?.toString(), 'CA PEM');
    assert.equal(c.tls.cert?.toString(), 'CERT');
    assert.equal(c.tls.key?.toString(), 'KEY');
    assert.equal(c.tls.servername, 'api.example');
    assert.equal(c.tls.rejectUnauthorized, true);
    // --kube-api-url beside it: that server, the kubeconfig's credentials
    const o = loadKubeConfig({ kubeconfigFile: f, apiUrl: 'https://10.9.9.9:443' });
    assert.equal(o.server.href, 'https://10.9.9.9/');
    assert.equal(o.tls.cert?.toString(), 'CERT');
  });

  test('an exec or auth-provider plugin is refused, naming it', () => {
    const f = kubeconfig('exec', [
      'current-context: c',
      'clusters: [{name: k, cluster: {server: "https://10.0.0.1"}}]',
      'users: [{name: u, user: {exec: {command: aws}}}]',
      'contexts: [{name: c, context: {cluster: k, user: u}}]',
    ]);
    assert.throws(
      () => loadKubeConfig({ kubeconfigFile: f }),
      (e) => isWeftError(e, 'WEFT_ERR_STORE_UNAVAILABLE') && /exec plugin/.test(e.message),
    );
  });

  test('in a pod: the service address, the service account CA and token file', () => {
    const sa = join(dir, 'sa');
    mkdirSync(sa);
    writeFileSync(join(sa, 'ca.crt'), 'SA CA');
    writeFileSync(join(sa, 'token'), 'tok');
    const c = loadKubeConfig({
      env: { KUBERNETES_SERVICE_HOST: 'fd00::1', KUBERNETES_SERVICE_PORT: '443' },
      serviceAccountDir: sa,
    });
    assert.equal(c.server.href, 'https://[fd00::1]/');
    assert.equal(c.tls.ca?.toString(), 'SA CA');
    assert.equal(c.tokenFile, join(sa, 'token'));
  });

  test('nothing to go by is WEFT_ERR_STORE_UNAVAILABLE saying what to give', () => {
    assert.throws(
      () => loadKubeConfig({ env: {} }),
      (e) => isWeftError(e, 'WEFT_ERR_STORE_UNAVAILABLE') && /--kube-api-url/.test(e.message),
    );
  });
});

test('a token file is read for each request (a rotated token is used at once)', async () => {
  const server = await FakeKubeApiServer.start({ token: 'second' });
  try {
    server.addNode({ name: 'n1', podCIDR: '10.5.1.0/24' });
    const tokenFile = join(dir, 'rotating-token');
    writeFileSync(tokenFile, 'first\n');
    const api = new KubeApi({
      server: new URL(server.url),
      tls: { rejectUnauthorized: true },
      tokenFile,
    });
    await assert.rejects(api.getNode('n1'), /401/);
    writeFileSync(tokenFile, 'second\n');
    assert.equal((await api.getNode('n1')).metadata.name, 'n1');
  } finally {
    await server.close();
  }
});
