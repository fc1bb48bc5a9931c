// A WireGuard session after the handshake: the transport key pair with its counters and replay
// window, the encryption and decryption of transport data messages (spans in, spans out, no
// allocation per packet: each key pair keys its OpenSSL contexts once), and a peer's
// timers as deadlines on the injected clock (wireguard-go device/timers.go, whitepaper §6).
#ifndef WEFT_NATIVE_WG_SESSION_H_
#define WEFT_NATIVE_WG_SESSION_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "wg_crypto.h"
#include "wg_noise.h"

namespace weft {
namespace wg {

// The sliding replay window of RFC 6479 as the kernel now and wireguard-go size it: a
// ring of 8192 bits, of which one word is the redundant block, so counters up to 8128 behind the
// newest are accepted once. (The kernel's first 2048 bits rejected 1 packet in 45 of a 4-stream
// transfer here: two loops per node opening one peer's packets on two shared CPUs, one of them
// preempted for a few milliseconds, fell more than 1984 counters behind the other.)
class ReplayWindow {
 public:
  static constexpr uint64_t kBitsTotal = 8192;
  static constexpr uint64_t kWordBits = 64;
  static constexpr uint64_t kWindowSize = kBitsTotal - kWordBits;
  // Accepts `counter` once (and records it); false for a duplicate, a counter too far behind
  // the newest, or one ≥ `limit`.
  bool Check(uint64_t counter, uint64_t limit = kRejectAfterMessages);
  void Reset();

 private:
  static constexpr uint64_t kWords = kBitsTotal / kWordBits;
  uint64_t last_ = 0;
  uint64_t bits_[kWords] = {};
};

// One direction pair of transport keys (KDF2 of the final chaining key) and its state.
struct Keypair {
  uint8_t send_key[kKeyLen] = {};
  uint8_t recv_key[kKeyLen] = {};
  // The next nonce to use (taken atomically: the key pair's expiry reads it without the seal).
  std::atomic<uint64_t> send_counter{0};
  // The keys' OpenSSL contexts, keyed on first use (SealTransport, Device::HandleTransport): one
  // sealer and one opener at a time (the engine seals and opens under the device's lock).
  AeadKey sealer;
  AeadKey opener;
  ReplayWindow replay;
  uint64_t created = 0;  // monotonic ns
  // Unique per key pair in its Device (never reused): what a worker's own keyed contexts are
  // filed under (SealTicket, OpenTicket).
  uint64_t serial = 0;
  bool is_initiator = false;
  uint32_t local_index = 0;
  uint32_t remote_index = 0;
  ~Keypair() { Zero(); }
  void Zero() {
    sealer.Clear();
    opener.Clear();
    Wipe(send_key, sizeof(send_key));
    Wipe(recv_key, sizeof(recv_key));
  }
};

enum class TransportStatus : uint8_t {
  kOk,
  kExpired,   // the key pair is past REJECT_AFTER_TIME or REJECT_AFTER_MESSAGES
  kTooShort,  // not a transport message, or no room for the result
  kForged,    // the AEAD refused it
  kReplayed,  // the counter was seen or is behind the window
};

// One transport message reserved under a key pair (ReserveTransport): everything sealing it
// needs, so that the sealing itself may run without the key pair (a worker's own context keyed
// with `key`, outside the device's lock). `key` points into the key pair: read it only while
// the key pair is certain to live (under the lock).
struct SealTicket {
  uint64_t serial = 0;
  const uint8_t* key = nullptr;
  uint64_t counter = 0;
  uint32_t remote_index = 0;
  size_t len = 0;    // payload bytes
  size_t body = 0;   // payload + zero padding (sealed)
  size_t total = 0;  // the datagram: header + body + tag
};

// Checks the key pair (kExpired past REJECT_AFTER_*), sizes the message (kTooShort if it does
// not fit `cap`) and takes its counter: the first half of SealTransport.
TransportStatus ReserveTransport(Keypair& kp, uint64_t now, size_t len, size_t pad_limit,
                                 size_t cap, SealTicket* t);
// The second half: writes the header, the payload (`payload` may be out + 16) and its padding,
// and seals them with `key` (keyed with the ticket's key); false if OpenSSL refused.
bool WriteTransport(AeadKey& key, const SealTicket& t, const uint8_t* payload, uint8_t* out);

// Seals `len` payload bytes into a transport message in `out` (capacity `cap`): header, the
// payload zero-padded to 16 (but not past `pad_limit`, the MTU) and the tag. `payload` may be
// `out + kTransportHeaderSize` (in place). `*out_len` = the datagram's size. One sealer per key
// pair at a time (its keyed context, Keypair::sealer), and one opener (the context and the
// replay window).
TransportStatus SealTransport(Keypair& kp, uint64_t now, const uint8_t* payload, size_t len,
                              size_t pad_limit, uint8_t* out, size_t cap, size_t* out_len);
// A peer's timers (wireguard-go timers.go), as deadlines on the monotonic clock (0: off). The
// owner reports events; Poll(now) says what is due.
class PeerTimers {
 public:
  enum Action : uint32_t {
    kSendInitiation = 1,  // a handshake (re)transmission or a new handshake is due
    kSendKeepalive = 2,
    kZeroKeys = 4,  // REJECT_AFTER_TIME × 3 without a new session: zero all key material
    kGaveUp = 8,    // MAX_TIMER_HANDSHAKES retransmissions went unanswered
  };
  void set_persistent_keepalive(uint64_t interval_ns) { persistent_interval_ = interval_ns; }
  // Events (each at `now`), named as in timers.go; jitter ∈ [0, 334 ms) is the caller's random.
  void HandshakeInitiated(uint64_t now, uint64_t jitter);
  void HandshakeComplete(uint64_t now);
  void SessionDerived(uint64_t now);
  void DataSent(uint64_t now, uint64_t jitter);
  void DataReceived(uint64_t now);
  void AnyAuthenticatedPacketSent(uint64_t now);
  void AnyAuthenticatedPacketReceived(uint64_t now);
  void AnyAuthenticatedPacketTraversal(uint64_t now);
  // What is due at `now` (an Action mask); firing re-arms or clears each timer as timers.go does.
  uint32_t Poll(uint64_t now);
  bool new_handshake_pending() const { return new_handshake_ != 0; }
  // The earliest pending deadline (0: none).
  uint64_t NextDeadline() const;
  uint32_t handshake_attempts() const { return handshake_attempts_; }
  // A new handshake (not a retransmission) starts counting its attempts again.
  void ResetAttempts() { handshake_attempts_ = 0; }
  void Stop();

 private:
  uint64_t retransmit_handshake_ = 0;
  uint64_t send_keepalive_ = 0;
  uint64_t new_handshake_ = 0;
  uint64_t zero_key_material_ = 0;
  uint64_t persistent_keepalive_ = 0;
  uint64_t persistent_interval_ = 0;
  uint32_t handshake_attempts_ = 0;
  bool need_another_keepalive_ = false;
};

}  // namespace wg
}  // namespace weft

#endif  // WEFT_NATIVE_WG_SESSION_H_
