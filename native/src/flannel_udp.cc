#include "flannel_udp.h"

namespace weft {

EncapResult FlannelUdpEncap(uint8_t* pkt, size_t len, const PeerTable& table, uint8_t* icmp_out,
                            size_t icmp_cap) {
  EncapResult res;
  IpInfo& ip = res.ip;
  res.drop = ParseIp(pkt, len, &ip);
  if (res.drop != DropReason::kNone) return res;
  if (ip.len > kMaxUdpPayload) {
    res.drop = DropReason::kOversized;
    return res;
  }
  res.peer = table.Lookup(ip.addr_len, ip.dst);
  if (res.peer == nullptr) {
    res.drop = DropReason::kNoRoute;
    res.icmp_len = BuildNetUnreachable(pkt, ip, icmp_out, icmp_cap);
    return res;
  }
  if (!DecrementTtl(pkt, ip)) {
    res.peer = nullptr;
    res.drop = DropReason::kTtlExpired;
    return res;
  }
  res.payload_len = ip.len;
  return res;
}

DecapResult FlannelUdpDecap(uint8_t* dgram, size_t len, size_t outer_len, const uint8_t* outer_src,
                            const PeerTable& table) {
  DecapResult res;
  if (!table.HasPublic(outer_len, outer_src)) {
    res.drop = DropReason::kUnknownSource;
    return res;
  }
  res.drop = ParseIp(dgram, len, &res.ip);
  if (res.drop != DropReason::kNone) return res;
  res.drop = CheckSource(table, outer_len, outer_src, res.ip);
  if (res.drop != DropReason::kNone) return res;
  if (!DecrementTtl(dgram, res.ip)) {
    res.drop = DropReason::kTtlExpired;
    return res;
  }
  res.inner_off = 0;
  res.inner_len = res.ip.len;
  return res;
}

}  // namespace weft
