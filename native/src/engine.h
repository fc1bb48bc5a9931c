// The packet engine: per worker one TUN queue, one UDP socket and one eventfd, looped by
// Run(worker) on a thread that stays in C++ until Stop(). Batch contract: a worker reads up to
// kBatch TUN packets (each up to 64 KB behind its virtio_net_hdr, so TSO super-packets fit once
// offloads are on) and sends them with one sendmmsg (a TSO packet's payload is not copied: each
// segment goes out as [headers in an arena slot][payload in the read buffer]; runs of equal-size
// datagrams to one peer go as one UDP GSO message); it receives up to
// kBatch datagrams (64 KB buffers: a same-host kernel vxlan sender delivers unsegmented ~64 KB
// datagrams; only 8 at a time while UDP GRO trains arrive, so they stay in cache) with one
// recvmmsg and writes each to the TUN (coalesced TCP, and UDP where the TUN takes USO, goes out
// by one writev that reads the later payloads in place); it drains both until EAGAIN before
// sleeping in epoll.
// Buffers belong to the worker for the whole run; nothing is allocated in the loop.
//
// Control (any thread): SetPeers swaps the whole peer table (readers never lock; old tables are
// freed once every worker has passed a quiescent point), ReadCounters reads relaxed atomics,
// Stop wakes every worker through its eventfd. The destructor closes every fd; call it only
// after every Run has returned (the addon holds engines by shared_ptr for that).
#ifndef WEFT_NATIVE_ENGINE_H_
#define WEFT_NATIVE_ENGINE_H_

#include <sys/socket.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "codec.h"
#include "counters.gen.h"
#include "packet.h"
#include "peer_table.h"
#include "tap_tx.h"
#include "wg_engine.h"

namespace weft {

// What one thread of a queue moves: both directions, or one. Two threads per queue (kTx and kRx)
// let one CPU send a flow's data while another takes its ACKs.
enum class Direction : uint8_t { kBoth = 0, kTx = 1, kRx = 2 };

struct EngineConfig {
  Format format = Format::kUdp;
  std::string tun_name;
  int workers = 1;
  std::string bind_ip;
  // Dual-stack underlay (flannel's flannel.<VNI> + flannel-v6.<VNI>): an IPv6 address to bind as
  // well, with bind_ip then IPv4. Peers are reached in their public address's family; both
  // families' sockets are read. "" = one family (bind_ip's).
  std::string bind_ip6;
  uint16_t port = 0;
  int sock_buf_bytes = 4 << 20;
  // Offload bits wanted (offloads.h): the TUN_F_* ones are probed on the TUN; kOffloadGro
  // (coalesce received TCP, and UDP with USO, into GSO writes), kOffloadUdpGso (UDP_SEGMENT on
  // send) and kOffloadUdpGro (UDP_GRO on receive) are the engine's own.
  unsigned offloads = 0;
  // After a drain that moved few packets (latency-bound traffic: ping, RPC), poll this long
  // before sleeping in epoll, so the reply that is on its way needs no wake-up. 0 = never.
  int busy_poll_us = 0;
  // CPU-affine queues: queue k's threads pinned to CPU k, the TUN steering each packet to the
  // queue of the CPU that sent it, and queue k's socket preferred for datagrams the kernel takes
  // in on CPU k (SO_INCOMING_CPU). Needs one queue per online CPU, all of them allowed; else
  // the engine runs unpinned (affinity_note() says why). Without it the TUN steers by flow.
  bool cpu_affine = false;
  // Attach a TUN steering program at all (tests turn it off to see the TUN's own choice).
  bool steering = true;
  // CPU-affine steering: a flow moves to the sending CPU's queue only after this long without a
  // packet, so packets it left in its old queue have gone out first (steering.h).
  uint64_t steering_gap_ns = 10'000'000;
  // With kOffloadTapGso: the egress TAP's name ("" lets the kernel pick) and a test knob that
  // makes the start-up probe write a frame the kernel refuses.
  std::string tap_name;
  bool tap_probe_fail = false;
  // Test knob: frame number N (counted per loop, from 1) written into the TAP is one the kernel
  // refuses (EINVAL), so the runtime switch back to the sockets runs for real. 0 = never.
  uint64_t tap_fail_at = 0;
  // Run the loop threads SCHED_FIFO at this priority (1..99; 0 = the normal policy).
  int fifo_priority = 0;
  // TUNSETPERSIST: the device (with its addresses and routes) outlives the engine and the
  // process; the next engine attaches to it again. false clears the flag on an existing device
  // (it then goes with its last queue).
  bool persist = false;
  CodecConfig codec;
  // format kWireguard (wg_engine.h): our static private key and the cluster-wide preshared key
  // (flannel's net-conf PSK; all zero and wg_has_psk false: none). `port` is the listen port.
  uint8_t wg_private_key[32] = {};
  uint8_t wg_psk[32] = {};
  bool wg_has_psk = false;
  // The first peers get a handshake from us at once (WgEngine::set_greet_first_peers): the
  // backend's engines may replace an earlier one whose sessions the peers still hold.
  bool wg_greet = false;
};

// Counter indexes, followed by one counter per DropReason (kDropBase + reason), from the table
// in src/dataplane/stats.ts (counters.gen.h). kCounterNames names them; the addon's
// counterNames() exports those names (then `drop_<reason>`), which stats.ts COUNTERS equals
// (checked when an engine starts, and by test/native/addon-exports.test.ts).
enum Counter : uint32_t {
#define WEFT_COUNTER_ENUM(id, name) k##id,
  WEFT_ENGINE_COUNTERS(WEFT_COUNTER_ENUM)
#undef WEFT_COUNTER_ENUM
      kDropBase,
  kCounterCount = kDropBase + static_cast<uint32_t>(DropReason::kCount),
};

// kCounterNames[i] names Counter i (i < kDropBase), as stats.ts calls it.
inline constexpr const char* kCounterNames[] = {
#define WEFT_COUNTER_NAME(id, name) name,
    WEFT_ENGINE_COUNTERS(WEFT_COUNTER_NAME)
#undef WEFT_COUNTER_NAME
};
static_assert(sizeof(kCounterNames) / sizeof(kCounterNames[0]) == kDropBase,
              "kCounterNames out of step with enum Counter");

struct alignas(64) WorkerCounters {
  std::atomic<uint64_t> v[kCounterCount];
  WorkerCounters() {
    for (auto& c : v) c.store(0, std::memory_order_relaxed);
  }
  void Add(uint32_t i, uint64_t n) { v[i].fetch_add(n, std::memory_order_relaxed); }
  void Drop(DropReason r) { Add(kDropBase + static_cast<uint32_t>(r), 1); }
};

class Engine {
 public:
  static constexpr int kBatch = 64;
  static constexpr size_t kBufSize = 65536 + 64;

