// The packet engine's loop (engine.h states the contracts). One queue's thread, per wake-up:
//
//   TUN → network (TunToUdp)                        network → TUN (UdpToTun)
//   1. read() the TUN: [virtio_net_hdr][packet],     1. recvmmsg() up to 64 datagrams (UDP_GRO:
//      a TSO super-packet up to 64 KB                   trains of equal-size datagrams)
//   2. peer = LPM(inner dst) in the current table    2. peer = by outer source; decap, checks
//   3. split: headers per segment into an arena         (VNI, MAC, anti-spoofing)
//      slot, payload left in the read buffer         3. coalesce consecutive TCP (UDP with USO)
//      (SplitTsoHeaders); encap (VXLAN / flannel)       segments of a flow (Coalescer)
//   4. MergeRuns: runs to one peer → UDP GSO msgs    4. one writev() per coalesced group to the
//   5. sendmmsg() per source socket; EIO → GSO off      TUN, as a GSO packet with NEEDS_CSUM
//   repeat 1-5 until a read hits EAGAIN              repeat 1-4 until a short batch
//
// Then epoll_wait (or busy-poll a while after a light drain). Stop() writes every eventfd.
#include "engine.h"

#include <arpa/inet.h>
#include <net/if.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/sysinfo.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <iterator>
#include <memory>
#include <unordered_map>

#include "checksum.h"
#include "coalesce.h"
#include "ipip.h"
#include "page_buffer.h"
#include "steering.h"
#include "tap_tx.h"
#include "tun.h"
#include "udp_socket.h"
#include "vxlan.h"
#include "wg_engine.h"

namespace weft {

namespace {

// TX slot layout: [.. headroom ..][inner packet at kTxPkt]; the VXLAN header goes in the 22
// bytes before the inner packet.
constexpr size_t kTxPkt = 42;
// RX slot layout: datagram at 16, so a vnet header fits before the inner packet of either
// format (flannel-udp: at 6; VXLAN: inner at 38, vnet header at 28).
constexpr size_t kRxData = 16;
constexpr int kUdpSegment = 103;  // UDP_SEGMENT (linux/udp.h)
constexpr int kUdpGro = 104;      // UDP_GRO

void FillSockaddr(const PeerRecord& p, sockaddr_storage* ss, socklen_t* len) {
  std::memset(ss, 0, sizeof(sockaddr_in6));
  if (p.public_family == 4) {
    auto* a = reinterpret_cast<sockaddr_in*>(ss);
    a->sin_family = AF_INET;
    a->sin_port = htons(p.port);
    std::memcpy(&a->sin_addr, p.public_ip, 4);
    *len = sizeof(sockaddr_in);
  } else {
    auto* a = reinterpret_cast<sockaddr_in6*>(ss);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(p.port);
    std::memcpy(&a->sin6_addr, p.public_ip, 16);
    *len = sizeof(sockaddr_in6);
  }
}

}  // namespace

// One worker's loop state: every buffer it needs, allocated once when Run starts.
class Engine::Loop {
 public:
  Loop(Engine* e, Worker* w, Direction dir)
      : e_(e),
        w_(w),
        dir_(dir),
        slot_(dir == Direction::kRx ? 1 : 0),
        c_(w->counters[slot_]),
        co_buf_(kVnetHdrLen + Coalescer::kMaxLen),
        // WireGuard delivers only packets it opened: authenticated (no checksum summed again)
        co_(co_buf_.data(), e->cfg_.codec.tun_mtu, /*gather=*/true,
            ((e->offloads_enabled_ & kTunFUso4) != 0 ? Coalescer::kUdpV4 : 0) |
                ((e->offloads_enabled_ & kTunFUso6) != 0 ? Coalescer::kUdpV6 : 0),
            /*authenticated=*/e->wg_ != nullptr),
        gro_((e->offloads_enabled_ & kOffloadGro) != 0) {
    // A slot holds one MTU-sized packet and the headroom before it (rounded to a cache line).
    // WireGuard seals in place: the tag and up to 15 bytes of padding follow the packet.
    const size_t trailer = e->wg_ ? wg::kTagLen + wg::kPaddingMultiple : 0;
    slot_size_ = (kTxPkt + e->cfg_.codec.tun_mtu + trailer + 63) / 64 * 64;
    if (slot_size_ < 2048) slot_size_ = 2048;
    tx_.Allocate(static_cast<size_t>(kArenaSlots) * slot_size_);
    rd_.Allocate(static_cast<size_t>(kReadBufs) * kBufSize);
    tx_msgs_.resize(kArenaSlots);
    tx_iov_.resize(2 * kArenaSlots);  // a TSO segment takes two: [headers][payload in rd_]
    tx_addr_.resize(kArenaSlots);
    tx_fd_.resize(kArenaSlots);
    tx_bytes_.resize(kArenaSlots);
    tx_segs_.resize(kArenaSlots);
    tx_gso_.resize(kArenaSlots);
    max_datagram_ = e->cfg_.codec.tun_mtu + EncapHeadroom(e->cfg_.format) + trailer;
    if (e->wg_) wg_buf_.resize(kWgBufSize);
    cmsg_.resize(static_cast<size_t>(kArenaSlots) * kCmsgSpace);
    udp_gso_ = (e->offloads_enabled_ & kOffloadUdpGso) != 0;
    seg_len_.resize(kMaxSegs);
    if (dir != Direction::kTx) rx_.Allocate(kBatch * kBufSize);
    icmp_.resize(kVnetHdrLen + kIcmpReplyMax);
    // A TAP frame's headers, then the inner headers of a GSO packet or a whole plain packet.
    tap_buf_.resize(kTapVnetHdrLen + kTapTemplateMax + kTapInnerMax + e->cfg_.codec.tun_mtu);
    for (int i = 0; i < kBatch; i++) {
      rx_iov_[i].iov_base = &rx_[i * kBufSize + kRxData];
      rx_iov_[i].iov_len = kBufSize - kRxData;
    }
    sock_family_ = e->cfg_.bind_ip.find(':') == std::string::npos ? 4 : 6;
  }

