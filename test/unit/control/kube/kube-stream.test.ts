/**
 * The readers of API server responses in pieces: a list's items found one by one as their bytes
 * arrive (whatever the chunking), a watch stream's lines, and the cap on one object.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { isWeftError } from '../../../../src/common/errors.js';
import { LineSplitter, ListScanner } from '../../../../src/control/kube/kube-stream.js';

const ITEMS = [
  { metadata: { name: 'a', annotations: { q: 'say "hi" \\ {not a [bracket' } } },
  { metadata: { name: 'b\u00e9\u4e2d' }, status: { images: [{ names: ['x]}'] }, [], {}] } },
  { metadata: { name: 'c', annotations: { e: '\\"', f: '\\\\' } }, spec: { podCIDRs: [] } },
];
/** metadata before and after items, as any member order is valid JSON */
const LIST =
  ` {"kind":"NodeList","apiVersion":"v1","metadata":{"resourceVersion":"42","continue":"t\\"k"},` +
  `"items":[ ${ITEMS.map((i) => JSON.stringify(i)).join(' ,\n')} ],"extra":[1,{"x":"]"}]} `;

function scan(bytes: Buffer, cut: number[], max = 1 << 20) {
  const items: unknown[] = [];
  const s = new ListScanner((b) => items.push(JSON.parse(b)), max);
  let at = 0;
  for (const c of [...cut, bytes.length]) {
    s.push(bytes.subarray(at, c));
    at = c;
  }
  s.end();
  return { items, top: s.top };
}

test('every item and the list metadata, whatever the chunk boundaries', () => {
  const bytes = Buffer.from(LIST, 'utf8');
  const whole = scan(bytes, []);
  assert.deepEqual(whole.items, ITEMS);
  assert.deepEqual(whole.top.metadata, { resourceVersion: '42', continue: 't"k' });
  assert.deepEqual(whole.top.extra, [1, { x: ']' }]);
  // cut at every byte (inside escapes, multi-byte characters, keys), and into single bytes
  for (let i = 1; i < bytes.length; i++) assert.deepEqual(scan(bytes, [i]), whole, `cut at ${i}`);
  const singles = Array.from({ length: bytes.length - 1 }, (_, i) => i + 1);
  assert.deepEqual(scan(bytes, singles), whole);
});

test('one item over the cap is refused before the rest of it has arrived', () => {
  const big = JSON.stringify({ metadata: { name: 'x', pad: 'p'.repeat(10_000) } });
  const s = new ListScanner(() => assert.fail('no item'), 4096);
  s.push(Buffer.from('{"metadata":{},"items":['));
  let pushed = 0;
  assert.throws(
    () => {
      for (; pushed < big.length; pushed += 512)
        s.push(Buffer.from(big.slice(pushed, pushed + 512)));
    },
    (err) => isWeftError(err, 'WEFT_ERR_STORE_RESPONSE_TOO_LARGE') && /4096/.test(err.message),
  );
  assert.ok(pushed <= 4096 + 512, `refused after ${pushed} bytes`);
});

test('a list cut short is an error, not a shorter list', () => {
  const bytes = Buffer.from(LIST, 'utf8');
  const s = new ListScanner(() => undefined, 1 << 20);
  s.push(bytes.subarray(0, bytes.length - 20));
  assert.throws(
    () => s.end(),
    (err) => isWeftError(err, 'WEFT_ERR_STORE_UNAVAILABLE'),
  );
  const t = new ListScanner(() => undefined, 1 << 20);
  assert.throws(
    () => t.push(Buffer.from('[1,2]')),
    (err) =>
      isWeftError(err, 'WEFT_ERR_STORE_UNAVAILABLE') && /not a JSON object/.test(err.message),
  );
});

test('lines across chunks, and one line over the cap refused before its newline', () => {
  const l = new LineSplitter(64);
  assert.deepEqual(l.push(Buffer.from('{"a":1}\n{"b"')).map(String), ['{"a":1}']);
  assert.deepEqual(l.push(Buffer.from(':2}\n\n{"c":3}\n')).map(String), ['{"b":2}', '', '{"c":3}']);
  l.push(Buffer.from('x'.repeat(40)));
  assert.throws(
    () => l.push(Buffer.from('x'.repeat(40))),
    (err) => isWeftError(err, 'WEFT_ERR_STORE_RESPONSE_TOO_LARGE'),
  );
  assert.throws(
    () => new LineSplitter(64).push(Buffer.from('y'.repeat(100) + '\n')),
    (err) => isWeftError(err, 'WEFT_ERR_STORE_RESPONSE_TOO_LARGE'),
  );
});

const KEEP = { metadata: { annotations: true, finalizers: true }, spec: true } as const;
const CUT_ITEMS = [
  {
    kind: 'Node',
    metadata: {
      name: 'a',
      labels: { x: '{"not":"a key"}' },
      annotations: { k: 'v', nested: '[' },
      managedFields: [{ f: { '{': 1 } }],
      finalizers: ['f'],
      uid: 'u',
    },
    spec: { podCIDRs: ['10.0.0.0/24'], taints: [{ key: 'k' }] },
    status: { images: [{ names: ['x]}'] }], conditions: [] },
  },
  // a member name written with an escape is kept (the scanner compares raw bytes)
  { metadata: { name: 'b' }, 'st\u0061tus': { kept: true }, extra: [1, 2] },
];
const CUT_WANT = [
  {
    kind: 'Node',
    metadata: {
      name: 'a',
      labels: null,
      annotations: { k: 'v', nested: '[' },
      managedFields: null,
      finalizers: ['f'],
      uid: 'u',
    },
    spec: { podCIDRs: ['10.0.0.0/24'], taints: [{ key: 'k' }] },
    status: null,
  },
  { metadata: { name: 'b' }, status: { kept: true }, extra: null },
];

test('with keep, the members it does not name arrive as null, whatever the chunk boundaries', () => {
  const text = JSON.stringify(CUT_ITEMS).replace('"status":{"kept"', '"st\\u0061tus":{"kept"');
  const bytes = Buffer.from(`{"metadata":{"resourceVersion":"7"},"items":${text}}`, 'utf8');
  const scanCut = (cut: number[]) => {
    const items: unknown[] = [];
    const s = new ListScanner((b) => items.push(JSON.parse(b)), 1 << 20, 'l', KEEP);
    let at = 0;
    for (const c of [...cut, bytes.length]) {
      s.push(bytes.subarray(at, c));
      at = c;
    }
    s.end();
    return items;
  };
  assert.deepEqual(scanCut([]), CUT_WANT);
  for (let i = 1; i < bytes.length; i++) assert.deepEqual(scanCut([i]), CUT_WANT, `cut at ${i}`);
});
