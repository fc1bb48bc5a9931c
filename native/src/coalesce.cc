#include "coalesce.h"

#include <cstring>

#include "checksum.h"

namespace weft {

namespace {

constexpr uint8_t kAck = 0x10;
constexpr uint8_t kPsh = 0x08;
constexpr size_t kUdpHdrLen = 8;

// A packet that may start or join a group: TCP or UDP, fits the TUN MTU, plain IP header, a
// payload, a valid checksum (not summed when `authenticated`: see the Coalescer constructor);
// TCP with only ACK (and PSH); UDP with a checksum (a zero one is not checked, so it is not
// merged either) and a length that matches the IP one. Returns the transport header length, or 0.
size_t Eligible(const uint8_t* pkt, const IpInfo& ip, uint32_t tun_mtu, unsigned udp_versions,
                bool authenticated) {
  if (ip.len > tun_mtu) return 0;
  if (ip.proto != kProtoTcp && (ip.proto != kProtoUdp || ((udp_versions >> ip.version) & 1) == 0)) {
    return 0;
  }
  if (ip.version == 4) {
    if (ip.l4_off != 20) return 0;                     // IP options
    if ((LoadBe16(pkt + 6) & 0x3fffu) != 0) return 0;  // MF or a fragment offset
  }
  size_t l4_len = ip.len - ip.l4_off;
  const uint8_t* t = pkt + ip.l4_off;
  size_t thl;
  if (ip.proto == kProtoTcp) {
    if (l4_len < 20) return 0;
    thl = (t[12] >> 4) * 4u;
    if (thl < 20 || thl >= l4_len) return 0;  // no payload: nothing to merge
    uint8_t flags = t[13];
    if ((flags & ~(kAck | kPsh)) != 0 || (flags & kAck) == 0) return 0;
  } else {
    thl = kUdpHdrLen;
    if (l4_len <= thl || LoadBe16(t + 4) != l4_len || LoadBe16(t + 6) == 0) return 0;
  }
  if (authenticated) return thl;
  uint16_t pseudo =
      PseudoHeaderSum(ip.addr_len, ip.src, ip.dst, ip.proto, static_cast<uint32_t>(l4_len));
  if (ChecksumSum(t, l4_len, pseudo) != 0xffff) return 0;
  return thl;
}

}  // namespace

bool Coalescer::Add(const uint8_t* pkt, const IpInfo& ip) {
  size_t thl = Eligible(pkt, ip, tun_mtu_, udp_versions_, authenticated_);
  if (thl == 0) return false;
  const uint8_t* t = pkt + ip.l4_off;
  size_t hdrs = ip.l4_off + thl;
  size_t payload = ip.len - hdrs;
  bool tcp = ip.proto == kProtoTcp;
  uint8_t* g = buf_ + kVnetHdrLen;
  if (segs_ == 0) {
    std::memcpy(g, pkt, ip.len);
    segs_ = 1;
    len_ = ip.len;
    head_len_ = ip.len;
    hdrs_ = hdrs;
    l4_off_ = ip.l4_off;
    seg_size_ = payload;
    last_payload_ = payload;
    next_seq_ = tcp ? LoadBe32(t + 4) + static_cast<uint32_t>(payload) : 0;
    next_id_ = static_cast<uint16_t>(ip.version == 4 ? LoadBe16(pkt + 4) + 1 : 0);
    version_ = ip.version;
    proto_ = ip.proto;
    closed_ = tcp && (t[13] & kPsh) != 0;
    return true;
  }
  if (closed_ || ip.version != version_ || ip.proto != proto_ || hdrs != hdrs_ ||
      ip.l4_off != l4_off_) {
    return false;
  }
  if (segs_ >= kMaxSegs || len_ + payload > kMaxLen) return false;
  if (last_payload_ != seg_size_ || payload > seg_size_) return false;
  if (tcp && LoadBe32(t + 4) != next_seq_) return false;
  if (ip.version == 4) {
    // Version/IHL and TOS; TTL and protocol; addresses; DF.
    if (std::memcmp(g, pkt, 2) != 0 || std::memcmp(g + 8, pkt + 8, 2) != 0 ||
        std::memcmp(g + 12, pkt + 12, 8) != 0 || ((g[6] ^ pkt[6]) & 0x40) != 0) {
      return false;
    }
    // Segmenting a UDP group gives IDs first, first + 1, ...: only those (or DF) round-trip.
    if (!tcp && (g[6] & 0x40) == 0 && LoadBe16(pkt + 4) != next_id_) return false;
  } else {
    // Version, traffic class, flow label; next header and hop limit; addresses.
    if (std::memcmp(g, pkt, 4) != 0 || std::memcmp(g + 6, pkt + 6, 34) != 0) return false;
  }
  const uint8_t* gt = g + l4_off_;
  if (std::memcmp(gt, t, 4) != 0) return false;  // ports
  // TCP: ACK number; data offset; options (everything after the fixed header).
  if (tcp && (std::memcmp(gt + 8, t + 8, 5) != 0 ||
              std::memcmp(gt + 20, t + 20, hdrs - l4_off_ - 20) != 0)) {
    return false;
  }
  if (gather_) {
    span_[segs_] = pkt + hdrs;
    span_len_[segs_] = payload;
  } else {
    std::memcpy(g + len_, pkt + hdrs, payload);
    head_len_ += payload;
  }
  len_ += payload;
  segs_++;
  last_payload_ = payload;
  next_seq_ += static_cast<uint32_t>(payload);
  next_id_++;
  if (tcp) {
    uint8_t* flags = g + l4_off_ + 13;
    *flags = t[13];  // the last segment's flags (PSH) and window stand for the group
    std::memcpy(g + l4_off_ + 14, t + 14, 2);
  }
  if ((tcp && (t[13] & kPsh) != 0) || payload < seg_size_) closed_ = true;
  return true;
}

size_t Coalescer::Finish(const uint8_t** out) {
  if (segs_ == 0) return 0;
  size_t len = Complete();
  *out = buf_;
  segs_ = 0;
  len_ = 0;
  return kVnetHdrLen + len;
}

int Coalescer::FinishIov(iovec* iov) {
  if (segs_ == 0) return 0;
  Complete();
  iov[0].iov_base = buf_;
  iov[0].iov_len = kVnetHdrLen + head_len_;
  int n = 1;
  if (gather_) {
    for (size_t i = 1; i < segs_; i++, n++) {
      iov[n].iov_base = const_cast<uint8_t*>(span_[i]);
      iov[n].iov_len = span_len_[i];
    }
  }
  segs_ = 0;
  len_ = 0;
  return n;
}

size_t Coalescer::Complete() {
  uint8_t* g = buf_ + kVnetHdrLen;
  VnetHdr h;
  if (segs_ > 1) {
    bool tcp = proto_ == kProtoTcp;
    size_t addr_len = version_ == 4 ? 4 : 16;
    const uint8_t* src = g + (version_ == 4 ? 12 : 8);
    const uint8_t* dst = g + (version_ == 4 ? 16 : 24);
    if (version_ == 4) {
      StoreBe16(g + 2, static_cast<uint16_t>(len_));
      StoreBe16(g + 10, 0);
      StoreBe16(g + 10, Checksum(g, l4_off_));
    } else {
      StoreBe16(g + 4, static_cast<uint16_t>(len_ - 40));
    }
    uint32_t l4_len = static_cast<uint32_t>(len_ - l4_off_);
    size_t csum_offset = tcp ? 16 : 6;
    if (!tcp) StoreBe16(g + l4_off_ + 4, static_cast<uint16_t>(l4_len));
    StoreBe16(g + l4_off_ + csum_offset, PseudoHeaderSum(addr_len, src, dst, proto_, l4_len));
    h.flags = kVnetFlagNeedsCsum;
    h.gso_type = tcp ? (version_ == 4 ? kVnetGsoTcpV4 : kVnetGsoTcpV6) : kVnetGsoUdpL4;
    h.hdr_len = static_cast<uint16_t>(hdrs_);
    h.gso_size = static_cast<uint16_t>(seg_size_);
    h.csum_start = static_cast<uint16_t>(l4_off_);
    h.csum_offset = static_cast<uint16_t>(csum_offset);
  }
  StoreVnetHdr(buf_, h);
  return len_;
}

}  // namespace weft
