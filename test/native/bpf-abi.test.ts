/**
 * The bpf ABI (native/bpf/weft_abi.h) as the loader compiled it equals what the programs' object
 * was compiled with, read from the object's BTF (bpftool): every struct with the same members in
 * the same order at the same offsets with the same sizes (two swapped fields of one size fail),
 * the same program and map names, and as many counter slots as the loader reads. The loader's
 * view comes from the addon (bpfAbi, built from the same header), so this catches an addon and
 * an object built from different headers, or a header that compiles differently for the BPF
 * target and the host. Reads files only: no bpf(2), no device.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { before, describe, it } from 'node:test';
import { loadNative } from '../../src/common/native.js';
import type { BpfAbi } from '../../src/common/native-addon.js';
import { bpfObjectPath } from '../../src/dataplane/bpf-binding.js';

interface BtfType {
  readonly id: number;
  readonly kind: string;
  readonly name: string;
  readonly size?: number;
  readonly type_id?: number;
  readonly nr_elems?: number;
  readonly members?: ReadonlyArray<{ name: string; type_id: number; bits_offset: number }>;
  readonly vars?: ReadonlyArray<{ type_id: number }>;
}

/** The object's BTF, by type id (bpftool -j btf dump file). */
function readBtf(object: string): Map<number, BtfType> {
  const r = spawnSync('bpftool', ['-j', 'btf', 'dump', 'file', object], { encoding: 'utf8' });
  assert.equal(r.status, 0, `bpftool btf dump: ${r.error?.message ?? r.stderr}`);
  const types = (JSON.parse(r.stdout) as { types: BtfType[] }).types;
  return new Map(types.map((t) => [t.id, t]));
}

/** A BTF type's size in bytes (through typedefs and qualifiers; arrays: elements × size). */
function sizeOf(btf: Map<number, BtfType>, id: number): number {
  const t = btf.get(id);
  assert.ok(t, `BTF type ${id}`);
  switch (t.kind) {
    case 'INT':
    case 'STRUCT':
    case 'UNION':
    case 'ENUM':
      return t.size!;
    case 'ARRAY':
      return t.nr_elems! * sizeOf(btf, t.type_id!);
    case 'PTR':
      return 8;
    default:
      return sizeOf(btf, t.type_id!);
  }
}

describe('bpf ABI: the loader (addon) against the object (BTF)', () => {
  let btf: Map<number, BtfType>;
  let abi: BpfAbi;
  before(() => {
    assert.ok(existsSync(bpfObjectPath()), `${bpfObjectPath()} (npm run build)`);
    btf = readBtf(bpfObjectPath());
    abi = loadNative().bpfAbi();
  });

  it('lays out every weft_* struct member by member as the object does', () => {
    const named = [...btf.values()].filter(
      (t) => t.kind === 'STRUCT' && t.name.startsWith('weft_'),
    );
    assert.deepEqual(named.map((t) => t.name).sort(), abi.structs.map((s) => s.name).sort());
    for (const s of abi.structs) {
      const t = named.find((x) => x.name === s.name)!;
      const members = t.members!.map((m) => ({
        name: m.name,
        offset: m.bits_offset / 8,
        size: sizeOf(btf, m.type_id),
      }));
      assert.deepEqual(
        { name: s.name, size: s.size, members: s.members },
        { name: t.name, size: t.size, members },
      );
    }
  });

  it('names the programs and maps the object holds', () => {
    const funcs = [...btf.values()].filter((t) => t.kind === 'FUNC').map((t) => t.name);
    assert.deepEqual(funcs.filter((f) => f.startsWith('weft_')).sort(), [...abi.programs].sort());
    const maps = [...btf.values()].find((t) => t.kind === 'DATASEC' && t.name === '.maps');
    assert.ok(maps, 'a .maps section');
    const vars = maps.vars!.map((v) => btf.get(v.type_id)!.name);
    assert.deepEqual(vars.sort(), [...abi.maps].sort());
  });

  it('has as many counter slots as the loader names', () => {
    // A map definition's max_entries is a pointer to an array of that many elements.
    const maps = [...btf.values()].find((t) => t.kind === 'DATASEC' && t.name === '.maps')!;
    const counters = maps
      .vars!.map((v) => btf.get(v.type_id)!)
      .find((v) => v.name === 'weft_counters');
    assert.ok(counters, 'weft_counters');
    const def = btf.get(counters.type_id!)!;
    const max = def.members!.find((m) => m.name === 'max_entries')!;
    const array = btf.get(btf.get(max.type_id)!.type_id!)!;
    assert.equal(array.kind, 'ARRAY');
    assert.equal(array.nr_elems, loadNative().bpfCounterNames().length);
  });
});
