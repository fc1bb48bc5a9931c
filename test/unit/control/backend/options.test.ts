// Backend options: every registered backend has a list, each listed option is really parsed by its
// backend (a bad value for it is refused), and anything else is reported as unsupported.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { isWeftError } from '../../../../src/common/errors.js';
import { parseNetConfig } from '../../../../src/control/config/net-config.js';
import {
  BACKEND_OPTIONS,
  unsupportedBackendOptions,
} from '../../../../src/control/backend/options.js';
import { knownBackends } from '../../../../src/control/backend/registry.js';
import { parseIpipConfig } from '../../../../src/control/backend/ipip.js';
import { parseUdpConfig } from '../../../../src/control/backend/udp.js';
import { parseVxlanConfig } from '../../../../src/control/backend/vxlan.js';
import { parseExtensionConfig } from '../../../../src/control/backend/extension.js';

const backend = (block: Record<string, unknown>) =>
  parseNetConfig(JSON.stringify({ Network: '10.5.0.0/16', Backend: block })).backend;

test('every registered backend has an option list', () => {
  for (const type of knownBackends()) assert.ok(BACKEND_OPTIONS[type], type);
});

test('each listed option is parsed: a wrong-typed value for it is refused', () => {
  const parsers: Record<string, (raw: Record<string, unknown>) => unknown> = {
    udp: parseUdpConfig,
    ipip: parseIpipConfig,
    'ipip-userspace': parseIpipConfig,
    vxlan: parseVxlanConfig,
    'vxlan-userspace': parseVxlanConfig,
    extension: parseExtensionConfig,
  };
  // the extension backend's options are strings (commands): a number is the wrong type there
  const badValue = (type: string) => (type === 'extension' ? 42 : 'not-a-valid-value');
  for (const [type, options] of Object.entries(BACKEND_OPTIONS)) {
    for (const option of options) {
      const parse = parsers[type];
      assert.ok(parse, `no parser known for ${type}`);
      assert.throws(
        () => parse({ Type: type, [option]: badValue(type) }),
        (err: unknown) => isWeftError(err) && err.message.includes(`Backend.${option}`),
        `${type} ${option}`,
      );
    }
  }
});

test('options a backend does not read are named as written; known ones in any case are not', () => {
  assert.deepEqual(
    unsupportedBackendOptions(
      backend({ type: 'VXLAN', vni: 4, PORT: 4789, MacPrefix: '0E:2A', Learning: true, VIN: 2 }),
    ),
    ['MacPrefix', 'VIN'],
  );
  assert.deepEqual(unsupportedBackendOptions(backend({ Type: 'host-gw', Port: 1 })), ['Port']);
  assert.deepEqual(unsupportedBackendOptions(backend({ Type: 'udp', Port: 8285 })), []);
  assert.deepEqual(unsupportedBackendOptions(backend({ Type: 'alloc' })), []);
  // A type this table does not know (a backend a test registers) reports nothing.
  assert.deepEqual(unsupportedBackendOptions(backend({ Type: 'carrier-pigeon', X: 1 })), []);
});
