#include "harness.h"

#include <sys/uio.h>

#include <cstring>

#include "coalesce.h"
#include "packet.h"

namespace weft {

std::vector<Bytes> TsoSplitForTest(const uint8_t* b, size_t len, bool in_place) {
  std::vector<Bytes> out;
  if (len < kVnetHdrLen) return out;
  const size_t max_segs = 128;
  std::vector<uint16_t> lens(max_segs);
  VnetHdr h = LoadVnetHdr(b);
  // Size the scratch for the worst case this packet can produce.
  size_t want = h.gso_size ? (len / h.gso_size + 2) : 2;
  if (want > max_segs) want = max_segs;
  size_t seg_slot = h.gso_size + 200u;
  std::vector<uint8_t> segs(seg_slot * want);
  const uint8_t* pkt = b + kVnetHdrLen;
  if (in_place) {
    size_t hdrs = 0;
    size_t n =
        SplitTsoHeaders(h, pkt, len - kVnetHdrLen, segs.data(), seg_slot, want, lens.data(), &hdrs);
    size_t off = hdrs;
    for (size_t i = 0; i < n; i++) {
      Bytes seg(segs.data() + i * seg_slot, segs.data() + i * seg_slot + hdrs);
      seg.insert(seg.end(), pkt + off, pkt + off + lens[i]);
      off += lens[i];
      out.push_back(std::move(seg));
    }
    return out;
  }
  size_t n = SplitTso(h, pkt, len - kVnetHdrLen, segs.data(), seg_slot, want, lens.data());
  for (size_t i = 0; i < n; i++) {
    out.emplace_back(segs.data() + i * seg_slot, segs.data() + i * seg_slot + lens[i]);
  }
  return out;
}

std::vector<Bytes> GroCoalesceForTest(const std::vector<Bytes>& packets, uint32_t tun_mtu,
                                      bool gather, bool udp, bool authenticated) {
  std::vector<uint8_t> buf(kVnetHdrLen + Coalescer::kMaxLen);
  Coalescer co(buf.data(), tun_mtu, gather, udp ? Coalescer::kUdpV4 | Coalescer::kUdpV6 : 0,
               authenticated);
  std::vector<Bytes> kept(packets);  // the coalescer may write into them; alive until flushed
  std::vector<Bytes> out;
  auto flush = [&]() {
    if (gather) {
      iovec iov[Coalescer::kMaxSegs];
      int k = co.FinishIov(iov);
      Bytes w;
      for (int j = 0; j < k; j++) {
        const uint8_t* base = static_cast<const uint8_t*>(iov[j].iov_base);
        w.insert(w.end(), base, base + iov[j].iov_len);
      }
      if (k) out.push_back(std::move(w));
      return;
    }
    const uint8_t* p;
    size_t len = co.Finish(&p);
    if (len) out.emplace_back(p, p + len);
  };
  for (Bytes& pkt : kept) {
    IpInfo ip;
    if (ParseIp(pkt.data(), pkt.size(), &ip) == DropReason::kNone &&
        (co.Add(pkt.data(), ip) || (flush(), co.Add(pkt.data(), ip)))) {
      continue;
    }
    flush();
    Bytes w(kVnetHdrLen + pkt.size());
    std::memcpy(w.data() + kVnetHdrLen, pkt.data(), pkt.size());
    out.push_back(std::move(w));
  }
  flush();
  return out;
}

}  // namespace weft
