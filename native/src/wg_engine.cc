#include "wg_engine.h"

#include <netinet/in.h>

#include <cstring>

namespace weft {

bool ParseWgPeers(const uint8_t* buf, size_t len, std::vector<WgPeerConfig>* out,
                  std::string* error) {
  if (len % kWgPeerRecordSize != 0) {
    *error = "wireguard peers: length " + std::to_string(len) + " is not a multiple of " +
             std::to_string(kWgPeerRecordSize);
    return false;
  }
  out->clear();
  std::map<std::array<uint8_t, wg::kKeyLen>, size_t> keys;
  for (size_t i = 0; i * kWgPeerRecordSize < len; i++) {
    const uint8_t* p = buf + i * kWgPeerRecordSize;
    WgPeerConfig c;
    std::memcpy(c.public_key, p, wg::kKeyLen);
    c.family = p[32];
    c.port = static_cast<uint16_t>(p[34] << 8 | p[35]);
    c.keepalive_s = static_cast<uint16_t>(p[36] << 8 | p[37]);
    std::memcpy(c.addr, p + 48, 16);
    const std::string what = "wireguard peer record " + std::to_string(i) + ": ";
    if (c.family != 4 && c.family != 6) {
      *error = what + "endpoint family must be 4 or 6";
      return false;
    }
    if (c.port == 0) {
      *error = what + "endpoint port must be 1..65535";
      return false;
    }
    std::array<uint8_t, wg::kKeyLen> k;
    std::memcpy(k.data(), c.public_key, wg::kKeyLen);
    if (!keys.emplace(k, i).second) {
      *error = what + "public key repeats record " + std::to_string(keys[k]);
      return false;
    }
    out->push_back(c);
  }
  return true;
}

std::unique_ptr<WgEngine> WgEngine::Create(const uint8_t private_key[wg::kKeyLen],
                                           const uint8_t* psk, std::string* error) {
  std::unique_ptr<WgEngine> e(new WgEngine());
  if (!e->dev_.ok()) {
    *error = "wireguard: OpenSSL lacks a primitive (X25519, ChaCha20-Poly1305, BLAKE2s)";
    return nullptr;
  }
  if (!e->dev_.SetPrivateKey(private_key)) {
    *error = "wireguard: the private key is not usable";
    return nullptr;
  }
  if (psk != nullptr) {
    std::memcpy(e->psk_, psk, wg::kKeyLen);
    e->has_psk_ = true;
  }
  return e;
}

std::array<uint8_t, 17> WgEngine::AddressKey(uint8_t family, const uint8_t* addr) {
  std::array<uint8_t, 17> k{};
  k[0] = family;
  std::memcpy(k.data() + 1, addr, family == 4 ? 4 : 16);
  return k;
}

void WgEngine::SetPeers(const std::vector<WgPeerConfig>& peers) {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::array<uint8_t, wg::kKeyLen>, const WgPeerConfig*> want;
  for (const WgPeerConfig& c : peers) {
    std::array<uint8_t, wg::kKeyLen> k;
    std::memcpy(k.data(), c.public_key, wg::kKeyLen);
    want[k] = &c;
  }
  std::vector<std::unique_ptr<PeerState>> kept;
  for (auto& ps : peers_) {
    std::array<uint8_t, wg::kKeyLen> k;
    std::memcpy(k.data(), ps->cfg.public_key, wg::kKeyLen);
    auto it = want.find(k);
    // A changed keepalive needs a new Device peer (its timers take the interval when added).
    if (it == want.end() || it->second->keepalive_s != ps->cfg.keepalive_s) {
      dev_.RemovePeer(ps->peer);
      continue;
    }
    kept.push_back(std::move(ps));
  }
  peers_ = std::move(kept);
  by_address_.clear();
  by_peer_.clear();
  std::map<std::array<uint8_t, wg::kKeyLen>, PeerState*> have;
  for (auto& ps : peers_) {
    std::array<uint8_t, wg::kKeyLen> k;
    std::memcpy(k.data(), ps->cfg.public_key, wg::kKeyLen);
    have[k] = ps.get();
  }
  for (const WgPeerConfig& c : peers) {
    std::array<uint8_t, wg::kKeyLen> k;
    std::memcpy(k.data(), c.public_key, wg::kKeyLen);
    PeerState* ps = have.count(k) != 0 ? have[k] : nullptr;
    // A peer whose lease endpoint stays keeps the endpoint it roamed to (Roam).
    const bool same_endpoint = ps != nullptr && ps->cfg.family == c.family &&
                               ps->cfg.port == c.port &&
                               std::memcmp(ps->cfg.addr, c.addr, sizeof(c.addr)) == 0;
    if (ps == nullptr) {
      wg::Peer* p = dev_.AddPeer(c.public_key, has_psk_ ? psk_ : nullptr,
                                 static_cast<uint64_t>(c.keepalive_s) * wg::kSecond);
      if (p == nullptr) continue;  // our own key: nothing to talk to
      // The engine's first peers (greeting asked for): this engine may replace one (a
      // restarted daemon, a TUN made again) whose sessions they still hold and would send into
      // until their own 15 s timeout; a handshake from us replaces those sessions at once.
      // Later peers wait for traffic, as the kernel's.
      if (first_peers_) dev_.WantHandshake(p);
      peers_.push_back(std::make_unique<PeerState>());
      ps = peers_.back().get();
      ps->peer = p;
    }
    ps->cfg = c;
    if (same_endpoint) {
      by_address_[AddressKey(c.family, c.addr)] = ps;
      by_peer_[ps->peer] = ps;
      continue;
    }
    std::memset(&ps->addr, 0, sizeof(ps->addr));
    if (c.family == 4) {
      auto* a = reinterpret_cast<sockaddr_in*>(&ps->addr);
      a->sin_family = AF_INET;
      a->sin_port = htons(c.port);
      std::memcpy(&a->sin_addr, c.addr, 4);
      ps->addr_len = sizeof(sockaddr_in);
    } else {
      auto* a = reinterpret_cast<sockaddr_in6*>(&ps->addr);
      a->sin6_family = AF_INET6;
      a->sin6_port = htons(c.port);
      std::memcpy(&a->sin6_addr, c.addr, 16);
      ps->addr_len = sizeof(sockaddr_in6);
    }
    by_address_[AddressKey(c.family, c.addr)] = ps;
    by_peer_[ps->peer] = ps;
  }
  if (!peers.empty()) first_peers_ = false;
  next_tick_.store(0, std::memory_order_relaxed);  // keepalives of new peers: at the next tick
}

size_t WgEngine::peer_count() {
  std::lock_guard<std::mutex> lock(mu_);
  return peers_.size();
}

bool WgEngine::Roam(PeerState* ps, const sockaddr_storage& from) {
  if (from.ss_family != ps->addr.ss_family) return false;  // another family: another socket
  const socklen_t n = from.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  if (from.ss_family == AF_INET) {
    const auto* f = reinterpret_cast<const sockaddr_in*>(&from);
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ps->addr);
    if (f->sin_port == a->sin_port && f->sin_addr.s_addr == a->sin_addr.s_addr) return false;
  } else {
    const auto* f = reinterpret_cast<const sockaddr_in6*>(&from);
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ps->addr);
    if (f->sin6_port == a->sin6_port &&
        std::memcmp(&f->sin6_addr, &a->sin6_addr, sizeof(in6_addr)) == 0 &&
        f->sin6_scope_id == a->sin6_scope_id) {
      return false;
    }
  }
  std::memset(&ps->addr, 0, sizeof(ps->addr));
  std::memcpy(&ps->addr, &from, n);
  ps->addr_len = n;
  return true;
}

