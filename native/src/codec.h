// What the flannel-udp and VXLAN codecs share: their configuration, result types, the
// anti-spoofing source check and the ICMP "no route" builder.
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

struct CodecConfig {
  uint32_t vni = 1;
  uint8_t vtep_mac[6] = {};
  uint32_t tun_mtu = 1450;
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

}  // namespace weft

#endif  // WEFT_NATIVE_CODEC_H_
