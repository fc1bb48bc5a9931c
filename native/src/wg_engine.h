// The WireGuard framing's shared state in the packet engine (engine.h): one wg::Device (our
// static key, the peers, the index table, handshakes, key pairs, timers) for all of an engine's
// queues, and per peer where it is (its endpoint) and the packets waiting for its first session.
//
// What the backend hands the engine (the API a `wireguard` backend calls):
//   - EngineConfig: format kWireguard, the private key, the cluster-wide PSK (flannel's net-conf
//     `PSK`; optional), the listen port (`port`, 51820 by default in the TS options);
//   - the peer table (peer_table.h) as for the other framings: AllowedIPs = the records' subnets,
//     longest-prefix matched; a record names its peer by its public address;
//   - SetPeers: one WgPeerConfig per peer (public key, endpoint, persistent keepalive), in the
//     record format below. A record of the peer table whose public address has no WireGuard
//     peer carries nothing (drop wg_no_peer).
//
// Locking: mu() guards the Device and everything here. Packet threads take it per packet for
// the protocol state only (TX: the peer, the key pair and its counter, the timers; RX: the key
// pair by index, then the replay window, rotation, timers and roaming) and seal or open the
// transport message between, without it, on contexts of their own keyed with the key pair's key
// (engine.cc WgKey; forgotten when the Device drops the key pair). Timers take it on the tick,
// SetPeers on a change; handshake messages, keepalives and staged packets are handled under it.
#ifndef WEFT_NATIVE_WG_ENGINE_H_
#define WEFT_NATIVE_WG_ENGINE_H_

#include <sys/socket.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "wg_device.h"

namespace weft {

// One WireGuard peer record, 64 bytes (mirrored by src/dataplane/wireguard-peers.ts), multi-byte
// fields in network byte order:
//   0  u8[32]  the peer's public key (X25519)
//   32 u8      endpoint family (4 | 6)
//   33 u8      reserved, zero
//   34 u16     endpoint UDP port (its listen port)
//   36 u16     persistent keepalive interval, seconds (0: off)
//   38 u8[10]  reserved, zero
//   48 u8[16]  endpoint address (its public address; IPv4 in the first 4 bytes)
constexpr size_t kWgPeerRecordSize = 64;

struct WgPeerConfig {
  uint8_t public_key[wg::kKeyLen] = {};
  uint8_t family = 0;
  uint16_t port = 0;  // host order
  uint16_t keepalive_s = 0;
  uint8_t addr[16] = {};
};

// Decodes `len` bytes of records; false with `error` naming the record when the length is not a
// multiple of the record size, a family is neither 4 nor 6, the port is 0 or a key repeats.
bool ParseWgPeers(const uint8_t* buf, size_t len, std::vector<WgPeerConfig>* out,
                  std::string* error);

// One peer as `wg show` reports it (WgEngine::Snapshot): a copy, no secret in it.
struct WgPeerState {
  uint8_t public_key[wg::kKeyLen] = {};
  bool has_psk = false;
  // The endpoint datagrams to it go to now: family 4 | 6, address (IPv4 in the first 4
  // bytes), port (host order).
  uint8_t family = 0;
  uint8_t addr[16] = {};
  uint16_t port = 0;
  // Its lease's public address (what the peer table's records name it by: its AllowedIPs).
  uint8_t lease_family = 0;
  uint8_t lease_addr[16] = {};
  uint16_t keepalive_s = 0;
  uint64_t last_handshake_wall_ns = 0;  // 0: no handshake yet
  uint64_t rx_bytes = 0;
  uint64_t tx_bytes = 0;
};

// A prefix of a peer's AllowedIPs (a subnet of the peer table; IPv4 in the first 4 bytes).
struct WgAllowedIp {
  uint8_t family = 0;
  uint8_t prefix = 0;
  uint8_t addr[16] = {};
};

// The device as `wg show` reports it (Engine::WgState): our public key, the listen port and
// every peer, allowed_ips[i] the AllowedIPs of peers[i]. No private key, no PSK: the caller
// that handed them to the engine has them.
struct WgDeviceState {
  uint8_t public_key[wg::kKeyLen] = {};
  uint16_t listen_port = 0;
  std::vector<WgPeerState> peers;
  std::vector<std::vector<WgAllowedIp>> allowed_ips;
};

class WgEngine {
 public:
  // Packets kept per peer while it has no session (wireguard-go keeps 128).
  static constexpr size_t kStagedMax = 128;
  // How often a queue's loop runs the timers (the loop's epoll timeout while idle).
  static constexpr uint64_t kTickNs = 100 * 1000000ull;

