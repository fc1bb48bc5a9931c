#include "wg_noise.h"

#include <time.h>

#include <cstring>
#include <mutex>

namespace weft {
namespace wg {

namespace {

uint64_t ReadClock(clockid_t id) {
  timespec ts{};
  clock_gettime(id, &ts);
  return uint64_t(ts.tv_sec) * kSecond + uint64_t(ts.tv_nsec);
}

struct Initial {
  uint8_t chain_key[kHashLen];
  uint8_t hash[kHashLen];
};

const Initial& Init() {
  static Initial init;
  static std::once_flag once;
  std::call_once(once, [] {
    CryptoContext c;
    c.Hash(init.chain_key, reinterpret_cast<const uint8_t*>(kConstruction),
           sizeof(kConstruction) - 1);
    c.Hash(init.hash, init.chain_key, kHashLen, reinterpret_cast<const uint8_t*>(kIdentifier),
           sizeof(kIdentifier) - 1);
  });
  return init;
}

// HASH(label ‖ key): the mac1 key and the cookie key of a public key.
bool LabelKey(CryptoContext& c, uint8_t out[kHashLen], const char* label,
              const uint8_t key[kKeyLen]) {
  return c.Hash(out, reinterpret_cast<const uint8_t*>(label), 8, key, kKeyLen);
}

}  // namespace

uint64_t SystemClock::MonotonicNs() const { return ReadClock(CLOCK_MONOTONIC); }
uint64_t SystemClock::WallNs() const { return ReadClock(CLOCK_REALTIME); }

void Tai64n(uint8_t out[kTimestampLen], uint64_t wall_ns) {
  uint64_t secs = 0x400000000000000aull + wall_ns / kSecond;
  uint32_t nanos = uint32_t(wall_ns % kSecond) & ~uint32_t(0xffffff);
  for (int i = 0; i < 8; i++) out[i] = uint8_t(secs >> (56 - 8 * i));
  for (int i = 0; i < 4; i++) out[8 + i] = uint8_t(nanos >> (24 - 8 * i));
}

const uint8_t* InitialChainKey() { return Init().chain_key; }
const uint8_t* InitialHash() { return Init().hash; }

bool MixHash(CryptoContext& c, uint8_t h[kHashLen], const uint8_t* data, size_t len) {
  uint8_t next[kHashLen];
  bool ok = c.Hash(next, h, kHashLen, data, len);
  std::memcpy(h, next, kHashLen);
  return ok;
}

uint32_t MessageTypeOf(const uint8_t* msg, size_t len) {
  if (len < 4) return 0;
  uint32_t type = GetLe32(msg);
  switch (type) {
    case kMessageInitiation:
      return len == kInitiationSize ? type : 0;
    case kMessageResponse:
      return len == kResponseSize ? type : 0;
    case kMessageCookieReply:
      return len == kCookieReplySize ? type : 0;
    case kMessageTransport:
      return len >= kKeepaliveSize ? type : 0;
    default:
      return 0;
  }
}

// ---- CookieChecker ----

bool CookieChecker::Init(CryptoContext& c, const uint8_t local_public[kKeyLen]) {
  has_secret_ = false;
  return LabelKey(c, mac1_key_, kLabelMac1, local_public) &&
         LabelKey(c, cookie_key_, kLabelCookie, local_public);
}

CookieChecker::~CookieChecker() {
  Wipe(secret_, sizeof(secret_));
  Wipe(cookie_key_, sizeof(cookie_key_));
}

bool CookieChecker::CheckMac1(CryptoContext& c, const uint8_t* msg, size_t len) const {
  uint8_t mac[kMacLen];
  return c.Mac(mac, mac1_key_, kHashLen, msg, Mac1Offset(len)) &&
         Equal(mac, msg + Mac1Offset(len), kMacLen);
}

bool CookieChecker::Cookie(CryptoContext& c, uint8_t out[kCookieLen], const uint8_t* src,
                           size_t src_len, uint64_t now) {
  if (!has_secret_ || now - secret_set_ >= kCookieRefreshTime) {
    if (!RandomBytes(secret_, sizeof(secret_))) return false;
    secret_set_ = now;
    has_secret_ = true;
  }
  return c.Mac(out, secret_, sizeof(secret_), src, src_len);
}

bool CookieChecker::CheckMac2(CryptoContext& c, const uint8_t* msg, size_t len, const uint8_t* src,
                              size_t src_len, uint64_t now) {
  // An expired secret answers nothing: the sender's cookie is from the previous one.
  if (!has_secret_ || now - secret_set_ >= kCookieRefreshTime) return false;
  uint8_t cookie[kCookieLen], mac[kMacLen];
  bool ok = Cookie(c, cookie, src, src_len, now) &&
            c.Mac(mac, cookie, kCookieLen, msg, Mac2Offset(len)) &&
            Equal(mac, msg + Mac2Offset(len), kMacLen);
  Wipe(cookie, sizeof(cookie));
  return ok;
}

bool CookieChecker::CreateReply(CryptoContext& c, uint8_t out[kCookieReplySize], const uint8_t* msg,
                                size_t len, uint32_t receiver, const uint8_t* src, size_t src_len,
                                uint64_t now) {
  uint8_t cookie[kCookieLen];
  std::memset(out, 0, kCookieReplySize);
  PutLe32(out, kMessageCookieReply);
  PutLe32(out + kCookieReceiver, receiver);
  bool ok = RandomBytes(out + kCookieNonce, kXNonceLen) && Cookie(c, cookie, src, src_len, now) &&
            c.XSeal(out + kCookieBody, cookie_key_, out + kCookieNonce, cookie, kCookieLen,
                    msg + Mac1Offset(len), kMacLen);
  Wipe(cookie, sizeof(cookie));
  return ok;
}

// ---- CookieGenerator ----

bool CookieGenerator::Init(CryptoContext& c, const uint8_t remote_public[kKeyLen]) {
  has_last_mac1_ = has_cookie_ = false;
  return LabelKey(c, mac1_key_, kLabelMac1, remote_public) &&
         LabelKey(c, cookie_key_, kLabelCookie, remote_public);
}

CookieGenerator::~CookieGenerator() { Wipe(cookie_, sizeof(cookie_)); }

bool CookieGenerator::AddMacs(CryptoContext& c, uint8_t* msg, size_t len, uint64_t now) {
  uint8_t* mac1 = msg + Mac1Offset(len);
  uint8_t* mac2 = msg + Mac2Offset(len);
  if (!c.Mac(mac1, mac1_key_, kHashLen, msg, Mac1Offset(len))) return false;
  std::memcpy(last_mac1_, mac1, kMacLen);
  has_last_mac1_ = true;
  if (!has_cookie(now)) {
    std::memset(mac2, 0, kMacLen);
    return true;
  }
  return c.Mac(mac2, cookie_, kCookieLen, msg, Mac2Offset(len));
}

bool CookieGenerator::ConsumeReply(CryptoContext& c, const uint8_t msg[kCookieReplySize],
                                   uint64_t now) {
  if (!has_last_mac1_) return false;
  uint8_t cookie[kCookieLen];
  if (!c.XOpen(cookie, cookie_key_, msg + kCookieNonce, msg + kCookieBody, kCookieLen + kTagLen,
               last_mac1_, kMacLen)) {
    return false;
  }
  std::memcpy(cookie_, cookie, kCookieLen);
  Wipe(cookie, sizeof(cookie));
  cookie_set_ = now;
  has_cookie_ = true;
  return true;
}

}  // namespace wg
}  // namespace weft
