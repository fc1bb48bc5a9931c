// Shared packet vocabulary for the codecs and the engine: drop reasons (a fixed set, from
// src/dataplane/stats.ts), the virtio_net_hdr that prefixes every TUN read and write, and
// inner IP header parsing. Plain C++, no allocation, no syscalls.
#ifndef WEFT_NATIVE_PACKET_H_
#define WEFT_NATIVE_PACKET_H_

#include <cstddef>
#include <cstdint>

#include "counters.gen.h"

namespace weft {

// Why a packet was dropped: the table in src/dataplane/stats.ts (DROP_REASON_TABLE, written to
// counters.gen.h), which also gives weft_dataplane_dropped_packets_total its `reason` values.
enum class DropReason : uint8_t {
#define WEFT_DROP_REASON_ENUM(id, name) k##id,
  WEFT_DROP_REASONS(WEFT_DROP_REASON_ENUM)
#undef WEFT_DROP_REASON_ENUM
      kCount,
};

constexpr const char* kDropReasonNames[] = {
#define WEFT_DROP_REASON_NAME(id, name) name,
    WEFT_DROP_REASONS(WEFT_DROP_REASON_NAME)
#undef WEFT_DROP_REASON_NAME
};
static_assert(sizeof(kDropReasonNames) / sizeof(kDropReasonNames[0]) ==
                  static_cast<size_t>(DropReason::kCount),
              "drop reason names out of step");

// struct virtio_net_hdr (10 bytes, host byte order), as TUN reads and writes it with
// IFF_VNET_HDR. Kept as bytes so spans can be parsed without alignment concerns.
constexpr size_t kVnetHdrLen = 10;
constexpr uint8_t kVnetFlagNeedsCsum = 1;
constexpr uint8_t kVnetGsoNone = 0;
constexpr uint8_t kVnetGsoTcpV4 = 1;
constexpr uint8_t kVnetGsoTcpV6 = 4;
constexpr uint8_t kVnetGsoUdpL4 = 5;  // kernel headers here are 6.1: define it ourselves

struct VnetHdr {
  uint8_t flags = 0;
  uint8_t gso_type = kVnetGsoNone;
  uint16_t hdr_len = 0;
  uint16_t gso_size = 0;
  uint16_t csum_start = 0;
  uint16_t csum_offset = 0;
};

void StoreVnetHdr(uint8_t* p, const VnetHdr& h);
VnetHdr LoadVnetHdr(const uint8_t* p);

constexpr uint8_t kProtoIcmp = 1;
constexpr uint8_t kProtoTcp = 6;
constexpr uint8_t kProtoUdp = 17;
constexpr uint8_t kProtoIcmpV6 = 58;

// The parts of an inner IP header the codecs use. `len` is the IP total length (IPv6: 40 +
// payload length); `l4_off` the offset of the upper-layer header (IPv6: 40; extension headers
// are not walked, `proto` is then the first next-header value).
struct IpInfo {
  uint8_t version = 0;
  uint8_t proto = 0;
  uint16_t l4_off = 0;
  uint32_t len = 0;
  const uint8_t* src = nullptr;
  const uint8_t* dst = nullptr;
  size_t addr_len = 0;
};

// Parses an IP header at the start of `p` (`avail` bytes). Returns kNone, kTruncated or
// kMalformed. The total length may be shorter than `avail` (trailing bytes are ignored).
DropReason ParseIp(const uint8_t* p, size_t avail, IpInfo* out);

// Decrements the IPv4 TTL (fixing the header checksum incrementally) or the IPv6 hop limit.
// Returns false, leaving the packet untouched, when it would reach zero.
bool DecrementTtl(uint8_t* p, const IpInfo& ip);

// Fills the virtio_net_hdr for writing `pkt` (an inner IP packet) into the TUN. A TCP/UDP packet
// whose checksum field holds only the pseudo-header sum (a same-host kernel vxlan sender leaves
// it partial) gets NEEDS_CSUM; a TCP packet longer than `tun_mtu` becomes a GSO packet
// (gso_size = tun_mtu - IP - TCP headers) with the pseudo-header sum in its checksum field.
// Everything else gets a zeroed header. May rewrite the L4 checksum field of `pkt`.
void PrepareTunWrite(uint8_t* pkt, const IpInfo& ip, uint32_t tun_mtu, VnetHdr* out);

// Userspace TSO: splits a TCP super-packet read from a TUN with TUN_F_TSO4/6 (`h` its
// virtio_net_hdr, `pkt`/`len` the packet after it) into MSS-sized segments. Segment i is built at
// out + i * slot_size (headers copied, IPv4 total length / id + i / header checksum, IPv6
// payload length, TCP seq + i * gso_size, FIN and PSH only on the last, CWR only on the first,
// full TCP checksum). hdr_len is not trusted: it is recomputed from csum_start and the TCP data
// offset. Returns the number of segments (≤ max_segs), or 0 when the packet is not a valid TCP
// GSO packet or a segment would not fit a slot. `seg_len[i]` receives each segment's length.
// A UDP GSO packet (USO: gso_type UDP_L4, TUN_F_USO4/6) is split the same way into datagrams of
// gso_size payload bytes, each with its UDP length and a full UDP checksum.
size_t SplitTso(const VnetHdr& h, const uint8_t* pkt, size_t len, uint8_t* out, size_t slot_size,
                size_t max_segs, uint16_t* seg_len);

// SplitTso without the payload copy: slot i gets only segment i's headers (*hdrs bytes, the same
// for every segment, everything else as SplitTso); its payload stays in `pkt` at
// *hdrs + i * h.gso_size, payload_len[i] bytes long. The TCP checksums cover those payloads, so
// a sender gathers [slot headers][payload in pkt] per segment (one iovec pair each).
size_t SplitTsoHeaders(const VnetHdr& h, const uint8_t* pkt, size_t len, uint8_t* out,
                       size_t slot_size, size_t max_segs, uint16_t* payload_len, size_t* hdrs);

}  // namespace weft

#endif  // WEFT_NATIVE_PACKET_H_