  int Run() {
    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) return errno;
    struct epoll_event ev;
    int fds[4] = {w_->event_fd, w_->tun_fd, w_->udp_fd, w_->udp6_fd};
    if (dir_ == Direction::kTx) fds[2] = fds[3] = -1;
    if (dir_ == Direction::kRx) fds[1] = -1;
    for (int fd : fds) {
      if (fd < 0) continue;
      std::memset(&ev, 0, sizeof(ev));
      ev.events = EPOLLIN;
      ev.data.fd = fd;
      if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0) {
        int err = errno;
        close(ep);
        return err;
      }
    }
    int rc = 0;
    struct epoll_event events[4];
    const uint64_t spin_ns = static_cast<uint64_t>(e_->cfg_.busy_poll_us) * 1000;
    uint64_t spin_until = 0;  // while set, poll epoll without sleeping until this time
    // WireGuard's timers run on the loops' wake-ups: an idle loop wakes every tick.
    const int idle_ms = e_->wg_ ? static_cast<int>(WgEngine::kTickNs / 1000000) : -1;
    while (!e_->stop_.load(std::memory_order_acquire)) {
      int n = epoll_wait(ep, events, 4, spin_until != 0 ? 0 : idle_ms);
      if (e_->wg_ && n >= 0 && e_->wg_->TickDue(NowNs())) WgTick();
      // Key pairs gone: their keys go from this loop's contexts too (within a tick).
      if (e_->wg_ && e_->wg_->device().keypair_drops() != wg_drops_seen_) {
        WgLock();
        WgUnlock();
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        rc = errno;
        break;
      }
      if (n == 0) {
        if (spin_until != 0 && NowNs() >= spin_until) spin_until = 0;
        continue;
      }
      c_.Add(spin_until != 0 ? kBusyPolls : kWakeups, 1);
      check_cpu_ = spin_until == 0;
      // The eventfd is written only by Stop and never drained: every loop of the queue sees it
      // (draining it here could hide it from the queue's other thread).
      uint64_t moved0 = Moved();
      // Drain both directions until each returns a short batch (it hit EAGAIN).
      bool more = true;
      while (more && !e_->stop_.load(std::memory_order_relaxed)) {
        const PeerTable* table = e_->AcquireTable(&w_->seen[slot_]);
        int tun = 0;
        if (dir_ != Direction::kRx) {
          std::lock_guard<std::mutex> lock(w_->tun_read_mu);
          tun = TunToUdp(*table);
        }
        bool udp_full = false;
        if (dir_ != Direction::kTx) {
          uint64_t rx0 = c_.v[kRxPackets].load(std::memory_order_relaxed);
          udp_full = UdpToTun(*table, w_->udp_fd);
          if (w_->udp6_fd >= 0) udp_full = UdpToTun(*table, w_->udp6_fd) || udp_full;
          if (dir_ == Direction::kRx && c_.v[kRxPackets].load(std::memory_order_relaxed) != rx0 &&
              w_->tun_read_mu.try_lock()) {
            TunToUdp(*table);
            w_->tun_read_mu.unlock();
          }
        }
        more = tun == kBatch || udp_full;
      }
      w_->seen[slot_].store(0, std::memory_order_seq_cst);  // quiescent while asleep
      // A drain of a few packets is latency-bound traffic whose answer is on its way: poll for
      // it rather than pay a wake-up on each hop. Bulk traffic sleeps (it would only steal CPU
      // from the applications producing it).
      spin_until = spin_ns != 0 && Moved() - moved0 <= kBusyPollMaxPackets ? NowNs() + spin_ns : 0;
    }
    w_->seen[slot_].store(0, std::memory_order_seq_cst);
    close(ep);
    return rc;
  }

 private:
  // Bytes the framing writes before the inner packet (codec.h).
  size_t Headroom() const { return EncapHeadroom(e_->cfg_.format); }

  // Packets moved either way so far (this worker's own counters: relaxed reads are exact here).
  uint64_t Moved() const {
    return c_.v[kTxPackets].load(std::memory_order_relaxed) +
           c_.v[kRxPackets].load(std::memory_order_relaxed);
  }

  static uint64_t NowNs() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
  }

  void WriteIcmp(size_t len) {
    std::memset(icmp_.data(), 0, kVnetHdrLen);
    if (write(w_->tun_fd, icmp_.data(), kVnetHdrLen + len) < 0) {
      c_.Drop(DropReason::kTunWriteError);
    } else {
      c_.Add(kIcmpSent, 1);
    }
  }

  uint8_t* Slot(int i) { return &tx_[static_cast<size_t>(i) * slot_size_]; }

  // The socket an inner packet leaves by: for VXLAN one of the source-port sockets, by flow
  // hash (every segment of a flow leaves from the same port); else the bound one.
  // Dual-stack: towards a peer's IPv6 address, the IPv6 set of sockets.
  int SendFd(const uint8_t* pkt, const IpInfo& ip, uint8_t family) const {
    const bool v6 = family == 6 && sock_family_ != 6;
    const int n = v6 ? e_->src6_count_ : e_->src_count_;
    if (n == 0) return v6 ? w_->udp6_fd : w_->udp_fd;
    const int* fds = v6 ? e_->src6_fds_ : e_->src_fds_;
    return fds[VxlanSourcePort(pkt, ip) % static_cast<unsigned>(n)];
  }

  // Whether a socket of the underlay `family` is open (both, on a dual-stack underlay).
  bool Reaches(uint8_t family) const {
    return family == sock_family_ || (family == 6 && w_->udp6_fd >= 0);
  }

  // Encapsulates the packet at slot `slot` (kTxPkt in) and queues it as message `out_`.
  void EncapSlot(int slot, size_t len, const PeerTable& table) {
    uint8_t* pkt = Slot(slot) + kTxPkt;
    if (e_->wg_) {
      WgSealSlot(pkt, len, table);
      return;
    }
    EncapResult r = Encap(e_->cfg_.format, pkt, len, table, e_->cfg_.codec,
                          icmp_.data() + kVnetHdrLen, kIcmpReplyMax);
    if (r.drop != DropReason::kNone) {
      c_.Drop(r.drop);
      // Before the first peer table (an engine that just attached to a persistent TUN) a miss
      // says nothing about the route: drop it quietly, as the detached TUN did, rather than
      // tell the pod its network is unreachable.
      if (r.icmp_len > 0 && e_->gen_.load(std::memory_order_relaxed) > 1) WriteIcmp(r.icmp_len);
      return;
    }
    if (!Reaches(r.peer->public_family)) {
      c_.Drop(DropReason::kNoRoute);
      return;
    }
    int o = out_++;
    int v = niov_++;
    tx_iov_[v].iov_base = pkt - Headroom();
    tx_iov_[v].iov_len = r.payload_len;
    socklen_t alen;
    FillSockaddr(*r.peer, &tx_addr_[o], &alen);
    SetMessage(o, &tx_addr_[o], alen, &tx_iov_[v], 1, 1, 0, r.payload_len - Headroom(),
               SendFd(pkt, r.ip, r.peer->public_family));
  }

  // Fills queued message `m`: `iovlen` iovecs to `name`, leaving by socket `fd`, carrying `segs`
  // datagrams and `bytes` inner bytes. With segs > 1 it is a UDP GSO message of `seg_size`-byte
  // datagrams (a UDP_SEGMENT cmsg; the kernel cuts it).
  void SetMessage(int m, void* name, socklen_t namelen, iovec* iov, size_t iovlen, int segs,
                  size_t seg_size, uint64_t bytes, int fd) {
    msghdr& h = tx_msgs_[m].msg_hdr;
    std::memset(&tx_msgs_[m], 0, sizeof(tx_msgs_[m]));
    h.msg_name = name;
    h.msg_namelen = namelen;
    h.msg_iov = iov;
    h.msg_iovlen = iovlen;
    if (segs > 1) {
      char* cbuf = &cmsg_[static_cast<size_t>(m) * kCmsgSpace];
      std::memset(cbuf, 0, kCmsgSpace);
      h.msg_control = cbuf;
      h.msg_controllen = CMSG_SPACE(sizeof(uint16_t));
      cmsghdr* cm = CMSG_FIRSTHDR(&h);
      cm->cmsg_level = IPPROTO_UDP;
      cm->cmsg_type = kUdpSegment;
      cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
      uint16_t size = static_cast<uint16_t>(seg_size);
      std::memcpy(CMSG_DATA(cm), &size, sizeof(size));
    }
    size_t size = seg_size;
    if (segs == 1) {
      size = 0;
      for (size_t k = 0; k < iovlen; k++) size += iov[k].iov_len;
    }
    tx_bytes_[m] = bytes;
    tx_segs_[m] = static_cast<uint16_t>(segs);
    tx_gso_[m] = static_cast<uint16_t>(size);
    tx_fd_[m] = fd;
  }

  // Merges runs of adjacent one-datagram messages into UDP GSO messages: the same destination by
  // the same socket, iovecs that follow one another, as many iovecs each (1: a packet sent whole;
  // 2: a TSO segment's [headers][payload in the read buffer]), every datagram the run's size but
  // a shorter last, ≤ kGsoMaxSegs datagrams and ≤ kMaxUdpPayload bytes. The kernel cuts them
  // back into the same datagrams (UDP_SEGMENT); on the way, each message takes the stack one
  // trip instead of one per datagram. That joins the segments of TSO packets (those of a flow's
  // consecutive packets too: a 46-segment packet does not leave as 44 + 2) and bursts of small
  // packets (a UDP flood, a train of ACKs). Other messages keep their place and order. Until
  // it runs, every queued message is one datagram without a cmsg.
  void MergeRuns() {
    if (!udp_gso_) return;
    int m = 0;
    for (int i = 0; i < out_;) {
      int j = i + 1;
      const msghdr& h = tx_msgs_[i].msg_hdr;
      size_t seg = tx_gso_[i];
      if (seg <= max_datagram_ && (pauses_ == 0 || !GsoPaused(h.msg_name, h.msg_namelen))) {
        size_t per = kMaxUdpPayload / seg;
        if (per > static_cast<size_t>(kGsoMaxSegs)) per = kGsoMaxSegs;
        while (j < out_ && static_cast<size_t>(j - i) < per && Joins(i, j, seg)) {
          if (tx_gso_[j++] < seg) break;  // a shorter datagram ends the run
        }
      }
      if (j - i > 1) {
        uint64_t bytes = 0;
        for (int k = i; k < j; k++) bytes += tx_bytes_[k];
        SetMessage(m, h.msg_name, h.msg_namelen, h.msg_iov, (j - i) * h.msg_iovlen, j - i, seg,
                   bytes, tx_fd_[i]);
      } else if (m != i) {
        MoveMessage(i, m);
      }
      m++;
      i = j;
    }
    out_ = m;
  }

  // Whether queued message `j` can join the run of one-datagram messages that message `i`
  // starts (datagrams of `seg` bytes).
  bool Joins(int i, int j, size_t seg) const {
    const msghdr& a = tx_msgs_[i].msg_hdr;
    const msghdr& b = tx_msgs_[j].msg_hdr;
    return tx_gso_[j] <= seg && b.msg_iovlen == a.msg_iovlen &&
           b.msg_iov == a.msg_iov + (j - i) * a.msg_iovlen && tx_fd_[j] == tx_fd_[i] &&
           b.msg_namelen == a.msg_namelen &&
           std::memcmp(b.msg_name, a.msg_name, a.msg_namelen) == 0;
  }

  // Moves queued one-datagram message `from` to the earlier index `to`.
  void MoveMessage(int from, int to) {
    tx_msgs_[to] = tx_msgs_[from];
    tx_bytes_[to] = tx_bytes_[from];
    tx_segs_[to] = tx_segs_[from];
    tx_gso_[to] = tx_gso_[from];
    tx_fd_[to] = tx_fd_[from];
  }

  void Flush() {
    WgUnlock();  // sealed: the datagrams go without the WireGuard lock
    MergeRuns();
    Send(out_);
    out_ = 0;
    niov_ = 0;
    used_ = 0;
    rd_used_ = 0;
    tcp_queued_ = false;
  }

  // Sends a TSO super-packet without copying its payload: each segment is [encapsulation and
  // headers in an arena slot][payload where the TUN read put it], gathered by iovec pairs into
  // UDP GSO messages. The read buffer then stays in use until the flush. Returns false (nothing
  // queued, nothing changed) when the packet needs the copying path: no route (which answers
  // with ICMP), TTL expiry, another family, or a packet SplitTsoHeaders refuses.
  bool SendTsoInPlace(const VnetHdr& h, const uint8_t* pkt, size_t len, const PeerTable& table) {
    IpInfo ip;
    if (ParseIp(pkt, len, &ip) != DropReason::kNone) return false;
    const PeerRecord* peer = table.Lookup(ip.addr_len, ip.dst);
    if (peer == nullptr || !Reaches(peer->public_family)) return false;
    switch (e_->cfg_.format) {
      case Format::kWireguard:
        return false;  // each segment is sealed on its own (EncapSlot)
      case Format::kVxlan:
        if (!peer->has_vtep_mac()) return false;
        break;
      case Format::kIpip:
        if (ip.version != 4) return false;
        break;
      case Format::kUdp:
        if ((ip.version == 4 ? pkt[8] : pkt[7]) <= 1) return false;
        break;
    }
    size_t hdrs = 0;
    size_t segs = SplitTsoHeaders(h, pkt, len, Slot(used_) + kTxPkt, slot_size_, kMaxSegs,
                                  seg_len_.data(), &hdrs);
    if (segs == 0 || hdrs + kTxPkt > slot_size_) return false;
    c_.Add(kTsoSegments, segs);
    size_t pre = Headroom();
    int v0 = niov_;
    size_t off = hdrs;
    for (size_t i = 0; i < segs; i++) {
      uint8_t* s = Slot(used_ + static_cast<int>(i)) + kTxPkt;
      switch (e_->cfg_.format) {
        case Format::kVxlan:
          WriteVxlanEncap(s - pre, *peer, e_->cfg_.codec, ip.version);
          break;
        case Format::kIpip:
          WriteIpipHeader(s - pre, s, *peer, e_->cfg_.codec);  // s: this segment's headers
          break;
        case Format::kUdp:
          DecrementTtl(s, ip);  // flannel-udp forwards: one hop, as FlannelUdpEncap does
          break;
        case Format::kWireguard:
          break;
      }
      tx_iov_[niov_].iov_base = s - pre;
      tx_iov_[niov_++].iov_len = pre + hdrs;
      tx_iov_[niov_].iov_base = const_cast<uint8_t*>(pkt + off);
      tx_iov_[niov_++].iov_len = seg_len_[i];
      off += seg_len_[i];
    }
    used_ += static_cast<int>(segs);
    int first = out_;
    int fd = SendFd(pkt, ip, peer->public_family);
    socklen_t alen;
    FillSockaddr(*peer, &tx_addr_[first], &alen);
    // One message per segment: MergeRuns joins them (and the next TSO packet's) into UDP GSO
    // messages at the flush.
    for (size_t i = 0; i < segs; i++) {
      SetMessage(out_++, &tx_addr_[first], alen, &tx_iov_[static_cast<size_t>(v0) + 2 * i], 2, 1, 0,
                 hdrs + seg_len_[i], fd);
    }
    rd_used_++;
    return true;
  }

  // Sends a TCP packet through the egress TAP (tap_tx.h): a TSO super-packet as one frame, its
  // inner headers copied after the outer ones and its payload read in place. All of a flow's TCP
  // packets go this way, so none overtakes another by the sockets; packets that cannot (no
  // frame for the peer, TTL, an outer length overflow) go by the sockets after what is queued
  // there is sent first. Returns false (nothing sent; `h` may have lost NEEDS_CSUM, the checksum
  // being complete) for the socket path. The TAP refusing a frame with EINVAL turns it off for
  // the engine for good (counted once), and that packet goes by the sockets.
  bool TapSend(VnetHdr* h, uint8_t* pkt, size_t len, const PeerTable& table) {
    IpInfo ip;
    if (ParseIp(pkt, len, &ip) != DropReason::kNone || ip.proto != kProtoTcp) return false;
    // From here on a packet not sent by the TAP is queued for the sockets: later ones of its
    // flow may not overtake it by the TAP.
    const bool queued = tcp_queued_;
    tcp_queued_ = true;
    const PeerRecord* peer = table.Lookup(ip.addr_len, ip.dst);
    const uint8_t* aux = peer != nullptr ? table.Aux(peer) : nullptr;
    if (aux == nullptr) return false;
    const TapTemplate& t = *reinterpret_cast<const TapTemplate*>(aux);
    if (t.len == 0) return false;
    const bool gso = h->gso_type != kVnetGsoNone;
    size_t inner_hdrs = 0;
    size_t segs = 1;
    if (gso) {
      if (h->gso_type != (ip.version == 4 ? kVnetGsoTcpV4 : kVnetGsoTcpV6) || h->gso_size == 0)
        return false;
      size_t l4 = h->csum_start;
      if (l4 < ip.l4_off || l4 + 20 > ip.len || h->csum_offset != 16) return false;
      inner_hdrs = l4 + (pkt[l4 + 12] >> 4) * 4u;
      if (inner_hdrs > ip.len || inner_hdrs > kTapInnerMax) return false;
      size_t payload = ip.len - inner_hdrs;
      segs = payload == 0 ? 1 : (payload + h->gso_size - 1) / h->gso_size;
    } else {
      if (ip.len > e_->cfg_.codec.tun_mtu) return false;
      if ((h->flags & kVnetFlagNeedsCsum) != 0) {
        size_t start = h->csum_start;
        if (start + h->csum_offset + 2u > ip.len) return false;
        StoreBe16(pkt + start + h->csum_offset, Checksum(pkt + start, ip.len - start));
        h->flags = 0;
      }
    }
    uint8_t* b = tap_buf_.data();
    uint16_t sport =
        e_->src_count_ == 0
            ? e_->cfg_.port
            : e_->src_ports_[VxlanSourcePort(pkt, ip) % static_cast<unsigned>(e_->src_count_)];
    size_t n = WriteTapHeaders(t, *h, ip.len, inner_hdrs, ip.version, sport, tap_ip_id_, b);
    if (n == 0) return false;
    size_t copy = gso ? inner_hdrs : ip.len;
    std::memcpy(b + n, pkt, copy);
    // flannel-udp forwards: one hop (one it would expire goes by the sockets, which drop it)
    if (e_->cfg_.format == Format::kUdp && !DecrementTtl(b + n, ip)) return false;
    if (queued) Flush();
    tcp_queued_ = false;
    if (e_->cfg_.tap_fail_at != 0 && ++tap_frames_ == e_->cfg_.tap_fail_at) {
      // test knob: both tunnel families and outer_th_offset 0, which the kernel refuses
      b[1] |= kVnetGsoUdpTunnelV4 | kVnetGsoUdpTunnelV6;
      b[20] = b[21] = 0;
    }
    iovec iov[2] = {{b, n + copy}, {pkt + copy, ip.len - copy}};
    if (writev(e_->tap_fd_, iov, gso ? 2 : 1) < 0) {
      if (errno != EINVAL) {
        c_.Drop(DropReason::kSendError);
        return true;
      }
      tcp_queued_ = true;
      if (e_->tap_on_.exchange(false)) c_.Add(kTapDisabled, 1);
      return false;
    }
    tap_ip_id_++;
    c_.Add(kTapWrites, 1);
    if (gso) c_.Add(kTsoSegments, segs);
    c_.Add(kTxPackets, segs);
    c_.Add(kTxBytes, ip.len);
    return true;
  }

  // Reads up to kBatch packets from the TUN (each may be a TSO super-packet, split here into
  // segments), encapsulates them into arena slots and sends them with sendmmsg, flushing when
  // the arena runs low. Returns how many reads returned a packet.
  int TunToUdp(const PeerTable& table) {
    int reads = 0;
    while (reads < kBatch) {
      if (kArenaSlots - used_ < kMaxSegs || rd_used_ == kReadBufs) Flush();
      uint8_t* rd = &rd_[static_cast<size_t>(rd_used_) * kBufSize];
      ssize_t n = read(w_->tun_fd, rd, kBufSize);
      if (n < 0) {
        if (errno == EINTR) continue;
        break;  // EAGAIN (or an error: the next epoll round tells)
      }
      reads++;
      c_.Add(kTunReads, 1);
      if (static_cast<size_t>(n) < kVnetHdrLen) {
        c_.Drop(DropReason::kTruncated);
        continue;
      }
      uint8_t* pkt = rd + kVnetHdrLen;
      size_t len = static_cast<size_t>(n) - kVnetHdrLen;
      VnetHdr h = LoadVnetHdr(rd);
      if (e_->tap_on_.load(std::memory_order_relaxed) && TapSend(&h, pkt, len, table)) continue;
      if (h.gso_type != kVnetGsoNone) {
        if (SendTsoInPlace(h, pkt, len, table)) continue;
        size_t segs =
            SplitTso(h, pkt, len, Slot(used_) + kTxPkt, slot_size_, kMaxSegs, seg_len_.data());
        if (segs == 0) {
          c_.Drop(DropReason::kMalformed);
          continue;
        }
        c_.Add(kTsoSegments, segs);
        int first = used_;
        used_ += static_cast<int>(segs);
        for (size_t i = 0; i < segs; i++)
          EncapSlot(first + static_cast<int>(i), seg_len_[i], table);
        continue;
      }
      if ((h.flags & kVnetFlagNeedsCsum) != 0) {
        size_t start = h.csum_start;
        if (start + h.csum_offset + 2u > len) {
          c_.Drop(DropReason::kMalformed);
          continue;
        }
        StoreBe16(pkt + start + h.csum_offset, Checksum(pkt + start, len - start));
      }
      if (len + kTxPkt > slot_size_) {
        c_.Drop(DropReason::kOversized);
        continue;
      }
      std::memcpy(Slot(used_) + kTxPkt, pkt, len);
      EncapSlot(used_++, len, table);
    }
    Flush();
    return reads;
  }

  // Sends the queued messages: one sendmmsg per run of messages leaving by the same socket.
  void Send(int count) {
    for (int start = 0; start < count;) {
      int end = start + 1;
      while (end < count && tx_fd_[end] == tx_fd_[start]) end++;
      SendRun(tx_fd_[start], start, end);
      start = end;
    }
  }

  // One sendmmsg of msgs[0..count), retried on EINTR and, once per `waited`, after waiting up
  // to 10 ms for room (EAGAIN, ENOBUFS). Returns how many went (> 0), or -errno for msgs[0].
  static int SendBatch(int fd, mmsghdr* msgs, int count, bool* waited) {
    for (;;) {
      int n = sendmmsg(fd, msgs, count, 0);
      if (n > 0) return n;
      int err = n < 0 ? errno : EAGAIN;
      if (err == EINTR) continue;
      if ((err == EAGAIN || err == ENOBUFS) && !*waited) {
        struct pollfd p = {fd, POLLOUT, 0};
        poll(&p, 1, 10);
        *waited = true;
        continue;
      }
      return -err;
    }
  }

  void SendRun(int fd, int done, int count) {
    bool waited = false;
    while (done < count) {
      int n = SendBatch(fd, &tx_msgs_[done], count - done, &waited);
      if (n > 0) {
        c_.Add(kSendBatches, 1);
        for (int i = done; i < done + n; i++) {
          c_.Add(kTxBytes, tx_bytes_[i]);
          c_.Add(kTxPackets, tx_segs_[i]);
          if (tx_segs_[i] > 1) c_.Add(kGsoSends, 1);
        }
        done += n;
        continue;
      }
      // EMSGSIZE on a GSO message: the path MTU (a route's, or the device's) is below its
      // segment size. Send its datagrams one by one (the kernel fragments them, DF being clear)
      // and stop joining datagrams to that destination for a while.
      if (n == -EMSGSIZE && tx_segs_[done] > 1) {
        SendDatagrams(fd, done);
        done++;
        continue;
      }
      // The first message is refused: skip it. EIO on a GSO message means the device cannot
      // checksum for UDP GSO: switch GSO off for this worker for good.
      if (n == -EIO && tx_segs_[done] > 1 && udp_gso_) {
        udp_gso_ = false;
        c_.Add(kGsoDisabled, 1);
      }
      for (int j = 0; j < tx_segs_[done]; j++) c_.Drop(DropReason::kSendError);
      done++;
    }
  }

  // Sends GSO message `m`'s datagrams as separate messages (same destination, its iovecs in
  // equal shares, no UDP_SEGMENT), counting them as the GSO message would have been, and pauses
  // GSO towards that destination for kGsoPauseNs (PauseGso).
  void SendDatagrams(int fd, int m) {
    const msghdr& h = tx_msgs_[m].msg_hdr;
    const int segs = tx_segs_[m];
    const size_t per = h.msg_iovlen / static_cast<size_t>(segs);
    for (int k = 0; k < segs; k++) {
      std::memset(&fb_msgs_[k], 0, sizeof(fb_msgs_[k]));
      fb_msgs_[k].msg_hdr.msg_name = h.msg_name;
      fb_msgs_[k].msg_hdr.msg_namelen = h.msg_namelen;
      fb_msgs_[k].msg_hdr.msg_iov = h.msg_iov + static_cast<size_t>(k) * per;
      fb_msgs_[k].msg_hdr.msg_iovlen = per;
    }
    c_.Add(kGsoFallbacks, 1);
    PauseGso(h.msg_name, h.msg_namelen);
    int done = 0;
    int failed = 0;
    bool waited = false;
    while (done < segs) {
      int n = SendBatch(fd, &fb_msgs_[done], segs - done, &waited);
      if (n > 0) {
        done += n;
        continue;
      }
      c_.Drop(DropReason::kSendError);  // this datagram; the next ones may still go
      failed++;
      done++;
    }
    const int sent = segs - failed;
    c_.Add(kSendBatches, 1);
    c_.Add(kTxPackets, static_cast<uint64_t>(sent));
    c_.Add(kTxBytes, tx_bytes_[m] * static_cast<uint64_t>(sent) / static_cast<uint64_t>(segs));
  }

  // Stops MergeRuns joining datagrams to `name` until kGsoPauseNs from now (then GSO is tried
  // again: a path MTU that grew back is used without a restart). A full table drops the oldest.
  void PauseGso(const void* name, socklen_t len) {
    const uint64_t until = NowNs() + kGsoPauseNs;
    int slot = 0;
    for (int i = 0; i < kGsoPauseSlots; i++) {
      if (pause_[i].until == 0 ||
          (pause_[i].len == len && std::memcmp(&pause_[i].addr, name, len) == 0)) {
        slot = i;
        break;
      }
      if (pause_[i].until < pause_[slot].until) slot = i;
    }
    std::memcpy(&pause_[slot].addr, name, len);
    pause_[slot].len = len;
    pause_[slot].until = until;
    pauses_ = 0;
    for (const GsoPause& p : pause_) pauses_ += p.until != 0 ? 1 : 0;
  }

  // Whether GSO towards `name` is paused (an expired pause is forgotten here).
  bool GsoPaused(const void* name, socklen_t len) {
    for (GsoPause& p : pause_) {
      if (p.until == 0 || p.len != len || std::memcmp(&p.addr, name, len) != 0) continue;
      if (NowNs() < p.until) return true;
      p.until = 0;
      pauses_--;
      return false;
    }
    return false;
  }

  // Receives up to kBatch datagrams (with UDP_GRO: trains of equal-size datagrams, one per
  // buffer) with one recvmmsg, decapsulates them and writes them to the TUN, coalescing TCP
  // (and UDP where the TUN took USO).
  // Returns whether the batch was full (more may be waiting).
  bool UdpToTun(const PeerTable& table, int fd) {
    for (int i = 0; i < kBatch; i++) {
      std::memset(&rx_msgs_[i], 0, sizeof(rx_msgs_[i]));
      rx_msgs_[i].msg_hdr.msg_name = &rx_addr_[i];
      rx_msgs_[i].msg_hdr.msg_namelen = sizeof(rx_addr_[i]);
      rx_msgs_[i].msg_hdr.msg_iov = &rx_iov_[i];
      rx_msgs_[i].msg_hdr.msg_iovlen = 1;
      rx_msgs_[i].msg_hdr.msg_control = &rx_cmsg_[static_cast<size_t>(i) * kRxCmsgSpace];
      rx_msgs_[i].msg_hdr.msg_controllen = kRxCmsgSpace;
    }
    int batch = rx_batch_;
    int n = recvmmsg(fd, rx_msgs_, batch, MSG_DONTWAIT, nullptr);
    if (n <= 0) return false;
    if (check_cpu_) {
      // The first datagrams after a wake-up: did the kernel take them in on another CPU (one
      // more cross-CPU hop on their way)?
      check_cpu_ = false;
      int cpu = -1;
      socklen_t cl = sizeof(cpu);
      if (getsockopt(fd, SOL_SOCKET, SO_INCOMING_CPU, &cpu, &cl) == 0 && cpu >= 0 &&
          cpu != sched_getcpu()) {
        c_.Add(kRemoteWakeups, 1);
      }
    }
    bool big = false;
    c_.Add(kRecvBatches, 1);
    for (int i = 0; i < n; i++) {
      uint8_t* data = &rx_[i * kBufSize + kRxData];
      size_t len = rx_msgs_[i].msg_len;
      big = big || len > kBigDatagram;
      if ((rx_msgs_[i].msg_hdr.msg_flags & MSG_TRUNC) != 0) {
        c_.Drop(DropReason::kOversized);
        continue;
      }
      size_t seg = len;
      for (cmsghdr* cm = CMSG_FIRSTHDR(&rx_msgs_[i].msg_hdr); cm != nullptr;
           cm = CMSG_NXTHDR(&rx_msgs_[i].msg_hdr, cm)) {
        if (cm->cmsg_level == IPPROTO_UDP && cm->cmsg_type == kUdpGro) {
          int size;
          std::memcpy(&size, CMSG_DATA(cm), sizeof(size));
          if (size > 0 && static_cast<size_t>(size) < len) seg = static_cast<size_t>(size);
        }
      }
      if (seg < len) c_.Add(kGroTrains, 1);
      const uint8_t* src;
      size_t src_len;
      if (rx_addr_[i].ss_family == AF_INET) {
        src = reinterpret_cast<const uint8_t*>(
            &reinterpret_cast<const sockaddr_in*>(&rx_addr_[i])->sin_addr);
        src_len = 4;
      } else {
        src = reinterpret_cast<const uint8_t*>(
            &reinterpret_cast<const sockaddr_in6*>(&rx_addr_[i])->sin6_addr);
        src_len = 16;
      }
      // Datagram k of a train starts where k-1 ended: its vnet header space (before the inner
      // packet) overlaps bytes of datagram k-1, which are consumed (copied or written) by then.
      // An empty datagram (len 0) is delivered once too, so the decap counts its drop.
      // WireGuard binds cookies to the source address and its port: those bytes, once a message
      // (the port sits at the same offset in sockaddr_in and sockaddr_in6).
      static_assert(offsetof(sockaddr_in, sin_port) == offsetof(sockaddr_in6, sin6_port));
      uint8_t wg_src[18];
      if (e_->wg_) {
        std::memcpy(wg_src, src, src_len);
        std::memcpy(
            wg_src + src_len,
            reinterpret_cast<const uint8_t*>(&rx_addr_[i]) + offsetof(sockaddr_in, sin_port), 2);
      }
      size_t off = 0;
      do {
        size_t dlen = len - off < seg ? len - off : seg;
        if (e_->wg_) {
          WgDeliver(data + off, dlen, wg_src, src_len + 2, rx_addr_[i], fd, table);
        } else {
          Deliver(data + off, dlen, src_len, src, table);
        }
        off += seg;
      } while (off < len);
    }
    FlushGro();
    WgUnlock();
    // GRO trains fill up to 64 KB per buffer: while they arrive, a few per recvmmsg keep them
    // in cache until they are checksummed, coalesced and written; small datagrams come 64 at a
    // time.
    rx_batch_ = big ? kGroBatch : kBatch;
    return n == batch;
  }

  void Deliver(uint8_t* dgram, size_t len, size_t src_len, const uint8_t* src,
               const PeerTable& table) {
    DecapResult r = Decap(e_->cfg_.format, dgram, len, src_len, src, table, e_->cfg_.codec);
    if (r.drop != DropReason::kNone) {
      c_.Drop(r.drop);
      return;
    }
    DeliverInner(dgram + r.inner_off, r.inner_len, r.ip);
  }

  // Writes a decapsulated inner packet (kVnetHdrLen writable bytes before it) to the TUN, or
  // adds it to the coalesced group.
  void DeliverInner(uint8_t* inner, size_t inner_len, const IpInfo& ip) {
    if (gro_) {
      if (co_.Add(inner, ip) || (FlushGro(), co_.Add(inner, ip))) {
        c_.Add(kRxPackets, 1);
        c_.Add(kRxBytes, inner_len);
        return;
      }
    }
    FlushGro();
    VnetHdr h;
    PrepareTunWrite(inner, ip, e_->cfg_.codec.tun_mtu, &h);
    StoreVnetHdr(inner - kVnetHdrLen, h);
    if (write(w_->tun_fd, inner - kVnetHdrLen, kVnetHdrLen + inner_len) < 0) {
      c_.Drop(DropReason::kTunWriteError);
      return;
    }
    c_.Add(kRxPackets, 1);
    c_.Add(kRxBytes, inner_len);
  }

  // Writes the pending coalesced group (if any) to the TUN.
  // The group's later payloads are read in place from rx_ (gathering coalescer): this runs
  // before those buffers are received into again or written over by a vnet header.
  void FlushGro() {
    WgUnlock();  // the TUN write goes without the WireGuard lock
    int n = co_.FinishIov(gro_iov_);
    if (n == 0) return;
    if (n > 1 || gro_iov_[0].iov_len > kVnetHdrLen + e_->cfg_.codec.tun_mtu) c_.Add(kGroWrites, 1);
    if (writev(w_->tun_fd, gro_iov_, n) < 0) c_.Drop(DropReason::kTunWriteError);
  }

  // --- WireGuard (format kWireguard; wg_engine.h). Everything below runs with the lock held
  // (WgLock) but the sealing and opening of transport messages: those run on this loop's own
  // contexts (WgKey) with the lock released, so that the loops of a node (its TX and RX,
  // every queue's) seal and open in parallel and never wait for another's batch.

  void WgLock() {
    if (wg_lock_.owns_lock()) return;
    wg_lock_ = std::unique_lock<std::mutex>(e_->wg_->mu());
    WgForgetKeys();
  }

  // With the lock: this loop's context keyed with a key pair's key (a ticket's serial and key),
  // made on first use; null if OpenSSL refused.
  wg::AeadKey* WgKey(bool seal, uint64_t serial, const uint8_t* key) {
    auto& m = seal ? wg_sealers_ : wg_openers_;
    auto it = m.find(serial);
    if (it != m.end()) return it->second.get();
    auto k = std::make_unique<wg::AeadKey>();
    if (!k->Init(key, seal)) return nullptr;
    return m.emplace(serial, std::move(k)).first->second.get();
  }

  // With the lock: when the device dropped key pairs since the last look, the contexts keyed
  // with theirs go (freed: OpenSSL cleanses the keys), as the device zeroes its own copies.
  void WgForgetKeys() {
    const wg::Device& dev = e_->wg_->device();
    const uint64_t drops = dev.keypair_drops();
    if (drops == wg_drops_seen_) return;
    wg_drops_seen_ = drops;
    for (auto* m : {&wg_sealers_, &wg_openers_}) {
      for (auto it = m->begin(); it != m->end();) {
        it = dev.KeypairLive(it->first) ? std::next(it) : m->erase(it);
      }
    }
  }
  void WgUnlock() {
    if (wg_lock_.owns_lock()) wg_lock_.unlock();
  }

  // The socket towards an endpoint of `family` (the listen port's: peers see our port).
  int WgFd(uint8_t family) const {
    return family == 6 && sock_family_ != 6 ? w_->udp6_fd : w_->udp_fd;
  }

  // One datagram now (handshake messages, keepalives, staged packets: the rare path).
  bool WgSendTo(int fd, const sockaddr_storage& to, socklen_t to_len, const uint8_t* d, size_t n) {
    if (fd < 0) return false;
    for (;;) {
      if (sendto(fd, d, n, 0, reinterpret_cast<const sockaddr*>(&to), to_len) >= 0) return true;
      if (errno != EINTR) {
        c_.Drop(DropReason::kSendError);
        return false;
      }
    }
  }

  void WgInitiate(WgEngine::PeerState* ps) {
    size_t n = e_->wg_->device().CreateInitiation(ps->peer, wg_buf_.data());
    if (n == 0) return;  // within REKEY_TIMEOUT of the last: the timers retry
    if (WgSendTo(WgFd(ps->cfg.family), ps->addr, ps->addr_len, wg_buf_.data(), n)) {
      c_.Add(kWgHandshakesSent, 1);
      ps->tx_bytes += n;
    }
  }

  // Seals and sends the packets `ps` kept while it had no session, once it has one.
  void WgFlushStaged(WgEngine::PeerState* ps) {
    wg::Device& dev = e_->wg_->device();
    while (!ps->staged.empty() && ps->peer->current() != nullptr) {
      const std::vector<uint8_t>& p = ps->staged.front();
      size_t n = 0;
      wg::TransportStatus st = dev.Send(ps->peer, p.data(), p.size(), wg_buf_.data(),
                                        wg_buf_.size(), &n, e_->cfg_.codec.tun_mtu);
      if (st == wg::TransportStatus::kExpired) break;
      if (st == wg::TransportStatus::kOk &&
          WgSendTo(WgFd(ps->cfg.family), ps->addr, ps->addr_len, wg_buf_.data(), n)) {
        c_.Add(kTxPackets, 1);
        c_.Add(kTxBytes, p.size());
        ps->tx_bytes += n;
      }
      ps->staged.pop_front();
    }
  }

  // The timers of every peer (one loop of the engine at a time, once per WgEngine::kTickNs).
  void WgTick() {
    WgLock();
    e_->wg_->TickLoad(NowNs());
    wg::Device& dev = e_->wg_->device();
    for (const auto& ps : e_->wg_->peers()) {
      uint32_t due = dev.Tick(ps->peer);
      if ((due & wg::PeerTimers::kSendInitiation) != 0) WgInitiate(ps.get());
      if ((due & wg::PeerTimers::kSendKeepalive) != 0) {
        size_t n = 0;
        if (dev.Send(ps->peer, nullptr, 0, wg_buf_.data(), wg_buf_.size(), &n) ==
                wg::TransportStatus::kOk &&
            WgSendTo(WgFd(ps->cfg.family), ps->addr, ps->addr_len, wg_buf_.data(), n)) {
          c_.Add(kWgKeepalives, 1);
          ps->tx_bytes += n;
        }
      }
      if ((due & (wg::PeerTimers::kZeroKeys | wg::PeerTimers::kGaveUp)) != 0 &&
          ps->peer->current() == nullptr) {
        ps->staged.clear();  // no session came: what waited for one goes (wireguard-go too)
      }
      WgFlushStaged(ps.get());
    }
    WgUnlock();
  }

  // TX: seals the inner packet at `pkt` (len bytes; the transport header goes in the 16 bytes
  // before it, the padding and tag after) for the peer that holds its destination, and queues
  // the datagram. No session yet: the packet waits (bounded) and a handshake starts.
  void WgSealSlot(uint8_t* pkt, size_t len, const PeerTable& table) {
    IpInfo ip;
    DropReason d = ParseIp(pkt, len, &ip);
    if (d != DropReason::kNone) {
      c_.Drop(d);
      return;
    }
    const PeerRecord* rec = table.Lookup(ip.addr_len, ip.dst);
    if (rec == nullptr) {
      c_.Drop(DropReason::kNoRoute);
      size_t n = e_->gen_.load(std::memory_order_relaxed) > 1
                     ? BuildNetUnreachable(pkt, ip, icmp_.data() + kVnetHdrLen, kIcmpReplyMax)
                     : 0;
      if (n > 0) WriteIcmp(n);
      return;
    }
    WgLock();
    WgEngine::PeerState* ps = e_->wg_->ByAddress(rec->public_family, rec->public_ip);
    if (ps == nullptr) {
      c_.Drop(DropReason::kWgNoPeer);
      return;
    }
    if (!Reaches(ps->cfg.family)) {
      c_.Drop(DropReason::kNoRoute);
      return;
    }
    const size_t inner = ip.len;
    uint8_t* out = pkt - wg::kTransportHeaderSize;
    wg::SealTicket t;
    wg::TransportStatus st = e_->wg_->device().ReserveSend(
        ps->peer, inner, slot_size_ - (kTxPkt - wg::kTransportHeaderSize), e_->cfg_.codec.tun_mtu,
        &t);
    if (st == wg::TransportStatus::kExpired) {
      if (ps->staged.size() >= WgEngine::kStagedMax) {
        c_.Drop(DropReason::kWgQueueFull);
      } else {
        ps->staged.emplace_back(pkt, pkt + inner);
        c_.Add(kWgStaged, 1);
      }
      WgInitiate(ps);
      return;
    }
    if (st != wg::TransportStatus::kOk) {
      c_.Drop(DropReason::kOversized);
      return;
    }
    wg::AeadKey* key = WgKey(true, t.serial, t.key);
    ps->tx_bytes += t.total;  // sealed for it (a failed sendmmsg counts as send_error, not here)
    const int o = out_;
    std::memcpy(&tx_addr_[o], &ps->addr, ps->addr_len);  // where it roamed: read under the lock
    const socklen_t alen = ps->addr_len;
    const int fd = WgFd(ps->cfg.family);
    WgUnlock();
    if (key == nullptr || !wg::WriteTransport(*key, t, pkt, out)) {
      c_.Drop(DropReason::kOversized);  // OpenSSL refused: as Device::Send's kForged
      return;
    }
    out_++;
    int v = niov_++;
    tx_iov_[v].iov_base = out;
    tx_iov_[v].iov_len = t.total;
    SetMessage(o, &tx_addr_[o], alen, &tx_iov_[v], 1, 1, 0, inner, fd);
  }

  // RX: one WireGuard datagram from `from` (received on `fd`; `src`: its address and port
  // bytes). Handshake messages go to the Device (answers back to where they came from); a
  // transport message is opened in place (the inner packet lands 16 bytes into the datagram),
  // checked against the sending peer's AllowedIPs (cryptokey routing: the longest-prefix peer of
  // the inner source must be the peer whose key opened it) and delivered.
  void WgDeliver(uint8_t* dgram, size_t len, const uint8_t* src, size_t src_len,
                 const sockaddr_storage& from, int fd, const PeerTable& table) {
    const bool transport = len > wg::kTransportHeaderSize && dgram[0] == wg::kMessageTransport;
    uint8_t* out = transport ? dgram + wg::kTransportHeaderSize : wg_buf_.data();
    size_t cap = transport ? len - wg::kTransportHeaderSize : wg_buf_.size();
    wg::Device& dev = e_->wg_->device();
    WgLock();
    wg::Received r;
    if (!transport) {
      e_->wg_->CountHandshake(NowNs());
      r = dev.Receive(dgram, len, src, src_len, out, cap);
    } else {
      // A transport message: its key pair under the lock, the opening on this loop's context
      // without it, then the replay window and the rest under it again.
      wg::OpenTicket t;
      if (dev.BeginOpen(dgram, len, &t, &r)) {
        wg::AeadKey* key = WgKey(false, t.serial, t.key);
        WgUnlock();
        const bool opened = key != nullptr && key->OpenCounter(out, t.counter, out, cap);
        WgLock();
        r = dev.FinishOpen(t, opened, out, cap - wg::kTagLen, src, src_len);
      }
    }
    WgEngine::PeerState* ps = r.peer != nullptr ? e_->wg_->ByPeer(r.peer) : nullptr;
    // An authenticated message from the peer (a handshake message it took, or a transport
    // message that opened): its bytes, as wireguard-go counts rx_bytes.
    if (ps != nullptr &&
        (r.verdict == wg::Verdict::kResponse || r.verdict == wg::Verdict::kHandshakeDone ||
         r.verdict == wg::Verdict::kKeepalive || r.verdict == wg::Verdict::kData)) {
      ps->rx_bytes += len;
      e_->wg_->Roam(ps, from);
    }
    switch (r.verdict) {
      case wg::Verdict::kResponse:
      case wg::Verdict::kHandshakeDone:
      case wg::Verdict::kCookieReply:
        if (WgSendTo(fd, from,
                     from.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6), out,
                     r.len)) {
          c_.Add(r.verdict == wg::Verdict::kCookieReply ? kWgCookieReplies : kWgHandshakesSent, 1);
          if (ps != nullptr && r.verdict != wg::Verdict::kCookieReply) ps->tx_bytes += r.len;
        }
        if (ps != nullptr) WgFlushStaged(ps);
        return;
      case wg::Verdict::kCookieTaken:
        return;
      case wg::Verdict::kKeepalive:
        c_.Add(kWgKeepalives, 1);
        if (ps != nullptr) WgFlushStaged(ps);  // a responder's session is confirmed
        return;
      case wg::Verdict::kData:
        break;
      default:
        c_.Drop(DropReason::kWgRejected);
        return;
    }
    if (ps != nullptr && !ps->staged.empty()) WgFlushStaged(ps);
    IpInfo ip;
    DropReason d = ParseIp(out, r.len, &ip);
    if (d != DropReason::kNone) {
      c_.Drop(d);
      return;
    }
    const PeerRecord* rec = table.Lookup(ip.addr_len, ip.src);
    if (ps == nullptr || rec == nullptr || !ps->At(rec->public_family, rec->public_ip)) {
      c_.Drop(DropReason::kWgAllowedIps);
      return;
    }
    DeliverInner(out, r.len, ip);
  }

  Engine* e_;
  Worker* w_;
  Direction dir_;
  int slot_;  // this thread's index into the worker's running/seen/counters
  WorkerCounters& c_;
  uint8_t sock_family_ = 4;
  // TX: TUN reads land in rd_; packets (or TSO segments) are copied into arena slots, each
  // [headroom: VXLAN header][packet], and go out in one sendmmsg per flush.
  static constexpr int kArenaSlots = 512;
  static constexpr int kMaxSegs = 128;  // per super-packet (64 KB / a 512-byte MSS)
  size_t slot_size_ = 2048;
  int used_ = 0;  // arena slots filled since the last flush
  // TUN reads land in one of kReadBufs buffers; a TSO packet sent in place keeps its buffer
  // until the flush.
  static constexpr int kReadBufs = 8;
  int rd_used_ = 0;
  int out_ = 0;   // messages queued since the last flush
  int niov_ = 0;  // iovecs used since the last flush (one per segment)
  static constexpr int kGsoMaxSegs = 64;
  static constexpr size_t kCmsgSpace = CMSG_SPACE(sizeof(uint16_t));
  bool udp_gso_ = false;
  // Egress TAP: one frame's headers (and a plain packet) are built here; the outer IPv4 id of
  // the next frame; whether a TCP packet waits in the socket queue (a TAP frame of its flow
  // must not overtake it: flush first).
  static constexpr size_t kTapInnerMax = 256;  // inner IP + TCP headers of a GSO packet
  std::vector<uint8_t> tap_buf_;
  uint16_t tap_ip_id_ = 0;
  uint64_t tap_frames_ = 0;  // frames tried (for the tap_fail_at test knob)
  bool tcp_queued_ = false;
  // Destinations whose path MTU refused a GSO message (EMSGSIZE): sent datagram by datagram
  // until `until` (CLOCK_MONOTONIC ns; 0 = a free slot).
  struct GsoPause {
    sockaddr_storage addr;
    socklen_t len = 0;
    uint64_t until = 0;
  };
  static constexpr int kGsoPauseSlots = 8;
  static constexpr uint64_t kGsoPauseNs = 1000000000;  // 1 s
  GsoPause pause_[kGsoPauseSlots];
  int pauses_ = 0;  // slots in use
  struct mmsghdr fb_msgs_[kGsoMaxSegs];
  std::vector<uint16_t> tx_segs_;  // segments per queued message
  std::vector<uint16_t> tx_gso_;   // its datagram size (of each but a shorter last)
  // The largest datagram a GSO message may be cut into: the kernel refuses a GSO size it would
  // have to fragment.
  size_t max_datagram_ = 0;
  std::vector<char> cmsg_;
  PageBuffer tx_;  // the large buffers are touched only as traffic uses them (page_buffer.h)
  PageBuffer rd_;
  PageBuffer rx_;
  std::vector<uint8_t> icmp_;
  std::vector<struct mmsghdr> tx_msgs_;
  std::vector<struct iovec> tx_iov_;
  std::vector<sockaddr_storage> tx_addr_;
  std::vector<int> tx_fd_;  // the socket each queued message leaves by
  std::vector<uint64_t> tx_bytes_;
  std::vector<uint16_t> seg_len_;
  // RX: consecutive TCP segments (or UDP datagrams, with USO) of one flow merged into one GSO
  // write.
  PageBuffer co_buf_;
  Coalescer co_;
  iovec gro_iov_[Coalescer::kMaxSegs];
  bool gro_;
  static constexpr size_t kRxCmsgSpace = CMSG_SPACE(sizeof(int));
  std::vector<char> rx_cmsg_ = std::vector<char>(kBatch * kRxCmsgSpace);
  static constexpr int kGroBatch = 8;
  static constexpr uint64_t kBusyPollMaxPackets = 8;
  static constexpr size_t kBigDatagram = 16384;
  int rx_batch_ = kBatch;   // datagrams (or GRO trains) per recvmmsg
  bool check_cpu_ = false;  // a wake-up happened: compare the next datagrams' CPU with ours
  struct mmsghdr rx_msgs_[kBatch];
  struct iovec rx_iov_[kBatch];
  sockaddr_storage rx_addr_[kBatch];
  // WireGuard: the Device's lock while this loop holds it (WgLock), and a buffer for handshake
  // messages, keepalives and staged packets.
  static constexpr size_t kWgBufSize = 65536;
  std::unique_lock<std::mutex> wg_lock_;
  std::vector<uint8_t> wg_buf_;
  // This loop's contexts keyed with key pairs' keys, by key pair serial (WgKey, WgForgetKeys),
  // and the device's count of dropped key pairs when it last looked.
  std::unordered_map<uint64_t, std::unique_ptr<wg::AeadKey>> wg_sealers_;
  std::unordered_map<uint64_t, std::unique_ptr<wg::AeadKey>> wg_openers_;
  uint64_t wg_drops_seen_ = 0;
};

