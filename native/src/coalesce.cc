#include "coalesce.h"

#include <cstring>

#include "checksum.h"

namespace weft {

namespace {

constexpr uint8_t kAck = 0x10;
constexpr uint8_t kPsh = 0x08;

// A segment that may start or join a group: TCP, fits the TUN MTU, plain headers, only ACK
// (and PSH), a payload, a valid checksum.
bool Eligible(const uint8_t* pkt, const IpInfo& ip, uint32_t tun_mtu, size_t* thl_out) {
  if (ip.proto != kProtoTcp || ip.len > tun_mtu) return false;
  if (ip.version == 4) {
    if (ip.l4_off != 20) return false;                      // IP options
    if ((LoadBe16(pkt + 6) & 0x3fffu) != 0) return false;   // MF or a fragment offset
  }
  size_t l4_len = ip.len - ip.l4_off;
  if (l4_len < 20) return false;
  const uint8_t* t = pkt + ip.l4_off;
  size_t thl = (t[12] >> 4) * 4u;
  if (thl < 20 || thl >= l4_len) return false;  // no payload: nothing to merge
  uint8_t flags = t[13];
  if ((flags & ~(kAck | kPsh)) != 0 || (flags & kAck) == 0) return false;
  uint16_t pseudo = PseudoHeaderSum(ip.addr_len, ip.src, ip.dst, kProtoTcp,
                                    static_cast<uint32_t>(l4_len));
  if (ChecksumSum(t, l4_len, pseudo) != 0xffff) return false;
  *thl_out = thl;
  return true;
}

}  // namespace

bool TcpCoalescer::Add(const uint8_t* pkt, const IpInfo& ip) {
  size_t thl;
  if (!Eligible(pkt, ip, tun_mtu_, &thl)) return false;
  const uint8_t* t = pkt + ip.l4_off;
  size_t hdrs = ip.l4_off + thl;
  size_t payload = ip.len - hdrs;
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
    next_seq_ = LoadBe32(t + 4) + static_cast<uint32_t>(payload);
    version_ = ip.version;
    closed_ = (t[13] & kPsh) != 0;
    return true;
  }
  if (closed_ || ip.version != version_ || hdrs != hdrs_ || ip.l4_off != l4_off_) return false;
  if (segs_ >= kMaxSegs || len_ + payload > kMaxLen) return false;
  if (last_payload_ != seg_size_ || payload > seg_size_) return false;
  if (LoadBe32(t + 4) != next_seq_) return false;
  if (ip.version == 4) {
    // Version/IHL and TOS; TTL and protocol; addresses; DF.
    if (std::memcmp(g, pkt, 2) != 0 || std::memcmp(g + 8, pkt + 8, 2) != 0 ||
        std::memcmp(g + 12, pkt + 12, 8) != 0 || ((g[6] ^ pkt[6]) & 0x40) != 0) {
      return false;
    }
  } else {
    // Version, traffic class, flow label; next header and hop limit; addresses.
    if (std::memcmp(g, pkt, 4) != 0 || std::memcmp(g + 6, pkt + 6, 34) != 0) return false;
  }
  const uint8_t* gt = g + l4_off_;
  // Ports; ACK number; data offset; options (everything after the fixed header).
  if (std::memcmp(gt, t, 4) != 0 || std::memcmp(gt + 8, t + 8, 5) != 0 ||
      std::memcmp(gt + 20, t + 20, hdrs - l4_off_ - 20) != 0) {
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
  uint8_t* flags = g + l4_off_ + 13;
  *flags = t[13];  // the last segment's flags (PSH) and window stand for the group
  std::memcpy(g + l4_off_ + 14, t + 14, 2);
  if ((t[13] & kPsh) != 0 || payload < seg_size_) closed_ = true;
  return true;
}

size_t TcpCoalescer::Finish(const uint8_t** out) {
  if (segs_ == 0) return 0;
  size_t len = Complete();
  *out = buf_;
  segs_ = 0;
  len_ = 0;
  return kVnetHdrLen + len;
}

int TcpCoalescer::FinishIov(iovec* iov) {
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

size_t TcpCoalescer::Complete() {
  uint8_t* g = buf_ + kVnetHdrLen;
  VnetHdr h;
  if (segs_ > 1) {
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
    StoreBe16(g + l4_off_ + 16, PseudoHeaderSum(addr_len, src, dst, kProtoTcp, l4_len));
    h.flags = kVnetFlagNeedsCsum;
    h.gso_type = version_ == 4 ? kVnetGsoTcpV4 : kVnetGsoTcpV6;
    h.hdr_len = static_cast<uint16_t>(hdrs_);
    h.gso_size = static_cast<uint16_t>(seg_size_);
    h.csum_start = static_cast<uint16_t>(l4_off_);
    h.csum_offset = 16;
  }
  StoreVnetHdr(buf_, h);
  return len_;
}

}  // namespace weft
