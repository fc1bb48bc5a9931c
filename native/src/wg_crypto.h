// WireGuard's primitives over OpenSSL 3 (libcrypto): X25519, ChaCha20-Poly1305 (with the
// 64-bit counter nonce), XChaCha20-Poly1305 (HChaCha20 written here, the AEAD OpenSSL's),
// BLAKE2s-256, keyed BLAKE2s-128 (mac1, mac2, cookies), HMAC-BLAKE2s and the paper's HKDF.
// The algorithms are fetched once per process; a CryptoContext holds the reusable OpenSSL
// contexts, one per thread (a worker keeps its own): nothing is allocated per packet.
#ifndef WEFT_NATIVE_WG_CRYPTO_H_
#define WEFT_NATIVE_WG_CRYPTO_H_

#include <openssl/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace weft {
namespace wg {

constexpr size_t kKeyLen = 32;     // X25519 keys, AEAD keys, preshared keys
constexpr size_t kHashLen = 32;    // BLAKE2s-256
constexpr size_t kTagLen = 16;     // Poly1305
constexpr size_t kMacLen = 16;     // keyed BLAKE2s-128
constexpr size_t kNonceLen = 12;   // ChaCha20-Poly1305
constexpr size_t kXNonceLen = 24;  // XChaCha20-Poly1305

// Overwrites `len` bytes so the compiler cannot drop it (OPENSSL_cleanse).
void Wipe(void* p, size_t len);
// Constant-time equality (CRYPTO_memcmp).
bool Equal(const uint8_t* a, const uint8_t* b, size_t len);
// `len` bytes from OpenSSL's CSPRNG; false if it failed.
bool RandomBytes(uint8_t* out, size_t len);

// Fetches the algorithms once (thread-safe); false with a reason when this libcrypto lacks one.
bool CryptoInit(std::string* error);

// RFC 7748 clamping, as WireGuard applies it to every private key it generates or loads.
void ClampPrivateKey(uint8_t key[kKeyLen]);
// A new clamped private key.
bool GeneratePrivateKey(uint8_t out[kKeyLen]);
// The public key of a private key; false if OpenSSL refused.
bool PublicKey(uint8_t out[kKeyLen], const uint8_t priv[kKeyLen]);
// X25519(priv, pub); false when it failed or the shared secret is all zeros (a low-order point:
// WireGuard refuses it).
bool X25519(uint8_t out[kKeyLen], const uint8_t priv[kKeyLen], const uint8_t pub[kKeyLen]);

// Keyed BLAKE2s with any output length (1..32): makes its own context, so it is for tests and
// setup, not for the packet path (CryptoContext::Mac is).
bool KeyedBlake2s(uint8_t* out, size_t out_len, const uint8_t* key, size_t key_len,
                  const uint8_t* in, size_t len);

// HChaCha20 (draft-irtf-cfrg-xchacha §2.2): the 32-byte subkey of `key` and a 16-byte nonce.
void HChaCha20(uint8_t out[kKeyLen], const uint8_t key[kKeyLen], const uint8_t nonce[16]);

// ChaCha20-Poly1305 under one key with WireGuard's counter nonce (RFC 8439 §2.8, no associated
// data), for the packet path: OpenSSL's ChaCha20 keyed once, each message then only sets its
// nonce (EVP_CipherInit_ex2 with a cipher or a key frees and remakes the provider's context,
// which cost as much as the cipher itself on a full-size packet), and OpenSSL's Poly1305. The
// two are put together here so a message takes one ChaCha20 call (wg_crypto.cc says why); the
// tests check every length against OpenSSL's ChaCha20-Poly1305 and node:crypto's. One direction
// (seal or open) per key; one caller at a time. The key material lives in the contexts and the
// scratch: Clear (and the destructor) free and cleanse them. The scratch grows to the longest
// message seen (a full-size packet's, once), so nothing is allocated per packet.
class AeadKey {
 public:
  AeadKey() = default;
  ~AeadKey() { Clear(); }
  AeadKey(const AeadKey&) = delete;
  AeadKey& operator=(const AeadKey&) = delete;
  // Keys the context for sealing (`seal`) or opening; false (and not ready) if OpenSSL refused.
  bool Init(const uint8_t key[kKeyLen], bool seal);
  void Clear();
  bool ready() const { return stream_ != nullptr; }
  // As CryptoContext::SealCounter / OpenCounter (no associated data), under this key; a context
  // keyed for the other direction refuses. A refused message writes nothing to `out`.
  bool SealCounter(uint8_t* out, uint64_t counter, const uint8_t* in, size_t len);
  bool OpenCounter(uint8_t* out, uint64_t counter, const uint8_t* in, size_t len);

