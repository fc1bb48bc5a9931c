#include "wg_device.h"

#include <cstring>
#include <iterator>

namespace weft {
namespace wg {

namespace {

// The IP packet's own length (the transport payload is padded to 16); 0 if it is not IP.
size_t IpLength(const uint8_t* p, size_t len) {
  if (len >= 20 && (p[0] >> 4) == 4) {
    size_t total = size_t(p[2]) << 8 | p[3];
    return total >= 20 && total <= len ? total : 0;
  }
  if (len >= 40 && (p[0] >> 4) == 6) {
    size_t total = 40 + (size_t(p[4]) << 8 | p[5]);
    return total <= len ? total : 0;
  }
  return 0;
}

}  // namespace

const char* VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kResponse:
      return "response";
    case Verdict::kHandshakeDone:
      return "handshake_done";
    case Verdict::kCookieReply:
      return "cookie_reply";
    case Verdict::kCookieTaken:
      return "cookie_taken";
    case Verdict::kData:
      return "data";
    case Verdict::kKeepalive:
      return "keepalive";
    case Verdict::kDropMalformed:
      return "drop_malformed";
    case Verdict::kDropMac1:
      return "drop_mac1";
    case Verdict::kDropHandshake:
      return "drop_handshake";
    case Verdict::kDropTimestamp:
      return "drop_timestamp";
    case Verdict::kDropIndex:
      return "drop_index";
    case Verdict::kDropExpired:
      return "drop_expired";
    case Verdict::kDropForged:
      return "drop_forged";
    case Verdict::kDropReplayed:
      return "drop_replayed";
    case Verdict::kDropNotIp:
      return "drop_not_ip";
    case Verdict::kDropCookie:
      return "drop_cookie";
    case Verdict::kDropRateLimit:
      return "drop_ratelimit";
  }
  return "unknown";
}

bool HandshakeRateLimiter::Allow(const uint8_t* addr, size_t len, uint64_t now) {
  if (now - last_collect_ >= kGarbageCollectTime) {
    for (auto it = table_.begin(); it != table_.end();) {
      it = now - it->second.last > kGarbageCollectTime ? table_.erase(it) : std::next(it);
    }
    last_collect_ = now;
  }
  std::array<uint8_t, 16> key{};
  std::memcpy(key.data(), addr, len < key.size() ? len : key.size());
  auto found = table_.find(key);
  if (found == table_.end()) {
    table_[key] = Entry{now, kMaxTokens - kPacketCost};
    return true;
  }
  Entry& e = found->second;
  e.tokens += now - e.last;
  e.last = now;
  if (e.tokens > kMaxTokens) e.tokens = kMaxTokens;
  if (e.tokens > kPacketCost) {
    e.tokens -= kPacketCost;
    return true;
  }
  return false;
}

void Handshake::ZeroSecrets() {
  Wipe(hash, sizeof(hash));
  Wipe(chain_key, sizeof(chain_key));
  Wipe(local_ephemeral, sizeof(local_ephemeral));
  Wipe(remote_ephemeral, sizeof(remote_ephemeral));
  state = State::kZeroed;
}

Peer::~Peer() {
  Wipe(psk_, sizeof(psk_));
  Wipe(static_static_, sizeof(static_static_));
}

Device::Device(const Clock* clock) : clock_(clock) {
  uint8_t seed[8];
  RandomBytes(seed, sizeof(seed));
  jitter_state_ = GetLe64(seed) | 1;
}

Device::~Device() { Wipe(private_key_, sizeof(private_key_)); }

bool Device::SetPrivateKey(const uint8_t priv[kKeyLen]) {
  std::memcpy(private_key_, priv, kKeyLen);
  ClampPrivateKey(private_key_);
  if (!PublicKey(public_key_, private_key_) || !cookie_checker_.Init(crypto_, public_key_)) {
    return false;
  }
  has_key_ = true;
  for (auto& p : peers_) {
    p->static_static_ok_ = X25519(p->static_static_, private_key_, p->public_key());
    ZeroAll(p.get());
  }
  return true;
}

