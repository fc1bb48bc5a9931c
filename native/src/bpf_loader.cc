#include "bpf_loader.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/bpf.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <algorithm>

#include "peer_table.h"

namespace weft {
namespace {

// tcx attach types (kernel ≥ 6.6); this machine's uapi headers are 6.1.
constexpr int kBpfTcxIngress = 46;
constexpr int kBpfTcxEgress = 47;

// clsact filters: weft's handle and priority, so a restart finds (and replaces) its own.
constexpr uint32_t kTcHandle = 0x77ef;
constexpr uint32_t kTcPriority = 0x77ef;

// weft.bpf.c's map values.
struct MapConfig {
  uint32_t format;
  uint32_t vni;
  uint32_t tun_ifindex;
  uint32_t underlay_ifindex;
  uint8_t local_v4[4];
  uint16_t port;  // network order
  uint8_t vtep_mac[6];
};
static_assert(sizeof(MapConfig) == 28, "struct config in weft.bpf.c");

struct MapPeer {
  uint8_t pub_family;
  uint8_t has_mac;
  uint16_t port;  // network order
  uint8_t mac[6];
  uint8_t pad[2];
  uint8_t pub[16];
};
static_assert(sizeof(MapPeer) == 28, "struct peer in weft.bpf.c");

// libbpf's messages (the verifier log among them) go here while Load runs.
thread_local std::string* g_libbpf_log = nullptr;

int LibbpfPrint(enum libbpf_print_level level, const char* fmt, va_list args) {
  if (!g_libbpf_log || level == LIBBPF_DEBUG) return 0;
  char buf[1024];
  int n = vsnprintf(buf, sizeof(buf), fmt, args);
  if (n > 0 && g_libbpf_log->size() < 16384) g_libbpf_log->append(buf, std::min<size_t>(n, sizeof(buf) - 1));
  return 0;
}

std::string Errno(const char* what, int err) {
  return std::string(what) + ": " + std::strerror(err < 0 ? -err : err);
}

void CloseFd(int* fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

}  // namespace

std::unique_ptr<BpfEngine> BpfEngine::Load(const std::string& object_path, std::string* error) {
  std::unique_ptr<BpfEngine> e(new BpfEngine());
  std::string log;
  libbpf_set_print(LibbpfPrint);
  g_libbpf_log = &log;
  e->obj_ = bpf_object__open_file(object_path.c_str(), nullptr);
  if (!e->obj_) {
    int err = errno;
    g_libbpf_log = nullptr;
    *error = Errno(("open " + object_path).c_str(), err);
    return nullptr;
  }
  int rc = bpf_object__load(e->obj_);
  g_libbpf_log = nullptr;
  if (rc < 0) {
    *error = Errno("load (verifier)", rc) + (log.empty() ? "" : "\n" + log);
    return nullptr;
  }
  const char* progs[3] = {"weft_tx", "weft_rx", "weft_bridge"};
  for (int i = 0; i < 3; i++) {
    bpf_program* p = bpf_object__find_program_by_name(e->obj_, progs[i]);
    e->prog_fd_[i] = p ? bpf_program__fd(p) : -1;
    if (e->prog_fd_[i] < 0) {
      *error = std::string("program ") + progs[i] + " missing from " + object_path;
      return nullptr;
    }
  }
  struct {
    const char* name;
    int* fd;
  } maps[] = {{"weft_config", &e->config_fd_},   {"weft_peers4", &e->peers4_fd_},
              {"weft_peers6", &e->peers6_fd_},   {"weft_sources", &e->sources_fd_},
              {"weft_counters", &e->counters_fd_}, {"weft_ports", &e->ports_fd_}};
  for (auto& m : maps) {
    *m.fd = bpf_object__find_map_fd_by_name(e->obj_, m.name);
    if (*m.fd < 0) {
      *error = std::string("map ") + m.name + " missing from " + object_path;
      return nullptr;
    }
  }
  return e;
}

BpfEngine::~BpfEngine() {
  Detach();
  // The object owns the program and map fds.
  if (obj_) bpf_object__close(obj_);
}

int BpfEngine::Configure(const BpfConfig& cfg) {
  MapConfig v{};
  v.format = cfg.vxlan ? 1 : 0;
  v.vni = cfg.vni;
  v.tun_ifindex = cfg.tun_ifindex;
  v.underlay_ifindex = cfg.underlay_ifindex;
  std::memcpy(v.local_v4, cfg.local_v4, 4);
  v.port = htons(cfg.port);
  std::memcpy(v.vtep_mac, cfg.vtep_mac, 6);
  uint32_t zero = 0;
  return bpf_map_update_elem(config_fd_, &zero, &v, BPF_ANY) < 0 ? -errno : 0;
}

bool BpfEngine::WritePeer(int family, const uint8_t* key, const uint8_t* value, std::string* error) {
  int fd = family == 4 ? peers4_fd_ : peers6_fd_;
  if (bpf_map_update_elem(fd, key, value, BPF_ANY) < 0) {
    *error = Errno("peer map update", errno);
    return false;
  }
  return true;
}

bool BpfEngine::SetPeers(const uint8_t* table, size_t len, std::string* error) {
  std::unique_ptr<PeerTable> t = PeerTable::Build(table, len, error);
  if (!t) return false;
  // The wanted contents: key = family byte + LPM key (prefixlen u32 host order + address).
  std::map<std::string, std::string> want;
  std::map<uint32_t, uint32_t> sources;
  for (size_t i = 0; i < t->size(); i++) {
    const PeerRecord& r = t->records()[i];
    size_t alen = r.family == 4 ? 4 : 16;
    uint8_t key[1 + 4 + 16] = {};
    key[0] = r.family;
    uint32_t prefixlen = r.prefix;
    std::memcpy(key + 1, &prefixlen, 4);
    // Host bits cleared, so the trie holds one entry per subnet.
    for (size_t b = 0; b < alen; b++) {
      int bits = static_cast<int>(r.prefix) - static_cast<int>(b * 8);
      uint8_t mask = bits >= 8 ? 0xff : bits <= 0 ? 0 : static_cast<uint8_t>(0xff << (8 - bits));
      key[5 + b] = r.subnet[b] & mask;
    }
    MapPeer v{};
    v.pub_family = r.public_family;
    v.has_mac = r.has_vtep_mac() ? 1 : 0;
    v.port = htons(r.port);
    std::memcpy(v.mac, r.vtep_mac, 6);
    std::memcpy(v.pub, r.public_ip, r.public_len());
    want[std::string(reinterpret_cast<char*>(key), 5 + alen)] =
        std::string(reinterpret_cast<char*>(&v), sizeof(v));
    if (r.public_family == 4) {
      uint32_t a;
      std::memcpy(&a, r.public_ip, 4);
      sources[a]++;
    }
  }
  // Add and change first: a peer in both tables is never absent.
  for (auto& [a, n] : sources) {
    if (sources_.count(a)) continue;
    if (bpf_map_update_elem(sources_fd_, &a, &n, BPF_ANY) < 0) {
      *error = Errno("source map update", errno);
      return false;
    }
    sources_[a] = n;
  }
  for (auto& [k, v] : want) {
    auto it = peers_.find(k);
    if (it != peers_.end() && it->second == v) continue;
    if (!WritePeer(k[0], reinterpret_cast<const uint8_t*>(k.data()) + 1,
                   reinterpret_cast<const uint8_t*>(v.data()), error))
      return false;
    peers_[k] = v;
  }
  // Then remove what left.
  for (auto it = peers_.begin(); it != peers_.end();) {
    if (want.count(it->first)) {
      ++it;
      continue;
    }
    int fd = it->first[0] == 4 ? peers4_fd_ : peers6_fd_;
    if (bpf_map_delete_elem(fd, it->first.data() + 1) < 0 && errno != ENOENT) {
      *error = Errno("peer map delete", errno);
      return false;
    }
    it = peers_.erase(it);
  }
  for (auto it = sources_.begin(); it != sources_.end();) {
    if (sources.count(it->first)) {
      it->second = sources[it->first];
      ++it;
      continue;
    }
    uint32_t a = it->first;
    if (bpf_map_delete_elem(sources_fd_, &a) < 0 && errno != ENOENT) {
      *error = Errno("source map delete", errno);
      return false;
    }
    it = sources_.erase(it);
  }
  return true;
}

bool BpfEngine::SetPorts(const uint8_t* records, size_t len, std::string* error) {
  constexpr size_t kRecord = 12;
  if (len % kRecord != 0) {
    *error = "port records: length " + std::to_string(len) + " is not a multiple of 12";
    return false;
  }
  std::map<uint64_t, uint32_t> want;
  for (size_t off = 0; off < len; off += kRecord) {
    uint64_t mac = 0;
    std::memcpy(&mac, records + off, 6);
    uint32_t ifindex;
    std::memcpy(&ifindex, records + off + 8, 4);
    want[mac] = ifindex;
  }
  for (auto& [mac, ifindex] : want) {
    auto it = ports_.find(mac);
    if (it != ports_.end() && it->second == ifindex) continue;
    if (bpf_map_update_elem(ports_fd_, &mac, &ifindex, BPF_ANY) < 0) {
      *error = Errno("port map update", errno);
      return false;
    }
    ports_[mac] = ifindex;
  }
  for (auto it = ports_.begin(); it != ports_.end();) {
    if (want.count(it->first)) {
      ++it;
      continue;
    }
    uint64_t mac = it->first;
    if (bpf_map_delete_elem(ports_fd_, &mac) < 0 && errno != ENOENT) {
      *error = Errno("port map delete", errno);
      return false;
    }
    it = ports_.erase(it);
  }
  return true;
}

int BpfEngine::AttachBridge(uint32_t ifindex) {
  if (ifindex == bridge_ifindex_ && (ifindex == 0 || bridge_link_fd_ >= 0)) return 0;
  CloseFd(&bridge_link_fd_);
  bridge_ifindex_ = 0;
  if (ifindex == 0) return 0;
  int fd = bpf_link_create(prog_fd_[2], static_cast<int>(ifindex),
                           static_cast<enum bpf_attach_type>(kBpfTcxEgress), nullptr);
  if (fd < 0) return -errno;
  bridge_link_fd_ = fd;
  bridge_ifindex_ = ifindex;
  return 0;
}

int BpfEngine::TestRun(BpfProgram prog, const uint8_t* in, size_t len, uint32_t gso_size,
                       uint32_t gso_segs, int* retval, std::vector<uint8_t>* out) {
  out->assign(len + 256, 0);
  struct __sk_buff ctx {};
  ctx.gso_size = gso_size;
  ctx.gso_segs = gso_segs;
  LIBBPF_OPTS(bpf_test_run_opts, opts);
  opts.data_in = in;
  opts.data_size_in = static_cast<uint32_t>(len);
  opts.data_out = out->data();
  opts.data_size_out = static_cast<uint32_t>(out->size());
  opts.ctx_in = &ctx;
  opts.ctx_size_in = sizeof(ctx);
  opts.repeat = 1;
  int rc = bpf_prog_test_run_opts(prog_fd_[static_cast<int>(prog)], &opts);
  if (rc < 0) return -errno;
  *retval = static_cast<int>(opts.retval);
  out->resize(opts.data_size_out);
  return 0;
}

BpfAttachMode BpfEngine::Attach(uint32_t tun_ifindex, uint32_t underlay_ifindex,
                                BpfAttachMode want, std::string* error) {
  Detach();
  uint32_t ifindex[2] = {tun_ifindex, underlay_ifindex};
  if (want == BpfAttachMode::kNone || want == BpfAttachMode::kTcx) {
    int types[2] = {kBpfTcxEgress, kBpfTcxIngress};
    int err = 0;
    for (int i = 0; i < 2; i++) {
      link_fd_[i] = bpf_link_create(prog_fd_[i], static_cast<int>(ifindex[i]),
                                    static_cast<enum bpf_attach_type>(types[i]), nullptr);
      if (link_fd_[i] < 0) {
        err = errno;
        link_fd_[i] = -1;
        break;
      }
    }
    if (!err) {
      mode_ = BpfAttachMode::kTcx;
      attached_ifindex_[0] = tun_ifindex;
      attached_ifindex_[1] = underlay_ifindex;
      return mode_;
    }
    CloseFd(&link_fd_[0]);
    CloseFd(&link_fd_[1]);
    *error = Errno("tcx link", err);
    if (want == BpfAttachMode::kTcx) return BpfAttachMode::kNone;
  }
  bpf_tc_attach_point points[2] = {BPF_TC_EGRESS, BPF_TC_INGRESS};
  for (int i = 0; i < 2; i++) {
    LIBBPF_OPTS(bpf_tc_hook, hook);
    hook.ifindex = static_cast<int>(ifindex[i]);
    hook.attach_point = points[i];
    int rc = bpf_tc_hook_create(&hook);
    if (rc < 0 && rc != -EEXIST) {
      *error += (error->empty() ? "" : "; ") + Errno("clsact", rc);
      Detach();
      return BpfAttachMode::kNone;
    }
    created_hook_[i] = rc == 0;
    LIBBPF_OPTS(bpf_tc_opts, opts);
    opts.prog_fd = prog_fd_[i];
    opts.handle = kTcHandle;
    opts.priority = kTcPriority;
    opts.flags = BPF_TC_F_REPLACE;
    rc = bpf_tc_attach(&hook, &opts);
    if (rc < 0) {
      *error += (error->empty() ? "" : "; ") + Errno("tc filter", rc);
      Detach();
      return BpfAttachMode::kNone;
    }
    mode_ = BpfAttachMode::kClsact;
    attached_ifindex_[i] = ifindex[i];
  }
  error->clear();
  return mode_;
}

void BpfEngine::Detach() {
  AttachBridge(0);
  if (mode_ == BpfAttachMode::kTcx) {
    CloseFd(&link_fd_[0]);
    CloseFd(&link_fd_[1]);
  } else if (mode_ == BpfAttachMode::kClsact) {
    bpf_tc_attach_point points[2] = {BPF_TC_EGRESS, BPF_TC_INGRESS};
    for (int i = 0; i < 2; i++) {
      if (!attached_ifindex_[i]) continue;
      LIBBPF_OPTS(bpf_tc_hook, hook);
      hook.ifindex = static_cast<int>(attached_ifindex_[i]);
      hook.attach_point = points[i];
      LIBBPF_OPTS(bpf_tc_opts, opts);
      opts.handle = kTcHandle;
      opts.priority = kTcPriority;
      bpf_tc_detach(&hook, &opts);  // the device may be gone already
      if (created_hook_[i]) {
        // Only the qdisc weft created: destroying clsact removes every filter on that side.
        hook.attach_point = static_cast<bpf_tc_attach_point>(BPF_TC_INGRESS | BPF_TC_EGRESS);
        bpf_tc_hook_destroy(&hook);
      }
    }
  }
  mode_ = BpfAttachMode::kNone;
  attached_ifindex_[0] = attached_ifindex_[1] = 0;
  created_hook_[0] = created_hook_[1] = false;
}

std::vector<uint64_t> BpfEngine::Counters() const {
  int cpus = libbpf_num_possible_cpus();
  std::vector<uint64_t> total(kBpfCounterCount, 0);
  if (cpus <= 0) return total;
  std::vector<uint64_t> per(static_cast<size_t>(cpus));
  for (uint32_t i = 0; i < kBpfCounterCount; i++) {
    if (bpf_map_lookup_elem(counters_fd_, &i, per.data()) < 0) continue;
    for (uint64_t v : per) total[i] += v;
  }
  return total;
}

std::vector<uint32_t> BpfEngine::ObjectIds() const {
  std::vector<uint32_t> ids;
  // bpf_prog_info, bpf_map_info and bpf_link_info all start with { __u32 type; __u32 id; }.
  auto add = [&](int fd) {
    if (fd < 0) return;
    bpf_prog_info info{};
    uint32_t len = sizeof(info);
    if (bpf_obj_get_info_by_fd(fd, &info, &len) == 0) ids.push_back(info.id);
  };
  for (int fd : {prog_fd_[0], prog_fd_[1], prog_fd_[2], config_fd_, peers4_fd_, peers6_fd_,
                 sources_fd_, counters_fd_, ports_fd_, link_fd_[0], link_fd_[1], bridge_link_fd_})
    add(fd);
  return ids;
}

}  // namespace weft
