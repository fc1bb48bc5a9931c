// The TUN write side's userspace GRO: consecutive TCP segments (or UDP datagrams) of one flow,
// received as separate datagrams, are merged into one super-packet and written to the TUN once
// with a GSO virtio_net_hdr (TCPV4/TCPV6 or UDP_L4, NEEDS_CSUM, the pseudo-header sum in the
// checksum field); the kernel segments or forwards it as GRO would.
// Merge rules (DESIGN §7.2), both protocols: same addresses and ports, IPv4 TOS/TTL/DF (no IP
// options, no fragments; IPv6 without extension headers and the same traffic class / flow label
// / hop limit); equal payload sizes, nothing after a short one; every packet's checksum verified
// first; at most 64 KB and kMaxSegs packets. TCP: the same ACK number, header length and
// options; contiguous sequence numbers; flags ACK or ACK|PSH; nothing after a PSH. UDP (only for
// the IP versions the TUN takes USO for, kernel ≥ 6.2): a non-zero checksum; IPv4 IDs that
// count up by one, as the kernel's segmentation gives them back, unless DF is set.
#ifndef WEFT_NATIVE_COALESCE_H_
#define WEFT_NATIVE_COALESCE_H_

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>

#include "packet.h"

namespace weft {

class Coalescer {
 public:
  static constexpr size_t kMaxSegs = 64;
  static constexpr size_t kMaxLen = 65535;

  // `buf` (≥ kVnetHdrLen + kMaxLen bytes) holds the pending super-packet behind its vnet header.
  // With `gather`, only the first segment is copied into `buf`: later segments' payloads stay
  // where Add found them (the caller keeps those bytes unchanged until the group is finished)
  // and FinishIov returns the group as iovecs — one copy less per byte.
  // `udp_versions`: bit 4 and/or bit 6 (kUdpV4, kUdpV6) allow UDP groups of that IP version.
  // A packet's transport checksum is verified before it joins (the group leaves with a new one),
  // unless `authenticated`: packets that arrive under an authenticated cipher (WireGuard's
  // Poly1305) cannot have been corrupted on the way, and their checksums are the sender's
  // business, as the kernel's WireGuard marks every packet it decrypts CHECKSUM_UNNECESSARY.
  static constexpr unsigned kUdpV4 = 1u << 4;
  static constexpr unsigned kUdpV6 = 1u << 6;
  Coalescer(uint8_t* buf, uint32_t tun_mtu, bool gather = false, unsigned udp_versions = 0,
            bool authenticated = false)
      : buf_(buf),
        tun_mtu_(tun_mtu),
        gather_(gather),
        udp_versions_(udp_versions),
        authenticated_(authenticated) {}

  // Takes `pkt` (an inner packet described by `ip`) into the pending group. Returns
  // false when it cannot join: the caller then Finish()es the group and calls Add again, and
  // writes the packet on its own when it is refused by an empty group too.
  bool Add(const uint8_t* pkt, const IpInfo& ip);

  // Completes the pending group: returns the bytes to write (vnet header + packet) and their
  // length, and empties the group. Returns 0 when the group is empty.
  size_t Finish(const uint8_t** out);

  // Finish for a gathering coalescer: fills iov[0..n) (room for kMaxSegs) with the vnet header,
  // the first segment and the later payloads, and returns n (0 when the group is empty).
  int FinishIov(iovec* iov);

  bool empty() const { return segs_ == 0; }

 private:
  uint8_t* buf_;
  uint32_t tun_mtu_;
  size_t segs_ = 0;
  size_t len_ = 0;   // packet bytes held (after the vnet header)
  size_t hdrs_ = 0;  // IP + TCP/UDP header length
  size_t l4_off_ = 0;
  size_t seg_size_ = 0;  // payload length of the first segment (the GSO size)
  size_t last_payload_ = 0;
  uint32_t next_seq_ = 0;  // TCP: the next segment's sequence number
  uint16_t next_id_ = 0;   // UDP over IPv4 without DF: the next datagram's IP ID
  uint8_t version_ = 0;
  uint8_t proto_ = 0;
  bool closed_ = false;  // a PSH or short segment ended the group
  bool gather_ = false;
  unsigned udp_versions_ = 0;
  bool authenticated_ = false;
  size_t head_len_ = 0;  // bytes of the group held in buf_ (all of it unless gathering)
  const uint8_t* span_[kMaxSegs] = {};  // gathering: payload of segment i (i ≥ 1)
  size_t span_len_[kMaxSegs] = {};

  // Sets the group's headers and vnet header in buf_; returns the group's packet length.
  size_t Complete();
};

}  // namespace weft

#endif  // WEFT_NATIVE_COALESCE_H_
