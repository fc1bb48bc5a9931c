// The bpf engine's loader (libbpf): loads native/bpf/weft.bpf.c's object, writes its config and
// peer maps, runs its programs under BPF_PROG_TEST_RUN, attaches them (tcx links, or clsact
// filters where tcx is missing) and takes everything down again.
//
// Ownership: a BpfEngine owns every fd (programs, maps, tcx links). With a pin directory (on a
// bpffs), its tcx links are pinned there as `tx`, `rx` and `bridge`: they outlive the process
// (even SIGKILL), keeping the programs attached and, through them, the maps with the last peer
// table. The next engine's Attach adopts a pinned link that is on the right device and hook and
// runs weft's program of that slot (TakeOver then swaps its program with bpf_link_update, one
// atomic step per link), and unpins and replaces any other. Without a pin directory the kernel
// drops the links with the process's fds. clsact filters (the fallback) are never pinned and
// outlive the process: Attach replaces a filter left at weft's handle/priority by an earlier
// process, Detach removes its own.
#ifndef WEFT_NATIVE_BPF_LOADER_H_
#define WEFT_NATIVE_BPF_LOADER_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../bpf/weft_abi.h"

struct bpf_object;

namespace weft {

struct PeerDelta;  // peer_table.h

enum class BpfProgram { kTx = 0, kRx = 1 };

// How the programs are attached: tcx links (kernel ≥ 6.6) or clsact + cls_bpf filters.
enum class BpfAttachMode { kNone = 0, kTcx = 1, kClsact = 2 };

struct BpfConfig {
  uint32_t format = WEFT_FORMAT_UDP;  // WEFT_FORMAT_* (weft_abi.h)
  uint32_t vni = 0;
  uint32_t tun_ifindex = 0;
  uint32_t underlay_ifindex = 0;
  uint8_t local_v4[4] = {};  // our underlay IPv4 address (all zero: none)
  uint16_t port = 0;         // host order
  uint8_t vtep_mac[6] = {};
  uint8_t local_v6[16] = {};  // our underlay IPv6 address (all zero: none)
};

// Counter slots of the programs (weft_abi.h: the table in src/dataplane/stats.ts).
constexpr size_t kBpfCounterCount = WEFT_C_COUNT;

// Entries each peer map (per family) and the source map hold (weft_abi.h).
constexpr size_t kBpfMapEntries = WEFT_PEER_MAP_ENTRIES;

// The names of the counter slots, in order.
std::vector<std::string> BpfCounterNames();

// One member of a map struct as the loader compiles it: name, offset and size in bytes.
struct BpfAbiMember {
  std::string name;
  size_t offset;
  size_t size;
};
struct BpfAbiStruct {
  std::string name;
  size_t size;
  std::vector<BpfAbiMember> members;
};
// Every struct of weft_abi.h, member by member (test/native/bpf-abi.test.ts compares them with
// the object's BTF), and the program and map names.
std::vector<BpfAbiStruct> BpfAbiStructs();
std::vector<std::string> BpfProgramNames();
std::vector<std::string> BpfMapNames();

// What a bpffs path holds, for the pin checks and tests: kind "link" | "prog" | "map" | ""
// (nothing there, or not a bpf object); for a link its type, id, program (id and name) and, for
// a tcx link, its device (0: the device is gone) and attach type.
struct BpfPinInfo {
  std::string kind;
  uint32_t id = 0;
  uint32_t link_type = 0;
  uint32_t prog_id = 0;
  std::string prog_name;
  uint32_t ifindex = 0;
  uint32_t attach_type = 0;
};
BpfPinInfo DescribeBpfPin(const std::string& path);

// The ids of the programs attached with tcx to `ifindex` (ingress or egress), in order. 0 or
// -errno.
int TcxProgIds(uint32_t ifindex, bool ingress, std::vector<uint32_t>* ids);

// Why `dir` cannot hold weft's pins ("" when it can): it must be a directory, not a symlink,
// owned by root and not writable by group or others (a bpffs without mode= is 1777).
std::string UntrustedPinDir(const std::string& dir);

// Removes weft's pins in `dir` (`tx`, `rx`, `bridge`; nothing else is touched) and the directory
// if that leaves it empty; a pinned link is detached first (so its program leaves the device now,
// whoever else holds the link), a symlink is removed without being followed. Returns how many
// pins went, or -EPERM (nothing touched) when UntrustedPinDir refuses `dir`.
int UnpinBpfDir(const std::string& dir);

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
  // Changes the peer maps by `d` alone (peer_table.h): upserted entries (and the sources they
  // name) are written first, removed ones deleted after, so a peer present before and after is
  // never missing. False and `error` when a removed subnet is not in the maps (nothing written)
  // or a map write failed.
  bool UpdatePeers(const PeerDelta& d, std::string* error);

