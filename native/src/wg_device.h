// A WireGuard device's protocol state: our static key, the peers (by public key), the index
// table, the Noise IKpsk2 handshake (whitepaper §5.4; wireguard-go device/noise-protocol.go),
// key pair rotation and each peer's timers. Plain C++ over byte spans: every call takes the
// datagram and the caller's output buffer, and times come from the injected Clock.
//
// Contract: one thread at a time drives a Device (the engine: under its lock). The engine's
// workers seal and open transport messages with their own keyed contexts outside that lock:
// ReserveSend / BeginOpen hand them a ticket under the lock, FinishOpen takes the result back.
// Nothing here allocates per data packet (a Keypair is allocated once per handshake).
#ifndef WEFT_NATIVE_WG_DEVICE_H_
#define WEFT_NATIVE_WG_DEVICE_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "wg_crypto.h"
#include "wg_noise.h"
#include "wg_session.h"

namespace weft {
namespace wg {

// One peer's handshake in progress (either role).
struct Handshake {
  enum class State : uint8_t {
    kZeroed,
    kInitiationCreated,
    kInitiationConsumed,
    kResponseCreated,
    kResponseConsumed,
  };
  State state = State::kZeroed;
  uint8_t hash[kHashLen] = {};
  uint8_t chain_key[kHashLen] = {};
  uint8_t local_ephemeral[kKeyLen] = {};  // private
  uint8_t remote_ephemeral[kKeyLen] = {};
  uint32_t local_index = 0;
  uint32_t remote_index = 0;
  // Replay protection of initiations: the greatest timestamp taken, and when (flood limit).
  uint8_t latest_timestamp[kTimestampLen] = {};
  uint64_t last_initiation_consumed = 0;
  bool consumed_any = false;
  // The last initiation or response we sent: no new initiation within REKEY_TIMEOUT of it.
  uint64_t last_sent_handshake = 0;
  bool sent_any = false;
  void ZeroSecrets();
  ~Handshake() { ZeroSecrets(); }
};

class Device;

// Handshakes per source address while under load (wireguard-go ratelimiter.go): a token bucket
// of 20 a second, 5 deep; entries idle for a second are forgotten.
class HandshakeRateLimiter {
 public:
  static constexpr uint64_t kPacketsPerSecond = 20;
  static constexpr uint64_t kBurstable = 5;
  static constexpr uint64_t kPacketCost = kSecond / kPacketsPerSecond;
  static constexpr uint64_t kMaxTokens = kPacketCost * kBurstable;
  static constexpr uint64_t kGarbageCollectTime = kSecond;
  bool Allow(const uint8_t* addr, size_t len, uint64_t now);
  size_t size() const { return table_.size(); }

 private:
  struct Entry {
    uint64_t last = 0;
    uint64_t tokens = 0;
  };
  std::map<std::array<uint8_t, 16>, Entry> table_;
  uint64_t last_collect_ = 0;
};

class Peer {
 public:
  const uint8_t* public_key() const { return public_key_.data(); }
  const Keypair* current() const { return current_.get(); }
  const Keypair* previous() const { return previous_.get(); }
  const Keypair* next() const { return next_.get(); }
  const Handshake& handshake() const { return hs_; }
  const PeerTimers& timers() const { return timers_; }
  // Wall time of the last completed handshake (0: none), as `wg show` reports it.
  uint64_t last_handshake_wall() const { return last_handshake_wall_; }
  // Where its last authenticated packet came from (the `src` bytes of Receive; roaming):
  // empty until one came.
  const uint8_t* endpoint() const { return endpoint_; }
  size_t endpoint_len() const { return endpoint_len_; }
  ~Peer();

 private:
  friend class Device;

