// IPIP (RFC 2003, IPv4 in IPv4, IP protocol 4) as the kernel's ipip device sends it when created
// the way flannel creates flannel.ipip (IFLA_IPTUN_TTL 0, TOS 0, PMTUDISC 0; net/ipv4/ipip.c
// ipip_netlink_parms, net/ipv4/ip_tunnel.c ip_tunnel_xmit):
//   version 4, IHL 5, no options; protocol 4
//   TTL      the inner TTL (ttl 0 = "inherit"; the inner packet was already forwarded once)
//   TOS      DSCP 0, ECN copied from the inner packet, CE sent as ECT(0) (INET_ECN_encapsulate)
//   DF       the inner packet's DF (pmtudisc off: frag_off 0, then |= inner DF); MF/offset 0
//   ID       0 here: the raw socket path (IP_HDRINCL) lets the kernel pick one, which a kernel
//            ipip sender also does (the one field not fixed by the encapsulation)
//   source   our address; destination the peer's PublicIP; header checksum valid
// Receive (ip_tunnel_rcv): the inner packet goes on unchanged (no TTL decrement), except ECN
// decapsulation: outer CE marks an ECN-capable inner packet CE, and drops a not-ECT one.
#ifndef WEFT_NATIVE_IPIP_H_
#define WEFT_NATIVE_IPIP_H_

#include <cstddef>
#include <cstdint>

#include "codec.h"

namespace weft {

constexpr size_t kIpipHdrLen = 20;
constexpr uint8_t kProtoIpip = 4;

// Writes the outer header at h (kIpipHdrLen bytes) for the IPv4 packet `inner` (whose header
// holds its total length, TOS, DF and TTL) to `peer`.
void WriteIpipHeader(uint8_t* h, const uint8_t* inner, const PeerRecord& peer,
                     const CodecConfig& cfg);

// TUN → network: `pkt` (len bytes) with kIpipHdrLen writable bytes before it. On success the
// outer packet starts at pkt - kIpipHdrLen and is payload_len bytes long. IPv6 (which IPIP
// cannot carry) and destinations without a peer are kNoRoute (with an ICMP reply).
EncapResult IpipEncap(uint8_t* pkt, size_t len, const PeerTable& table, const CodecConfig& cfg,
                      uint8_t* icmp_out, size_t icmp_cap);

// Network → TUN: `pkt` is the whole received IPv4 packet (outer header first, as a raw socket
// returns it) from `outer_src`. Drops strangers (no lease) first, then checks the outer header
// (IPv4, protocol 4), the inner IPv4 packet and its source.
DecapResult IpipDecap(uint8_t* pkt, size_t len, size_t outer_len, const uint8_t* outer_src,
                      const PeerTable& table);

}  // namespace weft

#endif  // WEFT_NATIVE_IPIP_H_
