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
