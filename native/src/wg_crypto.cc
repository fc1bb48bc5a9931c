#include "wg_crypto.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <cstring>
#include <mutex>

namespace weft {
namespace wg {

namespace {

// The algorithms, fetched once: EVP_chacha20_poly1305() and friends would fetch on every init.
struct Algorithms {
  EVP_CIPHER* aead = nullptr;
  EVP_CIPHER* chacha20 = nullptr;
  EVP_MAC* poly1305 = nullptr;
  EVP_MD* blake2s = nullptr;
  EVP_MAC* blake2smac = nullptr;
  EVP_MAC* hmac = nullptr;
  std::string error;
};

const Algorithms& Algs() {
  static Algorithms algs;
  static std::once_flag once;
  std::call_once(once, [] {
    algs.aead = EVP_CIPHER_fetch(nullptr, "ChaCha20-Poly1305", nullptr);
    algs.chacha20 = EVP_CIPHER_fetch(nullptr, "ChaCha20", nullptr);
    algs.poly1305 = EVP_MAC_fetch(nullptr, "POLY1305", nullptr);
    algs.blake2s = EVP_MD_fetch(nullptr, "BLAKE2S-256", nullptr);
    algs.blake2smac = EVP_MAC_fetch(nullptr, "BLAKE2SMAC", nullptr);
    algs.hmac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
    if (!algs.aead) algs.error = "libcrypto has no ChaCha20-Poly1305";
    if (!algs.chacha20) algs.error = "libcrypto has no ChaCha20";
    if (!algs.poly1305) algs.error = "libcrypto has no POLY1305";
    if (!algs.blake2s) algs.error = "libcrypto has no BLAKE2S-256";
    if (!algs.blake2smac) algs.error = "libcrypto has no BLAKE2SMAC";
    if (!algs.hmac) algs.error = "libcrypto has no HMAC";
  });
  return algs;
}

uint32_t Load32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

void Store32(uint8_t* p, uint32_t v) {
  p[0] = uint8_t(v);
  p[1] = uint8_t(v >> 8);
  p[2] = uint8_t(v >> 16);
  p[3] = uint8_t(v >> 24);
}

uint32_t Rotl(uint32_t v, int n) { return (v << n) | (v >> (32 - n)); }

void QuarterRound(uint32_t* x, int a, int b, int c, int d) {
  x[a] += x[b];
  x[d] = Rotl(x[d] ^ x[a], 16);
  x[c] += x[d];
  x[b] = Rotl(x[b] ^ x[c], 12);
  x[a] += x[b];
  x[d] = Rotl(x[d] ^ x[a], 8);
  x[c] += x[d];
  x[b] = Rotl(x[b] ^ x[c], 7);
}

// An EVP_PKEY for a raw X25519 key (private or public).
EVP_PKEY* RawKey(const uint8_t key[kKeyLen], bool priv) {
  return priv ? EVP_PKEY_new_raw_private_key_ex(nullptr, "X25519", nullptr, key, kKeyLen)
              : EVP_PKEY_new_raw_public_key_ex(nullptr, "X25519", nullptr, key, kKeyLen);
}

}  // namespace

void Wipe(void* p, size_t len) { OPENSSL_cleanse(p, len); }

bool Equal(const uint8_t* a, const uint8_t* b, size_t len) { return CRYPTO_memcmp(a, b, len) == 0; }

bool RandomBytes(uint8_t* out, size_t len) { return RAND_bytes(out, int(len)) == 1; }

bool CryptoInit(std::string* error) {
  const Algorithms& a = Algs();
  if (!a.error.empty()) {
    if (error) *error = a.error;
    return false;
  }
  return true;
}

void ClampPrivateKey(uint8_t key[kKeyLen]) {
  key[0] &= 248;
  key[31] &= 127;
  key[31] |= 64;
}

bool GeneratePrivateKey(uint8_t out[kKeyLen]) {
  if (!RandomBytes(out, kKeyLen)) return false;
  ClampPrivateKey(out);
  return true;
}

bool PublicKey(uint8_t out[kKeyLen], const uint8_t priv[kKeyLen]) {
  EVP_PKEY* k = RawKey(priv, true);
  if (!k) return false;
  size_t len = kKeyLen;
  bool ok = EVP_PKEY_get_raw_public_key(k, out, &len) == 1 && len == kKeyLen;
  EVP_PKEY_free(k);  // frees (and cleanses) the private key copy
  return ok;
}

bool X25519(uint8_t out[kKeyLen], const uint8_t priv[kKeyLen], const uint8_t pub[kKeyLen]) {
  EVP_PKEY* k = RawKey(priv, true);
  EVP_PKEY* peer = RawKey(pub, false);
  EVP_PKEY_CTX* ctx = k ? EVP_PKEY_CTX_new_from_pkey(nullptr, k, nullptr) : nullptr;
  size_t len = kKeyLen;
  // OpenSSL's X25519 derive fails on an all-zero result (RFC 7748 §6.1's check).
  bool ok = ctx && peer && EVP_PKEY_derive_init(ctx) == 1 &&
            EVP_PKEY_derive_set_peer(ctx, peer) == 1 && EVP_PKEY_derive(ctx, out, &len) == 1 &&
            len == kKeyLen;
  EVP_PKEY_CTX_free(ctx);
  EVP_PKEY_free(peer);
  EVP_PKEY_free(k);
  if (!ok) Wipe(out, kKeyLen);
  return ok;
}

bool KeyedBlake2s(uint8_t* out, size_t out_len, const uint8_t* key, size_t key_len,
                  const uint8_t* in, size_t len) {
  const Algorithms& a = Algs();
  if (!a.blake2smac) return false;
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(a.blake2smac);
  OSSL_PARAM params[] = {OSSL_PARAM_construct_size_t(OSSL_MAC_PARAM_SIZE, &out_len),
                         OSSL_PARAM_construct_end()};
  size_t n = 0;
  bool ok = ctx && EVP_MAC_init(ctx, key, key_len, params) == 1 &&
            EVP_MAC_update(ctx, in, len) == 1 && EVP_MAC_final(ctx, out, &n, out_len) == 1 &&
            n == out_len;
  EVP_MAC_CTX_free(ctx);
  return ok;
}

void HChaCha20(uint8_t out[kKeyLen], const uint8_t key[kKeyLen], const uint8_t nonce[16]) {
  uint32_t x[16] = {0x61707865, 0x3320646e, 0x79622d32, 0x6b206574};  // "expand 32-byte k"
  for (int i = 0; i < 8; i++) x[4 + i] = Load32(key + 4 * i);
  for (int i = 0; i < 4; i++) x[12 + i] = Load32(nonce + 4 * i);
  for (int i = 0; i < 10; i++) {
    QuarterRound(x, 0, 4, 8, 12);
    QuarterRound(x, 1, 5, 9, 13);
    QuarterRound(x, 2, 6, 10, 14);
    QuarterRound(x, 3, 7, 11, 15);
    QuarterRound(x, 0, 5, 10, 15);
    QuarterRound(x, 1, 6, 11, 12);
    QuarterRound(x, 2, 7, 8, 13);
    QuarterRound(x, 3, 4, 9, 14);
  }
  for (int i = 0; i < 4; i++) Store32(out + 4 * i, x[i]);
  for (int i = 0; i < 4; i++) Store32(out + 16 + 4 * i, x[12 + i]);
  Wipe(x, sizeof(x));
}

CryptoContext::CryptoContext() {
  const Algorithms& a = Algs();
  if (!a.error.empty()) return;
  cipher_ = EVP_CIPHER_CTX_new();
  md_ = EVP_MD_CTX_new();
  mac_ = EVP_MAC_CTX_new(a.blake2smac);
  hmac_ = EVP_MAC_CTX_new(a.hmac);
  if (!cipher_ || !md_ || !mac_ || !hmac_) return;
  size_t mac_size = kMacLen;
  OSSL_PARAM mac_params[] = {OSSL_PARAM_construct_size_t(OSSL_MAC_PARAM_SIZE, &mac_size),
                             OSSL_PARAM_construct_end()};
  char digest[] = "BLAKE2S-256";
  OSSL_PARAM hmac_params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                              OSSL_PARAM_construct_end()};
  ok_ = EVP_MAC_CTX_set_params(mac_, mac_params) == 1 &&
        EVP_MAC_CTX_set_params(hmac_, hmac_params) == 1;
}

CryptoContext::~CryptoContext() {
  EVP_CIPHER_CTX_free(cipher_);  // each free cleanses the key material it held
  EVP_MD_CTX_free(md_);
  EVP_MAC_CTX_free(mac_);
  EVP_MAC_CTX_free(hmac_);
}

bool CryptoContext::Aead(bool seal, uint8_t* out, const uint8_t key[kKeyLen],
                         const uint8_t nonce[kNonceLen], const uint8_t* in, size_t len,
                         const uint8_t* ad, size_t ad_len) {
  if (!ok_) return false;
  if (!seal && len < kTagLen) return false;
  size_t body = seal ? len : len - kTagLen;
  if (body > size_t(INT32_MAX) || ad_len > size_t(INT32_MAX)) return false;
  int n = 0;
  if (EVP_CipherInit_ex2(cipher_, Algs().aead, key, nonce, seal ? 1 : 0, nullptr) != 1)
    return false;
  if (ad_len && EVP_CipherUpdate(cipher_, nullptr, &n, ad, int(ad_len)) != 1) return false;
  if (!seal && EVP_CIPHER_CTX_ctrl(cipher_, EVP_CTRL_AEAD_SET_TAG, int(kTagLen),
                                   const_cast<uint8_t*>(in + body)) != 1) {
    return false;
  }
  if (body && EVP_CipherUpdate(cipher_, out, &n, in, int(body)) != 1) return false;
  if (EVP_CipherFinal_ex(cipher_, out + body, &n) != 1) {
    if (!seal) Wipe(out, body);  // never hand out a forged packet's plaintext
    return false;
  }
  if (seal)
    return EVP_CIPHER_CTX_ctrl(cipher_, EVP_CTRL_AEAD_GET_TAG, int(kTagLen), out + body) == 1;
  return true;
}

bool CryptoContext::Seal(uint8_t* out, const uint8_t key[kKeyLen], const uint8_t nonce[kNonceLen],
                         const uint8_t* in, size_t len, const uint8_t* ad, size_t ad_len) {
  return Aead(true, out, key, nonce, in, len, ad, ad_len);
}

bool CryptoContext::Open(uint8_t* out, const uint8_t key[kKeyLen], const uint8_t nonce[kNonceLen],
                         const uint8_t* in, size_t len, const uint8_t* ad, size_t ad_len) {
  return Aead(false, out, key, nonce, in, len, ad, ad_len);
}

namespace {
void CounterNonce(uint8_t nonce[kNonceLen], uint64_t counter) {
  std::memset(nonce, 0, 4);
  for (int i = 0; i < 8; i++) nonce[4 + i] = uint8_t(counter >> (8 * i));
}
}  // namespace

bool CryptoContext::SealCounter(uint8_t* out, const uint8_t key[kKeyLen], uint64_t counter,
                                const uint8_t* in, size_t len, const uint8_t* ad, size_t ad_len) {
  uint8_t nonce[kNonceLen];
  CounterNonce(nonce, counter);
  return Aead(true, out, key, nonce, in, len, ad, ad_len);
}

bool CryptoContext::OpenCounter(uint8_t* out, const uint8_t key[kKeyLen], uint64_t counter,
                                const uint8_t* in, size_t len, const uint8_t* ad, size_t ad_len) {
  uint8_t nonce[kNonceLen];
  CounterNonce(nonce, counter);
  return Aead(false, out, key, nonce, in, len, ad, ad_len);
}

bool AeadKey::Init(const uint8_t key[kKeyLen], bool seal) {
  Clear();
  const Algorithms& a = Algs();
  if (!a.chacha20 || !a.poly1305) return false;
  uint8_t iv[16] = {};
  stream_ = EVP_CIPHER_CTX_new();
  mac_ = EVP_MAC_CTX_new(a.poly1305);
  if (stream_ == nullptr || mac_ == nullptr ||
      EVP_CipherInit_ex2(stream_, a.chacha20, key, iv, 1, nullptr) != 1) {
    Clear();
    return false;
  }
  seal_ = seal;
  return true;
}

void AeadKey::Clear() {
  EVP_CIPHER_CTX_free(stream_);  // cleanses the key schedule it held
  EVP_MAC_CTX_free(mac_);
  stream_ = nullptr;
  mac_ = nullptr;
  if (!scratch_.empty()) Wipe(scratch_.data(), scratch_.size());
}

// RFC 8439 §2.8 in one ChaCha20 call: the scratch holds a zero block, then the message, rounded
// up to whole blocks. Run from block counter 0 under the message's nonce, the zero block becomes
// the one-time Poly1305 key (§2.6) and the rest the message XOR its key stream from block 1 on
// (§2.4). OpenSSL's ChaCha20-Poly1305 makes three calls of ChaCha20 for a message whose length
// is not a multiple of 64 (the Poly1305 key block, the whole blocks, the tail block), and each
// call costs about as much as 256 bytes of key stream: a third of a full-size packet's sealing.
bool AeadKey::Stream(uint64_t counter, const uint8_t* in, size_t len) {
  const size_t span = kBlockLen + ((len + kBlockLen - 1) & ~(kBlockLen - 1));
  if (scratch_.size() < span) scratch_.resize(span);
  std::memset(scratch_.data(), 0, kBlockLen);
  if (len) std::memcpy(scratch_.data() + kBlockLen, in, len);
  // The ChaCha20 cipher's IV: the 32-bit block counter (0), then WireGuard's nonce.
  uint8_t iv[16] = {};
  CounterNonce(iv + 4, counter);
  int n = 0;
  return EVP_CipherInit_ex2(stream_, nullptr, nullptr, iv, -1, nullptr) == 1 &&
         EVP_CipherUpdate(stream_, scratch_.data(), &n, scratch_.data(), int(span)) == 1 &&
         EVP_MAC_init(mac_, scratch_.data(), kKeyLen, nullptr) == 1;
}

// The tag of `len` bytes of ciphertext (no associated data): Poly1305 over the ciphertext padded
// to 16 bytes, then the two lengths (RFC 8439 §2.8).
bool AeadKey::Tag(uint8_t tag[kTagLen], const uint8_t* ct, size_t len) {
  uint8_t tail[2 * 16] = {};
  const size_t pad = (16 - len % 16) % 16;
  for (int i = 0; i < 8; i++) tail[pad + 8 + i] = uint8_t(uint64_t(len) >> (8 * i));
  size_t n = 0;
  return (len == 0 || EVP_MAC_update(mac_, ct, len) == 1) &&
         EVP_MAC_update(mac_, tail, pad + 16) == 1 && EVP_MAC_final(mac_, tag, &n, kTagLen) == 1 &&
         n == kTagLen;
}

bool AeadKey::SealCounter(uint8_t* out, uint64_t counter, const uint8_t* in, size_t len) {
  if (stream_ == nullptr || !seal_ || len > size_t(INT32_MAX) - 2 * kBlockLen) return false;
  bool ok = Stream(counter, in, len);
  const uint8_t* ct = scratch_.data() + kBlockLen;  // after Stream, which may grow the scratch
  ok = ok && Tag(out + len, ct, len);
  if (ok && len) std::memcpy(out, ct, len);
  Wipe(scratch_.data(), kKeyLen);  // the one-time key, whatever failed
  return ok;
}

bool AeadKey::OpenCounter(uint8_t* out, uint64_t counter, const uint8_t* in, size_t len) {
  if (stream_ == nullptr || seal_ || len < kTagLen || len > size_t(INT32_MAX) - 2 * kBlockLen)
    return false;
  const size_t body = len - kTagLen;
  uint8_t tag[kTagLen];
  // The tag is of the ciphertext, which `in` still holds (the scratch has the plaintext): a
  // forged message's plaintext never reaches `out`.
  const bool ok = Stream(counter, in, body) && Tag(tag, in, body) && Equal(tag, in + body, kTagLen);
  if (ok && body) std::memcpy(out, scratch_.data() + kBlockLen, body);
  Wipe(scratch_.data(), kKeyLen);
  return ok;
}

bool CryptoContext::XSeal(uint8_t* out, const uint8_t key[kKeyLen], const uint8_t nonce[kXNonceLen],
                          const uint8_t* in, size_t len, const uint8_t* ad, size_t ad_len) {
  uint8_t subkey[kKeyLen], n12[kNonceLen] = {};
  HChaCha20(subkey, key, nonce);
  std::memcpy(n12 + 4, nonce + 16, 8);
  bool ok = Aead(true, out, subkey, n12, in, len, ad, ad_len);
  Wipe(subkey, sizeof(subkey));
  return ok;
}

bool CryptoContext::XOpen(uint8_t* out, const uint8_t key[kKeyLen], const uint8_t nonce[kXNonceLen],
                          const uint8_t* in, size_t len, const uint8_t* ad, size_t ad_len) {
  uint8_t subkey[kKeyLen], n12[kNonceLen] = {};
  HChaCha20(subkey, key, nonce);
  std::memcpy(n12 + 4, nonce + 16, 8);
  bool ok = Aead(false, out, subkey, n12, in, len, ad, ad_len);
  Wipe(subkey, sizeof(subkey));
  return ok;
}

bool CryptoContext::Hash(uint8_t out[kHashLen], const uint8_t* a, size_t a_len, const uint8_t* b,
                         size_t b_len) {
  unsigned int n = 0;
  return ok_ && EVP_DigestInit_ex2(md_, Algs().blake2s, nullptr) == 1 &&
         EVP_DigestUpdate(md_, a, a_len) == 1 && (!b || EVP_DigestUpdate(md_, b, b_len) == 1) &&
         EVP_DigestFinal_ex(md_, out, &n) == 1 && n == kHashLen;
}

bool CryptoContext::Mac(uint8_t out[kMacLen], const uint8_t* key, size_t key_len, const uint8_t* in,
                        size_t len) {
  size_t n = 0;
  return ok_ && EVP_MAC_init(mac_, key, key_len, nullptr) == 1 &&
         EVP_MAC_update(mac_, in, len) == 1 && EVP_MAC_final(mac_, out, &n, kMacLen) == 1 &&
         n == kMacLen;
}

bool CryptoContext::Hmac(uint8_t out[kHashLen], const uint8_t* key, size_t key_len,
                         const uint8_t* in, size_t len) {
  size_t n = 0;
  return ok_ && EVP_MAC_init(hmac_, key, key_len, nullptr) == 1 &&
         EVP_MAC_update(hmac_, in, len) == 1 && EVP_MAC_final(hmac_, out, &n, kHashLen) == 1 &&
         n == kHashLen;
}

bool CryptoContext::Kdf(uint8_t* out1, uint8_t* out2, uint8_t* out3, const uint8_t key[kHashLen],
                        const uint8_t* input, size_t input_len) {
  // τ0 = HMAC(key, input); τ1 = HMAC(τ0, 0x1); τi = HMAC(τ0, τi−1 ‖ i).
  uint8_t t0[kHashLen], t[kHashLen + 1];
  bool ok = Hmac(t0, key, kHashLen, input, input_len);
  uint8_t* outs[3] = {out1, out2, out3};
  size_t prev = 0;
  for (int i = 0; ok && i < 3 && outs[i]; i++) {
    t[prev] = uint8_t(i + 1);
    uint8_t next[kHashLen];
    ok = Hmac(next, t0, kHashLen, t, prev + 1);
    std::memcpy(t, next, kHashLen);
    std::memcpy(outs[i], next, kHashLen);
    Wipe(next, sizeof(next));
    prev = kHashLen;
  }
  Wipe(t0, sizeof(t0));
  Wipe(t, sizeof(t));
  return ok;
}

}  // namespace wg
}  // namespace weft
