import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { ERROR_CODES, WeftError, configError, usageError } from '../../../src/common/errors.js';

const doc = readFileSync(new URL('../../../docs/errors.md', import.meta.url), 'utf8');

test('every error code is documented in docs/errors.md', () => {
  const headings = new Set([...doc.matchAll(/^## (WEFT_ERR_[A-Z_]+)$/gm)].map((m) => m[1]));
  for (const code of Object.keys(ERROR_CODES))
    assert.ok(headings.has(code), `${code} undocumented`);
  for (const h of headings) assert.ok(h! in ERROR_CODES, `${h} documented but not defined`);
});

test('config errors name the field and exit 2', () => {
  const err = configError('SubnetLen', 'must be <= 30');
  assert.equal(err.message, 'SubnetLen: must be <= 30');
  assert.equal(err.code, 'WEFT_ERR_CONFIG_INVALID');
  assert.equal(err.exitCode, 2);
  assert.ok(err instanceof WeftError);
});

test('usage errors name the flag with its dashes', () => {
  assert.equal(usageError('iface', 'needs a value').message, '--iface: needs a value');
  assert.equal(usageError('-x', 'unknown flag').message, '-x: unknown flag');
});