Peer* Device::AddPeer(const uint8_t pub[kKeyLen], const uint8_t* psk,
                      uint64_t persistent_keepalive_ns) {
  std::array<uint8_t, kKeyLen> key;
  std::memcpy(key.data(), pub, kKeyLen);
  if (by_key_.count(key) || (has_key_ && std::memcmp(pub, public_key_, kKeyLen) == 0)) {
    return nullptr;
  }
  auto peer = std::make_unique<Peer>();
  peer->public_key_ = key;
  if (psk) std::memcpy(peer->psk_, psk, kKeyLen);
  if (!peer->cookies_.Init(crypto_, pub)) return nullptr;
  if (has_key_) peer->static_static_ok_ = X25519(peer->static_static_, private_key_, pub);
  peer->timers_.set_persistent_keepalive(persistent_keepalive_ns);
  Peer* p = peer.get();
  by_key_[key] = p;
  peers_.push_back(std::move(peer));
  return p;
}

Peer* Device::FindPeer(const uint8_t pub[kKeyLen]) const {
  std::array<uint8_t, kKeyLen> key;
  std::memcpy(key.data(), pub, kKeyLen);
  auto it = by_key_.find(key);
  return it == by_key_.end() ? nullptr : it->second;
}

void Device::RemovePeer(Peer* peer) {
  ZeroAll(peer);
  by_key_.erase(peer->public_key_);
  for (auto it = peers_.begin(); it != peers_.end(); ++it) {
    if (it->get() == peer) {
      peers_.erase(it);
      break;
    }
  }
}

uint32_t Device::NewIndex(Peer* peer) {
  for (;;) {
    uint8_t b[4];
    RandomBytes(b, sizeof(b));
    uint32_t index = GetLe32(b);
    if (indices_.emplace(index, IndexEntry{peer, nullptr}).second) return index;
  }
}

void Device::DropIndex(uint32_t index) { indices_.erase(index); }

void Device::DropKeypair(std::unique_ptr<Keypair>& kp) {
  if (!kp) return;
  DropIndex(kp->local_index);
  live_serials_.erase(kp->serial);
  kp.reset();  // ~Keypair zeroes the keys
  keypair_drops_.fetch_add(1, std::memory_order_release);
}

void Device::ZeroAll(Peer* peer) {
  DropKeypair(peer->previous_);
  DropKeypair(peer->current_);
  DropKeypair(peer->next_);
  if (peer->hs_.state != Handshake::State::kZeroed) DropIndex(peer->hs_.local_index);
  peer->hs_.ZeroSecrets();
}

uint64_t Device::Jitter() {
  // Timer jitter needs no secrecy (wireguard-go uses fastrandn): xorshift64*, no syscall per
  // data packet.
  jitter_state_ ^= jitter_state_ >> 12;
  jitter_state_ ^= jitter_state_ << 25;
  jitter_state_ ^= jitter_state_ >> 27;
  return (jitter_state_ * 0x2545F4914F6CDD1Dull >> 11) % kRekeyTimeoutJitterMax;
}

// After crossed initiations, the lower key's second initiation waits this long after its first:
// past the peer's flood limit (50 initiations a second) and the TAI64N timestamp's granularity
// (2^24 ns), so the peer takes it.
constexpr uint64_t kCrossedReinitiateAfter = kSecond / 20;

