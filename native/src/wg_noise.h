// WireGuard's protocol constants, message layouts and the pieces of the Noise IKpsk2 handshake
// that hold no peer state: the symmetric state (chaining key + hash), TAI64N timestamps, and
// the mac1/mac2/cookie machinery of both sides. Names follow the whitepaper (§5) and
// wireguard-go's device/noise-protocol.go, cookie.go and constants.go.
#ifndef WEFT_NATIVE_WG_NOISE_H_
#define WEFT_NATIVE_WG_NOISE_H_

#include <cstddef>
#include <cstdint>

#include "wg_crypto.h"

namespace weft {
namespace wg {

// ---- the construction (whitepaper §5.4) ----
constexpr char kConstruction[] = "Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s";
constexpr char kIdentifier[] = "WireGuard v1 zx2c4 Jason@zx2c4.com";
constexpr char kLabelMac1[] = "mac1----";
constexpr char kLabelCookie[] = "cookie--";

// ---- messages: a little-endian u32 type (the 3 reserved bytes are zero), then the fields ----
enum MessageType : uint32_t {
  kMessageInitiation = 1,
  kMessageResponse = 2,
  kMessageCookieReply = 3,
  kMessageTransport = 4,
};
constexpr size_t kTimestampLen = 12;  // TAI64N
constexpr size_t kCookieLen = 16;
// Initiation: type, sender, ephemeral, static (32 + tag), timestamp (12 + tag), mac1, mac2.
constexpr size_t kInitiationSize =
    4 + 4 + 32 + (32 + kTagLen) + (kTimestampLen + kTagLen) + 16 + 16;
constexpr size_t kInitSender = 4, kInitEphemeral = 8, kInitStatic = 40, kInitTimestamp = 88;
// Response: type, sender, receiver, ephemeral, empty (0 + tag), mac1, mac2.
constexpr size_t kResponseSize = 4 + 4 + 4 + 32 + kTagLen + 16 + 16;
constexpr size_t kRespSender = 4, kRespReceiver = 8, kRespEphemeral = 12, kRespEmpty = 44;
// Cookie reply: type, receiver, nonce (24), cookie (16 + tag).
constexpr size_t kCookieReplySize = 4 + 4 + kXNonceLen + kCookieLen + kTagLen;
constexpr size_t kCookieReceiver = 4, kCookieNonce = 8, kCookieBody = 32;
// Transport data: type, receiver, counter (u64), then the sealed packet (padded to 16).
constexpr size_t kTransportHeaderSize = 16;
constexpr size_t kTransportReceiver = 4, kTransportCounter = 8;
constexpr size_t kKeepaliveSize = kTransportHeaderSize + kTagLen;
constexpr size_t kPaddingMultiple = 16;
// Where mac1 and mac2 sit in a handshake message of `size` bytes.
constexpr size_t Mac1Offset(size_t size) { return size - 32; }
constexpr size_t Mac2Offset(size_t size) { return size - 16; }

// ---- timers and limits (whitepaper §6.1; wireguard-go device/constants.go), nanoseconds ----
constexpr uint64_t kSecond = 1000000000ull;
constexpr uint64_t kRekeyAfterMessages = 1ull << 60;
constexpr uint64_t kRejectAfterMessages = ~0ull - (1ull << 13);  // 2^64 − 2^13 − 1
constexpr uint64_t kRekeyAfterTime = 120 * kSecond;
constexpr uint64_t kRejectAfterTime = 180 * kSecond;
constexpr uint64_t kRekeyAttemptTime = 90 * kSecond;
constexpr uint64_t kRekeyTimeout = 5 * kSecond;
constexpr uint64_t kMaxTimerHandshakes = 90 / 5;  // REKEY_ATTEMPT_TIME / REKEY_TIMEOUT
constexpr uint64_t kRekeyTimeoutJitterMax = 334 * 1000000ull;
constexpr uint64_t kKeepaliveTimeout = 10 * kSecond;
constexpr uint64_t kCookieRefreshTime = 120 * kSecond;
constexpr uint64_t kHandshakeInitiationRate = kSecond / 50;

// The protocol code never reads a clock itself: every time comes from one of these (tests
// inject a manual one). Monotonic drives timers, cookies and rate limits; wall time only the
// TAI64N timestamp of initiations.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual uint64_t MonotonicNs() const = 0;
  virtual uint64_t WallNs() const = 0;  // since the Unix epoch
};

// CLOCK_MONOTONIC and CLOCK_REALTIME.
class SystemClock : public Clock {
 public:
  uint64_t MonotonicNs() const override;
  uint64_t WallNs() const override;
};

// TAI64N of a wall time: big-endian 2^62 + 10 + seconds, then nanoseconds rounded down to 2^24 ns
// (as the kernel and wireguard-go whiten them, so the timestamp leaks no fine timing).
void Tai64n(uint8_t out[kTimestampLen], uint64_t wall_ns);

// The initial chaining key HASH(Construction) and hash HASH(Ci ‖ Identifier), computed once.
const uint8_t* InitialChainKey();
const uint8_t* InitialHash();

// h = HASH(h ‖ data)
bool MixHash(CryptoContext& c, uint8_t h[kHashLen], const uint8_t* data, size_t len);

// The responder's side of mac1/mac2: checks them with our static public key and the cookie
// secret (rotated every COOKIE refresh time), and builds cookie replies.
class CookieChecker {
 public:
  bool Init(CryptoContext& c, const uint8_t local_public[kKeyLen]);
  // mac1 of a handshake message of `len` bytes (148 or 92).
  bool CheckMac1(CryptoContext& c, const uint8_t* msg, size_t len) const;
  // mac2 against the cookie of this source address (opaque bytes: address and port).
  bool CheckMac2(CryptoContext& c, const uint8_t* msg, size_t len, const uint8_t* src,
                 size_t src_len, uint64_t now);
  // The 64-byte cookie reply to `msg` (whose sender index it is addressed to).
  bool CreateReply(CryptoContext& c, uint8_t out[kCookieReplySize], const uint8_t* msg, size_t len,
                   uint32_t receiver, const uint8_t* src, size_t src_len, uint64_t now);
  ~CookieChecker();

