/**
 * Known-answer tests of WireGuard's primitives in the native addon (native/src/wg_crypto.cc over
 * OpenSSL 3, HChaCha20 written there): RFC 7748 X25519, RFC 8439 ChaCha20-Poly1305,
 * draft-irtf-cfrg-xchacha HChaCha20 and XChaCha20-Poly1305, RFC 7693 / BLAKE2 reference BLAKE2s
 * (plain and keyed), and the WireGuard construction's initial chaining key and hash as the
 * official Rust implementation publishes them (WireGuard/wireguard-rs
 * src/wireguard/handshake/noise.rs INITIAL_CK / INITIAL_HS).
 */
import assert from 'node:assert/strict';
import { createCipheriv, randomBytes } from 'node:crypto';
import { describe, it } from 'node:test';
import { loadNative } from '../../src/common/native.js';

const native = loadNative();
const hex = (s: string): Buffer => Buffer.from(s.replace(/\s+/g, ''), 'hex');
const seq = (start: number, n: number): Buffer =>
  Buffer.from(Array.from({ length: n }, (_, i) => (start + i) & 0xff));
const crypto = (op: Parameters<typeof native.wgCrypto>[0], ...args: Buffer[]): string => {
  const out = native.wgCrypto(op, ...args);
  assert.ok(out, `${op} refused`);
  return out.toString('hex');
};

describe('X25519 (RFC 7748)', () => {
  it('§5.2 vectors: scalar × u-coordinate', () => {
    assert.equal(
      crypto(
        'x25519',
        hex('a546e36bf0527c9d3b16154b82465edd62144c0ac1fc5a18506a2244ba449ac4'),
        hex('e6db6867583030db3594c1a424b15f7c726624ec26b3353b10a903a6d0ab1c4c'),
      ),
      'c3da55379de9c6908e94ea4df28d084f32eccf03491c71f754b4075577a28552',
    );
    assert.equal(
      crypto(
        'x25519',
        hex('4b66e9d4d1b4673c5ad22691957d6af5c11b6421e0ea01d42ca4169e7918ba0d'),
        hex('e5210f12786811d3f4b7959d0538ae2c31dbe7106fc03c3efc4cd549c715a493'),
      ),
      '95cbde9476e8907d7aade45cb4b873f88b595a68799fa152e6f8f7647aac7957',
    );
  });

  it('§5.2 iteration: one round from k = u = 9', () => {
    const nine = Buffer.alloc(32);
    nine[0] = 9;
    assert.equal(
      crypto('x25519', nine, nine),
      '422c8e7a6227d7bca1350b3e2bb7279f7897b87bb6854b783c60e80311ae3079',
    );
  });

  it('§6.1 Diffie-Hellman: both public keys and the shared secret', () => {
    const alice = hex('77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a');
    const bob = hex('5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb');
    const alicePub = '8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a';
    const bobPub = 'de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f';
    const shared = '4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742';
    assert.equal(crypto('publicKey', alice), alicePub);
    assert.equal(crypto('publicKey', bob), bobPub);
    assert.equal(crypto('x25519', alice, hex(bobPub)), shared);
    assert.equal(crypto('x25519', bob, hex(alicePub)), shared);
  });

  it('refuses a low-order point (all-zero shared secret), as WireGuard does', () => {
    assert.equal(native.wgCrypto('x25519', seq(1, 32), Buffer.alloc(32)), null);
  });
});

// RFC 8439 §2.8.2 and draft-irtf-cfrg-xchacha-03 §A.3.1 share the plaintext and AAD.
const SUNSCREEN = Buffer.from(
  "Ladies and Gentlemen of the class of '99: If I could offer you only one tip for the future, sunscreen would be it.",
);
const AAD = hex('50515253c0c1c2c3c4c5c6c7');

describe('ChaCha20-Poly1305 (RFC 8439 §2.8.2)', () => {
  const key = seq(0x80, 32);
  const nonce = hex('070000004041424344454647');
  const sealed =
    'd31a8d34648e60db7b86afbc53ef7ec2a4aded51296e08fea9e2b5a736ee62d63dbea45e8ca9671282fafb69da92728b1a71de0a9e060b2905d6a5b67ecd3b3692ddbd7f2d778b8c9803aee328091b58fab324e4fad675945585808b4831d7bc3ff4def08e4b7a9de576d26586cec64b6116' +
    '1ae10b594f09e26a7e902ecbd0600691';

  it('seals to the published ciphertext and tag', () => {
    assert.equal(crypto('seal', key, nonce, AAD, SUNSCREEN), sealed);
  });

  it('opens it back, and refuses a flipped bit in the ciphertext, the tag or the AAD', () => {
    assert.deepEqual(native.wgCrypto('open', key, nonce, AAD, hex(sealed)), SUNSCREEN);
    for (const at of [0, 60, hex(sealed).length - 1]) {
      const bad = hex(sealed);
      bad[at] = bad[at]! ^ 1;
      assert.equal(native.wgCrypto('open', key, nonce, AAD, bad), null, `bit at ${at}`);
    }
    const badAad = Buffer.from(AAD);
    badAad[0] = badAad[0]! ^ 1;
    assert.equal(native.wgCrypto('open', key, nonce, badAad, hex(sealed)), null);
  });
});