std::unique_ptr<Engine> Engine::Create(const EngineConfig& cfg, std::string* error) {
  if (cfg.workers < 1 || cfg.workers > 64) {
    *error = "workers must be 1..64";
    return nullptr;
  }
  sockaddr_storage addr;
  socklen_t alen;
  if (!MakeSockaddr(cfg.bind_ip, cfg.port, &addr, &alen)) {
    *error = "bad bind address " + cfg.bind_ip;
    return nullptr;
  }
  const bool ipip = cfg.format == Format::kIpip;
  if (ipip && addr.ss_family != AF_INET) {
    *error = "ipip needs an IPv4 bind address, not " + cfg.bind_ip;
    return nullptr;
  }
  std::unique_ptr<Engine> e(new Engine());
  e->cfg_ = cfg;
  if (cfg.format == Format::kWireguard) {
    e->wg_ = WgEngine::Create(cfg.wg_private_key, cfg.wg_has_psk ? cfg.wg_psk : nullptr, error);
    if (!e->wg_) return nullptr;
    e->wg_->set_greet_first_peers(cfg.wg_greet);
    // The keys live in the WgEngine (zeroed with its Device); not in the config copy.
    wg::Wipe(e->cfg_.wg_private_key, sizeof(e->cfg_.wg_private_key));
    wg::Wipe(e->cfg_.wg_psk, sizeof(e->cfg_.wg_psk));
  }
  if (ipip) {
    // The outer source of every IPIP packet (the raw sockets send IP_HDRINCL).
    std::memcpy(e->cfg_.codec.local_ip, &reinterpret_cast<const sockaddr_in*>(&addr)->sin_addr, 4);
  }
  // Dual-stack underlay: the IPv6 address beside the IPv4 one.
  sockaddr_storage addr6;
  socklen_t alen6 = 0;
  if (!cfg.bind_ip6.empty()) {
    if (ipip || addr.ss_family != AF_INET ||
        !MakeSockaddr(cfg.bind_ip6, cfg.port, &addr6, &alen6) || addr6.ss_family != AF_INET6) {
      *error = "a dual-stack underlay needs udp or vxlan, an IPv4 bindIp and an IPv6 bindIp6 (" +
               cfg.bind_ip + ", " + cfg.bind_ip6 + ")";
      return nullptr;
    }
  }
  if (cfg.format == Format::kVxlan) {
    // Bound to the same address, port 0: the kernel gives each an ephemeral port. Nothing is
    // sent to them, so a minimal receive buffer.
    auto open_sources = [&](sockaddr_storage src, socklen_t len, const std::string& ip, int* fds,
                            int* count) {
      if (src.ss_family == AF_INET) {
        reinterpret_cast<sockaddr_in*>(&src)->sin_port = 0;
      } else {
        reinterpret_cast<sockaddr_in6*>(&src)->sin6_port = 0;
      }
      for (int k = 0; k < kSourcePorts; k++) {
        fds[k] = OpenUdpSocket(src, len, cfg.sock_buf_bytes, error, 0);
        if (fds[k] < 0) {
          *error = "udp " + ip + ":0 (vxlan source port): " + *error;
          return false;
        }
        *count = k + 1;
      }
      return true;
    };
    if (!open_sources(addr, alen, cfg.bind_ip, e->src_fds_, &e->src_count_)) {
      return nullptr;  // ~Engine closes what is open
    }
    for (int k = 0; k < e->src_count_; k++) {  // what TAP frames of the flow carry (SendFd's)
      sockaddr_storage got;
      socklen_t glen = sizeof(got);
      if (getsockname(e->src_fds_[k], reinterpret_cast<sockaddr*>(&got), &glen) == 0) {
        e->src_ports_[k] =
            ntohs(got.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&got)->sin_port
                                           : reinterpret_cast<sockaddr_in6*>(&got)->sin6_port);
      }
    }
    if (alen6 != 0 && !open_sources(addr6, alen6, cfg.bind_ip6, e->src6_fds_, &e->src6_count_)) {
      return nullptr;
    }
  }
  bool udp_gro = (cfg.offloads & kOffloadUdpGro) != 0;
  std::string empty_error;
  e->table_.store(PeerTable::Build(nullptr, 0, &empty_error).release());
  for (int i = 0; i < cfg.workers; i++) {
    auto w = std::make_unique<Worker>();
    std::string name;
    w->tun_fd = OpenTunQueue(i == 0 ? cfg.tun_name : e->tun_name_, &name, error);
    if (w->tun_fd < 0) return nullptr;  // ~Engine closes what is open
    if (i == 0) {
      e->tun_name_ = name;
      if (SetTunPersist(w->tun_fd, cfg.persist, error) != 0) {
        *error = name + ": " + *error;
        close(w->tun_fd);
        return nullptr;
      }
      // The loop splits TCP (TSO) and UDP (USO) super-packets and finishes partial checksums.
      unsigned want = cfg.offloads & kTunFAll;
      if ((want & kTunFCsum) == 0) want = 0;  // the kernel needs CSUM for TSO
      e->offloads_accepted_ = ProbeTunOffloads(w->tun_fd, want);
      e->offloads_enabled_ = want & e->offloads_accepted_;
    }
    e->workers_.push_back(std::move(w));
    Worker* wp = e->workers_.back().get();
    if (ipip) {
      // IPIP: a raw IPPROTO_IPIP socket takes udp_fd's place (sends and receives).
      wp->udp_fd = OpenRawIpipSocket(addr, alen, cfg.sock_buf_bytes, error);
      if (wp->udp_fd < 0) {
        *error = "raw ipip socket on " + cfg.bind_ip + ": " + *error;
        return nullptr;
      }
    } else {
      wp->udp_fd = OpenUdpSocket(addr, alen, cfg.sock_buf_bytes, error);
      if (wp->udp_fd < 0) {
        *error = "udp " + cfg.bind_ip + ":" + std::to_string(cfg.port) + ": " + *error;
        return nullptr;
      }
      if (alen6 != 0) {
        wp->udp6_fd = OpenUdpSocket(addr6, alen6, cfg.sock_buf_bytes, error);
        if (wp->udp6_fd < 0) {
          *error = "udp [" + cfg.bind_ip6 + "]:" + std::to_string(cfg.port) + ": " + *error;
          return nullptr;
        }
      }
    }
    for (int fd : {wp->udp_fd, wp->udp6_fd}) {
      if (ipip || fd < 0 || (cfg.offloads & kOffloadUdpGro) == 0) continue;
      int one = 1;
      if (setsockopt(fd, IPPROTO_UDP, kUdpGro, &one, sizeof(one)) < 0) {
        udp_gro = false;  // an old kernel: receive datagram by datagram
      }
    }
    wp->event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wp->event_fd < 0) {
      *error = std::string("eventfd: ") + std::strerror(errno);
      return nullptr;
    }
  }
  e->SetUpSteering();
  if (ipip && cfg.workers > 1) {
    // Raw sockets have no SO_REUSEPORT: each would get a copy of every packet. A filter on
    // each hands a packet to exactly one queue (by CPU when the queues are pinned, else by
    // the inner addresses, so a flow keeps its queue).
    for (int k = 0; k < cfg.workers; k++) {
      if (!AttachRawSpread(e->workers_[k]->udp_fd, k, cfg.workers, !e->cpus_.empty(), error)) {
        *error = "raw ipip socket filter: " + *error;
        return nullptr;
      }
    }
  }
  if (cfg.fifo_priority > 0) e->CheckFifo();
  // TSO super-packets go whole through the TAP (UDP framings) only if the TUN hands them over.
  // (Not WireGuard: each segment is sealed on its own.)
  if (!ipip && !e->wg_ && (cfg.offloads & kOffloadTapGso) != 0 &&
      (e->offloads_enabled_ & kTunFTso4) != 0) {
    e->SetUpTap(addr);
  }
  // The engine's own offloads, reported beside the TUN bits (offloads.h). UDP GSO/GRO need a
  // UDP socket: not for IPIP.
  e->offloads_enabled_ |= cfg.offloads & (kOffloadGro | (ipip ? 0 : kOffloadUdpGso));
  if (udp_gro && !ipip) e->offloads_enabled_ |= kOffloadUdpGro;
  if (e->tap_on_.load()) e->offloads_enabled_ |= kOffloadTapGso;
  return e;
}