  // Opens the TUN queues, sockets and eventfds and probes the offloads; no thread starts.
  // Returns null with `error` set on failure (everything opened so far is closed again).
  static std::unique_ptr<Engine> Create(const EngineConfig& cfg, std::string* error);
  // Closes every fd. Only after every Run has returned (the TUN device goes with its last queue).
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Runs worker `w`'s loop for `dir` until Stop(). A queue runs either one kBoth loop or a kTx
  // and a kRx loop (on two threads). Returns 0, or an errno for a fatal error (EBUSY when that
  // direction of the worker already runs, EINVAL for a bad index or direction).
  // Blocks the calling thread (never a JS event loop) in the packet loop; allocates only on entry.
  int Run(int w, Direction dir = Direction::kBoth);
  // Any thread, idempotent, never blocks: every Run returns soon after (Stop is for good).
  void Stop();
  // Any thread (serialised with other SetPeers): copies `buf` (peer_table.h format) into a new
  // table that packets read after the return see; false with `error` (old table kept) if invalid.
  bool SetPeers(const uint8_t* buf, size_t len, std::string* error);
  // Any thread (serialised with SetPeers): applies `d` to the current table, at a cost
  // proportional to the delta: to the table the last change replaced, brought up to date,
  // when no packet thread still reads it (else to a copy of the current one), then swapped in
  // as SetPeers swaps. False with `error` (table kept) when `d` does not apply.
  bool UpdatePeers(const PeerDelta& d, std::string* error);
  // Format kWireguard, any thread: the WireGuard peers from now on (wg_engine.h records); false
  // with `error` (peers kept) when a record is invalid or the engine is of another format.
  bool SetWgPeers(const uint8_t* buf, size_t len, std::string* error);
  // Format kWireguard: our public key (32 bytes); null otherwise.
  const uint8_t* wg_public_key() const { return wg_ ? wg_->public_key() : nullptr; }
  size_t wg_peer_count() const { return wg_ ? wg_->peer_count() : 0; }
  // Format kWireguard, control thread: the device as `wg show` reports it (a copy taken under
  // the WireGuard lock, then the table's subnets as each peer's AllowedIPs); false otherwise.
  bool WgState(WgDeviceState* out);
  // Any thread, lock-free: copies worker `w`'s counters (both directions summed) into
  // out[0..kCounterCount); relaxed reads, so a snapshot may mix a few packets' worth of moments.
  void ReadCounters(int w, uint64_t* out) const;

  // The number of queues (fixed at Create).
  int workers() const { return static_cast<int>(workers_.size()); }
  // The kernel's name for the TUN device (cfg.tun_name, or what the kernel picked for "").
  const std::string& tun_name() const { return tun_name_; }
  // offloads.h bits the kernel accepted on the TUN, whether wanted or not.
  unsigned offloads_accepted() const { return offloads_accepted_; }
  // offloads.h bits in use: wanted and accepted (a loop may still drop udp_gso later, counted).
  unsigned offloads_enabled() const { return offloads_enabled_; }
  // Peers in the current table (any thread).
  size_t peer_count() const;
  // How the TUN picks a queue: "flow" (the steering program, by flow), "cpu" (by the sending
  // CPU, queues pinned) or "tun" (the TUN's own flow table: no program attached).
  const char* steering() const { return steering_; }
  // Why CPU-affine queues were asked for but not set up, or why no steering program is attached
  // ("" if neither).
  const std::string& affinity_note() const { return affinity_note_; }
  // The egress TAP's name while TCP leaves through it ("" when it does not), and why it does
  // not when it was asked for ("" otherwise).
  const std::string& tap_name() const { return tap_name_; }
  const std::string& tap_note() const { return tap_note_; }
  // Why SCHED_FIFO was asked for and is not used ("" otherwise).
  const std::string& fifo_note() const { return fifo_note_; }