 private:
  static constexpr size_t kBlockLen = 64;  // a ChaCha20 block
  bool Stream(uint64_t counter, const uint8_t* in, size_t len);
  bool Tag(uint8_t tag[kTagLen], const uint8_t* ct, size_t len);

  EVP_CIPHER_CTX* stream_ = nullptr;  // ChaCha20
  EVP_MAC_CTX* mac_ = nullptr;        // Poly1305, keyed per message
  std::vector<uint8_t> scratch_;      // [Poly1305 key block][message, whole blocks]
  bool seal_ = false;
};

// The reusable OpenSSL contexts of one thread. Not thread-safe; cheap to keep, costly to make.
class CryptoContext {
 public:
  CryptoContext();
  ~CryptoContext();
  CryptoContext(const CryptoContext&) = delete;
  CryptoContext& operator=(const CryptoContext&) = delete;
  bool ok() const { return ok_; }

  // ChaCha20-Poly1305 with a 12-byte nonce: `out` gets len + kTagLen bytes (out may be in).
  bool Seal(uint8_t* out, const uint8_t key[kKeyLen], const uint8_t nonce[kNonceLen],
            const uint8_t* in, size_t len, const uint8_t* ad, size_t ad_len);
  // Opens len bytes (ciphertext + tag) into `out` (len − kTagLen bytes); false if forged.
  bool Open(uint8_t* out, const uint8_t key[kKeyLen], const uint8_t nonce[kNonceLen],
            const uint8_t* in, size_t len, const uint8_t* ad, size_t ad_len);
  // The same with WireGuard's nonce: 4 zero bytes, then the counter little-endian.
  bool SealCounter(uint8_t* out, const uint8_t key[kKeyLen], uint64_t counter, const uint8_t* in,
                   size_t len, const uint8_t* ad, size_t ad_len);
  bool OpenCounter(uint8_t* out, const uint8_t key[kKeyLen], uint64_t counter, const uint8_t* in,
                   size_t len, const uint8_t* ad, size_t ad_len);
  // XChaCha20-Poly1305 (24-byte nonce), for cookie replies.
  bool XSeal(uint8_t* out, const uint8_t key[kKeyLen], const uint8_t nonce[kXNonceLen],
             const uint8_t* in, size_t len, const uint8_t* ad, size_t ad_len);
  bool XOpen(uint8_t* out, const uint8_t key[kKeyLen], const uint8_t nonce[kXNonceLen],
             const uint8_t* in, size_t len, const uint8_t* ad, size_t ad_len);

  // BLAKE2s-256 of a‖b (b may be null).
  bool Hash(uint8_t out[kHashLen], const uint8_t* a, size_t a_len, const uint8_t* b = nullptr,
            size_t b_len = 0);
  // Keyed BLAKE2s with a 16-byte output (key 1..32 bytes).
  bool Mac(uint8_t out[kMacLen], const uint8_t* key, size_t key_len, const uint8_t* in, size_t len);
  // HMAC-BLAKE2s.
  bool Hmac(uint8_t out[kHashLen], const uint8_t* key, size_t key_len, const uint8_t* in,
            size_t len);
  // The paper's KDF_n(key, input): n (1..3) outputs of 32 bytes (HKDF over HMAC-BLAKE2s).
  bool Kdf(uint8_t* out1, uint8_t* out2, uint8_t* out3, const uint8_t key[kHashLen],
           const uint8_t* input, size_t input_len);

 private:
  bool Aead(bool seal, uint8_t* out, const uint8_t key[kKeyLen], const uint8_t nonce[kNonceLen],
            const uint8_t* in, size_t len, const uint8_t* ad, size_t ad_len);

  bool ok_ = false;
  EVP_CIPHER_CTX* cipher_ = nullptr;
  EVP_MD_CTX* md_ = nullptr;
  EVP_MAC_CTX* mac_ = nullptr;
  EVP_MAC_CTX* hmac_ = nullptr;
};

}  // namespace wg
}  // namespace weft

#endif  // WEFT_NATIVE_WG_CRYPTO_H_