size_t Device::CreateInitiation(Peer* peer, uint8_t* out) {
  uint64_t now = clock_->MonotonicNs();
  Handshake& hs = peer->hs_;
  if (!has_key_ || !peer->static_static_ok_) return 0;
  const bool crossed = peer->crossed_reinitiate_at_ != 0 && now >= peer->crossed_reinitiate_at_;
  if (hs.sent_any && now - hs.last_sent_handshake < kRekeyTimeout && !crossed) return 0;
  CryptoContext& c = crypto_;

  if (hs.state != Handshake::State::kZeroed) DropIndex(hs.local_index);
  hs.ZeroSecrets();
  std::memcpy(hs.hash, InitialHash(), kHashLen);
  std::memcpy(hs.chain_key, InitialChainKey(), kHashLen);
  uint8_t key[kKeyLen], ss[kKeyLen];
  std::memset(out, 0, kInitiationSize);
  PutLe32(out, kMessageInitiation);
  bool ok = GeneratePrivateKey(hs.local_ephemeral) &&
            PublicKey(out + kInitEphemeral, hs.local_ephemeral) &&
            MixHash(c, hs.hash, peer->public_key(), kKeyLen) &&
            c.Kdf(hs.chain_key, nullptr, nullptr, hs.chain_key, out + kInitEphemeral, kKeyLen) &&
            MixHash(c, hs.hash, out + kInitEphemeral, kKeyLen) &&
            X25519(ss, hs.local_ephemeral, peer->public_key()) &&
            c.Kdf(hs.chain_key, key, nullptr, hs.chain_key, ss, kKeyLen) &&
            c.SealCounter(out + kInitStatic, key, 0, public_key_, kKeyLen, hs.hash, kHashLen) &&
            MixHash(c, hs.hash, out + kInitStatic, kKeyLen + kTagLen) &&
            c.Kdf(hs.chain_key, key, nullptr, hs.chain_key, peer->static_static_, kKeyLen);
  if (ok) {
    uint8_t ts[kTimestampLen];
    Tai64n(ts, clock_->WallNs());
    ok = c.SealCounter(out + kInitTimestamp, key, 0, ts, kTimestampLen, hs.hash, kHashLen) &&
         MixHash(c, hs.hash, out + kInitTimestamp, kTimestampLen + kTagLen);
  }
  Wipe(key, sizeof(key));
  Wipe(ss, sizeof(ss));
  if (!ok) {
    hs.ZeroSecrets();
    return 0;
  }
  hs.local_index = NewIndex(peer);
  PutLe32(out + kInitSender, hs.local_index);
  hs.state = Handshake::State::kInitiationCreated;
  peer->cookies_.AddMacs(c, out, kInitiationSize, now);
  hs.last_sent_handshake = now;
  hs.sent_any = true;
  peer->handshake_wanted_ = false;
  peer->crossed_reinitiate_at_ = 0;
  peer->timers_.HandshakeInitiated(now, Jitter());
  peer->timers_.AnyAuthenticatedPacketTraversal(now);
  peer->timers_.AnyAuthenticatedPacketSent(now);
  return kInitiationSize;
}