Engine::~Engine() {
  for (auto& w : workers_) {
    if (w->tun_fd >= 0) close(w->tun_fd);
    if (w->udp_fd >= 0) close(w->udp_fd);
    if (w->udp6_fd >= 0) close(w->udp6_fd);
    if (w->event_fd >= 0) close(w->event_fd);
  }
  for (int k = 0; k < src_count_; k++) close(src_fds_[k]);
  for (int k = 0; k < src6_count_; k++) close(src6_fds_[k]);
  if (tap_fd_ >= 0) close(tap_fd_);
  delete table_.load();
  for (const Retired& r : retired_) delete r.table;
  delete spare_.table;
}

const PeerTable* Engine::AcquireTable(std::atomic<uint64_t>* seen) {
  // Publish the generation we are about to read under, then confirm it did not move: a
  // SetPeers that retires a table after this point sees `seen` and keeps the table alive.
  for (;;) {
    uint64_t g = gen_.load(std::memory_order_seq_cst);
    seen->store(g, std::memory_order_seq_cst);
    if (gen_.load(std::memory_order_seq_cst) == g) break;
  }
  return table_.load(std::memory_order_seq_cst);
}

bool Engine::SetPeers(const uint8_t* buf, size_t len, std::string* error) {
  std::unique_ptr<PeerTable> t = PeerTable::Build(buf, len, error);
  if (!t) return false;
  AttachTapTemplates(t.get());
  std::lock_guard<std::mutex> lock(control_mu_);
  // A whole new table: the spare cannot be brought up to it by deltas.
  if (spare_.table != nullptr) retired_.push_back(spare_);
  spare_ = {nullptr, 0};
  spare_behind_.clear();
  PublishLocked(t.release(), {});
  ReclaimLocked();
  return true;
}

