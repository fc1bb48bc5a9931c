/**
 * test/helpers/dataplane-pair.ts's Node: a dataplane-node process that dies fails what is still
 * owed (its ready line, a reply) instead of leaving the test waiting for ever.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { test } from 'node:test';
import { Node } from '../../helpers/dataplane-pair.js';

const node = (script: string) =>
  new Node(spawn(process.execPath, ['-e', script], { stdio: ['pipe', 'pipe', 'inherit'] }));

test('a process that ends before its ready line fails ready, naming how it ended', async () => {
  await assert.rejects(node('process.exit(3)').ready, /dataplane-node ended \(exit 3\)/);
});

test('a process that ends with a reply owed fails that reply, and every later send', async () => {
  const n = node(
    `console.log(JSON.stringify({ ready: true }));
     process.stdin.once('data', () => process.exit(4));`,
  );
  assert.deepEqual(await n.ready, { ready: true });
  await assert.rejects(n.send({ cmd: 'stats' }), /exit 4/);
  await assert.rejects(n.send({ cmd: 'stats' }), /exit 4/);
  await n.closed;
});

test('lines written before the end still answer', async () => {
  const n = node(
    `console.log(JSON.stringify({ ready: true }));
     process.stdin.once('data', () => { console.log(JSON.stringify({ ok: true })); process.exit(0); });`,
  );
  await n.ready;
  assert.deepEqual(await n.send({ cmd: 'close' }), { ok: true });
  await n.closed;
});