Received Device::HandleInitiation(const uint8_t* msg, uint8_t* out) {
  uint64_t now = clock_->MonotonicNs();
  CryptoContext& c = crypto_;
  Received r;
  r.verdict = Verdict::kDropHandshake;
  uint8_t hash[kHashLen], chain_key[kHashLen], key[kKeyLen], ss[kKeyLen], peer_pk[kKeyLen];
  uint8_t ts[kTimestampLen];
  std::memcpy(hash, InitialHash(), kHashLen);
  std::memcpy(chain_key, InitialChainKey(), kHashLen);
  const uint8_t* eph = msg + kInitEphemeral;
  Peer* peer = nullptr;
  bool ok = MixHash(c, hash, public_key_, kKeyLen) && MixHash(c, hash, eph, kKeyLen) &&
            c.Kdf(chain_key, nullptr, nullptr, chain_key, eph, kKeyLen) &&
            X25519(ss, private_key_, eph) &&
            c.Kdf(chain_key, key, nullptr, chain_key, ss, kKeyLen) &&
            c.OpenCounter(peer_pk, key, 0, msg + kInitStatic, kKeyLen + kTagLen, hash, kHashLen) &&
            MixHash(c, hash, msg + kInitStatic, kKeyLen + kTagLen);
  if (ok) peer = FindPeer(peer_pk);
  ok = ok && peer && peer->static_static_ok_ &&
       c.Kdf(chain_key, key, nullptr, chain_key, peer->static_static_, kKeyLen) &&
       c.OpenCounter(ts, key, 0, msg + kInitTimestamp, kTimestampLen + kTagLen, hash, kHashLen) &&
       MixHash(c, hash, msg + kInitTimestamp, kTimestampLen + kTagLen);
  Wipe(key, sizeof(key));
  Wipe(ss, sizeof(ss));
  if (!ok) {
    Wipe(chain_key, sizeof(chain_key));
    return r;
  }
  r.peer = peer;
  Handshake& hs = peer->hs_;
  // Replay: the timestamp must be newer than any taken; flood: at most 50 initiations a second.
  bool newer = !hs.consumed_any || std::memcmp(ts, hs.latest_timestamp, kTimestampLen) > 0;
  bool flood = hs.consumed_any && now - hs.last_initiation_consumed <= kHandshakeInitiationRate;
  if (!newer || flood) {
    Wipe(chain_key, sizeof(chain_key));
    r.verdict = Verdict::kDropTimestamp;
    return r;
  }
  // Crossed initiations: both ends initiated at once (each greets the peers it first learns,
  // so two daemons that start together do). Taking the other's initiation replaces our own, so
  // each end refuses the response to its own, and neither has a session it may send on until
  // REKEY_TIMEOUT's retransmission, 5 s on. So the end with the lower public key answers, then
  // initiates again at once (past the peer's flood limit), which the other end takes; the other
  // end does as WireGuard does. Where our initiation was dropped instead (the peer did not know
  // us yet), the peer completes on our response and the second handshake just replaces it.
  const bool crossed = hs.state == Handshake::State::kInitiationCreated &&
                       now - hs.last_sent_handshake < kRekeyTimeout &&
                       std::memcmp(public_key_, peer->public_key(), kKeyLen) < 0;
  const uint64_t our_initiation = hs.last_sent_handshake;
  if (hs.state != Handshake::State::kZeroed) DropIndex(hs.local_index);
  hs.ZeroSecrets();
  std::memcpy(hs.hash, hash, kHashLen);
  std::memcpy(hs.chain_key, chain_key, kHashLen);
  Wipe(chain_key, sizeof(chain_key));
  std::memcpy(hs.remote_ephemeral, eph, kKeyLen);
  hs.remote_index = GetLe32(msg + kInitSender);
  std::memcpy(hs.latest_timestamp, ts, kTimestampLen);
  hs.last_initiation_consumed = now;
  hs.consumed_any = true;
  hs.state = Handshake::State::kInitiationConsumed;
  peer->timers_.AnyAuthenticatedPacketTraversal(now);
  peer->timers_.AnyAuthenticatedPacketReceived(now);

  // The response: e, ee, se, psk, {}.
  uint8_t tau[kHashLen];
  std::memset(out, 0, kResponseSize);
  PutLe32(out, kMessageResponse);
  PutLe32(out + kRespReceiver, hs.remote_index);
  uint8_t* reph = out + kRespEphemeral;
  ok = GeneratePrivateKey(hs.local_ephemeral) && PublicKey(reph, hs.local_ephemeral) &&
       MixHash(c, hs.hash, reph, kKeyLen) &&
       c.Kdf(hs.chain_key, nullptr, nullptr, hs.chain_key, reph, kKeyLen) &&
       X25519(ss, hs.local_ephemeral, hs.remote_ephemeral) &&
       c.Kdf(hs.chain_key, nullptr, nullptr, hs.chain_key, ss, kKeyLen) &&
       X25519(ss, hs.local_ephemeral, peer->public_key()) &&
       c.Kdf(hs.chain_key, nullptr, nullptr, hs.chain_key, ss, kKeyLen) &&
       c.Kdf(hs.chain_key, tau, key, hs.chain_key, peer->psk_, kKeyLen) &&
       MixHash(c, hs.hash, tau, kHashLen) &&
       c.SealCounter(out + kRespEmpty, key, 0, nullptr, 0, hs.hash, kHashLen) &&
       MixHash(c, hs.hash, out + kRespEmpty, kTagLen);
  Wipe(tau, sizeof(tau));
  Wipe(key, sizeof(key));
  Wipe(ss, sizeof(ss));
  if (!ok) {
    hs.ZeroSecrets();
    return r;
  }
  hs.local_index = NewIndex(peer);
  PutLe32(out + kRespSender, hs.local_index);
  hs.state = Handshake::State::kResponseCreated;
  peer->cookies_.AddMacs(c, out, kResponseSize, now);
  hs.last_sent_handshake = now;
  hs.sent_any = true;
  if (!BeginSession(peer)) return r;
  peer->timers_.SessionDerived(now);
  peer->timers_.AnyAuthenticatedPacketTraversal(now);
  peer->timers_.AnyAuthenticatedPacketSent(now);
  if (crossed) {
    const uint64_t at = our_initiation + kCrossedReinitiateAfter;
    peer->crossed_reinitiate_at_ = at > now ? at : now;
    peer->handshake_wanted_ = true;
  }
  r.verdict = Verdict::kResponse;
  r.len = kResponseSize;
  return r;
}

