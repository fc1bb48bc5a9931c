// libFuzzer target for the receive path (and, on the same bytes, the send path and the TSO split):
// whatever a datagram holds, decapsulation, the source check and the TUN write preparation must
// neither crash nor read or write out of bounds. Input: byte 0 selects the format (bit 0: VXLAN,
// bit 2: IPIP, whose "datagram" is the whole outer IPv4 packet) and the outer source family (bit 1:
// IPv6), then the outer source address, then the datagram. Bit 3 sends the datagram to the
// WireGuard receive path instead (message types 1-4 parsed and checked by a device with an
// established session; bit 4: under load, so mac2 and cookie replies run too). Bit 5 hands the
// decapsulated packet to the coalescer as authenticated (as WireGuard's receive path does: no
// checksum summed, so arbitrary payloads reach its merging).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "coalesce.h"
#include "codec.h"
#include "packet.h"
#include "peer_table.h"
#include "vxlan.h"
#include "wg_device.h"

namespace {

std::vector<uint8_t> Record(uint8_t family, const uint8_t* subnet, uint8_t prefix,
                            const uint8_t* pub, uint8_t pub_family, bool mac) {
  std::vector<uint8_t> r(weft::kPeerRecordSize, 0);
  r[0] = family;
  r[1] = prefix;
  r[2] = mac ? weft::kPeerFlagVtepMac : 0;
  r[3] = pub_family;
  r[4] = 0x21;
  r[5] = 0x18;  // 8472
  if (mac) {
    const uint8_t m[6] = {0x02, 0, 0, 0, 0, prefix};
    std::memcpy(&r[6], m, 6);
  }
  std::memcpy(&r[16], subnet, family == 4 ? 4 : 16);
  std::memcpy(&r[32], pub, pub_family == 4 ? 4 : 16);
  return r;
}

const weft::PeerTable& Table() {
  static std::unique_ptr<weft::PeerTable> table = [] {
    std::vector<uint8_t> buf;
    const uint8_t s1[4] = {10, 5, 0, 0}, p1[4] = {192, 168, 1, 1};
    const uint8_t s2[4] = {10, 5, 1, 0}, p2[4] = {192, 168, 1, 2};
    const uint8_t s3[4] = {0, 0, 0, 0}, p3[4] = {192, 168, 1, 3};
    uint8_t s4[16] = {0xfc}, p4[16] = {0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    for (const auto& r : {Record(4, s1, 16, p1, 4, true), Record(4, s2, 24, p2, 4, true),
                          Record(4, s3, 0, p3, 4, false), Record(6, s4, 8, p4, 6, true),
                          Record(6, s4, 64, p1, 4, true)}) {
      buf.insert(buf.end(), r.begin(), r.end());
    }
    std::string error;
    return weft::PeerTable::Build(buf.data(), buf.size(), &error);
  }();
  return *table;
}

// Two WireGuard devices with fixed keys and an established session (b is the one fuzzed), on a
// clock that stands still.
class FixedClock : public weft::wg::Clock {
 public:
  uint64_t MonotonicNs() const override { return 10 * weft::wg::kSecond; }
  uint64_t WallNs() const override { return 1700000000 * weft::wg::kSecond; }
};

struct WgPair {
  FixedClock clock;
  weft::wg::Device a{&clock};
  weft::wg::Device b{&clock};
};

WgPair& Wg() {
  static WgPair* pair = [] {
    auto* p = new WgPair;
    uint8_t ka[32], kb[32], psk[32];
    std::memset(ka, 0x11, sizeof(ka));
    std::memset(kb, 0x22, sizeof(kb));
    std::memset(psk, 0x33, sizeof(psk));
    if (!p->a.SetPrivateKey(ka) || !p->b.SetPrivateKey(kb)) __builtin_trap();
    weft::wg::Peer* pa = p->a.AddPeer(p->b.public_key(), psk, 0);
    p->b.AddPeer(p->a.public_key(), psk, 0);
    std::vector<uint8_t> m1(weft::wg::kInitiationSize), m2(256), m3(256), m4(256);
    if (p->a.CreateInitiation(pa, m1.data()) != m1.size()) __builtin_trap();
    const uint8_t src[6] = {127, 0, 0, 1, 0, 1};
    weft::wg::Received r = p->b.Receive(m1.data(), m1.size(), src, 6, m2.data(), m2.size());
    weft::wg::Received d = p->a.Receive(m2.data(), r.len, src, 6, m3.data(), m3.size());
    weft::wg::Received k = p->b.Receive(m3.data(), d.len, src, 6, m4.data(), m4.size());
    if (k.verdict != weft::wg::Verdict::kKeepalive) __builtin_trap();
    return p;
  }();
  return *pair;
}

int FuzzWireGuard(uint8_t selector, const uint8_t* src, size_t src_len, const uint8_t* dgram,
                  size_t len) {
  WgPair& wg = Wg();
  std::vector<uint8_t> msg(dgram, dgram + len);
  weft::wg::MessageTypeOf(msg.data(), msg.size());
  std::vector<uint8_t> out(std::max(len, weft::wg::kInitiationSize));
  wg.b.set_under_load((selector & 16) != 0);
  weft::wg::Received r = wg.b.Receive(msg.data(), msg.size(), src, src_len, out.data(), out.size());
  if (r.len > out.size()) __builtin_trap();
  // The replay window on the datagram's bytes as counters.
  static weft::wg::ReplayWindow window;
  for (size_t i = 0; i + 8 <= len; i += 8) window.Check(weft::wg::GetLe64(dgram + i));
  return 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const weft::Format format = (data[0] & 4) != 0   ? weft::Format::kIpip
                              : (data[0] & 1) != 0 ? weft::Format::kVxlan
                                                   : weft::Format::kUdp;
  size_t src_len = (data[0] & 2) != 0 ? 16 : 4;
  if (size < 1 + src_len) return 0;
  const uint8_t* src = data + 1;
  const uint8_t* dgram = data + 1 + src_len;
  size_t len = size - 1 - src_len;
  if (data[0] & 8) return FuzzWireGuard(data[0], src, src_len, dgram, len);

  weft::CodecConfig cfg;
  const uint8_t mac[6] = {0x02, 0, 0, 0, 0, 24};
  std::memcpy(cfg.vtep_mac, mac, 6);
  cfg.tun_mtu = 1450;

  // Exact-size copies so the sanitizer sees any overrun.
  std::vector<uint8_t> rx(dgram, dgram + len);
  weft::DecapResult r = weft::Decap(format, rx.data(), rx.size(), src_len, src, Table(), cfg);
  if (r.drop == weft::DropReason::kNone) {
    if (r.inner_off + r.inner_len > rx.size()) __builtin_trap();
    weft::VnetHdr h;
    weft::PrepareTunWrite(rx.data() + r.inner_off, r.ip, cfg.tun_mtu, &h);
    // The receive-side coalescer (TCP and UDP) sees the packet twice (a flow of identical
    // segments mostly breaks on the sequence or ID check; the group logic runs either way).
    static std::vector<uint8_t> co_buf(weft::kVnetHdrLen + weft::Coalescer::kMaxLen);
    weft::Coalescer co(co_buf.data(), cfg.tun_mtu, false,
                       weft::Coalescer::kUdpV4 | weft::Coalescer::kUdpV6, (data[0] & 0x20) != 0);
    for (int k = 0; k < 2; k++) {
      if (!co.Add(rx.data() + r.inner_off, r.ip)) {
        const uint8_t* out;
        co.Finish(&out);
      }
    }
    const uint8_t* out;
    if (co.Finish(&out) > weft::kVnetHdrLen + weft::Coalescer::kMaxLen) __builtin_trap();
  }

  std::vector<uint8_t> tx(weft::kVxlanEncapLen + len);
  std::memcpy(tx.data() + weft::kVxlanEncapLen, dgram, len);
  uint8_t icmp[weft::kIcmpReplyMax];
  uint8_t* pkt = tx.data() + weft::kVxlanEncapLen;
  weft::EncapResult e = weft::Encap(format, pkt, len, Table(), cfg, icmp, sizeof(icmp));
  if (e.icmp_len > sizeof(icmp)) __builtin_trap();
  if (e.drop == weft::DropReason::kNone) {
    size_t head = weft::EncapHeadroom(format);
    if (e.payload_len > len + head) __builtin_trap();
    weft::IpInfo ip;
    if (weft::ParseIp(pkt, len, &ip) == weft::DropReason::kNone) weft::VxlanSourcePort(pkt, ip);
  }
  // The TUN read side with offloads on: the first 10 bytes as a virtio_net_hdr, the rest a
  // (possibly GSO) packet to split.
  if (len >= weft::kVnetHdrLen) {
    weft::VnetHdr vh = weft::LoadVnetHdr(dgram);
    static std::vector<uint8_t> segs(2048 * 128);
    uint16_t seg_len[128];
    std::vector<uint8_t> pkt_copy(dgram + weft::kVnetHdrLen, dgram + len);
    size_t n =
        weft::SplitTso(vh, pkt_copy.data(), pkt_copy.size(), segs.data(), 2048, 128, seg_len);
    for (size_t i = 0; i < n; i++) {
      if (seg_len[i] > 2048) __builtin_trap();
    }
  }
  return 0;
}
