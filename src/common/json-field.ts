/**
 * Reading JSON the way Go's encoding/json fills a struct, so weft reads whatever flannel reads
 * (net-conf, Backend blocks, lease values): a field name matches an object key
 * case-insensitively, and when several keys match, the last one wins (Go decodes each in order
 * into the same field). A `null` value leaves the field as it was (Go's rule for plain fields),
 * so it is skipped.
 */

/** The value of `name` in `obj` under Go's rules above; undefined when absent or only null. */
export function jsonField(obj: Readonly<Record<string, unknown>>, name: string): unknown {
  const lower = name.toLowerCase();
  let found: unknown;
  for (const [k, v] of Object.entries(obj)) {
    if (v !== null && k.toLowerCase() === lower) found = v;
  }
  return found;
}
