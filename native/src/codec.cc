#include "codec.h"

#include <cstring>

#include "checksum.h"
#include "flannel_udp.h"
#include "ipip.h"
#include "vxlan.h"

namespace weft {

DropReason CheckSource(const PeerTable& table, size_t outer_len, const uint8_t* outer_src,
                       const IpInfo& ip) {
  const PeerRecord* r = table.Lookup(ip.addr_len, ip.src);
  if (r != nullptr && r->public_len() == outer_len &&
      std::memcmp(r->public_ip, outer_src, outer_len) == 0) {
    return DropReason::kNone;
  }
  if (!table.HasPublic(outer_len, outer_src)) return DropReason::kUnknownSource;
  return DropReason::kSpoofedSource;
}

namespace {

bool AllZero(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (p[i] != 0) return false;
  }
  return true;
}

}  // namespace

size_t BuildNetUnreachable(const uint8_t* pkt, const IpInfo& ip, uint8_t* out, size_t cap) {
  if (cap < kIcmpReplyMax) return 0;
  const uint8_t* l4 = pkt + ip.l4_off;
  size_t l4_len = ip.len - ip.l4_off;
  if (ip.version == 4) {
    if ((LoadBe16(pkt + 6) & 0x1fffu) != 0) return 0;  // not the first fragment
    if (AllZero(ip.src, 4) || ip.src[0] >= 224 || ip.dst[0] >= 224) return 0;
    if (ip.proto == kProtoIcmp) {
      if (l4_len < 1) return 0;
      uint8_t t = l4[0];
      if (t == 3 || t == 4 || t == 5 || t == 11 || t == 12) return 0;
    }
    size_t quoted = ip.l4_off + (l4_len < 8 ? l4_len : 8);
    size_t total = 20 + 8 + quoted;
    std::memset(out, 0, 28);
    out[0] = 0x45;
    StoreBe16(out + 2, static_cast<uint16_t>(total));
    out[8] = 64;
    out[9] = kProtoIcmp;
    std::memcpy(out + 12, ip.dst, 4);
    std::memcpy(out + 16, ip.src, 4);
    StoreBe16(out + 10, Checksum(out, 20));
    out[20] = 3;  // destination unreachable
    out[21] = 0;  // net unreachable
    std::memcpy(out + 28, pkt, quoted);
    StoreBe16(out + 22, Checksum(out + 20, 8 + quoted));
    return total;
  }
  if (AllZero(ip.src, 16) || ip.src[0] == 0xff || ip.dst[0] == 0xff) return 0;
  if (ip.proto == kProtoIcmpV6) {
    if (l4_len < 1) return 0;
    if (l4[0] < 128) return 0;  // an ICMPv6 error message
  }
  size_t quoted = ip.len < kIcmpReplyMax - 48 ? ip.len : kIcmpReplyMax - 48;
  size_t icmp_len = 8 + quoted;
  std::memset(out, 0, 48);
  out[0] = 0x60;
  StoreBe16(out + 4, static_cast<uint16_t>(icmp_len));
  out[6] = kProtoIcmpV6;
  out[7] = 64;
  std::memcpy(out + 8, ip.dst, 16);
  std::memcpy(out + 24, ip.src, 16);
  out[40] = 1;  // destination unreachable
  out[41] = 0;  // no route to destination
  std::memcpy(out + 48, pkt, quoted);
  uint16_t pseudo =
      PseudoHeaderSum(16, out + 8, out + 24, kProtoIcmpV6, static_cast<uint32_t>(icmp_len));
  StoreBe16(out + 42, Checksum(out + 40, icmp_len, pseudo));
  return 40 + icmp_len;
}

size_t EncapHeadroom(Format f) {
  switch (f) {
    case Format::kVxlan:
      return kVxlanEncapLen;
    case Format::kIpip:
      return kIpipHdrLen;
    case Format::kWireguard:
      return 16;  // wg::kTransportHeaderSize
    case Format::kUdp:
      break;
  }
  return 0;
}

EncapResult Encap(Format f, uint8_t* pkt, size_t len, const PeerTable& table,
                  const CodecConfig& cfg, uint8_t* icmp_out, size_t icmp_cap) {
  switch (f) {
    case Format::kVxlan:
      return VxlanEncap(pkt, len, table, cfg, icmp_out, icmp_cap);
    case Format::kIpip:
      return IpipEncap(pkt, len, table, cfg, icmp_out, icmp_cap);
    case Format::kWireguard: {
      EncapResult r;
      r.drop = DropReason::kMalformed;  // sealed by the engine (wg_engine.h), never here
      return r;
    }
    case Format::kUdp:
      break;
  }
  return FlannelUdpEncap(pkt, len, table, icmp_out, icmp_cap);
}

DecapResult Decap(Format f, uint8_t* data, size_t len, size_t outer_len, const uint8_t* outer_src,
                  const PeerTable& table, const CodecConfig& cfg) {
  switch (f) {
    case Format::kVxlan:
      return VxlanDecap(data, len, outer_len, outer_src, table, cfg);
    case Format::kIpip:
      return IpipDecap(data, len, outer_len, outer_src, table);
    case Format::kWireguard: {
      DecapResult r;
      r.drop = DropReason::kMalformed;  // opened by the engine (wg_engine.h), never here
      return r;
    }
    case Format::kUdp:
      break;
  }
  return FlannelUdpDecap(data, len, outer_len, outer_src, table);
}

}  // namespace weft
