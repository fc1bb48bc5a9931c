// What the three framings (flannel-udp, VXLAN, IPIP) share: their names, configuration, result
// types, the anti-spoofing source check, the ICMP "no route" builder, and Encap/Decap, which
// pick the framing's codec (the engine and the addon speak only these).
#ifndef WEFT_NATIVE_CODEC_H_
#define WEFT_NATIVE_CODEC_H_

#include <cstddef>
#include <cstdint>

#include "packet.h"
#include "peer_table.h"

namespace weft {

// The largest UDP payload one IPv4 datagram can carry.
constexpr size_t kMaxUdpPayload = 65507;
// Room an ICMP reply needs (IPv6: 1280, the minimum MTU).
constexpr size_t kIcmpReplyMax = 1280;

// The framing on the wire: flannel-udp and VXLAN in UDP datagrams, IPIP in raw IP packets
// (protocol 4), WireGuard transport messages in UDP datagrams (sealed and opened by the engine
// itself with wg_engine.h: Encap/Decap refuse it).
enum class Format : uint8_t { kUdp, kVxlan, kIpip, kWireguard };

struct CodecConfig {
  uint32_t vni = 1;
  uint8_t vtep_mac[6] = {};
  uint32_t tun_mtu = 1450;
  uint8_t local_ip[4] = {};  // IPIP: the outer source address (ours)
};

// TUN → UDP. On success (drop == kNone) `peer` is the destination and the datagram payload is
// `payload_len` bytes (flannel-udp: the inner packet itself; VXLAN: the 22-byte header written
// just before the inner packet, then the packet). On kNoRoute, `icmp_len` > 0 when an ICMP
// unreachable for the sender was built in the caller's reply buffer.
struct EncapResult {
  DropReason drop = DropReason::kNone;
  const PeerRecord* peer = nullptr;
  IpInfo ip;  // the inner packet's header, once parsed (the sender hashes its flow)
  size_t payload_len = 0;
  size_t icmp_len = 0;
};

// UDP → TUN. On success the inner IP packet is `inner_len` bytes at `inner_off` in the datagram,
// described by `ip`.
struct DecapResult {
  DropReason drop = DropReason::kNone;
  size_t inner_off = 0;
  size_t inner_len = 0;
  IpInfo ip;
};

// Accepts an inner packet only when the longest-prefix peer for its source address is the peer
// the datagram came from (outer source `outer_src`, `outer_len` 4 or 16 bytes). The decoders
// first drop datagrams whose source holds no lease (kUnknownSource), before parsing anything.
DropReason CheckSource(const PeerTable& table, size_t outer_len, const uint8_t* outer_src,
                       const IpInfo& ip);

// Builds an ICMP (IPv4: type 3 code 0, net unreachable; IPv6: type 1 code 0, no route) reply to
// `pkt` into `out` (`cap` ≥ kIcmpReplyMax). Returns its length, or 0 when none is due (the
// offender is itself an ICMP error, a non-first fragment, or from an unspecified/multicast
// address).
size_t BuildNetUnreachable(const uint8_t* pkt, const IpInfo& ip, uint8_t* out, size_t cap);

// Bytes a framing writes before the inner packet in what it sends (flannel-udp 0, VXLAN 22,
// IPIP 20: the outer IPv4 header, WireGuard 16: the transport header; its tag and padding
// follow the packet).
size_t EncapHeadroom(Format f);

// TUN → network in framing `f`: `pkt` (len bytes) has EncapHeadroom(f) writable bytes before
// it; on success what to send starts at pkt - EncapHeadroom(f) (payload_len bytes).
EncapResult Encap(Format f, uint8_t* pkt, size_t len, const PeerTable& table,
                  const CodecConfig& cfg, uint8_t* icmp_out, size_t icmp_cap);

// Network → TUN in framing `f`: `data` is what the socket returned (a UDP payload; for IPIP the
// whole IPv4 packet) from `outer_src`.
DecapResult Decap(Format f, uint8_t* data, size_t len, size_t outer_len, const uint8_t* outer_src,
                  const PeerTable& table, const CodecConfig& cfg);

}  // namespace weft

#endif  // WEFT_NATIVE_CODEC_H_
