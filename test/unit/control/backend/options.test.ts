// Backend options: every registered backend has a list, each listed option is really parsed by the
// parser of the same spec (a bad value for it is refused), and anything else is reported as
// unsupported.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { isWeftError } from '../../../../src/common/errors.js';
import { parseNetConfig } from '../../../../src/control/config/net-config.js';
import {
  BACKEND_OPTIONS,
  unsupportedBackendOptions,
} from '../../../../src/control/backend/options.js';
import { backendSpecs, knownBackends } from '../../../../src/control/backend/registry.js';

const backend = (block: Record<string, unknown>) =>
  parseNetConfig(JSON.stringify({ Network: '10.5.0.0/16', Backend: block })).backend;

test('every registered backend has an option list', () => {
  for (const type of knownBackends()) assert.ok(BACKEND_OPTIONS[type], type);
});

test('each listed option is parsed by its spec: a wrong-typed value for it is refused', () => {
  // the extension backend's options are strings (commands): a number is the wrong type there
  const badValue = (type: string) => (type === 'extension' ? 42 : 'not-a-valid-value');
  for (const { type, options, parseConfig: parse } of backendSpecs()) {
    for (const option of options) {
      assert.ok(parse, `${type} lists options but has no parser`);
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
