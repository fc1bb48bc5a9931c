/**
 * The wireguard backend's static key, kept where flanneld keeps it so a node moving between
 * flanneld and weft keeps its identity (flannel HEAD pkg/backend/wireguard/device.go):
 *
 *   path     $WIREGUARD_KEY_FILE, else /run/flannel/wgkey
 *   absent   a random X25519 private key (clamped, as `wg genkey`), written base64 with no
 *            newline, mode 0400, its directory made 0755 when missing
 *   present  read: base64 of 32 bytes (surrounding whitespace allowed, as `wg genkey > file`
 *            writes a newline); anything else is WEFT_ERR_WIREGUARD_KEY naming the path and the
 *            rule (never the content)
 *
 * The public key is derived here (node:crypto's X25519), so the lease can publish it before the
 * engine starts; the engine derives its own from the same private key and the backend checks
 * they agree.
 */
import { randomBytes } from 'node:crypto';
import { closeSync, mkdirSync, openSync, readFileSync, writeSync, fchmodSync } from 'node:fs';
import { dirname } from 'node:path';
import { WeftError } from '../../common/errors.js';
import { x25519PublicKey } from '../../dataplane/index.js';

export const DEFAULT_KEY_FILE = '/run/flannel/wgkey';
export const KEY_FILE_ENV = 'WIREGUARD_KEY_FILE';
export const WG_KEY_LEN = 32;

/** The key file's path: $WIREGUARD_KEY_FILE when set and not empty, else /run/flannel/wgkey. */
export function keyFilePath(env: NodeJS.ProcessEnv = process.env): string {
  const v = env[KEY_FILE_ENV];
  return v !== undefined && v !== '' ? v : DEFAULT_KEY_FILE;
}

/** A base64 WireGuard key (32 bytes, standard alphabet, padded), or null. */
export function parseWgKey(text: string): Buffer | null {
  if (!/^[A-Za-z0-9+/]{43}=$/.test(text)) return null;
  const b = Buffer.from(text, 'base64');
  // the last character's spare bits must be zero (Go's strict decoding refuses others)
  return b.length === WG_KEY_LEN && b.toString('base64') === text ? b : null;
}

/** X25519's clamping of a private scalar (what `wg genkey` and wgtypes do). */
function clamp(k: Buffer): Buffer {
  k[0]! &= 248;
  k[31]! &= 127;
  k[31]! |= 64;
  return k;
}

export interface WgKeyPair {
  readonly privateKey: Buffer;
  readonly publicKey: Buffer;
  /** The file was absent and has just been written. */
  readonly created: boolean;
  readonly path: string;
}

function keyError(path: string, rule: string, cause?: unknown): WeftError {
  return new WeftError('WEFT_ERR_WIREGUARD_KEY', `wireguard key file ${path}: ${rule}`, {
    details: { path },
    ...(cause === undefined ? {} : { cause }),
  });
}

/** Reads the key file at `path`, or creates it (mode 0400) with a new key when absent. */
export function loadWgKey(path: string = keyFilePath()): WgKeyPair {
  let text: string | null = null;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT')
      throw keyError(path, `cannot be read (${(err as NodeJS.ErrnoException).code})`, err);
  }
  if (text !== null) {
    const privateKey = parseWgKey(text.trim());
    if (!privateKey)
      throw keyError(path, 'must hold one base64 WireGuard private key (32 bytes, as `wg genkey`)');
    return { privateKey, publicKey: x25519PublicKey(privateKey), created: false, path };
  }
  const privateKey = clamp(randomBytes(WG_KEY_LEN));
  try {
    mkdirSync(dirname(path), { recursive: true, mode: 0o755 });
    // exclusive create: two starts at once cannot both write (the loser fails, and restarts)
    const fd = openSync(path, 'wx', 0o400);
    try {
      fchmodSync(fd, 0o400);
      writeSync(fd, privateKey.toString('base64'));
    } finally {
      closeSync(fd);
    }
  } catch (err) {
    throw keyError(path, `cannot be written (${(err as NodeJS.ErrnoException).code})`, err);
  }
  return { privateKey, publicKey: x25519PublicKey(privateKey), created: true, path };
}