describe("a keyed ChaCha20-Poly1305 context (a key pair's: keyed once, a nonce per message)", () => {
  const key = seq(0x80, 32);
  // WireGuard's nonce: 4 zero bytes, then the counter little-endian.
  const nonceOf = (c: bigint): Buffer => {
    const n = Buffer.alloc(12);
    n.writeBigUInt64LE(c, 4);
    return n;
  };
  const counters = [0n, 1n, 2n, 7n, 0xfffffffen, 2n ** 60n + 3n];
  const packed = (cs: readonly bigint[]): Buffer =>
    Buffer.concat(cs.map((c) => Buffer.from(nonceOf(c).subarray(4))));

  it("seals each message as a one-shot seal under that counter's nonce", () => {
    for (const len of [0, 1, 63, 64, 65, 1440, 1456]) {
      const msg = seq(len, len);
      const keyed = crypto('sealKeyed', key, packed(counters), msg);
      const oneShot = counters
        .map((c) => crypto('seal', key, nonceOf(c), Buffer.alloc(0), msg))
        .join('');
      assert.equal(keyed, oneShot, `length ${len}`);
    }
  });

  it('opens each in turn; a forged one is refused (no plaintext) and the next still opens', () => {
    const msg = seq(3, 100);
    const sealed = counters.map((c) => hex(crypto('seal', key, nonceOf(c), Buffer.alloc(0), msg)));
    sealed[2]![10] = sealed[2]![10]! ^ 1; // ciphertext bit
    sealed[4]![sealed[4]!.length - 1] = sealed[4]![sealed[4]!.length - 1]! ^ 1; // tag bit
    const out = native.wgCrypto('openKeyed', key, packed(counters), Buffer.concat(sealed));
    assert.ok(out);
    const each = 1 + msg.length;
    for (let i = 0; i < counters.length; i++) {
      const r: Buffer = out.subarray(i * each, (i + 1) * each);
      if (i === 2 || i === 4) {
        assert.equal(r[0], 0, `message ${i} refused`);
        assert.deepEqual(r.subarray(1), Buffer.alloc(msg.length), `message ${i} no plaintext`);
      } else {
        assert.equal(r[0], 1, `message ${i} opened`);
        assert.deepEqual(r.subarray(1), msg, `message ${i}`);
      }
    }
  });

  // The keyed context puts ChaCha20 and Poly1305 together itself (one ChaCha20 call per
  // message): every length of a block's worth either side of each boundary, and long ones,
  // against node:crypto's ChaCha20-Poly1305, under random keys and counters.
  it("seals and opens every length as node:crypto's ChaCha20-Poly1305 does", () => {
    const lengths = [...Array.from({ length: 260 }, (_, i) => i), 1400, 1424, 1440, 4095, 9001];
    lengths.push(65_519);
    for (const len of lengths) {
      const k = randomBytes(32);
      const counter = randomBytes(8).readBigUInt64LE();
      const msg = randomBytes(len);
      const cipher = createCipheriv('chacha20-poly1305', k, nonceOf(counter), {
        authTagLength: 16,
      });
      const expected = Buffer.concat([cipher.update(msg), cipher.final(), cipher.getAuthTag()]);
      assert.equal(
        crypto('sealKeyed', k, packed([counter]), msg),
        expected.toString('hex'),
        `${len}`,
      );
      const opened = native.wgCrypto('openKeyed', k, packed([counter]), expected);
      assert.deepEqual(opened, Buffer.concat([Buffer.of(1), msg]), `open ${len}`);
    }
  });

  it('opens under the counter it was sealed with only', () => {
    const sealed = hex(crypto('seal', key, nonceOf(5n), Buffer.alloc(0), seq(1, 32)));
    const out = native.wgCrypto(
      'openKeyed',
      key,
      packed([6n, 5n]),
      Buffer.concat([sealed, sealed]),
    );
    assert.ok(out);
    assert.equal(out[0], 0);
    assert.equal(out[33], 1);
    assert.deepEqual(out.subarray(34), seq(1, 32));
  });
});

describe('XChaCha20-Poly1305 (draft-irtf-cfrg-xchacha-03)', () => {
  it('§2.2.1 HChaCha20 subkey', () => {
    assert.equal(
      crypto('hchacha20', seq(0, 32), hex('000000090000004a0000000031415927')),
      '82413b4227b27bfed30e42508a877d73a0f9e4d58a74a853c12ec41326d3ecdc',
    );
  });

  it('§A.3.1 AEAD vector: seal, open, and a forged tag refused', () => {
    const key = seq(0x80, 32);
    const nonce = hex('404142434445464748494a4b4c4d4e4f5051525354555657');
    const sealed =
      'bd6d179d3e83d43b9576579493c0e939572a1700252bfaccbed2902c21396cbb731c7f1b0b4aa6440bf3a82f4eda7e39ae64c6708c54c216cb96b72e1213b4522f8c9ba40db5d945b11b69b982c1bb9e3f3fac2bc369488f76b2383565d3fff921f9664c97637da9768812f615c68b13b52e' +
      'c0875924c1c7987947deafd8780acf49';
    assert.equal(crypto('xseal', key, nonce, AAD, SUNSCREEN), sealed);
    assert.deepEqual(native.wgCrypto('xopen', key, nonce, AAD, hex(sealed)), SUNSCREEN);
    const bad = hex(sealed);
    bad[bad.length - 1] = bad[bad.length - 1]! ^ 0x80;
    assert.equal(native.wgCrypto('xopen', key, nonce, AAD, bad), null);
  });
});