bool Engine::UpdatePeers(const PeerDelta& d, std::string* error) {
  std::lock_guard<std::mutex> lock(control_mu_);
  const PeerTable* cur = table_.load(std::memory_order_seq_cst);
  if (!cur->Check(d, error)) return false;
  PeerTable* next;
  if (spare_.table != nullptr && !InUseLocked(spare_.gen)) {
    next = const_cast<PeerTable*>(spare_.table);
    for (const PeerDelta& behind : spare_behind_) ApplyDelta(next, behind);
  } else {
    if (spare_.table != nullptr) retired_.push_back(spare_);
    next = new PeerTable(*cur);
  }
  spare_ = {nullptr, 0};
  spare_behind_.clear();
  ApplyDelta(next, d);
  PublishLocked(next, {d});
  ReclaimLocked();
  return true;
}

void Engine::ApplyDelta(PeerTable* t, const PeerDelta& d) const {
  if (tap_fd_ >= 0 && t->aux_stride() == 0) AttachTapTemplates(t);
  t->Apply(d, [this](const PeerRecord& r, uint8_t* aux) {
    TapTemplate tpl;
    BuildTapTemplate(r, tap_cfg_, &tpl);
    std::memcpy(aux, &tpl, sizeof(tpl));
  });
}

void Engine::PublishLocked(PeerTable* t, std::vector<PeerDelta> behind) {
  const PeerTable* old = table_.exchange(t, std::memory_order_seq_cst);
  uint64_t g = gen_.fetch_add(1, std::memory_order_seq_cst) + 1;
  if (behind.empty()) {
    retired_.push_back({old, g});
  } else {
    spare_ = {old, g};
    spare_behind_ = std::move(behind);
  }
}

