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
 * Both refuse a single item, member or line longer than `maxBytes` (WEFT_ERR_STORE_RESPONSE_
 * TOO_LARGE): a Kubernetes object is at most ~1.5 MiB (etcd's default request limit), so
 * anything far bigger is a broken or hostile server, not a node.
 *
 * A list item can also be cut down before it is parsed (`ListScanner`'s `keep`): the object and
 * array values of members weft never reads are handed over as `null`, so JSON.parse never builds
 * them. A real Node is ~17 KB of JSON, ~1 KB of which weft reads (its status' images and the
 * managedFields are most of the rest): on 5,000 Nodes that is the difference between parsing
 * ~85 MB and ~5 MB at every start and relist.
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

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const OPEN_OBJ = 0x7b;
const CLOSE_OBJ = 0x7d;
const OPEN_ARR = 0x5b;
const CLOSE_ARR = 0x5d;
/** The smallest buffer ListScanner keeps an item's bytes in across chunks. */
const MIN_STORE = 64 * 1024;
const NULL = Buffer.from('null');
/**
 * Which members of a list item to keep, two levels deep: a member of the item named here is kept
 * whole (`true`) or, given as a tree, only its own members named there. An object or array value
 * anywhere else in those two levels becomes `null` (strings, numbers and booleans are left as
 * they are: they are small, and leaving them keeps the cut byte-level simple). A member whose
 * name is written with an escape (`\u0061`) is kept: the scanner compares raw bytes.
 */
export interface KeepTree {
  readonly [member: string]: true | { readonly [member: string]: true };
}

/** A level of a KeepTree as the scanner matches it: each name's bytes and its rule. */
type KeepLevel = readonly (readonly [Buffer, true | KeepLevel])[];

function keepLevel(
  tree: Readonly<Record<string, true | Readonly<Record<string, true>>>>,
): KeepLevel {
  return Object.entries(tree).map(([name, rule]) => [
    Buffer.from(name, 'latin1'),
    rule === true ? true : keepLevel(rule),
  ]);
}

/**
 * Splits a JSON list's bytes into its `items` (handed to `onItem` as text, one complete
 * JSON value each) and its other top-level members (`top`, parsed). A byte scanner: it tracks
 * nesting and strings (and their escapes), keeping only the bytes of the value it is in.
 * Guarded state: written only by push()/end(), called in order by one reader.
 */
export class ListScanner {
  readonly #onItem: (item: string) => void;
  readonly #max: number;
  readonly #what: string;
  /** The members of the top-level object other than `items`. */
  readonly top: Record<string, unknown> = {};
  /**
   * The bytes received and not yet handed over are #store[0, #len): a chunk itself while nothing
   * of the previous one is kept, else a buffer of our own (#owned) that later chunks are
   * appended to, so that an item arriving in many small chunks is copied once, not once per
   * chunk. #pos and #capStart below are offsets in it.
   */
  #store: Buffer = Buffer.alloc(0);
  #len = 0;
  #owned = false;
  /** The next byte to scan. */
  #pos = 0;
  #depth = 0;
  #inStr = false;
  /** Where the value being kept starts (-1: none). */
  #capStart = -1;
  #capKind: 'item' | 'member' | 'string' = 'item';
  /** The last string at depth 1: the name of the member whose value follows. */
  #key = '';
  /** Where the string being crossed starts, as an offset in the item (-1: not a name). */
  #strStart = -1;
  #inItems = false;
  #done = false;
  readonly #keep: KeepLevel | null;
  // The cut of the item being captured (with `keep`), as offsets from its first byte (#capStart),
  // which stay valid when push() moves the item to the front of a new buffer:
  /** The last string inside the item's own object (depth 3) and in the one below (depth 4). */
  #key3 = [0, 0];
  #key4 = [0, 0];
  /** The kept member's tree the depth-4 object is filtered by (null: not filtered). */
  #sub: KeepLevel | null = null;
  /** Where the value being replaced by null starts (-1: none), and its depth. */
  #skipFrom = -1;
  #skipDepth = 0;
  /** [from, to) ranges of the item that become `null`, in order. */
  #cuts: number[] = [];
  /** Where #item puts a cut item's pieces together. */
  #scratch: Buffer = Buffer.alloc(0);

  constructor(
    onItem: (item: string) => void,
    maxBytes: number,
    what = 'list',
    keep: KeepTree | null = null,
  ) {
    this.#onItem = onItem;
    this.#max = maxBytes;
    this.#what = what;
    this.#keep = keep === null ? null : keepLevel(keep);
  }

  /**
   * The rule for the member whose name is at `key` (offsets of its quotes) in `rules`: `true`
   * (keep whole), a tree, or undefined (not named: cut). Compared byte by byte, no allocation;
   * a name written with an escape is kept whole.
   */
  #rule(b: Buffer, key: number[], rules: KeepLevel): true | KeepLevel | undefined {
    const from = this.#capStart + key[0]! + 1;
    const to = this.#capStart + key[1]!;
    for (const [name, rule] of rules) {
      if (name.length === to - from && name.compare(b, from, to) === 0) return rule;
    }
    for (let k = from; k < to; k++) if (b[k] === BACKSLASH) return true;
    return undefined;
  }

  /** An object or array opens at `depth` (4: a member of the item, 5: one level below) at `i`. */
  #opened(b: Buffer, i: number, depth: number, isObject: boolean): void {
    if (depth === 4) {
      this.#sub = null;
      const rule = this.#rule(b, this.#key3, this.#keep!);
      if (rule === undefined) this.#skip(i, depth);
      else if (rule !== true && isObject) this.#sub = rule;
    } else if (depth === 5 && this.#sub !== null) {
      if (this.#rule(b, this.#key4, this.#sub) === undefined) this.#skip(i, depth);
    }
  }

  /** Inside an item being cut (with `keep`), and not inside a value already being cut. */
  #cutting(): boolean {
    return this.#keep !== null && this.#inItems && this.#skipFrom < 0;
  }

  #skip(i: number, depth: number): void {
    this.#skipFrom = i - this.#capStart;
    this.#skipDepth = depth;
  }

  /**
   * The text of the captured item [capStart, end), its cuts replaced by `null`: the kept pieces
   * are copied together into #scratch and decoded once.
   */
  #item(b: Buffer, end: number): string {
    const start = this.#capStart;
    const cuts = this.#cuts;
    if (cuts.length === 0) return b.toString('utf8', start, end);
    let size = end - start;
    for (let k = 0; k < cuts.length; k += 2) size -= cuts[k + 1]! - cuts[k]! - NULL.length;
    if (this.#scratch.length < size) this.#scratch = Buffer.allocUnsafeSlow(Math.max(size, 4096));
    const out = this.#scratch;
    let at = start;
    let w = 0;
    for (let k = 0; k < cuts.length; k += 2) {
      w += b.copy(out, w, at, start + cuts[k]!);
      w += NULL.copy(out, w);
      at = start + cuts[k + 1]!;
    }
    w += b.copy(out, w, at, end);
    return out.toString('utf8', 0, w);
  }

  push(chunk: Buffer): void {
    const keep = this.#capStart >= 0 ? this.#capStart : this.#pos;
    const rest = this.#len - keep;
    if (rest > 0 && this.#owned && this.#len + chunk.length <= this.#store.length) {
      // room after what is kept: append, nothing moves
      chunk.copy(this.#store, this.#len);
      this.#len += chunk.length;
    } else {
      if (rest === 0) {
        this.#store = chunk;
        this.#owned = false;
      } else {
        // what is kept, then the chunk, at the front of a buffer of ours (the same one when it
        // has room: Buffer#copy allows the overlap)
        const size = rest + chunk.length;
        const to =
          this.#owned && size <= this.#store.length
            ? this.#store
            : Buffer.allocUnsafeSlow(Math.max(MIN_STORE, 2 * size));
        this.#store.copy(to, 0, keep, this.#len);
        chunk.copy(to, rest);
        this.#store = to;
        this.#owned = true;
      }
      this.#len = rest + chunk.length;
      this.#pos -= keep;
      if (this.#capStart >= 0) this.#capStart -= keep;
    }
    this.#scan();
  }

  /** The response ended: it must have been one whole JSON object. */
  end(): void {
    if (!this.#done) throw malformed(this.#what, 'the response ended inside the list');
  }

  #scan(): void {
    // The hot loop: state in locals; a string is crossed with indexOf (a Node's image names and
    // digests are most of its bytes).
    const b = this.#store.subarray(0, this.#len);
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
          if (this.#strStart >= 0) {
            // a string in the item's first two levels (with `keep`): maybe a member's name
            const k = depth === 3 ? this.#key3 : this.#key4;
            k[0] = this.#strStart;
            k[1] = i - this.#capStart;
            this.#strStart = -1;
          }
          if (this.#capStart >= 0 && this.#capKind === 'string') {
            this.#key = JSON.parse(b.toString('utf8', this.#capStart, i + 1)) as string;
            this.#capStart = -1;
          }
          continue;
        }
        if (c === QUOTE) {
          inStr = true;
          if ((depth === 3 || (depth === 4 && this.#sub !== null)) && this.#cutting()) {
            this.#strStart = i - this.#capStart;
          }
          if (depth === 1) {
            this.#capStart = i;
            this.#capKind = 'string';
          }
        } else if (c === OPEN_OBJ || c === OPEN_ARR) {
          depth++;
          if (depth === 3) {
            if (this.#inItems) {
              this.#capStart = i;
              this.#capKind = 'item';
              this.#sub = null;
              this.#cuts = [];
            }
          } else if ((depth === 4 || depth === 5) && this.#cutting()) {
            this.#opened(b, i, depth, c === OPEN_OBJ);
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
          if (this.#skipFrom >= 0 && depth === this.#skipDepth) {
            this.#cuts.push(this.#skipFrom, i + 1 - this.#capStart);
            this.#skipFrom = -1;
          }
          depth--;
          if (depth === 2) {
            if (this.#inItems && this.#capStart >= 0) {
              const item = this.#item(b, i + 1);
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