  // Runs one program on `in` (an Ethernet frame) under BPF_PROG_TEST_RUN, with the skb marked
  // GSO when gso_size > 0. Returns 0 or -errno; `retval` is the program's verdict and `out` the
  // packet it left.
  int TestRun(BpfProgram prog, const uint8_t* in, size_t len, uint32_t gso_size, uint32_t gso_segs,
              int* retval, std::vector<uint8_t>* out);

  // Attaches weft_tx to the egress of `tun_ifindex` and weft_rx to the ingress of
  // `underlay_ifindex`. kNone means: tcx, else clsact. Returns the mode used, or kNone and
  // `error`. `pin_dir` non-empty (an existing directory on a bpffs): the tcx links are pinned
  // there; a compatible link already pinned is adopted with its program left in place until
  // TakeOver (`adopted` names it), any other pin is unpinned and replaced (`replaced` says why).
  BpfAttachMode Attach(uint32_t tun_ifindex, uint32_t underlay_ifindex, BpfAttachMode want,
                       const std::string& pin_dir, std::vector<std::string>* adopted,
                       std::vector<std::string>* replaced, std::string* error);
  // Puts this engine's programs on the links Attach adopted (bpf_link_update: the old program
  // runs until the new one does, never neither). Returns how many, or -errno.
  int TakeOver();
  // Makes the port map hold exactly `records` (12 bytes each: MAC, 2 bytes padding, ifindex in
  // host order); new and changed entries first, then removals. False and `error` on a bad length
  // or a map write that failed.
  bool SetPorts(const uint8_t* records, size_t len, std::string* error);
  // Attaches weft_bridge to the egress of `ifindex` with a tcx link (replacing an earlier one;
  // pinned as `bridge` beside Attach's, a compatible pinned link taking this program at once);
  // 0 detaches it (and unpins it). 0 or -errno.
  int AttachBridge(uint32_t ifindex);
  // Detaches what Attach and AttachBridge attached (idempotent), and removes their pins and the
  // pin directory. keep_pinned: only the fds close; the pinned links stay attached.
  void Detach(bool keep_pinned = false);

  // The counters summed over CPUs, kBpfCounterCount of them.
  std::vector<uint64_t> Counters() const;

  // Program, map and link ids (for tests proving that stop leaves nothing behind).
  std::vector<uint32_t> ObjectIds() const;

 private:
  BpfEngine() = default;
  bool WritePeer(int family, const uint8_t* key, const uint8_t* value, std::string* error);
  // The link pinned at `path` if it is a tcx link of weft program `prog` on `ifindex`/`type`
  // (its fd; -1 and `why` otherwise, the pin then removed). No pin: -1, `why` empty.
  int AdoptPin(const std::string& path, int prog, uint32_t ifindex, int type, std::string* why);
  // Creates a tcx link of program `prog` on `ifindex`/`type`, pinned at `path` when non-empty.
  int CreateLink(int prog, uint32_t ifindex, int type, const std::string& path);

  bpf_object* obj_ = nullptr;
  int prog_fd_[3] = {-1, -1, -1};  // weft_tx, weft_rx, weft_bridge
  int config_fd_ = -1;
  int peers4_fd_ = -1;
  int peers6_fd_ = -1;
  int sources_fd_ = -1;
  int sources6_fd_ = -1;
  int counters_fd_ = -1;
  int ports_fd_ = -1;
  int link_fd_[2] = {-1, -1};
  bool pending_[2] = {false, false};  // adopted links still running the old program
  std::string pin_dir_;
  int bridge_link_fd_ = -1;
  uint32_t bridge_ifindex_ = 0;
  // What the port map holds: MAC (low six bytes) → ifindex.
  std::map<uint64_t, uint32_t> ports_;
  BpfAttachMode mode_ = BpfAttachMode::kNone;
  uint32_t attached_ifindex_[2] = {0, 0};
  bool created_hook_[2] = {false, false};
  // What the maps hold: LPM key bytes (family byte + prefixlen + address) → value bytes, and
  // public address (4 or 16 bytes: weft_sources or weft_sources6) → how many records name it.
  std::map<std::string, std::string> peers_;
  std::map<std::string, uint32_t> sources_;
  // Writes or deletes a source map entry (by the address's length).
  int WriteSource(const std::string& addr, uint32_t n);
  int DeleteSource(const std::string& addr);
};

}  // namespace weft

#endif  // WEFT_NATIVE_BPF_LOADER_H_
