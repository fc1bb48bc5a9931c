// VXLAN as the kernel's vxlan device speaks it (RFC 7348), so a kernel peer cannot tell weft
// apart: UDP payload = 8-byte header (flags 0x08, 24-bit VNI, reserved bytes zero) + inner
// Ethernet (dst = the peer's VtepMAC, src = ours, type IPv4/IPv6) + the inner IP packet.
#ifndef WEFT_NATIVE_VXLAN_H_
#define WEFT_NATIVE_VXLAN_H_

#include <cstddef>
#include <cstdint>

#include "codec.h"

namespace weft {

constexpr size_t kVxlanHdrLen = 8;
constexpr size_t kEthHdrLen = 14;
// Bytes the codec writes before the inner packet inside the UDP payload.
constexpr size_t kVxlanEncapLen = kVxlanHdrLen + kEthHdrLen;
// The kernel's default ephemeral range, which its vxlan device draws source ports from.
constexpr uint16_t kVxlanSrcPortMin = 32768;
constexpr uint16_t kVxlanSrcPortMax = 61000;

// Writes the kVxlanEncapLen bytes before an inner packet of IP `version` (VXLAN header, then
// Ethernet: peer VtepMAC, ours, ethertype).
void WriteVxlanEncap(uint8_t* h, const PeerRecord& peer, const CodecConfig& cfg, uint8_t version);

// TUN → UDP: `pkt` is the inner packet (len bytes) with kVxlanEncapLen writable bytes before it.
// On success the payload starts at pkt - kVxlanEncapLen.
EncapResult VxlanEncap(uint8_t* pkt, size_t len, const PeerTable& table, const CodecConfig& cfg,
                       uint8_t* icmp_out, size_t icmp_cap);

// UDP → TUN: drops strangers (no lease) first, then validates header, VNI, our VtepMAC,
// ethertype, inner IP and inner source.
DecapResult VxlanDecap(uint8_t* dgram, size_t len, size_t outer_len, const uint8_t* outer_src,
                       const PeerTable& table, const CodecConfig& cfg);

// The flow-hashed outer source port for an inner packet (FNV-1a over addresses, protocol and
// L4 ports, scaled into [kVxlanSrcPortMin, kVxlanSrcPortMax)), for paths that build outer
// headers themselves.
uint16_t VxlanSourcePort(const uint8_t* pkt, const IpInfo& ip);

}  // namespace weft

#endif  // WEFT_NATIVE_VXLAN_H_