void WgEngine::Snapshot(std::vector<WgPeerState>* out) {
  out->clear();
  std::lock_guard<std::mutex> lock(mu_);
  out->reserve(peers_.size());
  for (const auto& ps : peers_) {
    WgPeerState s;
    std::memcpy(s.public_key, ps->cfg.public_key, wg::kKeyLen);
    s.has_psk = has_psk_;
    if (ps->addr.ss_family == AF_INET) {
      const auto* a = reinterpret_cast<const sockaddr_in*>(&ps->addr);
      s.family = 4;
      std::memcpy(s.addr, &a->sin_addr, 4);
      s.port = ntohs(a->sin_port);
    } else if (ps->addr.ss_family == AF_INET6) {
      const auto* a = reinterpret_cast<const sockaddr_in6*>(&ps->addr);
      s.family = 6;
      std::memcpy(s.addr, &a->sin6_addr, 16);
      s.port = ntohs(a->sin6_port);
    }
    s.lease_family = ps->cfg.family;
    std::memcpy(s.lease_addr, ps->cfg.addr, 16);
    s.keepalive_s = ps->cfg.keepalive_s;
    s.last_handshake_wall_ns = ps->peer->last_handshake_wall();
    s.rx_bytes = ps->rx_bytes;
    s.tx_bytes = ps->tx_bytes;
    out->push_back(s);
  }
}

WgEngine::PeerState* WgEngine::ByAddress(uint8_t family, const uint8_t* addr) {
  auto it = by_address_.find(AddressKey(family, addr));
  return it == by_address_.end() ? nullptr : it->second;
}

WgEngine::PeerState* WgEngine::ByPeer(const wg::Peer* p) {
  auto it = by_peer_.find(p);
  return it == by_peer_.end() ? nullptr : it->second;
}

void WgEngine::CountHandshake(uint64_t now) {
  if (++handshakes_since_tick_ < kLoadHandshakes) return;
  if (under_load_until_ == 0) dev_.set_under_load(true);
  under_load_until_ = now + kUnderLoadAfterNs;
}

void WgEngine::TickLoad(uint64_t now) {
  handshakes_since_tick_ = 0;
  if (under_load_until_ != 0 && now >= under_load_until_) {
    under_load_until_ = 0;
    dev_.set_under_load(false);
  }
}

bool WgEngine::TickDue(uint64_t now) {
  uint64_t next = next_tick_.load(std::memory_order_relaxed);
  if (now < next) return false;
  return next_tick_.compare_exchange_strong(next, now + kTickNs, std::memory_order_relaxed);
}

}  // namespace weft
