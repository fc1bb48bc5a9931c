/**
 * The documentation stays reachable (issue #30): every relative link in README.md, docs/*.md,
 * bench/README.md and bench/faults/README.md names a file that exists, and a `#anchor` into a
 * Markdown file names one of its headings (GitHub's anchors: lower case, punctuation dropped,
 * spaces as `-`, a repeated heading suffixed `-1`, `-2`, ...). External links are not followed.
 */
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { describe, test } from 'node:test';

const ROOT = resolve(import.meta.dirname, '../../..');

const DOCS = [
  'README.md',
  ...readdirSync(join(ROOT, 'docs'))
    .filter((f) => f.endsWith('.md'))
    .map((f) => `docs/${f}`),
  'bench/README.md',
  'bench/faults/README.md',
];

/** The text outside fenced code blocks and inline code spans (links there are not links). */
function prose(markdown: string): string {
  return markdown.replace(/^```[\s\S]*?^```/gm, '').replace(/`[^`\n]*`/g, '');
}

/** Link targets of a Markdown text: `[text](target)` and `![alt](target)`, titles dropped. */
export function linkTargets(markdown: string): string[] {
  return [...prose(markdown).matchAll(/!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)].map(
    (m) => m[1]!,
  );
}

/** GitHub's anchor for each heading of a Markdown text, in order, duplicates numbered. */
export function headingAnchors(markdown: string): Set<string> {
  const seen = new Map<string, number>();
  const anchors = new Set<string>();
  const text = markdown.replace(/^```[\s\S]*?^```/gm, '');
  for (const m of text.matchAll(/^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$/gm)) {
    const base = m[1]!
      .replace(/\[([^\]]*)\]\([^)]*\)/g, '$1')
      .toLowerCase()
      .replace(/[^\p{L}\p{N}\p{M} _-]/gu, '')
      .replace(/ /g, '-');
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    anchors.add(n === 0 ? base : `${base}-${n}`);
  }
  return anchors;
}

/** `file: target (why)` for each relative link of `file` that does not resolve. */
function brokenLinks(file: string): string[] {
  const abs = join(ROOT, file);
  const bad: string[] = [];
  for (const target of linkTargets(readFileSync(abs, 'utf8'))) {
    if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue; // https:, mailto:, ...
    const [path, anchor] = target.split('#', 2) as [string, string | undefined];
    const dest = path === '' ? abs : resolve(dirname(abs), decodeURIComponent(path));
    if (!existsSync(dest)) {
      bad.push(`${file}: ${target} (no ${relative(ROOT, dest)})`);
      continue;
    }
    if (anchor === undefined || !dest.endsWith('.md') || statSync(dest).isDirectory()) continue;
    if (!headingAnchors(readFileSync(dest, 'utf8')).has(anchor.toLowerCase())) {
      bad.push(`${file}: ${target} (no heading #${anchor} in ${relative(ROOT, dest)})`);
    }
  }
  return bad;
}

describe('documentation links', () => {
  for (const file of DOCS) {
    test(`every relative link in ${file} resolves`, () => {
      assert.ok(existsSync(join(ROOT, file)), `${file} is missing`);
      assert.deepEqual(brokenLinks(file), []);
    });
  }

  test('the README links every document it was split into', () => {
    const targets = new Set(
      linkTargets(readFileSync(join(ROOT, 'README.md'), 'utf8')).map((t) => t.split('#')[0]),
    );
    for (const f of DOCS.filter((d) => d !== 'README.md')) {
      assert.ok(targets.has(f), `README.md does not link ${f}`);
    }
  });

  test('anchors are made as GitHub makes them', () => {
    const a = headingAnchors(
      [
        '# Benchmarks',
        '## Footprint (`npm run bench:footprint`)',
        '```sh',
        '# not a heading',
        '```',
        '### Real-sized Nodes (#28)',
        '## Tests',
        '## Tests',
      ].join('\n'),
    );
    assert.deepEqual(
      [...a],
      ['benchmarks', 'footprint-npm-run-benchfootprint', 'real-sized-nodes-28', 'tests', 'tests-1'],
    );
    assert.deepEqual(linkTargets('[a](b.md#c) `[x](y.md)` ![i](r/l.svg) [e](https://x.org)'), [
      'b.md#c',
      'r/l.svg',
      'https://x.org',
    ]);
  });
});
