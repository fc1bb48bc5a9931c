/**
 * The two shapes of API server response weft reads in pieces, so that memory holds one object
 * at a time, never a whole response:
 *
 * - a list (`{"kind":"NodeList","metadata":{...},"items":[{...},{...}]}`): `ListScanner` finds
 *   each element of the top-level `items` array as its bytes arrive and hands its text over
 *   (the caller parses and cuts it down before the next one); the other top-level members
 *   (`metadata`: resourceVersion, continue) are parsed whole. A list served whole (the watch
 *   cache ignores `limit` for resourceVersion=0) is read the same way.
 * - a watch stream (one JSON event per line): `LineSplitter`.
 *
 * A list's items can come with members nulled out as they are scanned (`nulled`: e.g. a Node's
 * `status` and `metadata.managedFields`, most of its bytes, which weft never reads): the item
 * handed over then has `null` in their place, so its parse builds none of them.
 *
 * Both refuse a single item, member or line longer than `maxBytes` (WEFT_ERR_STORE_RESPONSE_
 * TOO_LARGE): a Kubernetes object is at most ~1.5 MiB (etcd's default request limit), so
 * anything far bigger is a broken or hostile server, not a node.
 */
import { WeftError } from '../../common/errors.js';

/** The default cap on one object (a list item, a watch line, a whole plain response). */
export const MAX_OBJECT_BYTES = 4 * 1024 * 1024;

export function tooLarge(what: string, maxBytes: number): WeftError {
  return new WeftError(
    'WEFT_ERR_STORE_RESPONSE_TOO_LARGE',
    `kubernetes ${what}: larger than ${maxBytes} bytes`,
    { details: { maxBytes } },
  );
}

const NULL = Buffer.from('null');
const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const OPEN_OBJ = 0x7b;
const CLOSE_OBJ = 0x7d;
const OPEN_ARR = 0x5b;
const CLOSE_ARR = 0x5d;

/**
 * Members of a list item to hand over as `null` (their object or array value not kept): paths
 * of one name (a member of the item) or two (a member of one of its object members), e.g.
 * `[['status'], ['metadata', 'managedFields']]`. A member whose value is a string, number or
 * literal is left as it is, as is a name written with escapes.
 */
export type NulledMembers = ReadonlyArray<readonly [string] | readonly [string, string]>;

/** Depth of a list item's own members (top object 1, `items` 2, the item 3). */
const ITEM = 3;
/** Member names longer than this are never one of `nulled`: not decoded to compare. */
const MAX_NAME = 64;

/**
 * Splits a JSON list's bytes into its `items` (handed to `onItem` as raw UTF-8, one complete
 * JSON value each) and its other top-level members (`top`, parsed). A byte scanner: it tracks
 * nesting and strings (and their escapes), keeping only the bytes of the value it is in.
 * Guarded state: written only by push()/end(), called in order by one reader.
 */
export class ListScanner {
  readonly #onItem: (item: Buffer) => void;
  readonly #max: number;
  readonly #what: string;
  /** The members of the top-level object other than `items`. */
  readonly top: Record<string, unknown> = {};
  #buf: Buffer = Buffer.alloc(0);
  /** The next byte of #buf to scan. */
  #pos = 0;
  #depth = 0;
  #inStr = false;
  /** Where in #buf the value being kept starts (-1: none). */
  #capStart = -1;
  #capKind: 'item' | 'member' | 'string' = 'item';
  /** The last string at depth 1: the name of the member whose value follows. */
  #key = '';
  #inItems = false;
  #done = false;
  // Nulling (see NulledMembers); positions are in #buf, shifted with it.
  /** names at the item's depth → their nulled sub-names (empty: the member itself). */
  readonly #nulled: ReadonlyMap<string, ReadonlySet<string>>;
  /** Where the string being crossed at the item's depth or one below starts. */
  #strStart = 0;
  /** The last name (or short string) seen at the item's depth. */
  #member = '';
  /** A nulled name just ended at this depth: an object or array opening next is its value. */
  #pendingDepth = -1;
  /** Inside a nulled value: the depth of the object it is a member of (-1: not). */
  #nullDepth = -1;
  #nullStart = 0;
  /** Nulled values of the item being kept: [start, end] pairs, ends inclusive. */
  #spans: number[] = [];

