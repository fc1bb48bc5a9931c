// The wireguard key file, as flanneld keeps it: created 0400 with a random key when absent, read
// when present (so a node keeps its key across flanneld and weft), a malformed one refused.
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { after, describe, it } from 'node:test';
import { isWeftError } from '../../../../src/common/errors.js';
import {
  DEFAULT_KEY_FILE,
  keyFilePath,
  loadWgKey,
  parseWgKey,
} from '../../../../src/control/backend/wireguard-key.js';
import { x25519PublicKey } from '../../../../src/dataplane/index.js';

const dir = mkdtempSync(join(tmpdir(), 'weft-wgkey-'));
after(() => rmSync(dir, { recursive: true, force: true }));
let n = 0;
const fresh = () => join(dir, `k${++n}`, 'wgkey');

const hasWg = spawnSync('wg', ['--help']).status === 0;

describe('wireguard key file', () => {
  it('$WIREGUARD_KEY_FILE names it, else /run/flannel/wgkey', () => {
    assert.equal(keyFilePath({}), DEFAULT_KEY_FILE);
    assert.equal(keyFilePath({ WIREGUARD_KEY_FILE: '' }), DEFAULT_KEY_FILE);
    assert.equal(keyFilePath({ WIREGUARD_KEY_FILE: '/x/k' }), '/x/k');
  });

  it('absent: created (directory too) with mode 0400, base64 of a clamped 32-byte key', () => {
    const path = fresh();
    const k = loadWgKey(path);
    assert.equal(k.created, true);
    assert.equal(statSync(path).mode & 0o777, 0o400);
    const text = readFileSync(path, 'utf8');
    assert.equal(text, k.privateKey.toString('base64'));
    assert.equal(k.privateKey.length, 32);
    assert.equal(k.privateKey[0]! & 7, 0);
    assert.equal(k.privateKey[31]! & 0xc0, 0x40);
  });

  it('present: read, the same key every time (a restart keeps it)', () => {
    const path = fresh();
    const a = loadWgKey(path);
    const b = loadWgKey(path);
    assert.equal(b.created, false);
    assert.ok(a.privateKey.equals(b.privateKey));
    assert.ok(a.publicKey.equals(b.publicKey));
  });

  it(
    'a key written by `wg genkey` (newline included) is read, its public key as `wg pubkey`',
    {
      skip: !hasWg && 'wg missing (npm run setup installs wireguard-tools)',
    },
    () => {
      const path = fresh();
      const priv = execFileSync('wg', ['genkey'], { encoding: 'utf8' });
      mkdirSync(dirname(path));
      writeFileSync(path, priv, { mode: 0o400 });
      const k = loadWgKey(path);
      const pub = execFileSync('wg', ['pubkey'], { input: priv, encoding: 'utf8' }).trim();
      assert.equal(k.publicKey.toString('base64'), pub);
    },
  );

  it('the public key is X25519 of the private key (RFC 7748 test vector)', () => {
    const priv = Buffer.from(
      '77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a',
      'hex',
    );
    assert.equal(
      x25519PublicKey(priv).toString('hex'),
      '8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a',
    );
  });

  it('malformed: refused with the path and the rule, never the content', () => {
    for (const bad of ['', 'not a key', 'c2hvcnQ=', Buffer.alloc(33).toString('base64')]) {
      const path = fresh();
      mkdirSync(dirname(path));
      writeFileSync(path, bad);
      assert.throws(
        () => loadWgKey(path),
        (err: unknown) =>
          isWeftError(err) &&
          err.code === 'WEFT_ERR_WIREGUARD_KEY' &&
          err.message.includes(path) &&
          /32 bytes/.test(err.message) &&
          (bad === '' || !err.message.includes(bad)),
        JSON.stringify(bad),
      );
    }
  });

  it('parseWgKey takes exactly a padded base64 of 32 bytes', () => {
    const k = Buffer.alloc(32, 7).toString('base64');
    assert.ok(parseWgKey(k));
    assert.equal(parseWgKey(k.slice(0, 43)), null);
    assert.equal(parseWgKey(`${k} `), null);
    assert.equal(parseWgKey(k.replace(/.=$/, 'B=')), null, 'spare bits set');
  });
});