Received Device::HandleResponse(const uint8_t* msg, uint8_t* out, size_t cap) {
  uint64_t now = clock_->MonotonicNs();
  CryptoContext& c = crypto_;
  Received r;
  r.verdict = Verdict::kDropHandshake;
  auto it = indices_.find(GetLe32(msg + kRespReceiver));
  if (it == indices_.end() || it->second.keypair) return r;
  Peer* peer = it->second.peer;
  Handshake& hs = peer->hs_;
  if (hs.state != Handshake::State::kInitiationCreated) return r;
  r.peer = peer;
  uint8_t hash[kHashLen], chain_key[kHashLen], key[kKeyLen], ss[kKeyLen], tau[kHashLen];
  std::memcpy(hash, hs.hash, kHashLen);
  std::memcpy(chain_key, hs.chain_key, kHashLen);
  const uint8_t* eph = msg + kRespEphemeral;
  bool ok = MixHash(c, hash, eph, kKeyLen) &&
            c.Kdf(chain_key, nullptr, nullptr, chain_key, eph, kKeyLen) &&
            X25519(ss, hs.local_ephemeral, eph) &&
            c.Kdf(chain_key, nullptr, nullptr, chain_key, ss, kKeyLen) &&
            X25519(ss, private_key_, eph) &&
            c.Kdf(chain_key, nullptr, nullptr, chain_key, ss, kKeyLen) &&
            c.Kdf(chain_key, tau, key, chain_key, peer->psk_, kKeyLen) &&
            MixHash(c, hash, tau, kHashLen) &&
            c.OpenCounter(tau, key, 0, msg + kRespEmpty, kTagLen, hash, kHashLen) &&
            MixHash(c, hash, msg + kRespEmpty, kTagLen);
  Wipe(tau, sizeof(tau));
  Wipe(key, sizeof(key));
  Wipe(ss, sizeof(ss));
  if (ok) {
    std::memcpy(hs.hash, hash, kHashLen);
    std::memcpy(hs.chain_key, chain_key, kHashLen);
    hs.remote_index = GetLe32(msg + kRespSender);
    hs.state = Handshake::State::kResponseConsumed;
  }
  Wipe(chain_key, sizeof(chain_key));
  if (!ok || !BeginSession(peer)) return r;
  peer->timers_.AnyAuthenticatedPacketTraversal(now);
  peer->timers_.AnyAuthenticatedPacketReceived(now);
  peer->timers_.SessionDerived(now);
  peer->timers_.HandshakeComplete(now);
  // Confirm the session at once: the responder may send only after it hears from this key.
  size_t n = 0;
  if (Send(peer, nullptr, 0, out, cap, &n) != TransportStatus::kOk) return r;
  r.verdict = Verdict::kHandshakeDone;
  r.len = n;
  return r;
}