  constructor(
    onItem: (item: Buffer) => void,
    maxBytes: number,
    what = 'list',
    nulled: NulledMembers = [],
  ) {
    this.#onItem = onItem;
    this.#max = maxBytes;
    this.#what = what;
    const m = new Map<string, Set<string>>();
    for (const [name, sub] of nulled) {
      const subs = m.get(name) ?? new Set<string>();
      if (sub !== undefined) subs.add(sub);
      m.set(name, subs);
    }
    this.#nulled = m;
  }

  push(chunk: Buffer): void {
    const keep = this.#capStart >= 0 ? this.#capStart : this.#pos;
    const rest = this.#buf.subarray(keep);
    this.#buf = rest.length === 0 ? chunk : Buffer.concat([rest, chunk]);
    this.#pos -= keep;
    if (this.#capStart >= 0) this.#capStart -= keep;
    this.#strStart -= keep;
    this.#nullStart -= keep;
    for (let k = 0; k < this.#spans.length; k++) this.#spans[k]! -= keep;
    this.#scan();
  }

  /** A string at the item's depth (`depth` ITEM) or one below ended at `end` (its quote). */
  #nameEnded(b: Buffer, depth: number, end: number): void {
    const len = end - this.#strStart - 1;
    const name = len <= MAX_NAME ? b.toString('latin1', this.#strStart + 1, end) : '';
    if (depth === ITEM) {
      this.#member = name;
      const subs = this.#nulled.get(name);
      if (subs !== undefined && subs.size === 0) this.#pendingDepth = ITEM;
    } else if (this.#nulled.get(this.#member)?.has(name)) {
      this.#pendingDepth = ITEM + 1;
    }
  }

  /** The item as handed over: its bytes with each nulled value replaced by `null`. */
  #item(b: Buffer, start: number, end: number): Buffer {
    const spans = this.#spans;
    if (spans.length === 0) return b.subarray(start, end);
    const parts: Buffer[] = [];
    let at = start;
    for (let k = 0; k < spans.length; k += 2) {
      parts.push(b.subarray(at, spans[k]), NULL);
      at = spans[k + 1]! + 1;
    }
    parts.push(b.subarray(at, end));
    this.#spans = [];
    return Buffer.concat(parts);
  }

  /** The response ended: it must have been one whole JSON object. */
  end(): void {
    if (!this.#done) throw malformed(this.#what, 'the response ended inside the list');
  }

  #scan(): void {
    // The hot loop: state in locals; a string is crossed with indexOf (a Node's image names and
    // digests are most of its bytes).
    const b = this.#buf;
    const n = b.length;
    let i = this.#pos;
    let depth = this.#depth;
    let inStr = this.#inStr;
    try {
      for (; i < n; i++) {
        const c = b[i]!;
        if (inStr) {
          // jump to the string's next quote; escaped when an odd run of backslashes precedes it
          const q = b.indexOf(QUOTE, i);
          if (q < 0) {
            i = n - 1;
            continue;
          }
          let bs = 0;
          for (let k = q - 1; b[k] === BACKSLASH; k--) bs++;
          i = q;
          if (bs % 2 === 1) continue;
          inStr = false;
          if (this.#inItems && (depth === ITEM || depth === ITEM + 1) && this.#nullDepth < 0) {
            if (this.#nulled.size > 0) this.#nameEnded(b, depth, i);
          } else if (this.#capStart >= 0 && this.#capKind === 'string') {
            this.#key = JSON.parse(b.toString('utf8', this.#capStart, i + 1)) as string;
            this.#capStart = -1;
          }
          continue;
        }
        if (c === QUOTE) {
          inStr = true;
          if (depth === ITEM || depth === ITEM + 1) {
            this.#strStart = i;
            if (this.#pendingDepth === depth) this.#pendingDepth = -1;
          } else if (depth === 1) {
            this.#capStart = i;
            this.#capKind = 'string';
          }
        } else if (c === OPEN_OBJ || c === OPEN_ARR) {
          depth++;
          if (this.#pendingDepth === depth - 1 && this.#inItems) {
            this.#pendingDepth = -1;
            this.#nullDepth = depth - 1;
            this.#nullStart = i;
          } else if (depth === ITEM) {
            if (this.#inItems) {
              this.#capStart = i;
              this.#capKind = 'item';
              this.#member = '';
              this.#pendingDepth = -1;
              this.#spans = [];
            }
          } else if (depth === 2) {
            if (this.#key === 'items' && c === OPEN_ARR) {
              this.#inItems = true;
            } else {
              this.#capStart = i;
              this.#capKind = 'member';
            }
          } else if (depth === 1) {
            if (c !== OPEN_OBJ || this.#done) throw malformed(this.#what, 'not a JSON object');
          }
        } else if (c === CLOSE_OBJ || c === CLOSE_ARR) {
          depth--;
          if (this.#pendingDepth > depth) this.#pendingDepth = -1;
          if (this.#nullDepth >= 0 && depth === this.#nullDepth) {
            this.#spans.push(this.#nullStart, i);
            this.#nullDepth = -1;
          } else if (depth === 2) {
            if (this.#inItems && this.#capStart >= 0) {
              const item = this.#item(b, this.#capStart, i + 1);
              this.#capStart = -1;
              this.#onItem(item);
            }
          } else if (depth === 1) {
            if (this.#inItems) {
              this.#inItems = false;
            } else if (this.#capStart >= 0) {
              this.top[this.#key] = parseJson(
                b.toString('utf8', this.#capStart, i + 1),
                this.#what,
              );
              this.#capStart = -1;
            }
          } else if (depth === 0) {
            this.#done = true;
          } else if (depth < 0) {
            throw malformed(this.#what, 'unbalanced brackets');
          }
        } else if (depth === 0 && c > 0x20) {
          throw malformed(this.#what, this.#done ? 'data after the list' : 'not a JSON object');
        }
        if (this.#capStart >= 0 && i - this.#capStart >= this.#max) {
          i++;
          break;
        }
      }
    } finally {
      this.#pos = i;
      this.#depth = depth;
      this.#inStr = inStr;
    }
    if (this.#capStart >= 0 && this.#pos - this.#capStart > this.#max) {
      throw tooLarge(`${this.#what}: one ${this.#capKind}`, this.#max);
    }
  }
}

/** Complete lines of a byte stream (without the newline), refusing one over `maxBytes`. */
export class LineSplitter {
  readonly #max: number;
  readonly #what: string;
  #parts: Buffer[] = [];
  #len = 0;

  constructor(maxBytes: number, what = 'watch') {
    this.#max = maxBytes;
    this.#what = what;
  }

  push(chunk: Buffer): Buffer[] {
    const lines: Buffer[] = [];
    let start = 0;
    for (;;) {
      const nl = chunk.indexOf(0x0a, start);
      if (nl < 0) break;
      const piece = chunk.subarray(start, nl);
      if (this.#len + piece.length > this.#max)
        throw tooLarge(`${this.#what}: one line`, this.#max);
      lines.push(this.#len === 0 ? piece : Buffer.concat([...this.#parts, piece]));
      this.#parts = [];
      this.#len = 0;
      start = nl + 1;
    }
    if (start < chunk.length) {
      const rest = chunk.subarray(start);
      this.#len += rest.length;
      if (this.#len > this.#max) throw tooLarge(`${this.#what}: one line`, this.#max);
      this.#parts.push(rest);
    }
    return lines;
  }
}

function malformed(what: string, why: string): WeftError {
  return new WeftError('WEFT_ERR_STORE_UNAVAILABLE', `kubernetes ${what}: ${why}`);
}

export function parseJson(text: string, what: string): unknown {
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new WeftError('WEFT_ERR_STORE_UNAVAILABLE', `kubernetes ${what}: not JSON`, {
      cause: err,
    });
  }
}
