#include "tap_tx.h"

#include <cstring>

#include "checksum.h"
#include "vxlan.h"

namespace weft {

namespace {

inline void StoreLe16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}

uint32_t SumWords(const uint8_t* p, size_t len) {
  uint32_t s = 0;
  for (size_t i = 0; i + 1 < len; i += 2) s += LoadBe16(p + i);
  return s;
}

}  // namespace

void BuildTapTemplate(const PeerRecord& p, const TapFrameConfig& cfg, TapTemplate* t) {
  std::memset(t, 0, sizeof(*t));
  if (p.public_family != cfg.family || (cfg.vxlan && !p.has_vtep_mac())) return;
  uint8_t* b = t->bytes;
  std::memcpy(b, cfg.tap_mac, 6);
  std::memcpy(b + 6, cfg.src_mac, 6);
  const size_t alen = cfg.family == 4 ? 4 : 16;
  uint8_t* ip = b + 14;
  if (cfg.family == 4) {
    StoreBe16(b + 12, 0x0800);
    t->ip_len = 20;
    ip[0] = 0x45;
    ip[8] = kTapOuterTtl;
    ip[9] = kProtoUdp;
    std::memcpy(ip + 12, cfg.src_ip, 4);
    std::memcpy(ip + 16, p.public_ip, 4);
    t->ip_sum = SumWords(ip, 20);
  } else {
    StoreBe16(b + 12, 0x86dd);
    t->ip_len = 40;
    ip[0] = 0x60;
    ip[6] = kProtoUdp;
    ip[7] = kTapOuterTtl;
    std::memcpy(ip + 8, cfg.src_ip, 16);
    std::memcpy(ip + 24, p.public_ip, 16);
  }
  t->addr_sum = SumWords(cfg.src_ip, alen) + SumWords(p.public_ip, alen) + kProtoUdp;
  uint8_t* udp = ip + t->ip_len;
  StoreBe16(udp + 2, p.port);
  size_t len = 14 + t->ip_len + 8;
  if (cfg.vxlan) {
    WriteVxlanEncap(udp + 8, p, cfg.codec, 4);
    len += kVxlanEncapLen;
  }
  t->len = static_cast<uint8_t>(len);
}

size_t WriteTapHeaders(const TapTemplate& t, const VnetHdr& h, size_t inner_len, size_t inner_hdrs,
                       uint8_t version, uint16_t sport, uint16_t ip_id, uint8_t* out) {
  const size_t outer_th = 14 + static_cast<size_t>(t.ip_len);
  const size_t udp_len = t.len - outer_th + inner_len;
  const size_t ip_total = t.ip_len + udp_len;
  if (t.len == 0 || (t.ip_len == 20 ? ip_total : udp_len) > 65535) return 0;
  uint8_t* v = out;
  uint8_t* f = out + kTapVnetHdrLen;
  std::memset(v, 0, kTapVnetHdrLen);
  std::memcpy(f, t.bytes, t.len);
  uint8_t* ip = f + 14;
  if (t.ip_len == 20) {
    StoreBe16(ip + 2, static_cast<uint16_t>(ip_total));
    StoreBe16(ip + 4, ip_id);
    StoreBe16(ip + 10, static_cast<uint16_t>(~ChecksumFold(t.ip_sum + ip_total + ip_id)));
  } else {
    StoreBe16(ip + 4, static_cast<uint16_t>(udp_len));
  }
  uint8_t* udp = f + outer_th;
  StoreBe16(udp, sport);
  StoreBe16(udp + 4, static_cast<uint16_t>(udp_len));
  StoreBe16(udp + 6, ChecksumFold(static_cast<uint64_t>(t.addr_sum) + udp_len));
  if (version == 6 && t.len > outer_th + 8) StoreBe16(f + t.len - 2, 0x86dd);  // inner Ethernet
  const bool gso = h.gso_type == kVnetGsoTcpV4 || h.gso_type == kVnetGsoTcpV6;
  if (gso) {
    v[0] = kVnetFlagNeedsCsum | kVnetFlagUdpTunnelCsum;
    v[1] = static_cast<uint8_t>(h.gso_type |
                                (t.ip_len == 20 ? kVnetGsoUdpTunnelV4 : kVnetGsoUdpTunnelV6));
    StoreLe16(v + 2, static_cast<uint16_t>(t.len + inner_hdrs));
    StoreLe16(v + 4, h.gso_size);
    StoreLe16(v + 6, static_cast<uint16_t>(t.len + h.csum_start));
    StoreLe16(v + 8, h.csum_offset);
    StoreLe16(v + 20, static_cast<uint16_t>(outer_th));
    StoreLe16(v + 22, t.len);
  } else {
    v[0] = kVnetFlagNeedsCsum;
    StoreLe16(v + 6, static_cast<uint16_t>(outer_th));
    StoreLe16(v + 8, 6);
  }
  return kTapVnetHdrLen + t.len;
}

}  // namespace weft