bool Device::BeginSession(Peer* peer) {
  Handshake& hs = peer->hs_;
  auto kp = std::make_unique<Keypair>();
  bool initiator = hs.state == Handshake::State::kResponseConsumed;
  if (!initiator && hs.state != Handshake::State::kResponseCreated) return false;
  // (Ti_send = Tr_recv, Ti_recv = Tr_send) = KDF2(C, ε)
  bool ok = initiator ? crypto_.Kdf(kp->send_key, kp->recv_key, nullptr, hs.chain_key, nullptr, 0)
                      : crypto_.Kdf(kp->recv_key, kp->send_key, nullptr, hs.chain_key, nullptr, 0);
  uint32_t local_index = hs.local_index;
  kp->created = clock_->MonotonicNs();
  kp->is_initiator = initiator;
  kp->local_index = local_index;
  kp->remote_index = hs.remote_index;
  hs.ZeroSecrets();  // the handshake's index now names the key pair
  if (!ok) {
    DropIndex(local_index);
    return false;
  }
  indices_[local_index] = IndexEntry{peer, kp.get()};
  kp->serial = next_serial_++;
  live_serials_.insert(kp->serial);
  if (initiator) {
    if (peer->next_) {
      DropKeypair(peer->previous_);
      peer->previous_ = std::move(peer->next_);
    } else {
      DropKeypair(peer->previous_);
      peer->previous_ = std::move(peer->current_);
    }
    DropKeypair(peer->next_);
    DropKeypair(peer->current_);
    peer->current_ = std::move(kp);
  } else {
    DropKeypair(peer->next_);
    peer->next_ = std::move(kp);
    DropKeypair(peer->previous_);
  }
  peer->sent_last_minute_handshake_ = false;
  peer->last_handshake_wall_ = clock_->WallNs();
  return true;
}

TransportStatus Device::ReserveSend(Peer* peer, size_t len, size_t cap, size_t mtu, SealTicket* t) {
  uint64_t now = clock_->MonotonicNs();
  Keypair* kp = peer->current_.get();
  TransportStatus st =
      kp ? ReserveTransport(*kp, now, len, mtu, cap, t) : TransportStatus::kExpired;
  if (st == TransportStatus::kExpired) {
    peer->handshake_wanted_ = true;
    return st;
  }
  if (st != TransportStatus::kOk) return st;
  peer->timers_.AnyAuthenticatedPacketTraversal(now);
  peer->timers_.AnyAuthenticatedPacketSent(now);
  if (len && !peer->timers_.new_handshake_pending()) peer->timers_.DataSent(now, Jitter());
  // Keep the key fresh (initiator side): rekey after REKEY_AFTER_MESSAGES or REKEY_AFTER_TIME.
  if (kp->send_counter.load(std::memory_order_relaxed) > kRekeyAfterMessages ||
      (kp->is_initiator && now - kp->created > kRekeyAfterTime)) {
    peer->handshake_wanted_ = true;
  }
  return st;
}

TransportStatus Device::Send(Peer* peer, const uint8_t* payload, size_t len, uint8_t* out,
                             size_t cap, size_t* out_len, size_t mtu) {
  SealTicket t;
  TransportStatus st = ReserveSend(peer, len, cap, mtu, &t);
  if (st != TransportStatus::kOk) return st;
  Keypair* kp = peer->current_.get();
  if ((!kp->sealer.ready() && !kp->sealer.Init(kp->send_key, true)) ||
      !WriteTransport(kp->sealer, t, payload, out)) {
    return TransportStatus::kForged;
  }
  *out_len = t.total;
  return st;
}

