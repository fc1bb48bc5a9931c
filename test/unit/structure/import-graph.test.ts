/**
 * The import graph of src/ stays straight (issue #19.2): no import circle between modules, and
 * the folders of src/control depend on each other in one direction only (a folder never imports
 * one listed above it in LAYERS). Type-only imports count: they are edges a reader follows too.
 */
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../../..');
const SRC = join(ROOT, 'src');

/**
 * The parts of src/control from the entry point down: a folder, or a file directly in
 * src/control (named without .ts). Each may import the parts in rows below it (and src/common,
 * src/dataplane), never one in its own row or above.
 */
const LAYERS = [
  ['main'],
  ['demo'],
  ['cli'],
  ['daemon', 'iface', 'blackhole-route'],
  ['cni', 'backend', 'kube', 'iptables', 'peer-log', 'memory-trim'],
  ['lease'],
  ['registry', 'netlink', 'metrics', 'subnet-env', 'sd-notify', 'http'],
  ['config', 'version'],
];

/**
 * Circles that another change in flight removes (#19.2's dataplane part): reported, not failed.
 * Delete an entry when its circle is gone.
 */
const PENDING_CIRCLES: string[] = [];

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = join(dir, e.name);
    if (e.isDirectory()) return sourceFiles(p);
    return e.name.endsWith('.ts') ? [p] : [];
  });
}

/** Relative imports of one file (static `import`/`export … from` and `import(…)`), as .ts paths. */
function importsOf(file: string): string[] {
  const text = readFileSync(file, 'utf8');
  const specs = [
    ...text.matchAll(/^\s*(?:import|export)\b[^;]*?\bfrom\s+'([^']+)'/gms),
    ...text.matchAll(/\bimport\(\s*'([^']+)'\s*\)/g),
  ].map((m) => m[1]!);
  return specs
    .filter((s) => s.startsWith('.'))
    .map((s) => resolve(dirname(file), s).replace(/\.js$/, '.ts'));
}

export function importGraph(): Map<string, string[]> {
  const graph = new Map<string, string[]>();
  for (const f of sourceFiles(SRC))
    graph.set(
      relative(SRC, f),
      importsOf(f).map((p) => relative(SRC, p)),
    );
  return graph;
}

/** Every elementary cycle's first member path found by depth-first search (one per back edge). */
export function findCycles(graph: Map<string, string[]>): string[][] {
  const cycles: string[][] = [];
  const state = new Map<string, 'open' | 'done'>();
  const stack: string[] = [];
  const visit = (n: string): void => {
    state.set(n, 'open');
    stack.push(n);
    for (const m of graph.get(n) ?? []) {
      if (state.get(m) === 'open') cycles.push([...stack.slice(stack.indexOf(m)), m]);
      else if (!state.has(m)) visit(m);
    }
    stack.pop();
    state.set(n, 'done');
  };
  for (const n of [...graph.keys()].sort()) if (!state.has(n)) visit(n);
  return cycles;
}

/** The src/control part of a path (its folder, or its file name for files directly in it). */
function controlPart(path: string): string | null {
  const parts = path.split('/');
  if (parts[0] !== 'control') return null;
  return parts.length === 2 ? parts[1]!.replace(/\.ts$/, '') : parts[1]!;
}

export function upwardImports(graph: Map<string, string[]>): string[] {
  const rank = new Map(LAYERS.flatMap((names, i) => names.map((n) => [n, i] as const)));
  const bad: string[] = [];
  for (const [from, tos] of graph) {
    const ff = controlPart(from);
    for (const to of tos) {
      if (from.startsWith('dataplane/') || from.startsWith('common/')) {
        if (to.startsWith('control/'))
          bad.push(`${from} -> ${to} (control is above ${from.split('/')[0]})`);
        if (from.startsWith('common/') && to.startsWith('dataplane/')) bad.push(`${from} -> ${to}`);
        continue;
      }
      const tf = controlPart(to);
      if (ff === null || tf === null || ff === tf) continue;
      const rf = rank.get(ff);
      const rt = rank.get(tf);
      if (rf === undefined || rt === undefined) {
        bad.push(`${from} -> ${to} (part ${rf === undefined ? ff : tf} is not in LAYERS)`);
      } else if (rt <= rf) {
        bad.push(`${from} -> ${to} (${tf} is not below ${ff})`);
      }
    }
  }
  return bad;
}