  std::array<uint8_t, kKeyLen> public_key_{};
  uint8_t psk_[kKeyLen] = {};
  uint8_t static_static_[kKeyLen] = {};  // DH(our static, its static), precomputed
  bool static_static_ok_ = false;
  Handshake hs_;
  CookieGenerator cookies_;
  std::unique_ptr<Keypair> previous_, current_, next_;
  PeerTimers timers_;
  bool handshake_wanted_ = false;
  // Crossed initiations (Device::HandleInitiation): from this time on, one initiation may be
  // made within REKEY_TIMEOUT of the last handshake message (0: none).
  uint64_t crossed_reinitiate_at_ = 0;
  bool sent_last_minute_handshake_ = false;
  uint64_t last_handshake_wall_ = 0;
  uint8_t endpoint_[18] = {};
  size_t endpoint_len_ = 0;
};

// What Receive made of a datagram.
enum class Verdict : uint8_t {
  kResponse,       // an initiation was taken; `out` holds the response to send back
  kHandshakeDone,  // a response was taken; `out` holds the keepalive that confirms the session
  kCookieReply,    // under load without a valid mac2: `out` holds a cookie reply to send back
  kCookieTaken,    // a cookie reply was taken: the next handshake message carries mac2
  kData,           // `out` holds the decrypted IP packet (trimmed to its IP length)
  kKeepalive,      // an authenticated empty packet
  kDropMalformed,  // not a WireGuard message (type, size, reserved bytes)
  kDropMac1,       // mac1 wrong: never processed further
  kDropHandshake,  // did not authenticate: unknown static key, wrong PSK, bad AEAD, bad index
  kDropTimestamp,  // an initiation replayed (timestamp not newer) or faster than the flood limit
  kDropIndex,      // a transport message for an index we do not have
  kDropExpired,    // its key pair is past REJECT_AFTER_TIME / REJECT_AFTER_MESSAGES
  kDropForged,     // its tag did not verify
  kDropReplayed,   // its counter was seen or is behind the replay window
  kDropNotIp,      // decrypted but not an IPv4/IPv6 packet
  kDropCookie,     // a cookie reply that does not open
  kDropRateLimit,  // under load, a valid mac2, but its source address is over its handshake rate
};
const char* VerdictName(Verdict v);

struct Received {
  Verdict verdict = Verdict::kDropMalformed;
  Peer* peer = nullptr;
  size_t len = 0;  // bytes of `out` to send back (or deliver, for kData)
  bool send() const {
    return verdict == Verdict::kResponse || verdict == Verdict::kHandshakeDone ||
           verdict == Verdict::kCookieReply;
  }
};

// A transport message's key pair, looked up and checked (Device::BeginOpen): what opening it
// needs, so that the opening itself may run without the key pair (a worker's own context keyed
// with `key`, outside the device's lock). `key` points into the key pair: read it only while
// the key pair is certain to live (under the lock).
struct OpenTicket {
  uint64_t serial = 0;
  const uint8_t* key = nullptr;
  uint64_t counter = 0;
  uint32_t index = 0;
};

class Device {
 public:
  explicit Device(const Clock* clock);
  ~Device();
  bool ok() const { return crypto_.ok(); }

  // Our static key (clamped); peers added before keep working (their DH is recomputed).
  bool SetPrivateKey(const uint8_t priv[kKeyLen]);
  const uint8_t* public_key() const { return public_key_; }
  // A new peer (null if this key is ours or already a peer). psk may be null (all zeros).
  Peer* AddPeer(const uint8_t pub[kKeyLen], const uint8_t* psk, uint64_t persistent_keepalive_ns);
  Peer* FindPeer(const uint8_t pub[kKeyLen]) const;
  // Forgets a peer: its key material is zeroed and its indices go; `peer` is dangling after.
  void RemovePeer(Peer* peer);
  // Asks for a handshake with `peer` as if data waited for one (Tick then initiates, and goes
  // on until one is made): an engine that replaces another greets the peers that may still
  // hold a session with the one it replaces.
  void WantHandshake(Peer* peer) { peer->handshake_wanted_ = true; }
  // The load flag (the caller's handshake queue depth decides it): mac2 is then required.
  void set_under_load(bool on) { under_load_ = on; }