bool Device::BeginOpen(const uint8_t* msg, size_t len, OpenTicket* t, Received* r) {
  *r = Received();
  if (!has_key_ || MessageTypeOf(msg, len) != kMessageTransport) return false;
  auto it = indices_.find(GetLe32(msg + kTransportReceiver));
  if (it == indices_.end() || !it->second.keypair) {
    r->verdict = Verdict::kDropIndex;
    return false;
  }
  Keypair* kp = it->second.keypair;
  r->peer = it->second.peer;
  uint64_t counter = GetLe64(msg + kTransportCounter);
  if (counter >= kRejectAfterMessages || clock_->MonotonicNs() - kp->created >= kRejectAfterTime) {
    r->verdict = Verdict::kDropExpired;
    return false;
  }
  t->serial = kp->serial;
  t->key = kp->recv_key;
  t->counter = counter;
  t->index = it->first;
  return true;
}

Received Device::FinishOpen(const OpenTicket& t, bool opened, const uint8_t* out, size_t n,
                            const uint8_t* src, size_t src_len) {
  uint64_t now = clock_->MonotonicNs();
  Received r;
  auto it = indices_.find(t.index);
  if (it == indices_.end() || !it->second.keypair || it->second.keypair->serial != t.serial) {
    r.verdict = Verdict::kDropExpired;  // its key pair went while the message was opened
    return r;
  }
  Peer* peer = it->second.peer;
  Keypair* kp = it->second.keypair;
  r.peer = peer;
  if (!opened) {
    r.verdict = Verdict::kDropForged;
    return r;
  }
  // The counter is checked against the window only after the tag verified.
  if (!kp->replay.Check(t.counter)) {
    r.verdict = Verdict::kDropReplayed;
    return r;
  }
  // The first packet under the responder's new key pair confirms it: rotate.
  if (kp == peer->next_.get()) {
    DropKeypair(peer->previous_);
    peer->previous_ = std::move(peer->current_);
    peer->current_ = std::move(peer->next_);
    peer->timers_.HandshakeComplete(now);
  }
  // Keep the key fresh (initiator side): a handshake before the current key's last minute.
  const Keypair* cur = peer->current_.get();
  if (cur && cur->is_initiator && !peer->sent_last_minute_handshake_ &&
      now - cur->created > kRejectAfterTime - kKeepaliveTimeout - kRekeyTimeout) {
    peer->sent_last_minute_handshake_ = true;
    peer->handshake_wanted_ = true;
  }
  peer->timers_.AnyAuthenticatedPacketTraversal(now);
  peer->timers_.AnyAuthenticatedPacketReceived(now);
  if (n == 0) {
    r.verdict = Verdict::kKeepalive;
  } else if (size_t ip_len = IpLength(out, n)) {
    peer->timers_.DataReceived(now);
    r.verdict = Verdict::kData;
    r.len = ip_len;
  } else {
    r.verdict = Verdict::kDropNotIp;
  }
  NoteEndpoint(r, src, src_len);
  return r;
}

Received Device::HandleTransport(const uint8_t* msg, size_t len, uint8_t* out, size_t cap) {
  OpenTicket t;
  Received r;
  if (!BeginOpen(msg, len, &t, &r)) return r;
  const size_t body = len - kTransportHeaderSize;
  if (cap < body - kTagLen) {
    r.verdict = Verdict::kDropMalformed;
    return r;
  }
  Keypair* kp = indices_[t.index].keypair;
  const bool opened = (kp->opener.ready() || kp->opener.Init(kp->recv_key, false)) &&
                      kp->opener.OpenCounter(out, t.counter, msg + kTransportHeaderSize, body);
  // Receive notes the endpoint (no source here).
  return FinishOpen(t, opened, out, body - kTagLen, nullptr, 0);
}

void Device::NoteEndpoint(const Received& r, const uint8_t* src, size_t src_len) {
  switch (r.verdict) {
    case Verdict::kResponse:
    case Verdict::kHandshakeDone:
    case Verdict::kData:
    case Verdict::kKeepalive:
    case Verdict::kDropNotIp:
      if (r.peer && src && src_len <= sizeof(r.peer->endpoint_)) {
        std::memcpy(r.peer->endpoint_, src, src_len);
        r.peer->endpoint_len_ = src_len;
      }
      break;
    default:
      break;
  }
}

