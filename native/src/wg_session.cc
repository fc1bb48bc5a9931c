#include "wg_session.h"

#include <algorithm>
#include <cstring>

namespace weft {
namespace wg {

// ---- ReplayWindow ----

bool ReplayWindow::Check(uint64_t counter, uint64_t limit) {
  if (counter >= limit) return false;
  uint64_t word = counter / kWordBits;
  if (counter > last_) {
    // Slide forward: clear the words between the newest one and this counter's.
    uint64_t current = last_ / kWordBits;
    uint64_t clear = std::min(word - current, kWords);
    for (uint64_t i = 1; i <= clear; i++) bits_[(current + i) % kWords] = 0;
    last_ = counter;
  } else if (last_ - counter > kWindowSize) {
    return false;
  }
  uint64_t bit = uint64_t(1) << (counter % kWordBits);
  uint64_t& w = bits_[word % kWords];
  bool fresh = (w & bit) == 0;
  w |= bit;
  return fresh;
}

void ReplayWindow::Reset() {
  last_ = 0;
  std::memset(bits_, 0, sizeof(bits_));
}

// ---- transport data ----

TransportStatus ReserveTransport(Keypair& kp, uint64_t now, size_t len, size_t pad_limit,
                                 size_t cap, SealTicket* t) {
  if (kp.send_counter.load(std::memory_order_relaxed) >= kRejectAfterMessages ||
      now - kp.created >= kRejectAfterTime) {
    return TransportStatus::kExpired;
  }
  // wireguard-go's calculatePaddingSize: up to a multiple of 16, but never past the MTU.
  size_t last = len;
  if (pad_limit && last > pad_limit) last %= pad_limit;
  size_t padded = (last + kPaddingMultiple - 1) & ~(kPaddingMultiple - 1);
  if (pad_limit && padded > pad_limit) padded = pad_limit;
  size_t body = len + (padded > last ? padded - last : 0);
  size_t total = kTransportHeaderSize + body + kTagLen;
  if (total > cap) return TransportStatus::kTooShort;
  uint64_t counter = kp.send_counter.fetch_add(1, std::memory_order_relaxed);
  if (counter >= kRejectAfterMessages) {  // another worker took the last one meanwhile
    kp.send_counter.store(kRejectAfterMessages, std::memory_order_relaxed);
    return TransportStatus::kExpired;
  }
  t->serial = kp.serial;
  t->key = kp.send_key;
  t->counter = counter;
  t->remote_index = kp.remote_index;
  t->len = len;
  t->body = body;
  t->total = total;
  return TransportStatus::kOk;
}

bool WriteTransport(AeadKey& key, const SealTicket& t, const uint8_t* payload, uint8_t* out) {
  uint8_t* data = out + kTransportHeaderSize;
  if (t.len && payload != data) std::memmove(data, payload, t.len);
  std::memset(data + t.len, 0, t.body - t.len);
  PutLe32(out, kMessageTransport);
  PutLe32(out + kTransportReceiver, t.remote_index);
  PutLe64(out + kTransportCounter, t.counter);
  return key.SealCounter(data, t.counter, data, t.body);
}

TransportStatus SealTransport(Keypair& kp, uint64_t now, const uint8_t* payload, size_t len,
                              size_t pad_limit, uint8_t* out, size_t cap, size_t* out_len) {
  SealTicket t;
  TransportStatus st = ReserveTransport(kp, now, len, pad_limit, cap, &t);
  if (st != TransportStatus::kOk) return st;
  if ((!kp.sealer.ready() && !kp.sealer.Init(kp.send_key, true)) ||
      !WriteTransport(kp.sealer, t, payload, out)) {
    return TransportStatus::kForged;
  }
  *out_len = t.total;
  return TransportStatus::kOk;
}

// ---- PeerTimers ----

void PeerTimers::HandshakeInitiated(uint64_t now, uint64_t jitter) {
  retransmit_handshake_ = now + kRekeyTimeout + jitter;
}

void PeerTimers::HandshakeComplete(uint64_t now) {
  retransmit_handshake_ = 0;
  handshake_attempts_ = 0;
}

void PeerTimers::SessionDerived(uint64_t now) { zero_key_material_ = now + kRejectAfterTime * 3; }

void PeerTimers::DataSent(uint64_t now, uint64_t jitter) {
  if (!new_handshake_) new_handshake_ = now + kKeepaliveTimeout + kRekeyTimeout + jitter;
}

void PeerTimers::DataReceived(uint64_t now) {
  if (!send_keepalive_) {
    send_keepalive_ = now + kKeepaliveTimeout;
  } else {
    need_another_keepalive_ = true;
  }
}

void PeerTimers::AnyAuthenticatedPacketSent(uint64_t now) { send_keepalive_ = 0; }

void PeerTimers::AnyAuthenticatedPacketReceived(uint64_t now) { new_handshake_ = 0; }

void PeerTimers::AnyAuthenticatedPacketTraversal(uint64_t now) {
  if (persistent_interval_) persistent_keepalive_ = now + persistent_interval_;
}

uint32_t PeerTimers::Poll(uint64_t now) {
  uint32_t due = 0;
  if (retransmit_handshake_ && now >= retransmit_handshake_) {
    retransmit_handshake_ = 0;
    if (handshake_attempts_ > kMaxTimerHandshakes) {
      // Give up; the keys go after REJECT_AFTER_TIME × 3 unless that is already set.
      due |= kGaveUp;
      send_keepalive_ = 0;
      if (!zero_key_material_) zero_key_material_ = now + kRejectAfterTime * 3;
    } else {
      handshake_attempts_++;
      due |= kSendInitiation;
    }
  }
  if (send_keepalive_ && now >= send_keepalive_) {
    send_keepalive_ = 0;
    due |= kSendKeepalive;
    if (need_another_keepalive_) {
      need_another_keepalive_ = false;
      send_keepalive_ = now + kKeepaliveTimeout;
    }
  }
  if (new_handshake_ && now >= new_handshake_) {
    new_handshake_ = 0;
    handshake_attempts_ = 0;
    due |= kSendInitiation;
  }
  if (zero_key_material_ && now >= zero_key_material_) {
    zero_key_material_ = 0;
    due |= kZeroKeys;
  }
  if (persistent_keepalive_ && now >= persistent_keepalive_) {
    persistent_keepalive_ = 0;
    due |= kSendKeepalive;
  }
  return due;
}

uint64_t PeerTimers::NextDeadline() const {
  uint64_t next = 0;
  for (uint64_t t : {retransmit_handshake_, send_keepalive_, new_handshake_, zero_key_material_,
                     persistent_keepalive_}) {
    if (t && (!next || t < next)) next = t;
  }
  return next;
}

void PeerTimers::Stop() {
  retransmit_handshake_ = send_keepalive_ = new_handshake_ = zero_key_material_ = 0;
  persistent_keepalive_ = 0;
  handshake_attempts_ = 0;
  need_another_keepalive_ = false;
}

}  // namespace wg
}  // namespace weft