  // Seal in two halves, for a caller that seals with its own context outside its lock:
  // ReserveSend does all of Send but the sealing (the key pair checked, the counter taken,
  // the timers and the rekey told), then WriteTransport (wg_session.h) with the ticket.
  TransportStatus ReserveSend(Peer* peer, size_t len, size_t cap, size_t mtu, SealTicket* t);
  // Open in two halves likewise, for a transport message (MessageTypeOf kMessageTransport):
  // BeginOpen finds its key pair (false: `r` says why — kDropIndex, kDropExpired); the caller
  // opens msg + 16 with a context keyed with t.key (opened: the tag verified) into `out`
  // (n = len − 32 bytes); FinishOpen then does the rest of Receive: the replay window (a key
  // pair gone meanwhile: kDropExpired), key rotation, timers, the endpoint.
  bool BeginOpen(const uint8_t* msg, size_t len, OpenTicket* t, Received* r);
  Received FinishOpen(const OpenTicket& t, bool opened, const uint8_t* out, size_t n,
                      const uint8_t* src, size_t src_len);
  // Key pairs dropped so far (any thread): a caller keeping contexts keyed with key pairs'
  // keys (SealTicket / OpenTicket) checks them with KeypairLive when this moved, and forgets
  // those of key pairs gone.
  uint64_t keypair_drops() const { return keypair_drops_.load(std::memory_order_acquire); }
  bool KeypairLive(uint64_t serial) const { return live_serials_.count(serial) != 0; }

  // A handshake initiation to `peer` into out[148]; 0 if none may go now (REKEY_TIMEOUT since
  // the last one, or the peer's key gives an all-zero DH).
  size_t CreateInitiation(Peer* peer, uint8_t* out);
  // Seals a payload (empty: a keepalive) with the peer's current key pair. kExpired when there
  // is no usable key pair: a handshake is then wanted (Tick says so).
  TransportStatus Send(Peer* peer, const uint8_t* payload, size_t len, uint8_t* out, size_t cap,
                       size_t* out_len, size_t mtu = 0);
  // One datagram from `src`: the source address (4 or 16 bytes) then its port (2 bytes); the
  // cookie binds to all of it, the rate limit to the address. `out` needs room for
  // kInitiationSize or the datagram's payload (len − 32), whichever is larger.
  Received Receive(const uint8_t* msg, size_t len, const uint8_t* src, size_t src_len, uint8_t* out,
                   size_t cap);
  // Runs `peer`'s timers at the clock's now: zeroes expired key material and returns what to
  // send (PeerTimers::Action mask: kSendInitiation → CreateInitiation, kSendKeepalive → Send
  // of an empty payload).
  uint32_t Tick(Peer* peer);
  // When Tick(peer) next has something to do (monotonic ns; 0: nothing pending): its timers, a
  // wanted handshake (once REKEY_TIMEOUT after the last allows it) and key pair expiry.
  uint64_t NextDeadline(const Peer* peer) const;

  size_t index_count() const { return indices_.size(); }

 private:
  struct IndexEntry {
    Peer* peer;
    Keypair* keypair;  // null: the index names the peer's handshake
  };
  uint32_t NewIndex(Peer* peer);
  void DropIndex(uint32_t index);
  void DropKeypair(std::unique_ptr<Keypair>& kp);
  void ZeroAll(Peer* peer);
  bool BeginSession(Peer* peer);
  uint64_t Jitter();
  Received Dispatch(const uint8_t* msg, size_t len, const uint8_t* src, size_t src_len,
                    uint8_t* out, size_t cap);
  Received HandleInitiation(const uint8_t* msg, uint8_t* out);
  Received HandleResponse(const uint8_t* msg, uint8_t* out, size_t cap);
  Received HandleTransport(const uint8_t* msg, size_t len, uint8_t* out, size_t cap);
  // Roaming: an authenticated message moves `r.peer`'s endpoint to `src`.
  static void NoteEndpoint(const Received& r, const uint8_t* src, size_t src_len);

  const Clock* clock_;
  CryptoContext crypto_;
  uint8_t private_key_[kKeyLen] = {};
  uint8_t public_key_[kKeyLen] = {};
  bool has_key_ = false;
  bool under_load_ = false;
  uint64_t jitter_state_ = 1;
  CookieChecker cookie_checker_;
  HandshakeRateLimiter rate_limiter_;
  std::vector<std::unique_ptr<Peer>> peers_;
  std::map<std::array<uint8_t, kKeyLen>, Peer*> by_key_;
  std::unordered_map<uint32_t, IndexEntry> indices_;
  uint64_t next_serial_ = 1;
  std::unordered_set<uint64_t> live_serials_;
  std::atomic<uint64_t> keypair_drops_{0};
};

}  // namespace wg
}  // namespace weft

#endif  // WEFT_NATIVE_WG_DEVICE_H_