describe('BLAKE2s', () => {
  it('RFC 7693 Appendix B: BLAKE2s-256("abc")', () => {
    assert.equal(
      crypto('hash', Buffer.from('abc')),
      '508c5e8c327c14e2e1a72ba34eeb452f37458b209ed63a294d999b4c86675982',
    );
  });

  it('keyed (BLAKE2 reference blake2s-kat: key 00..1f, inputs "" and 00)', () => {
    const key = seq(0, 32);
    assert.equal(
      crypto('mac32', key, Buffer.alloc(0)),
      '48a8997da407876b3d79c0d92325ad3b89cbb754d86ab71aee047ad345fd2c49',
    );
    assert.equal(
      crypto('mac32', key, Buffer.from([0])),
      '40d15fee7c328830166ac3f918650f807e7e01e177258cdc0a39b11f598066f1',
    );
  });

  it('the 16-byte MAC is a distinct BLAKE2s (digest length in the parameter block)', () => {
    const key = seq(0, 32);
    const mac = crypto('mac', key, Buffer.from('abc'));
    assert.equal(mac.length, 32);
    assert.notEqual(mac, crypto('mac32', key, Buffer.from('abc')).slice(0, 32));
  });
});

describe('HMAC-BLAKE2s and the paper KDF', () => {
  it('HMAC is RFC 2104 over BLAKE2s-256 (block 64): checked against the definition', () => {
    // HMAC(K, m) = H((K ⊕ opad) ‖ H((K ⊕ ipad) ‖ m)) with the key zero-padded to 64 bytes.
    const key = seq(7, 32);
    const msg = Buffer.from('wireguard hmac');
    const pad = (b: number) => Buffer.from(Array.from({ length: 64 }, (_, i) => (key[i] ?? 0) ^ b));
    const inner = native.wgCrypto('hash', Buffer.concat([pad(0x36), msg]))!;
    const outer = native.wgCrypto('hash', Buffer.concat([pad(0x5c), inner]))!;
    assert.equal(crypto('hmac', key, msg), outer.toString('hex'));
  });

  it('KDF3: τ0 = HMAC(C, x), τ1 = HMAC(τ0, 1), τi = HMAC(τ0, τi−1 ‖ i)', () => {
    const ck = seq(1, 32);
    const input = seq(100, 32);
    const t0 = native.wgCrypto('hmac', ck, input)!;
    const t1 = native.wgCrypto('hmac', t0, Buffer.from([1]))!;
    const t2 = native.wgCrypto('hmac', t0, Buffer.concat([t1, Buffer.from([2])]))!;
    const t3 = native.wgCrypto('hmac', t0, Buffer.concat([t2, Buffer.from([3])]))!;
    assert.equal(crypto('kdf', ck, input), Buffer.concat([t1, t2, t3]).toString('hex'));
  });
});

describe('the WireGuard construction', () => {
  it('initial chaining key and hash equal the values wireguard-rs publishes', () => {
    const out = native.wgCrypto('initial')!;
    // HASH("Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s")
    assert.equal(
      out.subarray(0, 32).toString('hex'),
      '60e26daef327efc02ec335e2a025d2d016eb4206f87277f52d38d1988b78cd36',
    );
    // HASH(Ci ‖ "WireGuard v1 zx2c4 Jason@zx2c4.com")
    assert.equal(
      out.subarray(32).toString('hex'),
      '2211b361081ac566691243db458ad5322d9c6c662293e8b70ee19c65ba079ef3',
    );
    // and they are what the spec strings hash to
    const ci = native.wgCrypto('hash', Buffer.from('Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s'))!;
    assert.deepEqual(out.subarray(0, 32), ci);
    const hi = native.wgCrypto(
      'hash',
      Buffer.concat([ci, Buffer.from('WireGuard v1 zx2c4 Jason@zx2c4.com')]),
    )!;
    assert.deepEqual(out.subarray(32), hi);
  });

  it('TAI64N: 2^62 + 10 + seconds, big-endian, nanoseconds whitened to 2^24 ns', () => {
    const ns = Buffer.alloc(8);
    ns.writeBigUInt64LE(1700000000n * 1000000000n + 123456789n);
    // 1700000000 = 0x6553f100; 123456789 = 0x075bcd15 → 0x07000000
    assert.equal(crypto('tai64n', ns), '400000006553f10a' + '07000000');
  });
});