bool Engine::InUseLocked(uint64_t gen) const {
  for (auto& w : workers_) {
    for (const auto& seen : w->seen) {
      uint64_t s = seen.load(std::memory_order_seq_cst);
      if (s != 0 && s < gen) return true;
    }
  }
  return false;
}

void Engine::ReclaimLocked() {
  size_t keep = 0;
  for (const Retired& r : retired_) {
    if (InUseLocked(r.gen)) {
      retired_[keep++] = r;
    } else {
      delete r.table;
    }
  }
  retired_.resize(keep);
}

void Engine::AttachTapTemplates(PeerTable* t) const {
  if (tap_fd_ < 0) return;
  std::vector<uint8_t> aux(t->size() * sizeof(TapTemplate));
  for (size_t i = 0; i < t->size(); i++) {
    TapTemplate tpl;
    BuildTapTemplate(t->records()[i], tap_cfg_, &tpl);
    std::memcpy(&aux[i * sizeof(TapTemplate)], &tpl, sizeof(tpl));
  }
  t->SetAux(std::move(aux), sizeof(TapTemplate));
}

namespace {

// Writes `value` to /proc/sys/<path>; false with `error` naming it.
bool WriteSysctl(const std::string& path, const char* value, std::string* error) {
  std::string file = "/proc/sys/" + path;
  FILE* f = std::fopen(file.c_str(), "w");
  bool ok = f != nullptr && std::fputs(value, f) >= 0;
  if (f != nullptr && std::fclose(f) != 0) ok = false;
  if (!ok) *error = file + ": " + std::strerror(errno);
  return ok;
}

// The first character of /proc/sys/<path>, or 0.
char ReadSysctl(const std::string& path) {
  std::string file = "/proc/sys/" + path;
  FILE* f = std::fopen(file.c_str(), "r");
  if (f == nullptr) return 0;
  int c = std::fgetc(f);
  std::fclose(f);
  return c == EOF ? 0 : static_cast<char>(c);
}

bool LinkUp(const std::string& name, std::string* error) {
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) {
    *error = std::string("socket: ") + std::strerror(errno);
    return false;
  }
  struct ifreq ifr;
  std::memset(&ifr, 0, sizeof(ifr));
  std::memcpy(ifr.ifr_name, name.data(), name.size());
  bool ok = ioctl(s, SIOCGIFFLAGS, &ifr) == 0;
  if (ok) {
    ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP);
    ok = ioctl(s, SIOCSIFFLAGS, &ifr) == 0;
  }
  if (!ok) *error = "set " + name + " up: " + std::strerror(errno);
  close(s);
  return ok;
}

}  // namespace

