// flannel's udp backend format: the raw inner IP packet is the UDP payload, no header.
// flannel's proxy decrements the inner TTL on each side and answers "no route" with an ICMP
// net-unreachable written back into the TUN; weft does the same (and IPv6 too).
#ifndef WEFT_NATIVE_FLANNEL_UDP_H_
#define WEFT_NATIVE_FLANNEL_UDP_H_

#include <cstddef>
#include <cstdint>

#include "codec.h"

namespace weft {

// TUN → UDP: `pkt` is the inner packet as read (len bytes). Looks up the peer, then decrements
// the TTL in place. `icmp_out` (≥ kIcmpReplyMax bytes) receives the reply on kNoRoute.
EncapResult FlannelUdpEncap(uint8_t* pkt, size_t len, const PeerTable& table, uint8_t* icmp_out,
                            size_t icmp_cap);

// UDP → TUN: `dgram` (len bytes) came from `outer_src`. Drops strangers (no lease) first, then
// validates, checks the inner source and decrements the TTL in place.
DecapResult FlannelUdpDecap(uint8_t* dgram, size_t len, size_t outer_len, const uint8_t* outer_src,
                            const PeerTable& table);

}  // namespace weft

#endif  // WEFT_NATIVE_FLANNEL_UDP_H_
