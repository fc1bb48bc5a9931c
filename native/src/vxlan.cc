#include "vxlan.h"

#include <cstring>

#include "checksum.h"

namespace weft {

void WriteVxlanEncap(uint8_t* h, const PeerRecord& peer, const CodecConfig& cfg, uint8_t version) {
  h[0] = 0x08;
  h[1] = h[2] = h[3] = 0;
  h[4] = static_cast<uint8_t>(cfg.vni >> 16);
  h[5] = static_cast<uint8_t>(cfg.vni >> 8);
  h[6] = static_cast<uint8_t>(cfg.vni);
  h[7] = 0;
  std::memcpy(h + 8, peer.vtep_mac, 6);
  std::memcpy(h + 14, cfg.vtep_mac, 6);
  StoreBe16(h + 20, version == 4 ? 0x0800 : 0x86dd);
}

EncapResult VxlanEncap(uint8_t* pkt, size_t len, const PeerTable& table, const CodecConfig& cfg,
                       uint8_t* icmp_out, size_t icmp_cap) {
  EncapResult res;
  IpInfo& ip = res.ip;
  res.drop = ParseIp(pkt, len, &ip);
  if (res.drop != DropReason::kNone) return res;
  if (ip.len + kVxlanEncapLen > kMaxUdpPayload) {
    res.drop = DropReason::kOversized;
    return res;
  }
  const PeerRecord* peer = table.Lookup(ip.addr_len, ip.dst);
  if (peer == nullptr || !peer->has_vtep_mac()) {
    res.drop = DropReason::kNoRoute;
    res.icmp_len = BuildNetUnreachable(pkt, ip, icmp_out, icmp_cap);
    return res;
  }
  WriteVxlanEncap(pkt - kVxlanEncapLen, *peer, cfg, ip.version);
  res.peer = peer;
  res.payload_len = kVxlanEncapLen + ip.len;
  return res;
}

DecapResult VxlanDecap(uint8_t* dgram, size_t len, size_t outer_len, const uint8_t* outer_src,
                       const PeerTable& table, const CodecConfig& cfg) {
  DecapResult res;
  if (!table.HasPublic(outer_len, outer_src)) {
    res.drop = DropReason::kUnknownSource;
    return res;
  }
  if (len < kVxlanHdrLen) {
    res.drop = DropReason::kTruncated;
    return res;
  }
  if (dgram[0] != 0x08 || dgram[1] != 0 || dgram[2] != 0 || dgram[3] != 0 || dgram[7] != 0) {
    res.drop = DropReason::kMalformed;
    return res;
  }
  uint32_t vni = (static_cast<uint32_t>(dgram[4]) << 16) | (dgram[5] << 8) | dgram[6];
  if (vni != cfg.vni) {
    res.drop = DropReason::kBadVni;
    return res;
  }
  if (len < kVxlanEncapLen) {
    res.drop = DropReason::kTruncated;
    return res;
  }
  if (std::memcmp(dgram + 8, cfg.vtep_mac, 6) != 0) {
    res.drop = DropReason::kBadMac;
    return res;
  }
  uint16_t type = LoadBe16(dgram + 20);
  if (type != 0x0800 && type != 0x86dd) {
    res.drop = DropReason::kBadEthertype;
    return res;
  }
  uint8_t* inner = dgram + kVxlanEncapLen;
  res.drop = ParseIp(inner, len - kVxlanEncapLen, &res.ip);
  if (res.drop != DropReason::kNone) return res;
  if (res.ip.version != (type == 0x0800 ? 4 : 6)) {
    res.drop = DropReason::kMalformed;
    return res;
  }
  res.drop = CheckSource(table, outer_len, outer_src, res.ip);
  if (res.drop != DropReason::kNone) return res;
  res.inner_off = kVxlanEncapLen;
  res.inner_len = res.ip.len;
  return res;
}

uint16_t VxlanSourcePort(const uint8_t* pkt, const IpInfo& ip) {
  uint32_t h = 2166136261u;
  auto mix = [&h](const uint8_t* p, size_t n) {
    for (size_t i = 0; i < n; i++) {
      h ^= p[i];
      h *= 16777619u;
    }
  };
  mix(ip.src, ip.addr_len);
  mix(ip.dst, ip.addr_len);
  mix(&ip.proto, 1);
  bool first_fragment = ip.version == 6 || (LoadBe16(pkt + 6) & 0x1fffu) == 0;
  if ((ip.proto == kProtoTcp || ip.proto == kProtoUdp) && first_fragment &&
      ip.len >= ip.l4_off + 4u) {
    mix(pkt + ip.l4_off, 4);
  }
  uint32_t range = kVxlanSrcPortMax - kVxlanSrcPortMin;
  return static_cast<uint16_t>(kVxlanSrcPortMin + ((static_cast<uint64_t>(h) * range) >> 32));
}

}  // namespace weft
