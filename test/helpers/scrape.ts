/** A daemon's /metrics read from inside its namespace, and one sample of it. */
import assert from 'node:assert/strict';
import { nsExecAsync } from '../../src/testbed/netns.js';

/** The text of `http://127.0.0.1:<port>/metrics` as seen inside namespace `ns`. */
export function scrape(ns: string, port: number | string): Promise<string> {
  return nsExecAsync(ns, process.execPath, [
    '-e',
    `fetch('http://127.0.0.1:${port}/metrics').then((r) => r.text()).then((t) => process.stdout.write(t))`,
  ]);
}

/** The value of sample `name{labels}` (labels as exposed, e.g. `{engine="bpf"}`); asserts it exists. */
export function sample(text: string, name: string, labels = ''): number {
  const line = text.split('\n').find((l) => l.startsWith(`${name}${labels} `));
  assert.ok(line, `${name}${labels} missing`);
  return Number(line.split(' ')[1]);
}