/** The dataplane's one door (issue #30.1): all control may import of src/dataplane. */
const DATAPLANE_DOOR = 'dataplane/index.ts';

/**
 * The control files that may load the native addon (common/native.ts, and its type in
 * common/native-addon.ts), each for a binding that is not the packet dataplane's: rtnetlink
 * (libmnl), sd_notify, malloc_trim. The packet engines' addon (its probe included) is the
 * dataplane's, behind its door.
 */
const ADDON_USERS = new Set([
  'control/netlink/native-netlink.ts',
  'control/netlink/open-netlink.ts',
  'control/sd-notify.ts',
  'control/daemon.ts',
]);
const ADDON = ['common/native.ts', 'common/native-addon.ts'];

/**
 * Control's imports through a side door of the dataplane: any src/dataplane module but index.ts
 * (type-only imports too: a type is part of the surface control depends on, and index.ts
 * re-exports the ones control needs), and the native addon outside ADDON_USERS.
 */
export function sideDoors(graph: Map<string, string[]>): string[] {
  const bad: string[] = [];
  for (const [from, tos] of graph) {
    if (!from.startsWith('control/')) continue;
    for (const to of tos) {
      if (to.startsWith('dataplane/') && to !== DATAPLANE_DOOR)
        bad.push(`${from} -> ${to} (control imports only ${DATAPLANE_DOOR})`);
      if (ADDON.includes(to) && !ADDON_USERS.has(from))
        bad.push(`${from} -> ${to} (the engines' addon is the dataplane's)`);
    }
  }
  return bad;
}

describe('import graph', () => {
  const graph = importGraph();

  test('every relative import names a file that exists', () => {
    const missing = [...graph].flatMap(([f, tos]) =>
      tos.filter((t) => !graph.has(t)).map((t) => `${f} -> ${t}`),
    );
    assert.deepEqual(missing, []);
  });

  test('has no import circle', (t) => {
    const circles = findCycles(graph).map((c) => c.join(' -> '));
    for (const c of circles.filter((c) => PENDING_CIRCLES.includes(c))) {
      t.diagnostic(`pending (another change removes it): ${c}`);
    }
    assert.deepEqual(
      circles.filter((c) => !PENDING_CIRCLES.includes(c)),
      [],
    );
  });

  test('src/control folders import only folders below them; dataplane and common never import control', () => {
    assert.deepEqual(upwardImports(graph), []);
  });

  test('control enters the dataplane only through dataplane/index.ts, and loads no engine addon', () => {
    assert.deepEqual(sideDoors(graph), []);
  });

  test('the door check sees a side door when there is one', () => {
    const g = new Map([
      ['control/backend/a.ts', ['dataplane/index.ts', 'dataplane/peer-table.ts']],
      ['control/backend/b.ts', ['common/native.ts']],
      ['control/netlink/native-netlink.ts', ['common/native.ts']],
      ['dataplane/index.ts', ['dataplane/peer-table.ts', 'common/native.ts']],
    ]);
    assert.deepEqual(sideDoors(g), [
      'control/backend/a.ts -> dataplane/peer-table.ts (control imports only dataplane/index.ts)',
      "control/backend/b.ts -> common/native.ts (the engines' addon is the dataplane's)",
    ]);
  });

  test('the checks see a circle and an upward import when there is one', () => {
    const g = new Map([
      ['control/lease/a.ts', ['control/registry/b.ts']],
      ['control/registry/b.ts', ['control/lease/a.ts']],
    ]);
    assert.equal(findCycles(g).length, 1);
    assert.deepEqual(upwardImports(g), [
      'control/registry/b.ts -> control/lease/a.ts (lease is not below registry)',
    ]);
  });
});