// The TAP's frames arrive as its ingress with our own address as their source and leave
// forwarded: accept_local, no strict reverse-path check (loose where the host's all/rp_filter
// is strict: the effective value is the larger), forwarding. IPv6 underlay: forwarding (and
// force_forwarding, kernel >= 6.17, where the host's all/forwarding is off), no addresses of its
// own. These are the TAP's own settings: they go with it when the engine closes.
void Engine::SetUpTap(const sockaddr_storage& bind) {
  uint8_t mac[6];
  std::string error;
  int fd = OpenEgressTap(cfg_.tap_name, &tap_name_, mac, &error);
  if (fd < 0) {
    tap_note_ = error;
    tap_name_.clear();
    return;
  }
  tap_fd_ = fd;
  tap_cfg_.vxlan = cfg_.format == Format::kVxlan;
  tap_cfg_.codec = cfg_.codec;
  std::memcpy(tap_cfg_.tap_mac, mac, 6);
  std::memcpy(tap_cfg_.src_mac, mac, 6);
  tap_cfg_.src_mac[5] ^= 1;  // any other unicast address
  if (bind.ss_family == AF_INET) {
    tap_cfg_.family = 4;
    std::memcpy(tap_cfg_.src_ip, &reinterpret_cast<const sockaddr_in*>(&bind)->sin_addr, 4);
  } else {
    tap_cfg_.family = 6;
    std::memcpy(tap_cfg_.src_ip, &reinterpret_cast<const sockaddr_in6*>(&bind)->sin6_addr, 16);
  }
  const std::string v4 = "net/ipv4/conf/" + tap_name_ + "/";
  const std::string v6 = "net/ipv6/conf/" + tap_name_ + "/";
  std::string ignored;
  bool ok;
  if (tap_cfg_.family == 4) {
    WriteSysctl(v6 + "disable_ipv6", "1", &ignored);  // no router solicitations into the TAP
    ok = WriteSysctl(v4 + "accept_local", "1", &error) &&
         WriteSysctl(v4 + "rp_filter", ReadSysctl("net/ipv4/conf/all/rp_filter") == '1' ? "2" : "0",
                     &error) &&
         WriteSysctl(v4 + "forwarding", "1", &error);
  } else {
    WriteSysctl(v6 + "addr_gen_mode", "1", &ignored);
    ok = WriteSysctl(v6 + "forwarding", "1", &error);
    if (ok && ReadSysctl("net/ipv6/conf/all/forwarding") != '1') {
      ok = WriteSysctl(v6 + "force_forwarding", "1", &error);
    }
  }
  ok = ok && LinkUp(tap_name_, &error) && ProbeTap(&error);
  if (!ok) {
    tap_note_ = error;
    close(tap_fd_);
    tap_fd_ = -1;
    tap_name_.clear();
    return;
  }
  tap_on_.store(true);
}