 private:
  // VXLAN sends from kSourcePorts sockets bound to ephemeral ports, picked by the inner flow's
  // hash, so the outer source port carries the flow entropy a kernel vxlan sender gives
  // (ECMP and RSS on the way spread flows); udp_fd (the VXLAN port) only receives. The sockets
  // are the engine's, shared by its queues: a flow keeps its outer port when the TUN moves it
  // to another queue. (With a set per queue, such a move changed the port, so the peer's
  // SO_REUSEPORT group handed the flow to another of its queues, whose replies came back on
  // another of ours and moved the flow again: TCP saw reordering and retransmitted.)
  static constexpr int kSourcePorts = 8;

  struct Worker {
    int tun_fd = -1;
    int udp_fd = -1;
    int udp6_fd = -1;  // dual-stack: the IPv6 socket (udp_fd is then the IPv4 one)
    int event_fd = -1;
    // Per direction thread (index: kTx 0, kRx 1; a kBoth loop uses 0 and claims both).
    std::atomic<bool> running[2] = {false, false};
    std::atomic<uint64_t> seen[2] = {0, 0};  // generation of the table in use; 0 = quiescent
    WorkerCounters counters[2];              // summed by ReadCounters
    // Held while reading the TUN and sending what was read, so the queue's packets leave in
    // the order they were read. The kTx loop takes it to drain; the kRx loop, after writing to
    // the TUN, drains with it too when it is free: the reply a local pod answers with during
    // that write then leaves without waking the kTx thread.
    std::mutex tun_read_mu;
  };
  struct Retired {
    const PeerTable* table;
    uint64_t gen;
  };
  class Loop;

  Engine() = default;
  const PeerTable* AcquireTable(std::atomic<uint64_t>* seen);
  void SetUpSteering();
  void ReclaimLocked();
  // Whether a packet thread may still read a table retired at generation `gen`.
  bool InUseLocked(uint64_t gen) const;
  // Swaps `t` in; the table it replaces becomes the spare, `pending` behind it.
  void PublishLocked(PeerTable* t, std::vector<PeerDelta> pending);
  // Opens the egress TAP, sets its sysctls, brings it up and probes it (tap_tx.h); on any
  // failure closes it and leaves tap_note_ saying why (TCP then leaves by the sockets).
  void SetUpTap(const sockaddr_storage& bind);
  bool ProbeTap(std::string* error);
  void CheckFifo();
  // Attaches the TAP header templates to a table about to be published.
  void AttachTapTemplates(PeerTable* t) const;
  // Applies `d` to an unpublished table, the TAP templates of the records it writes with it.
  void ApplyDelta(PeerTable* t, const PeerDelta& d) const;

  EngineConfig cfg_;
  std::unique_ptr<WgEngine> wg_;  // format kWireguard only
  std::string tun_name_;
  const char* steering_ = "tun";
  std::string affinity_note_;
  std::vector<int> cpus_;  // CPU of queue k when the queues are pinned; empty otherwise
  unsigned offloads_accepted_ = 0;
  unsigned offloads_enabled_ = 0;
  std::vector<std::unique_ptr<Worker>> workers_;
  int src_fds_[kSourcePorts] = {-1, -1, -1, -1, -1, -1, -1, -1};
  int src_count_ = 0;  // 0: send from udp_fd (flannel-udp sends from its port, as flannel)
  int src6_fds_[kSourcePorts] = {-1, -1, -1, -1, -1, -1, -1, -1};  // dual-stack: IPv6 ones
  int src6_count_ = 0;
  uint16_t src_ports_[kSourcePorts] = {};  // their ports, host order (TAP frames use them too)
  // The egress TAP (one per engine, shared by the queues: each write is one frame).
  int tap_fd_ = -1;
  std::string tap_name_;
  std::string tap_note_;
  std::atomic<bool> tap_on_{false};  // false for good after a runtime EINVAL
  TapFrameConfig tap_cfg_;
  std::string fifo_note_;
  std::atomic<bool> stop_{false};
  std::atomic<const PeerTable*> table_{nullptr};
  std::atomic<uint64_t> gen_{1};
  std::mutex control_mu_;  // serialises SetPeers; never taken by a packet thread
  std::vector<Retired> retired_;
  // The table the last swap replaced (null: none to reuse) and the deltas that bring it to the
  // current one: UpdatePeers applies them and the new delta to it once no reader holds it.
  Retired spare_{nullptr, 0};
  std::vector<PeerDelta> spare_behind_;
};

}  // namespace weft

#endif  // WEFT_NATIVE_ENGINE_H_
