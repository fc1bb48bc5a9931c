#include "packet.h"

#include <cstring>

#include "checksum.h"

namespace weft {

namespace {

inline void StoreLe16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
inline uint16_t LoadLe16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

}  // namespace

void StoreVnetHdr(uint8_t* p, const VnetHdr& h) {
  p[0] = h.flags;
  p[1] = h.gso_type;
  StoreLe16(p + 2, h.hdr_len);
  StoreLe16(p + 4, h.gso_size);
  StoreLe16(p + 6, h.csum_start);
  StoreLe16(p + 8, h.csum_offset);
}

VnetHdr LoadVnetHdr(const uint8_t* p) {
  VnetHdr h;
  h.flags = p[0];
  h.gso_type = p[1];
  h.hdr_len = LoadLe16(p + 2);
  h.gso_size = LoadLe16(p + 4);
  h.csum_start = LoadLe16(p + 6);
  h.csum_offset = LoadLe16(p + 8);
  return h;
}

DropReason ParseIp(const uint8_t* p, size_t avail, IpInfo* out) {
  if (avail < 1) return DropReason::kTruncated;
  uint8_t version = p[0] >> 4;
  if (version == 4) {
    if (avail < 20) return DropReason::kTruncated;
    uint32_t ihl = (p[0] & 0x0fu) * 4u;
    uint32_t tot = LoadBe16(p + 2);
    if (ihl < 20 || tot < ihl) return DropReason::kMalformed;
    if (tot > avail) return DropReason::kTruncated;
    out->version = 4;
    out->proto = p[9];
    out->l4_off = static_cast<uint16_t>(ihl);
    out->len = tot;
    out->src = p + 12;
    out->dst = p + 16;
    out->addr_len = 4;
    return DropReason::kNone;
  }
  if (version == 6) {
    if (avail < 40) return DropReason::kTruncated;
    uint32_t tot = 40u + LoadBe16(p + 4);
    if (tot > avail) return DropReason::kTruncated;
    out->version = 6;
    out->proto = p[6];
    out->l4_off = 40;
    out->len = tot;
    out->src = p + 8;
    out->dst = p + 24;
    out->addr_len = 16;
    return DropReason::kNone;
  }
  return DropReason::kMalformed;
}

bool DecrementTtl(uint8_t* p, const IpInfo& ip) {
  if (ip.version == 4) {
    if (p[8] <= 1) return false;
    uint16_t old_word = LoadBe16(p + 8);
    p[8]--;
    uint16_t new_word = LoadBe16(p + 8);
    StoreBe16(p + 10, ChecksumUpdate16(LoadBe16(p + 10), old_word, new_word));
    return true;
  }
  if (p[7] <= 1) return false;
  p[7]--;
  return true;
}

void PrepareTunWrite(uint8_t* pkt, const IpInfo& ip, uint32_t tun_mtu, VnetHdr* out) {
  *out = VnetHdr();
  if (ip.proto != kProtoTcp && ip.proto != kProtoUdp) return;
  if (ip.version == 4 && (LoadBe16(pkt + 6) & 0x3fffu) != 0) return;  // a fragment
  uint32_t l4_len = ip.len - ip.l4_off;
  uint16_t csum_off = ip.proto == kProtoTcp ? 16 : 6;
  if (l4_len < (ip.proto == kProtoTcp ? 20u : 8u)) return;
  uint8_t* l4 = pkt + ip.l4_off;
  uint16_t field = LoadBe16(l4 + csum_off);
  if (ip.proto == kProtoUdp && ip.version == 4 && field == 0) return;  // no checksum
  uint16_t pseudo = PseudoHeaderSum(ip.addr_len, ip.src, ip.dst, ip.proto, l4_len);
  bool gso = ip.proto == kProtoTcp && ip.len > tun_mtu;
  if (field != pseudo && !gso) return;  // the common case: a complete checksum
  bool valid = ChecksumSum(l4, l4_len, pseudo) == 0xffff;
  bool partial = field == pseudo && !valid;
  if (gso) {
    uint32_t thl = (l4[12] >> 4) * 4u;
    if (thl < 20 || thl > l4_len) return;
    if (!partial && !valid) return;  // corrupt: let the receiver's TCP reject it
    uint32_t hdrs = ip.l4_off + thl;
    if (tun_mtu <= hdrs) return;
    StoreBe16(l4 + csum_off, pseudo);
    out->flags = kVnetFlagNeedsCsum;
    out->gso_type = ip.version == 4 ? kVnetGsoTcpV4 : kVnetGsoTcpV6;
    out->hdr_len = static_cast<uint16_t>(hdrs);
    out->gso_size = static_cast<uint16_t>(tun_mtu - hdrs);
    out->csum_start = ip.l4_off;
    out->csum_offset = csum_off;
    return;
  }
  if (partial) {
    out->flags = kVnetFlagNeedsCsum;
    out->csum_start = ip.l4_off;
    out->csum_offset = csum_off;
  }
}

namespace {

// SplitTso and SplitTsoHeaders: with `copy` each slot gets the whole segment; without, only
// its headers (the payload stays in `pkt`, and the L4 checksum is summed over it in place).
// TCP (TSO4/6) and UDP (USO: gso_type UDP_L4, either IP version).
size_t Split(const VnetHdr& h, const uint8_t* pkt, size_t len, uint8_t* out, size_t slot_size,
             size_t max_segs, uint16_t* seg_len, bool copy, size_t* hdrs_out) {
  bool udp = h.gso_type == kVnetGsoUdpL4;
  if (h.gso_type != kVnetGsoTcpV4 && h.gso_type != kVnetGsoTcpV6 && !udp) return 0;
  if (h.gso_size == 0) return 0;
  IpInfo ip;
  if (ParseIp(pkt, len, &ip) != DropReason::kNone) return 0;
  if (udp ? ip.proto != kProtoUdp
          : ip.proto != kProtoTcp || (ip.version == 4) != (h.gso_type == kVnetGsoTcpV4)) {
    return 0;
  }
  size_t l4 = h.csum_start;
  if (l4 < ip.l4_off || l4 + (udp ? 8 : 20) > ip.len) return 0;
  size_t thl = udp ? 8 : (pkt[l4 + 12] >> 4) * 4u;
  size_t hdrs = l4 + thl;
  if (thl < 8 || (!udp && thl < 20) || hdrs > ip.len) return 0;
  const uint8_t proto = udp ? kProtoUdp : kProtoTcp;
  const size_t csum_field = udp ? 6 : 16;
  size_t payload = ip.len - hdrs;
  size_t n = payload == 0 ? 1 : (payload + h.gso_size - 1) / h.gso_size;
  size_t first = copy ? (payload < h.gso_size ? payload : h.gso_size) : 0;
  if (n > max_segs || hdrs + first > slot_size) return 0;
  if (hdrs_out != nullptr) *hdrs_out = hdrs;
  uint32_t seq = udp ? 0 : LoadBe32(pkt + l4 + 4);
  uint8_t flags = udp ? 0 : pkt[l4 + 13];
  uint16_t id = ip.version == 4 ? LoadBe16(pkt + 4) : 0;
  for (size_t i = 0; i < n; i++) {
    size_t off = i * h.gso_size;
    size_t chunk = payload - off < h.gso_size ? payload - off : h.gso_size;
    uint8_t* s = out + i * slot_size;
    std::memcpy(s, pkt, hdrs);
    if (copy) std::memcpy(s + hdrs, pkt + hdrs + off, chunk);
    size_t total = hdrs + chunk;
    if (ip.version == 4) {
      StoreBe16(s + 2, static_cast<uint16_t>(total));
      StoreBe16(s + 4, static_cast<uint16_t>(id + i));
      StoreBe16(s + 10, 0);
      StoreBe16(s + 10, Checksum(s, ip.l4_off));
    } else {
      StoreBe16(s + 4, static_cast<uint16_t>(total - 40));
    }
    uint8_t* t = s + l4;
    uint32_t l4_len = static_cast<uint32_t>(total - l4);
    if (udp) {
      StoreBe16(t + 4, static_cast<uint16_t>(l4_len));  // each datagram's own UDP length
    } else {
      StoreBe32(t + 4, seq + static_cast<uint32_t>(off));
      uint8_t f = flags;
      if (i + 1 < n) f &= static_cast<uint8_t>(~0x09);  // FIN, PSH only on the last
      if (i > 0) f &= static_cast<uint8_t>(~0x80);      // CWR only on the first
      t[13] = f;
    }
    StoreBe16(t + csum_field, 0);
    uint16_t pseudo =
        PseudoHeaderSum(ip.addr_len, s + (ip.src - pkt), s + (ip.dst - pkt), proto, l4_len);
    uint16_t csum;
    if (copy) {
      csum = Checksum(t, l4_len, pseudo);
      seg_len[i] = static_cast<uint16_t>(total);
    } else {
      // The L4 header is a multiple of 4 bytes long, so the payload sum continues in step.
      uint16_t sum = ChecksumSum(t, thl, pseudo);
      csum = static_cast<uint16_t>(~ChecksumSum(pkt + hdrs + off, chunk, sum));
      seg_len[i] = static_cast<uint16_t>(chunk);
    }
    if (udp && csum == 0) csum = 0xffff;  // UDP: 0 means "no checksum"
    StoreBe16(t + csum_field, csum);
  }
  return n;
}

}  // namespace

size_t SplitTso(const VnetHdr& h, const uint8_t* pkt, size_t len, uint8_t* out, size_t slot_size,
                size_t max_segs, uint16_t* seg_len) {
  return Split(h, pkt, len, out, slot_size, max_segs, seg_len, true, nullptr);
}

size_t SplitTsoHeaders(const VnetHdr& h, const uint8_t* pkt, size_t len, uint8_t* out,
                       size_t slot_size, size_t max_segs, uint16_t* payload_len, size_t* hdrs) {
  return Split(h, pkt, len, out, slot_size, max_segs, payload_len, false, hdrs);
}

}  // namespace weft
