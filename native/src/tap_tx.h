// Frames for the egress TAP (kernel >= 6.17): an encapsulated packet, or a whole encapsulated
// TSO super-packet, written into a TAP as one frame behind the 24-byte
// virtio_net_hdr_v1_hash_tunnel. The kernel takes the frame in on the TAP (its destination MAC is
// the TAP's own), routes it to the peer and cuts it into segments only where a device cannot
// (it forwards it whole over veth):
//
//   [vnet header 24][Ethernet 14: TAP MAC][outer IPv4 20 | IPv6 40][UDP 8]
//   [VXLAN 8 + inner Ethernet 14 (VXLAN only)][inner IP][inner TCP][payload]
//
// vnet header (little-endian): flags NEEDS_CSUM|UDP_TUNNEL_CSUM, gso_type = inner TCPV4/TCPV6 |
// UDP_TUNNEL_IPV4 (0x20) or _IPV6 (0x40), hdr_len = every header, gso_size = inner MSS,
// csum_start = the inner TCP header's offset in the frame, csum_offset 16, outer_th_offset = the
// outer UDP header's, inner_nh_offset = the inner IP header's. The inner TCP checksum field holds
// the pseudo-header sum for the whole inner length (as a TUN TSO read leaves it); the outer UDP
// one the non-inverted pseudo-header sum for the whole UDP length. A packet that is not GSO goes
// with its inner checksums complete and only the outer UDP checksum left to the kernel
// (NEEDS_CSUM at the outer UDP header). Outer IPv4: DF clear (the kernel fragments, as for kernel
// vxlan), TTL 65 (forwarding takes one). Plain C++ over byte spans, no syscalls.
#ifndef WEFT_NATIVE_TAP_TX_H_
#define WEFT_NATIVE_TAP_TX_H_

#include <cstddef>
#include <cstdint>

#include "codec.h"
#include "packet.h"
#include "peer_table.h"

namespace weft {

constexpr size_t kTapVnetHdrLen = 24;  // sizeof(struct virtio_net_hdr_v1_hash_tunnel)
constexpr uint8_t kVnetFlagUdpTunnelCsum = 8;
constexpr uint8_t kVnetGsoUdpTunnelV4 = 0x20;
constexpr uint8_t kVnetGsoUdpTunnelV6 = 0x40;
// TUNSETOFFLOAD bits (linux/if_tun.h, kernel >= 6.17; this machine's headers are older).
constexpr unsigned kTunFUdpTunnelGso = 0x080;
constexpr unsigned kTunFUdpTunnelGsoCsum = 0x100;
constexpr uint8_t kTapOuterTtl = 65;
// Ethernet + outer IPv6 + UDP + VXLAN + inner Ethernet: the longest header before an inner packet.
constexpr size_t kTapTemplateMax = 14 + 40 + 8 + 22;

// What every frame of one engine shares.
struct TapFrameConfig {
  bool vxlan = false;
  uint8_t family = 4;  // the outer (underlay) family
  uint8_t src_ip[16] = {};
  uint8_t tap_mac[6] = {};  // the frame's destination: the TAP itself
  uint8_t src_mac[6] = {};
  CodecConfig codec;  // VNI and our VtepMAC (VXLAN)
};

// The headers before an inner packet towards one peer, built when the peer table changes:
// Ethernet, the outer IP header (length, id and checksum zero), UDP (destination port; source
// port, length and checksum zero), for VXLAN its header and the inner Ethernet (type IPv4).
struct TapTemplate {
  uint8_t bytes[kTapTemplateMax];
  uint8_t len;        // 0: no frame for this peer (another outer family, VXLAN without VtepMAC)
  uint8_t ip_len;     // outer IP header length (20 | 40)
  uint32_t ip_sum;    // IPv4: the sum of the outer header's fixed words
  uint32_t addr_sum;  // the sum of the outer addresses and the protocol (UDP pseudo-header)
};

// Fills `t` for peer `p` (len 0 when there is no frame for it).
void BuildTapTemplate(const PeerRecord& p, const TapFrameConfig& cfg, TapTemplate* t);

// Writes the vnet header and t.len header bytes at `out` for an inner packet of `inner_len`
// bytes of IP `version`, from UDP source port `sport`, outer IPv4 id `ip_id`. `h` is the TUN's
// vnet header of the inner packet: TCP GSO (TCPV4/TCPV6, `inner_hdrs` = its inner header length)
// becomes a tunnel GSO frame; anything else must have complete inner checksums. Returns the bytes
// written (kTapVnetHdrLen + t.len), or 0 when the frame would not fit an outer length field.
size_t WriteTapHeaders(const TapTemplate& t, const VnetHdr& h, size_t inner_len, size_t inner_hdrs,
                       uint8_t version, uint16_t sport, uint16_t ip_id, uint8_t* out);

}  // namespace weft

#endif  // WEFT_NATIVE_TAP_TX_H_