// Whether this process may run threads SCHED_FIFO at cfg_.fifo_priority (tried on the calling
// thread, then undone); if not, the loops run with the normal policy and fifo_note_ says why.
void Engine::CheckFifo() {
  int policy = SCHED_OTHER;
  sched_param before = {};
  int err = pthread_getschedparam(pthread_self(), &policy, &before);
  if (err == 0) {
    sched_param sp = {};
    sp.sched_priority = cfg_.fifo_priority;
    err = pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp);
    if (err == 0) pthread_setschedparam(pthread_self(), policy, &before);
  }
  if (err != 0) {
    fifo_note_ =
        std::string("SCHED_FIFO ") + std::to_string(cfg_.fifo_priority) + ": " + std::strerror(err);
    cfg_.fifo_priority = 0;
  }
}

// One 2-segment TCP frame towards the loopback address (a martian destination on the TAP: the
// kernel parses the tunnel header, then drops the frame). EINVAL: this kernel cannot take it.
bool Engine::ProbeTap(std::string* error) {
  PeerRecord p;
  p.public_family = tap_cfg_.family;
  p.flags = kPeerFlagVtepMac;
  p.port = 9;
  if (tap_cfg_.family == 4) {
    p.public_ip[0] = 127;
    p.public_ip[3] = 1;
  } else {
    p.public_ip[15] = 1;
  }
  TapTemplate t;
  BuildTapTemplate(p, tap_cfg_, &t);
  constexpr size_t kMss = 64;
  uint8_t inner[20 + 20 + 2 * kMss] = {};
  inner[0] = 0x45;
  StoreBe16(inner + 2, sizeof(inner));
  inner[8] = 64;
  inner[9] = kProtoTcp;
  inner[12] = 10;
  inner[15] = 1;
  inner[16] = 10;
  inner[19] = 2;
  StoreBe16(inner + 10, Checksum(inner, 20));
  inner[20 + 12] = 5 << 4;
  inner[20 + 13] = 0x10;  // ACK
  StoreBe16(inner + 20 + 16,
            PseudoHeaderSum(4, inner + 12, inner + 16, kProtoTcp, sizeof(inner) - 20));
  VnetHdr h;
  h.flags = kVnetFlagNeedsCsum;
  h.gso_type = kVnetGsoTcpV4;
  h.gso_size = kMss;
  h.csum_start = 20;
  h.csum_offset = 16;
  uint8_t frame[kTapVnetHdrLen + kTapTemplateMax + sizeof(inner)];
  size_t n = WriteTapHeaders(t, h, sizeof(inner), 40, 4, 9, 0, frame);
  if (cfg_.tap_probe_fail) frame[20] = frame[21] = 0;  // outer_th_offset 0: refused
  std::memcpy(frame + n, inner, sizeof(inner));
  if (write(tap_fd_, frame, n + sizeof(inner)) < 0) {
    *error = std::string("probe (a tunnel GSO frame): ") + std::strerror(errno);
    return false;
  }
  return true;
}

size_t Engine::peer_count() const { return table_.load()->size(); }

// Pins queue k to CPU k when asked and possible, then attaches the TUN steering program that
// matches (by CPU when pinned, else by flow). Failures leave the engine working, with a note.
void Engine::SetUpSteering() {
  const int n = workers();
  if (cfg_.cpu_affine) {
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    int online = get_nprocs();
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) {
      affinity_note_ = std::string("sched_getaffinity: ") + std::strerror(errno);
    } else if (online != n) {
      affinity_note_ = std::to_string(n) + " queue(s) for " + std::to_string(online) +
                       " online CPUs (CPU-affine queues need one queue per CPU)";
    } else if (!cfg_.steering) {
      affinity_note_ = "TUN steering is off";
    } else {
      for (int k = 0; k < n && affinity_note_.empty(); k++) {
        if (!CPU_ISSET(k, &allowed)) {
          affinity_note_ = "CPU " + std::to_string(k) + " is not in the allowed CPU set";
        }
      }
    }
    for (int k = 0; k < n && affinity_note_.empty(); k++) {
      // Datagrams the kernel takes in on CPU k go to queue k's socket (reuseport group).
      for (int fd : {workers_[k]->udp_fd, workers_[k]->udp6_fd}) {
        if (fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_INCOMING_CPU, &k, sizeof(k)) != 0) {
          affinity_note_ = std::string("SO_INCOMING_CPU: ") + std::strerror(errno);
        }
      }
    }
    std::string error;
    if (affinity_note_.empty() &&
        AttachSteering(workers_[0]->tun_fd, Steering::kCpu, cfg_.steering_gap_ns, &error) == 0) {
      for (int k = 0; k < n; k++) cpus_.push_back(k);
      steering_ = "cpu";
      return;
    }
    if (affinity_note_.empty()) affinity_note_ = error;
    for (int k = 0; k < n; k++) {  // unpinned queues: no CPU preference
      int none = -1;
      setsockopt(workers_[k]->udp_fd, SOL_SOCKET, SO_INCOMING_CPU, &none, sizeof(none));
      if (workers_[k]->udp6_fd >= 0) {
        setsockopt(workers_[k]->udp6_fd, SOL_SOCKET, SO_INCOMING_CPU, &none, sizeof(none));
      }
    }
  }
  if (!cfg_.steering) {
    // A device adopted from an earlier engine may still carry its program: back to the TUN's own
    // flow table, as asked.
    DetachSteering(workers_[0]->tun_fd);
    return;
  }
  std::string error;
  if (AttachSteering(workers_[0]->tun_fd, Steering::kFlowHash, 0, &error) == 0) {
    steering_ = "flow";
  } else {
    affinity_note_ += (affinity_note_.empty() ? "" : "; ") + error;
  }
}

int Engine::Run(int w, Direction dir) {
  if (w < 0 || w >= workers()) return EINVAL;
  if (dir != Direction::kBoth && dir != Direction::kTx && dir != Direction::kRx) return EINVAL;
  Worker* wp = workers_[w].get();
  // kBoth claims both direction slots, so it never runs beside a kTx or kRx loop.
  int first = dir == Direction::kRx ? 1 : 0;
  int last = dir == Direction::kTx ? 0 : 1;
  for (int i = first; i <= last; i++) {
    bool expected = false;
    if (!wp->running[i].compare_exchange_strong(expected, true)) {
      for (int j = first; j < i; j++) wp->running[j].store(false);
      return EBUSY;
    }
  }
  if (!cpus_.empty()) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpus_[w], &set);
    pthread_setaffinity_np(pthread_self(), sizeof(set), &set);  // allowed: checked at Create
  }
  // The loop thread alone runs SCHED_FIFO (permitted: checked at Create); the pool thread goes
  // back to its own policy after.
  int policy = SCHED_OTHER;
  sched_param before = {};
  const bool fifo =
      cfg_.fifo_priority > 0 && pthread_getschedparam(pthread_self(), &policy, &before) == 0;
  if (fifo) {
    sched_param sp = {};
    sp.sched_priority = cfg_.fifo_priority;
    pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp);
  }
  int rc;
  {
    std::unique_ptr<Loop> loop(new Loop(this, wp, dir));
    rc = loop->Run();
  }
  if (fifo) pthread_setschedparam(pthread_self(), policy, &before);
  for (int i = first; i <= last; i++) wp->running[i].store(false);
  return rc;
}

void Engine::Stop() {
  stop_.store(true, std::memory_order_release);
  for (auto& w : workers_) {
    uint64_t one = 1;
    ssize_t r = write(w->event_fd, &one, sizeof(one));
    (void)r;
  }
}

bool Engine::SetWgPeers(const uint8_t* buf, size_t len, std::string* error) {
  if (!wg_) {
    *error = "wireguard peers for an engine of another format";
    return false;
  }
  std::vector<WgPeerConfig> peers;
  if (!ParseWgPeers(buf, len, &peers, error)) return false;
  wg_->SetPeers(peers);
  return true;
}

bool Engine::WgState(WgDeviceState* out) {
  if (!wg_) return false;
  std::memcpy(out->public_key, wg_->public_key(), wg::kKeyLen);
  out->listen_port = cfg_.port;
  wg_->Snapshot(&out->peers);
  out->allowed_ips.assign(out->peers.size(), {});
  // AllowedIPs: the table's subnets whose public address is the peer's lease address (the
  // table as it is now; control_mu_ keeps it from being reclaimed while it is read).
  std::map<std::array<uint8_t, 17>, size_t> by_lease;
  for (size_t i = 0; i < out->peers.size(); i++) {
    std::array<uint8_t, 17> k{};
    k[0] = out->peers[i].lease_family;
    std::memcpy(k.data() + 1, out->peers[i].lease_addr, k[0] == 4 ? 4 : 16);
    by_lease[k] = i;
  }
  std::lock_guard<std::mutex> lock(control_mu_);
  const PeerTable* t = table_.load(std::memory_order_seq_cst);
  for (size_t r = 0; r < t->size(); r++) {
    const PeerRecord& rec = t->records()[r];
    std::array<uint8_t, 17> k{};
    k[0] = rec.public_family;
    std::memcpy(k.data() + 1, rec.public_ip, rec.public_len());
    auto it = by_lease.find(k);
    if (it == by_lease.end()) continue;
    WgAllowedIp a;
    a.family = rec.family;
    a.prefix = rec.prefix;
    std::memcpy(a.addr, rec.subnet, 16);
    out->allowed_ips[it->second].push_back(a);
  }
  return true;
}

void Engine::ReadCounters(int w, uint64_t* out) const {
  const Worker& wk = *workers_[w];
  for (uint32_t i = 0; i < kCounterCount; i++) {
    out[i] = wk.counters[0].v[i].load(std::memory_order_relaxed) +
             wk.counters[1].v[i].load(std::memory_order_relaxed);
  }
}

}  // namespace weft
