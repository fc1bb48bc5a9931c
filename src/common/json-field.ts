/**
 * Reading JSON the way Go's encoding/json fills a struct, so weft reads whatever flannel reads
 * (net-conf, Backend blocks, lease values): a field name matches an object key
 * case-insensitively, and when several keys match, the last one wins (Go decodes each in order
 * into the same field). A `null` value leaves the field as it was (Go's rule for plain fields),
 * so it is skipped.
 */

/**
 * The value of `name` in `obj` under Go's rules above; undefined when absent or only null.
 * `name` is ASCII (weft's field names are). Only keys of its length are compared (a key whose
 * lower case equals an ASCII name's has the same length), and nothing is allocated for the
 * others: a start checks 5,000 leases' backend data, several fields each.
 */
export function jsonField(obj: Readonly<Record<string, unknown>>, name: string): unknown {
  const lower = name.toLowerCase();
  let found: unknown;
  for (const k in obj) {
    if (k.length !== lower.length || !Object.hasOwn(obj, k)) continue;
    const v = obj[k];
    if (v !== null && (k === name || k.toLowerCase() === lower)) found = v;
  }
  return found;
}