 private:
  bool Cookie(CryptoContext& c, uint8_t out[kCookieLen], const uint8_t* src, size_t src_len,
              uint64_t now);
  uint8_t mac1_key_[kHashLen] = {};
  uint8_t cookie_key_[kHashLen] = {};
  uint8_t secret_[kHashLen] = {};
  uint64_t secret_set_ = 0;
  bool has_secret_ = false;
};

// The initiator's side (one per peer, keyed with the peer's public key): writes mac1 and mac2
// into outgoing handshake messages and takes the cookie a cookie reply carries.
class CookieGenerator {
 public:
  bool Init(CryptoContext& c, const uint8_t remote_public[kKeyLen]);
  bool AddMacs(CryptoContext& c, uint8_t* msg, size_t len, uint64_t now);
  // False when the reply does not open (not ours, or no message of ours to answer).
  bool ConsumeReply(CryptoContext& c, const uint8_t msg[kCookieReplySize], uint64_t now);
  bool has_cookie(uint64_t now) const {
    return has_cookie_ && now - cookie_set_ < kCookieRefreshTime;
  }
  ~CookieGenerator();

 private:
  uint8_t mac1_key_[kHashLen] = {};
  uint8_t cookie_key_[kHashLen] = {};
  uint8_t last_mac1_[kMacLen] = {};
  bool has_last_mac1_ = false;
  uint8_t cookie_[kCookieLen] = {};
  uint64_t cookie_set_ = 0;
  bool has_cookie_ = false;
};

// Little-endian field access for the message layouts.
inline uint32_t GetLe32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
inline void PutLe32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = uint8_t(v >> (8 * i));
}
inline uint64_t GetLe64(const uint8_t* p) { return GetLe32(p) | uint64_t(GetLe32(p + 4)) << 32; }
inline void PutLe64(uint8_t* p, uint64_t v) {
  PutLe32(p, uint32_t(v));
  PutLe32(p + 4, uint32_t(v >> 32));
}

// The type of a datagram when its size is right for that type (0: not a WireGuard message).
uint32_t MessageTypeOf(const uint8_t* msg, size_t len);

}  // namespace wg
}  // namespace weft

#endif  // WEFT_NATIVE_WG_NOISE_H_
