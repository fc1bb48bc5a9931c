/**
 * The TUN helper's frame format as the js engine reads it: a 2-byte big-endian length and the
 * packet, frames split or joined arbitrarily by the pipe.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { FrameParser, encodeFrame } from '../../../src/dataplane/tun-helper.js';

const packets = [Buffer.from([0x45, 1, 2]), Buffer.alloc(1500, 7), Buffer.alloc(65535, 9)];
const stream = Buffer.concat(packets.map(encodeFrame));

test('encodeFrame prefixes the big-endian length', () => {
  assert.deepEqual(encodeFrame(Buffer.from([0xaa, 0xbb])), Buffer.from([0, 2, 0xaa, 0xbb]));
  assert.equal(encodeFrame(Buffer.alloc(65535)).readUInt16BE(0), 65535);
});

test('encodeFrame refuses empty and oversized packets', () => {
  assert.throws(() => encodeFrame(Buffer.alloc(0)), RangeError);
  assert.throws(() => encodeFrame(Buffer.alloc(65536)), RangeError);
});

test('frames in one chunk come out whole and in order', () => {
  assert.deepEqual(new FrameParser().push(stream), packets);
});

test('frames cut at every possible point reassemble the same', () => {
  for (const cut of [1, 2, 3, 4, 5, 1501, 1504, 1505, stream.length - 1]) {
    const p = new FrameParser();
    const got = [...p.push(stream.subarray(0, cut)), ...p.push(stream.subarray(cut))];
    assert.deepEqual(got, packets, `cut at ${cut}`);
    assert.equal(p.pendingBytes, 0);
  }
});

test('byte-by-byte delivery yields each packet once its last byte arrives', () => {
  const p = new FrameParser();
  const got: Buffer[] = [];
  const small = Buffer.concat(packets.slice(0, 2).map(encodeFrame));
  for (let i = 0; i < small.length; i++) {
    const out = p.push(small.subarray(i, i + 1));
    if (i === 4) assert.equal(out.length, 1, 'first packet complete at its 5th byte');
    got.push(...out);
  }
  assert.deepEqual(got, packets.slice(0, 2));
});

test('an incomplete frame is held back, not returned', () => {
  const p = new FrameParser();
  assert.deepEqual(p.push(Buffer.from([0, 4, 1, 2])), []);
  assert.equal(p.pendingBytes, 4);
});

test('held packets do not change when the chunk they came from is reused', () => {
  const p = new FrameParser();
  const chunk = Buffer.from([0, 2, 0xaa]);
  p.push(chunk);
  chunk.fill(0);
  assert.deepEqual(p.push(Buffer.from([0xbb])), [Buffer.from([0xaa, 0xbb])]);
});

test('a zero length is a protocol error', () => {
  assert.throws(() => new FrameParser().push(Buffer.from([0, 0, 1])), /length 0/);
});
