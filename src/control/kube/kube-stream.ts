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

  constructor(onItem: (item: Buffer) => void, maxBytes: number, what = 'list') {
    this.#onItem = onItem;
    this.#max = maxBytes;
    this.#what = what;
  }

  push(chunk: Buffer): void {
    const keep = this.#capStart >= 0 ? this.#capStart : this.#pos;
    const rest = this.#buf.subarray(keep);
    this.#buf = rest.length === 0 ? chunk : Buffer.concat([rest, chunk]);
    this.#pos -= keep;
    if (this.#capStart >= 0) this.#capStart -= keep;
    this.#scan();
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
          if (this.#capStart >= 0 && this.#capKind === 'string') {
            this.#key = JSON.parse(b.toString('utf8', this.#capStart, i + 1)) as string;
            this.#capStart = -1;
          }
          continue;
        }
        if (c === QUOTE) {
          inStr = true;
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
          if (depth === 2) {
            if (this.#inItems && this.#capStart >= 0) {
              const item = b.subarray(this.#capStart, i + 1);
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
