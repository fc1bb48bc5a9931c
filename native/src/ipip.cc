#include "ipip.h"

#include <cstring>

#include "checksum.h"

namespace weft {

namespace {

constexpr uint8_t kEcnMask = 3;
constexpr uint8_t kEcnEct0 = 2;
constexpr uint8_t kEcnCe = 3;

}  // namespace

void WriteIpipHeader(uint8_t* h, const uint8_t* inner, const PeerRecord& peer,
                     const CodecConfig& cfg) {
  uint8_t ecn = inner[1] & kEcnMask;
  h[0] = 0x45;
  h[1] = ecn == kEcnCe ? kEcnEct0 : ecn;
  StoreBe16(h + 2, static_cast<uint16_t>(kIpipHdrLen + LoadBe16(inner + 2)));
  h[4] = h[5] = 0;
  h[6] = inner[6] & 0x40;  // DF only
  h[7] = 0;
  h[8] = inner[8];
  h[9] = kProtoIpip;
  h[10] = h[11] = 0;
  std::memcpy(h + 12, cfg.local_ip, 4);
  std::memcpy(h + 16, peer.public_ip, 4);
  StoreBe16(h + 10, Checksum(h, kIpipHdrLen));
}

EncapResult IpipEncap(uint8_t* pkt, size_t len, const PeerTable& table, const CodecConfig& cfg,
                      uint8_t* icmp_out, size_t icmp_cap) {
  EncapResult res;
  IpInfo& ip = res.ip;
  res.drop = ParseIp(pkt, len, &ip);
  if (res.drop != DropReason::kNone) return res;
  if (ip.len + kIpipHdrLen > 0xffff) {
    res.drop = DropReason::kOversized;
    return res;
  }
  const PeerRecord* peer = ip.version == 4 ? table.Lookup(4, ip.dst) : nullptr;
  if (peer == nullptr || peer->public_family != 4) {
    res.drop = DropReason::kNoRoute;
    res.icmp_len = BuildNetUnreachable(pkt, ip, icmp_out, icmp_cap);
    return res;
  }
  WriteIpipHeader(pkt - kIpipHdrLen, pkt, *peer, cfg);
  res.peer = peer;
  res.payload_len = kIpipHdrLen + ip.len;
  return res;
}

DecapResult IpipDecap(uint8_t* pkt, size_t len, size_t outer_len, const uint8_t* outer_src,
                      const PeerTable& table) {
  DecapResult res;
  if (!table.HasPublic(outer_len, outer_src)) {
    res.drop = DropReason::kUnknownSource;
    return res;
  }
  IpInfo outer;
  res.drop = ParseIp(pkt, len, &outer);
  if (res.drop != DropReason::kNone) return res;
  if (outer.version != 4 || outer.proto != kProtoIpip) {
    res.drop = DropReason::kMalformed;
    return res;
  }
  uint8_t* inner = pkt + outer.l4_off;
  res.drop = ParseIp(inner, outer.len - outer.l4_off, &res.ip);
  if (res.drop != DropReason::kNone) return res;
  if (res.ip.version != 4) {
    res.drop = DropReason::kMalformed;
    return res;
  }
  res.drop = CheckSource(table, outer_len, outer_src, res.ip);
  if (res.drop != DropReason::kNone) return res;
  // ECN decapsulation (INET_ECN_decapsulate): outer CE on a not-ECT inner packet is dropped,
  // on an ECN-capable one it marks the inner packet CE.
  if ((pkt[1] & kEcnMask) == kEcnCe) {
    uint8_t ecn = inner[1] & kEcnMask;
    if (ecn == 0) {
      res.drop = DropReason::kMalformed;
      return res;
    }
    if (ecn != kEcnCe) {
      uint16_t old_word = LoadBe16(inner);
      inner[1] |= kEcnCe;
      StoreBe16(inner + 10, ChecksumUpdate16(LoadBe16(inner + 10), old_word, LoadBe16(inner)));
    }
  }
  res.inner_off = outer.l4_off;
  res.inner_len = res.ip.len;
  return res;
}

}  // namespace weft
