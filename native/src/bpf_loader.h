// The bpf engine's loader (libbpf): loads native/bpf/weft.bpf.c's object, writes its config and
// peer maps, runs its programs under BPF_PROG_TEST_RUN, attaches them (tcx links, or clsact
// filters where tcx is missing) and takes everything down again.
//
// Ownership: a BpfEngine owns every fd (programs, maps, tcx links). Nothing is pinned, so when
// the process dies (even by SIGKILL) the kernel drops the tcx links and, with the last fd, the
// programs and maps. clsact filters (the fallback) outlive the process: Attach replaces a
// filter left at weft's handle/priority by an earlier process, Detach removes its own.
#ifndef WEFT_NATIVE_BPF_LOADER_H_
#define WEFT_NATIVE_BPF_LOADER_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

struct bpf_object;

namespace weft {

enum class BpfProgram { kTx = 0, kRx = 1 };

// How the programs are attached: tcx links (kernel ≥ 6.6) or clsact + cls_bpf filters.
enum class BpfAttachMode { kNone = 0, kTcx = 1, kClsact = 2 };

struct BpfConfig {
  bool vxlan = false;
  uint32_t vni = 0;
  uint32_t tun_ifindex = 0;
  uint32_t underlay_ifindex = 0;
  uint8_t local_v4[4] = {};  // our underlay IPv4 address
  uint16_t port = 0;         // host order
  uint8_t vtep_mac[6] = {};
};

// Counter slots of the programs (weft.bpf.c enum; src/dataplane/bpf-engine.ts BPF_COUNTERS).
constexpr size_t kBpfCounterCount = 8;

class BpfEngine {
 public:
  // Opens and loads the object (the verifier runs here). Null and `error` on failure.
  static std::unique_ptr<BpfEngine> Load(const std::string& object_path, std::string* error);
  ~BpfEngine();
  BpfEngine(const BpfEngine&) = delete;
  BpfEngine& operator=(const BpfEngine&) = delete;

  // 0 or -errno.
  int Configure(const BpfConfig& cfg);

  // Makes the peer maps hold exactly the records of `table` (peer_table.h layout): new and
  // changed entries are written first, entries that left are deleted after, so a peer present
  // before and after is never missing in between. False and `error` on a bad table or a map
  // write that failed (the maps then hold the old entries plus some new ones).
  bool SetPeers(const uint8_t* table, size_t len, std::string* error);

  // Runs one program on `in` (an Ethernet frame) under BPF_PROG_TEST_RUN, with the skb marked
  // GSO when gso_size > 0. Returns 0 or -errno; `retval` is the program's verdict and `out` the
  // packet it left.
  int TestRun(BpfProgram prog, const uint8_t* in, size_t len, uint32_t gso_size,
              uint32_t gso_segs, int* retval, std::vector<uint8_t>* out);

  // Attaches weft_tx to the egress of `tun_ifindex` and weft_rx to the ingress of
  // `underlay_ifindex`. kNone means: tcx, else clsact. Returns the mode used, or kNone and
  // `error`.
  BpfAttachMode Attach(uint32_t tun_ifindex, uint32_t underlay_ifindex, BpfAttachMode want,
                       std::string* error);
  // Makes the port map hold exactly `records` (12 bytes each: MAC, 2 bytes padding, ifindex in
  // host order); new and changed entries first, then removals. False and `error` on a bad length
  // or a map write that failed.
  bool SetPorts(const uint8_t* records, size_t len, std::string* error);
  // Attaches weft_bridge to the egress of `ifindex` with a tcx link (replacing an earlier one);
  // 0 detaches it. 0 or -errno.
  int AttachBridge(uint32_t ifindex);
  // Detaches what Attach and AttachBridge attached (idempotent).
  void Detach();

  // The counters summed over CPUs, kBpfCounterCount of them.
  std::vector<uint64_t> Counters() const;

  // Program, map and link ids (for tests proving that stop leaves nothing behind).
  std::vector<uint32_t> ObjectIds() const;

 private:
  BpfEngine() = default;
  bool WritePeer(int family, const uint8_t* key, const uint8_t* value, std::string* error);

  bpf_object* obj_ = nullptr;
  int prog_fd_[3] = {-1, -1, -1};  // weft_tx, weft_rx, weft_bridge
  int config_fd_ = -1;
  int peers4_fd_ = -1;
  int peers6_fd_ = -1;
  int sources_fd_ = -1;
  int counters_fd_ = -1;
  int ports_fd_ = -1;
  int link_fd_[2] = {-1, -1};
  int bridge_link_fd_ = -1;
  uint32_t bridge_ifindex_ = 0;
  // What the port map holds: MAC (low six bytes) → ifindex.
  std::map<uint64_t, uint32_t> ports_;
  BpfAttachMode mode_ = BpfAttachMode::kNone;
  uint32_t attached_ifindex_[2] = {0, 0};
  bool created_hook_[2] = {false, false};
  // What the maps hold: LPM key bytes (family byte + prefixlen + address) → value bytes, and
  // public IPv4 address → how many records name it.
  std::map<std::string, std::string> peers_;
  std::map<uint32_t, uint32_t> sources_;
};

}  // namespace weft

#endif  // WEFT_NATIVE_BPF_LOADER_H_