  struct PeerState {
    wg::Peer* peer = nullptr;
    WgPeerConfig cfg;
    sockaddr_storage addr;  // the endpoint, ready for sendto: the lease's, or where it roamed
    socklen_t addr_len = 0;
    std::deque<std::vector<uint8_t>> staged;  // inner packets waiting for a session
    // Bytes of WireGuard datagrams (whole UDP payloads, handshake messages included) sealed for
    // it and authenticated from it, as wireguard-go's tx_bytes / rx_bytes count them.
    uint64_t tx_bytes = 0;
    uint64_t rx_bytes = 0;
    // Whether its endpoint address is `addr` (the key ByAddress finds it under).
    bool At(uint8_t fam, const uint8_t* addr) const {
      return cfg.family == fam && std::memcmp(cfg.addr, addr, fam == 4 ? 4 : 16) == 0;
    }
  };

  // null with `error` when the key is unusable or OpenSSL lacks a primitive. `psk` may be null.
  static std::unique_ptr<WgEngine> Create(const uint8_t private_key[wg::kKeyLen],
                                          const uint8_t* psk, std::string* error);
  const uint8_t* public_key() const { return dev_.public_key(); }

  // Control thread: the peers from now on. A peer whose key stays keeps its sessions (its
  // endpoint and keepalive are updated); a peer that goes has its keys zeroed.
  void SetPeers(const std::vector<WgPeerConfig>& peers);
  // Whether the first non-empty SetPeers asks for a handshake with each of its peers (default
  // false: a peer's first handshake waits for traffic, as the kernel's). Set before SetPeers.
  void set_greet_first_peers(bool on) { first_peers_ = on; }
  size_t peer_count();
  // Control thread: every peer's state, copied under mu() (held only for the copy).
  void Snapshot(std::vector<WgPeerState>* out);
  bool has_psk() const { return has_psk_; }

  // Everything below: with mu() held.
  std::mutex& mu() { return mu_; }
  wg::Device& device() { return dev_; }
  // The peer whose endpoint address is `addr` (a peer table record's public address).
  PeerState* ByAddress(uint8_t family, const uint8_t* addr);
  PeerState* ByPeer(const wg::Peer* p);
  // Endpoint roaming (whitepaper §2.1; wireguard-go's SetEndpointFromPacket): an authenticated
  // message from `ps` came from `from`, so datagrams to it go there from now on (same family
  // only: the sockets are per family). True when it moved. SetPeers resets it to the lease's
  // endpoint only when that changes.
  bool Roam(PeerState* ps, const sockaddr_storage& from);
  const std::vector<std::unique_ptr<PeerState>>& peers() const { return peers_; }

  // Lock-free: true for one caller once per kTickNs (that caller runs the timers).
  bool TickDue(uint64_t now);

  // Under load (wireguard-go: a handshake queue 1/8 full, and for UNDER_LOAD_AFTER_TIME after):
  // more than kLoadHandshakes handshake messages since the last tick. The Device then wants
  // mac2 (else answers with a cookie reply) and rate-limits handshakes per source address.
  static constexpr uint32_t kLoadHandshakes = 64;
  static constexpr uint64_t kUnderLoadAfterNs = 1000000000ull;
  // A handshake message arrived (initiation, response or cookie reply).
  void CountHandshake(uint64_t now);
  // The timers' tick: the count starts again; the load flag goes once its time is over.
  void TickLoad(uint64_t now);

 private:
  WgEngine() : dev_(&clock_) {}
  static std::array<uint8_t, 17> AddressKey(uint8_t family, const uint8_t* addr);

  wg::SystemClock clock_;
  wg::Device dev_;
  uint8_t psk_[wg::kKeyLen] = {};
  bool has_psk_ = false;
  std::mutex mu_;
  std::vector<std::unique_ptr<PeerState>> peers_;
  std::map<std::array<uint8_t, 17>, PeerState*> by_address_;
  std::unordered_map<const wg::Peer*, PeerState*> by_peer_;
  std::atomic<uint64_t> next_tick_{0};
  // No peer set yet and greeting asked for: the first ones get a handshake from us (SetPeers).
  bool first_peers_ = false;
  uint32_t handshakes_since_tick_ = 0;
  uint64_t under_load_until_ = 0;  // 0: not under load
};

}  // namespace weft

#endif  // WEFT_NATIVE_WG_ENGINE_H_