Received Device::Receive(const uint8_t* msg, size_t len, const uint8_t* src, size_t src_len,
                         uint8_t* out, size_t cap) {
  Received r = Dispatch(msg, len, src, src_len, out, cap);
  NoteEndpoint(r, src, src_len);  // roaming: an authenticated packet moves the peer's endpoint
  return r;
}

Received Device::Dispatch(const uint8_t* msg, size_t len, const uint8_t* src, size_t src_len,
                          uint8_t* out, size_t cap) {
  Received r;
  uint32_t type = MessageTypeOf(msg, len);
  if (!has_key_ || type == 0) return r;
  if (type == kMessageTransport) return HandleTransport(msg, len, out, cap);
  uint64_t now = clock_->MonotonicNs();
  if (type == kMessageCookieReply) {
    auto it = indices_.find(GetLe32(msg + kCookieReceiver));
    r.verdict = Verdict::kDropCookie;
    if (it == indices_.end()) return r;
    r.peer = it->second.peer;
    if (r.peer->cookies_.ConsumeReply(crypto_, msg, now)) r.verdict = Verdict::kCookieTaken;
    return r;
  }
  // Initiation or response: mac1 always; under load a valid mac2 too, else a cookie reply.
  if (cap < kInitiationSize) return r;
  if (!cookie_checker_.CheckMac1(crypto_, msg, len)) {
    r.verdict = Verdict::kDropMac1;
    return r;
  }
  if (under_load_ && !cookie_checker_.CheckMac2(crypto_, msg, len, src, src_len, now)) {
    uint32_t sender = GetLe32(msg + 4);  // the sender index of either message
    if (!cookie_checker_.CreateReply(crypto_, out, msg, len, sender, src, src_len, now)) return r;
    r.verdict = Verdict::kCookieReply;
    r.len = kCookieReplySize;
    return r;
  }
  if (under_load_ && !rate_limiter_.Allow(src, src_len > 2 ? src_len - 2 : src_len, now)) {
    r.verdict = Verdict::kDropRateLimit;
    return r;
  }
  return type == kMessageInitiation ? HandleInitiation(msg, out) : HandleResponse(msg, out, cap);
}

uint32_t Device::Tick(Peer* peer) {
  uint64_t now = clock_->MonotonicNs();
  uint32_t due = peer->timers_.Poll(now);
  if (due & PeerTimers::kZeroKeys) {
    ZeroAll(peer);
    peer->handshake_wanted_ = false;
    peer->crossed_reinitiate_at_ = 0;
  }
  // A key pair past REJECT_AFTER_TIME can neither send nor receive: zero it now.
  for (auto* slot : {&peer->previous_, &peer->current_, &peer->next_}) {
    if (*slot && now - (*slot)->created >= kRejectAfterTime) DropKeypair(*slot);
  }
  // Wanted until one is made (CreateInitiation may refuse within REKEY_TIMEOUT of the last).
  if (peer->handshake_wanted_) {
    peer->timers_.ResetAttempts();
    due |= PeerTimers::kSendInitiation;
  }
  return due;
}

uint64_t Device::NextDeadline(const Peer* peer) const {
  uint64_t next = peer->timers_.NextDeadline();
  auto consider = [&next](uint64_t t) {
    if (t && (!next || t < next)) next = t;
  };
  if (peer->handshake_wanted_) {
    const Handshake& hs = peer->hs_;
    consider(peer->crossed_reinitiate_at_ ? peer->crossed_reinitiate_at_
             : hs.sent_any                ? hs.last_sent_handshake + kRekeyTimeout
                                          : clock_->MonotonicNs());
  }
  for (const auto* kp : {peer->previous_.get(), peer->current_.get(), peer->next_.get()}) {
    if (kp) consider(kp->created + kRejectAfterTime);
  }
  return next;
}

}  // namespace wg
}  // namespace weft
