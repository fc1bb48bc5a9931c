import assert from 'node:assert/strict';
import { test } from 'node:test';
import { jsonField } from '../../../src/common/json-field.js';

test('jsonField matches names case-insensitively', () => {
  assert.equal(jsonField({ vni: 7 }, 'VNI'), 7);
  assert.equal(jsonField({ Port: 1 }, 'port'), 1);
  assert.equal(jsonField({ Other: 1 }, 'Port'), undefined);
});

test('jsonField: the last matching key wins, exact or not (as Go decodes each in order)', () => {
  assert.equal(jsonField({ Port: 1, port: 2 }, 'Port'), 2);
  assert.equal(jsonField({ port: 1, Port: 2 }, 'Port'), 2);
  assert.equal(jsonField({ PORT: 1, Port: 2, port: 3 }, 'Port'), 3);
});

test('jsonField: null leaves the field as it was', () => {
  assert.equal(jsonField({ Type: null }, 'Type'), undefined);
  assert.equal(jsonField({ Type: 'vxlan', type: null }, 'Type'), 'vxlan');
});

test('jsonField: a key that folds to the name matches, as with Go (the Kelvin sign K is k)', () => {
  assert.equal(jsonField({ 'Bac\u212Aend': 1 }, 'Backend'), 1);
  assert.equal(jsonField({ Backend: 1, 'BAC\u212AEND': 2 }, 'backend'), 2);
});

test('jsonField: only the object own keys are read, not inherited ones', () => {
  const inherited = Object.create({ Port: 1 }) as Record<string, unknown>;
  assert.equal(jsonField(inherited, 'Port'), undefined);
  const parsed = JSON.parse('{"__proto__": {"Port": 1}, "port": 2}') as Record<string, unknown>;
  assert.equal(jsonField(parsed, 'Port'), 2);
});
