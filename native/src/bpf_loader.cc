#include "bpf_loader.h"

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <dirent.h>
#include <linux/bpf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <set>
#include <utility>

#include "../bpf/weft_abi.h"
#include "peer_table.h"

namespace weft {
namespace {

// tcx attach types (kernel ≥ 6.6); this machine's uapi headers are 6.1.
constexpr int kBpfTcxIngress = 46;
constexpr int kBpfTcxEgress = 47;

constexpr uint32_t kBpfLinkTypeTcx = 11;

// The pins of the three links (in the engine's pin directory) and the program each must run.
#define WEFT_PIN_NAME(prog, pin) pin,
#define WEFT_PROG_NAME(prog, pin) WEFT_BPF_NAME(prog),
const char* const kPinName[3] = {WEFT_BPF_PROGRAMS(WEFT_PIN_NAME)};
const char* const kProgName[3] = {WEFT_BPF_PROGRAMS(WEFT_PROG_NAME)};
#undef WEFT_PIN_NAME
#undef WEFT_PROG_NAME

// clsact filters: weft's handle and priority, so a restart finds (and replaces) its own.
constexpr uint32_t kTcHandle = 0x77ef;
constexpr uint32_t kTcPriority = 0x77ef;

// libbpf's messages (the verifier log among them) go here while Load runs.
thread_local std::string* g_libbpf_log = nullptr;

int LibbpfPrint(enum libbpf_print_level level, const char* fmt, va_list args) {
  if (!g_libbpf_log || level == LIBBPF_DEBUG) return 0;
  char buf[1024];
  int n = vsnprintf(buf, sizeof(buf), fmt, args);
  if (n > 0 && g_libbpf_log->size() < 16384)
    g_libbpf_log->append(buf, std::min<size_t>(n, sizeof(buf) - 1));
  return 0;
}

std::string Errno(const char* what, int err) {
  return std::string(what) + ": " + std::strerror(err < 0 ? -err : err);
}

void CloseFd(int* fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

std::string PinPath(const std::string& dir, int slot) {
  return dir.empty() ? std::string() : dir + "/" + kPinName[slot];
}

// "link", "prog" or "map" for a bpf object fd (its anon inode's name), else "".
std::string FdKind(int fd) {
  char link[64];
  char target[128];
  std::snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, target, sizeof(target) - 1);
  if (n <= 0) return "";
  target[n] = 0;
  const std::string prefix = "anon_inode:bpf-";
  std::string t(target);
  return t.rfind(prefix, 0) == 0 ? t.substr(prefix.size()) : "";
}

BpfPinInfo DescribeFd(int fd) {
  BpfPinInfo p;
  p.kind = FdKind(fd);
  if (p.kind != "link") return p;
  // 6.1 uapi headers: no tcx member yet; it is { ifindex, attach_type } at the union's start.
  bpf_link_info info{};
  uint32_t len = sizeof(info);
  if (bpf_obj_get_info_by_fd(fd, &info, &len) < 0) return p;
  p.id = info.id;
  p.link_type = info.type;
  p.prog_id = info.prog_id;
  if (info.type == kBpfLinkTypeTcx) {
    constexpr size_t kUnion = offsetof(bpf_link_info, raw_tracepoint);
    static_assert(kUnion == 16, "bpf_link_info's union");
    std::memcpy(&p.ifindex, reinterpret_cast<const uint8_t*>(&info) + kUnion, 4);
    std::memcpy(&p.attach_type, reinterpret_cast<const uint8_t*>(&info) + kUnion + 4, 4);
  }
  int prog = bpf_prog_get_fd_by_id(info.prog_id);
  if (prog >= 0) {
    bpf_prog_info pi{};
    uint32_t plen = sizeof(pi);
    if (bpf_obj_get_info_by_fd(prog, &pi, &plen) == 0) p.prog_name = pi.name;
    close(prog);
  }
  return p;
}

}  // namespace

BpfPinInfo DescribeBpfPin(const std::string& path) {
  int fd = bpf_obj_get(path.c_str());
  if (fd < 0) return BpfPinInfo{};
  BpfPinInfo p = DescribeFd(fd);
  close(fd);
  return p;
}

int TcxProgIds(uint32_t ifindex, bool ingress, std::vector<uint32_t>* ids) {
  ids->assign(64, 0);
  LIBBPF_OPTS(bpf_prog_query_opts, q);
  q.prog_ids = ids->data();
  q.prog_cnt = static_cast<uint32_t>(ids->size());
  // BPF_PROG_QUERY's target_fd is target_ifindex for tcx (one union).
  int rc = bpf_prog_query_opts(
      static_cast<int>(ifindex),
      static_cast<enum bpf_attach_type>(ingress ? kBpfTcxIngress : kBpfTcxEgress), &q);
  if (rc < 0) {
    ids->clear();
    return errno == ENOENT ? 0 : -errno;
  }
  ids->resize(std::min<size_t>(q.prog_cnt, ids->size()));
  return 0;
}

std::string UntrustedPinDir(const std::string& dir) {
  struct stat st;
  if (lstat(dir.c_str(), &st) < 0) return Errno(dir.c_str(), errno);
  if (S_ISLNK(st.st_mode)) return dir + " is a symlink";
  if (!S_ISDIR(st.st_mode)) return dir + " is not a directory";
  if (st.st_uid != 0) return dir + " is not owned by root";
  if (st.st_mode & (S_IWGRP | S_IWOTH)) return dir + " is writable by group or others";
  return "";
}

int UnpinBpfDir(const std::string& dir) {
  if (dir.empty()) return 0;
  struct stat st;
  if (lstat(dir.c_str(), &st) < 0) return 0;
  if (!UntrustedPinDir(dir).empty()) return -EPERM;
  // Only weft's own names: never every entry (another tool's pins may sit beside them).
  int removed = 0;
  for (const char* n : kPinName) {
    std::string path = dir + "/" + n;
    if (lstat(path.c_str(), &st) < 0) continue;
    // A symlink is removed, never followed (it may point at another tool's link).
    if (!S_ISLNK(st.st_mode)) {
      int fd = bpf_obj_get(path.c_str());
      if (fd >= 0) {
        if (FdKind(fd) == "link") bpf_link_detach(fd);
        close(fd);
      }
    }
    if (unlink(path.c_str()) == 0) removed++;
  }
  rmdir(dir.c_str());  // fails, leaving it, while anything else is in it
  return removed;
}

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
  for (int i = 0; i < 3; i++) {
    bpf_program* p = bpf_object__find_program_by_name(e->obj_, kProgName[i]);
    e->prog_fd_[i] = p ? bpf_program__fd(p) : -1;
    if (e->prog_fd_[i] < 0) {
      *error = std::string("program ") + kProgName[i] + " missing from " + object_path;
      return nullptr;
    }
  }
  struct {
    const char* name;
    int* fd;
  } maps[] = {{WEFT_BPF_NAME(WEFT_MAP_CONFIG), &e->config_fd_},
              {WEFT_BPF_NAME(WEFT_MAP_PEERS4), &e->peers4_fd_},
              {WEFT_BPF_NAME(WEFT_MAP_PEERS6), &e->peers6_fd_},
              {WEFT_BPF_NAME(WEFT_MAP_SOURCES), &e->sources_fd_},
              {WEFT_BPF_NAME(WEFT_MAP_SOURCES6), &e->sources6_fd_},
              {WEFT_BPF_NAME(WEFT_MAP_COUNTERS), &e->counters_fd_},
              {WEFT_BPF_NAME(WEFT_MAP_PORTS), &e->ports_fd_}};
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
  weft_config v{};
  v.format = cfg.format;
  v.vni = cfg.vni;
  v.tun_ifindex = cfg.tun_ifindex;
  v.underlay_ifindex = cfg.underlay_ifindex;
  std::memcpy(&v.local_v4, cfg.local_v4, 4);  // network order
  v.port = htons(cfg.port);
  std::memcpy(v.vtep_mac, cfg.vtep_mac, 6);
  std::memcpy(v.local_v6, cfg.local_v6, 16);
  uint32_t zero = 0;
  return bpf_map_update_elem(config_fd_, &zero, &v, BPF_ANY) < 0 ? -errno : 0;
}

int BpfEngine::WriteSource(const std::string& addr, uint32_t n) {
  int fd = addr.size() == 4 ? sources_fd_ : sources6_fd_;
  return bpf_map_update_elem(fd, addr.data(), &n, BPF_ANY) < 0 ? -errno : 0;
}

int BpfEngine::DeleteSource(const std::string& addr) {
  int fd = addr.size() == 4 ? sources_fd_ : sources6_fd_;
  if (bpf_map_delete_elem(fd, addr.data()) < 0 && errno != ENOENT) return -errno;
  return 0;
}

bool BpfEngine::WritePeer(int family, const uint8_t* key, const uint8_t* value,
                          std::string* error) {
  int fd = family == 4 ? peers4_fd_ : peers6_fd_;
  if (bpf_map_update_elem(fd, key, value, BPF_ANY) < 0) {
    *error = Errno("peer map update", errno);
    return false;
  }
  return true;
}

namespace {

// A record's peer map entry: key = family byte + LPM key (prefixlen u32 host order + address,
// host bits cleared, so the trie holds one entry per subnet), and its value.
// The key bytes after the family byte are the map's key (weft_abi.h weft_lpm_v4 / _v6).
static_assert(offsetof(weft_lpm_v4, addr) == 4 && sizeof(weft_lpm_v4) == 4 + 4, "weft_lpm_v4");
static_assert(offsetof(weft_lpm_v6, addr) == 4 && sizeof(weft_lpm_v6) == 4 + 16, "weft_lpm_v6");
void PeerEntryOf(const PeerRecord& r, std::string* key_out, std::string* value_out) {
  size_t alen = r.family == 4 ? 4 : 16;
  uint8_t key[1 + 4 + 16] = {};
  key[0] = r.family;
  uint32_t prefixlen = r.prefix;
  std::memcpy(key + 1, &prefixlen, 4);
  for (size_t b = 0; b < alen; b++) {
    int bits = static_cast<int>(r.prefix) - static_cast<int>(b * 8);
    uint8_t mask = bits >= 8 ? 0xff : bits <= 0 ? 0 : static_cast<uint8_t>(0xff << (8 - bits));
    key[5 + b] = r.subnet[b] & mask;
  }
  weft_peer v{};
  v.pub_family = r.public_family;
  v.has_mac = r.has_vtep_mac() ? 1 : 0;
  v.port = htons(r.port);
  std::memcpy(v.mac, r.vtep_mac, 6);
  std::memcpy(v.pub, r.public_ip, r.public_len());
  key_out->assign(reinterpret_cast<char*>(key), 5 + alen);
  value_out->assign(reinterpret_cast<char*>(&v), sizeof(v));
}

// The public address of a map value (a source map's key: 4 bytes, or 16 for IPv6).
bool SourceOf(const std::string& value, std::string* a) {
  weft_peer v;
  std::memcpy(&v, value.data(), sizeof(v));
  if (v.pub_family != 4 && v.pub_family != 6) return false;
  a->assign(reinterpret_cast<const char*>(v.pub), v.pub_family == 4 ? 4 : 16);
  return true;
}

}  // namespace

bool BpfEngine::SetPeers(const uint8_t* table, size_t len, std::string* error) {
  std::unique_ptr<PeerTable> t = PeerTable::Build(table, len, error);
  if (!t) return false;
  // The wanted contents (PeerEntryOf).
  std::map<std::string, std::string> want;
  std::map<std::string, uint32_t> sources;
  for (size_t i = 0; i < t->size(); i++) {
    const PeerRecord& r = t->records()[i];
    std::string k, v, a;
    PeerEntryOf(r, &k, &v);
    want[k] = v;
    if (SourceOf(v, &a)) sources[a]++;
  }
  // A table the maps cannot hold is refused whole, before anything is written.
  size_t per_family[2] = {0, 0};
  for (auto& e : want) per_family[e.first[0] == 4 ? 0 : 1]++;
  size_t src_family[2] = {0, 0};
  for (auto& e : sources) src_family[e.first.size() == 4 ? 0 : 1]++;
  if (per_family[0] > kBpfMapEntries || per_family[1] > kBpfMapEntries ||
      src_family[0] > kBpfMapEntries || src_family[1] > kBpfMapEntries) {
    *error = "peer table: " + std::to_string(per_family[0]) + " IPv4 and " +
             std::to_string(per_family[1]) + " IPv6 subnets, " +
             std::to_string(src_family[0] + src_family[1]) +
             " public addresses: the bpf maps hold " + std::to_string(kBpfMapEntries) +
             " each (per family)";
    return false;
  }
  // Removals: entries that left, then sources no entry names any more. Always run, even after a
  // failed add: a removed peer never stays live in the maps.
  auto remove = [&](std::string* err) {
    bool ok = true;
    for (auto it = peers_.begin(); it != peers_.end();) {
      if (want.count(it->first)) {
        ++it;
        continue;
      }
      int fd = it->first[0] == 4 ? peers4_fd_ : peers6_fd_;
      if (bpf_map_delete_elem(fd, it->first.data() + 1) < 0 && errno != ENOENT) {
        if (ok) *err = Errno("peer map delete", errno);
        ok = false;
        ++it;
        continue;
      }
      it = peers_.erase(it);
    }
    for (auto it = sources_.begin(); it != sources_.end();) {
      if (sources.count(it->first)) {
        it->second = sources[it->first];
        ++it;
        continue;
      }
      if (DeleteSource(it->first) < 0) {
        if (ok) *err = Errno("source map delete", errno);
        ok = false;
        ++it;
        continue;
      }
      it = sources_.erase(it);
    }
    return ok;
  };
  // Adds and changes: a peer in both tables is never absent (BPF_ANY replaces in place).
  auto add = [&](std::string* err) {
    for (auto& [a, n] : sources) {
      if (sources_.count(a)) continue;
      if (WriteSource(a, n) < 0) {
        *err = Errno("source map update", errno);
        return false;
      }
      sources_[a] = n;
    }
    for (auto& [k, v] : want) {
      auto it = peers_.find(k);
      if (it != peers_.end() && it->second == v) continue;
      if (!WritePeer(k[0], reinterpret_cast<const uint8_t*>(k.data()) + 1,
                     reinterpret_cast<const uint8_t*>(v.data()), err))
        return false;
      peers_[k] = v;
    }
    return true;
  };
  // Adds first, unless the maps could not hold the old and the new entries together: then the
  // entries that left go first (those subnets are unreachable either way).
  size_t fresh[2] = {0, 0};
  for (auto& e : want)
    if (!peers_.count(e.first)) fresh[e.first[0] == 4 ? 0 : 1]++;
  size_t held[2] = {0, 0};
  for (auto& e : peers_) held[e.first[0] == 4 ? 0 : 1]++;
  size_t held_sources[2] = {0, 0};
  for (auto& e : sources_) held_sources[e.first.size() == 4 ? 0 : 1]++;
  for (auto& e : sources)
    if (!sources_.count(e.first)) held_sources[e.first.size() == 4 ? 0 : 1]++;
  bool full = held[0] + fresh[0] > kBpfMapEntries || held[1] + fresh[1] > kBpfMapEntries ||
              held_sources[0] > kBpfMapEntries || held_sources[1] > kBpfMapEntries;
  std::string add_err, remove_err;
  bool ok;
  if (full) {
    ok = remove(&remove_err);
    ok = add(&add_err) && ok;
  } else {
    bool added = add(&add_err);
    ok = remove(&remove_err) && added;
  }
  if (!ok) *error = add_err.empty() ? remove_err : add_err;
  return ok;
}

bool BpfEngine::UpdatePeers(const PeerDelta& d, std::string* error) {
  std::vector<std::pair<std::string, std::string>> removed(d.removed.size()),
      upserts(d.upserts.size());
  for (size_t i = 0; i < d.removed.size(); i++) {
    PeerEntryOf(d.removed[i], &removed[i].first, &removed[i].second);
    if (!peers_.count(removed[i].first)) {
      *error = "removed: peer record " + std::to_string(i) + ": subnet not in the table";
      return false;
    }
  }
  for (size_t i = 0; i < d.upserts.size(); i++) {
    PeerEntryOf(d.upserts[i], &upserts[i].first, &upserts[i].second);
  }
  // Sources an entry leaves: deleted once no entry names them, after the entries change.
  std::vector<std::string> left;
  auto leave = [&](const std::string& value) {
    std::string a;
    if (SourceOf(value, &a) && --sources_[a] == 0) left.push_back(a);
  };
  // Adds and changes, each source before the entry that names it.
  auto add = [&](std::string* err) {
    for (auto& [k, v] : upserts) {
      auto it = peers_.find(k);
      if (it != peers_.end() && it->second == v) continue;
      std::string a;
      if (SourceOf(v, &a) && sources_[a]++ == 0) {
        if (WriteSource(a, 1) < 0) {
          if (--sources_[a] == 0) sources_.erase(a);
          *err = Errno("source map update", errno);
          return false;
        }
      }
      if (!WritePeer(k[0], reinterpret_cast<const uint8_t*>(k.data()) + 1,
                     reinterpret_cast<const uint8_t*>(v.data()), err))
        return false;
      if (it != peers_.end()) {
        leave(it->second);
        it->second = v;
      } else {
        peers_[k] = v;
      }
    }
    return true;
  };
  // What left (a subnet removed and upserted in one delta is replaced by the adds), then the
  // sources nothing names any more. Always run, even after a failed add.
  std::set<std::string> upserted;
  for (auto& e : upserts) upserted.insert(e.first);
  auto remove = [&](std::string* err) {
    bool ok = true;
    for (auto& [k, v] : removed) {
      if (upserted.count(k)) continue;
      auto it = peers_.find(k);
      if (it == peers_.end()) continue;
      int fd = k[0] == 4 ? peers4_fd_ : peers6_fd_;
      if (bpf_map_delete_elem(fd, k.data() + 1) < 0 && errno != ENOENT) {
        if (ok) *err = Errno("peer map delete", errno);
        ok = false;
        continue;
      }
      leave(it->second);
      peers_.erase(it);
    }
    for (const std::string& a : left) {
      auto it = sources_.find(a);
      if (it == sources_.end() || it->second != 0) continue;
      if (DeleteSource(a) < 0) {
        if (ok) *err = Errno("source map delete", errno);
        ok = false;
        continue;
      }
      sources_.erase(it);
    }
    left.clear();
    return ok;
  };
  // Adds first, unless the maps could not hold the new entries beside the ones leaving.
  size_t held[2] = {0, 0};
  for (auto& e : peers_) held[e.first[0] == 4 ? 0 : 1]++;
  size_t fresh[2] = {0, 0};
  std::set<std::string> fresh_sources;
  for (auto& [k, v] : upserts) {
    if (!peers_.count(k)) fresh[k[0] == 4 ? 0 : 1]++;
    std::string a;
    if (SourceOf(v, &a) && !sources_.count(a)) fresh_sources.insert(a);
  }
  size_t held_sources[2] = {0, 0};
  for (auto& e : sources_) held_sources[e.first.size() == 4 ? 0 : 1]++;
  for (auto& a : fresh_sources) held_sources[a.size() == 4 ? 0 : 1]++;
  bool full = held[0] + fresh[0] > kBpfMapEntries || held[1] + fresh[1] > kBpfMapEntries ||
              held_sources[0] > kBpfMapEntries || held_sources[1] > kBpfMapEntries;
  std::string add_err, remove_err;
  bool ok;
  if (full) {
    ok = remove(&remove_err);
    ok = add(&add_err) && ok;
    // Sources an upsert replaced (a changed public address) go after it.
    ok = remove(&remove_err) && ok;
  } else {
    bool added = add(&add_err);
    ok = remove(&remove_err) && added;
  }
  if (!ok) *error = add_err.empty() ? remove_err : add_err;
  return ok;
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

int BpfEngine::AdoptPin(const std::string& path, int prog, uint32_t ifindex, int type,
                        std::string* why) {
  why->clear();
  if (path.empty()) return -1;
  struct stat st;
  if (lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    *why = "a symlink, not a pin";
    unlink(path.c_str());  // the symlink itself; its target is never opened
    return -1;
  }
  int fd = bpf_obj_get(path.c_str());
  if (fd < 0) {
    if (errno == ENOENT) return -1;
    *why = Errno("open", errno);
    unlink(path.c_str());
    return -1;
  }
  BpfPinInfo p = DescribeFd(fd);
  auto n = [](uint32_t v) { return std::to_string(v); };
  if (p.kind != "link")
    *why = "a " + (p.kind.empty() ? std::string("foreign object") : p.kind) + ", not a link";
  else if (p.link_type != kBpfLinkTypeTcx)
    *why = "link type " + n(p.link_type) + ", not tcx";
  else if (p.ifindex == 0)
    *why = "its device is gone";
  else if (p.ifindex != ifindex)
    *why = "on ifindex " + n(p.ifindex) + ", not " + n(ifindex);
  else if (p.attach_type != static_cast<uint32_t>(type))
    *why = "attach type " + n(p.attach_type) + ", not " + n(static_cast<uint32_t>(type));
  else if (p.prog_name != kProgName[prog])
    *why = "runs " + (p.prog_name.empty() ? std::string("an unknown program") : p.prog_name) +
           ", not " + kProgName[prog];
  if (why->empty()) return fd;
  // Not ours to keep: off its device now (another fd may hold the link), then unpinned.
  if (p.kind == "link") bpf_link_detach(fd);
  close(fd);
  unlink(path.c_str());
  return -1;
}

int BpfEngine::CreateLink(int prog, uint32_t ifindex, int type, const std::string& path) {
  int fd = bpf_link_create(prog_fd_[prog], static_cast<int>(ifindex),
                           static_cast<enum bpf_attach_type>(type), nullptr);
  if (fd < 0) return -errno;
  if (!path.empty() && bpf_obj_pin(fd, path.c_str()) < 0) {
    int err = errno;
    close(fd);  // not pinned: the link goes with the fd
    return -err;
  }
  return fd;
}

int BpfEngine::TakeOver() {
  int n = 0;
  for (int i = 0; i < 2; i++) {
    if (!pending_[i] || link_fd_[i] < 0) continue;
    if (bpf_link_update(link_fd_[i], prog_fd_[i], nullptr) < 0) return -errno;
    pending_[i] = false;
    n++;
  }
  return n;
}

int BpfEngine::AttachBridge(uint32_t ifindex) {
  if (ifindex == bridge_ifindex_ && (ifindex == 0 || bridge_link_fd_ >= 0)) return 0;
  std::string path = PinPath(pin_dir_, 2);
  if (bridge_link_fd_ >= 0 && !path.empty()) {
    // The bridge went or was recreated: its link points at nothing we serve.
    bpf_link_detach(bridge_link_fd_);
    unlink(path.c_str());
  }
  CloseFd(&bridge_link_fd_);
  bridge_ifindex_ = 0;
  if (ifindex == 0) return 0;
  std::string why;
  int fd = AdoptPin(path, 2, ifindex, kBpfTcxEgress, &why);
  // weft_bridge reads only the port map, which the caller fills first: swap at once.
  if (fd >= 0 && bpf_link_update(fd, prog_fd_[2], nullptr) < 0) {
    bpf_link_detach(fd);
    close(fd);
    unlink(path.c_str());
    fd = -1;
  }
  if (fd < 0) fd = CreateLink(2, ifindex, kBpfTcxEgress, path);
  if (fd < 0) return fd;
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

BpfAttachMode BpfEngine::Attach(uint32_t tun_ifindex, uint32_t underlay_ifindex, BpfAttachMode want,
                                const std::string& pin_dir, std::vector<std::string>* adopted,
                                std::vector<std::string>* replaced, std::string* error) {
  Detach();
  uint32_t ifindex[2] = {tun_ifindex, underlay_ifindex};
  if (want == BpfAttachMode::kNone || want == BpfAttachMode::kTcx) {
    // A pin directory someone else could write to is never used (bpf-pins.ts checks it first).
    pin_dir_ = !pin_dir.empty() && UntrustedPinDir(pin_dir).empty() ? pin_dir : std::string();
    int types[2] = {kBpfTcxEgress, kBpfTcxIngress};
    int err = 0;
    for (int i = 0; i < 2 && !err; i++) {
      std::string why;
      std::string path = PinPath(pin_dir_, i);
      link_fd_[i] = AdoptPin(path, i, ifindex[i], types[i], &why);
      if (link_fd_[i] >= 0) {
        pending_[i] = true;
        adopted->push_back(kPinName[i]);
        continue;
      }
      if (!why.empty()) replaced->push_back(std::string(kPinName[i]) + ": " + why);
      int fd = CreateLink(i, ifindex[i], types[i], path);
      if (fd < 0)
        err = -fd;
      else
        link_fd_[i] = fd;
    }
    if (!err) {
      mode_ = BpfAttachMode::kTcx;
      attached_ifindex_[0] = tun_ifindex;
      attached_ifindex_[1] = underlay_ifindex;
      return mode_;
    }
    for (int i = 0; i < 2; i++) {
      CloseFd(&link_fd_[i]);
      pending_[i] = false;
    }
    adopted->clear();
    *error = Errno("tcx link", err);
    if (want == BpfAttachMode::kTcx) {
      UnpinBpfDir(pin_dir_);
      pin_dir_.clear();
      return BpfAttachMode::kNone;
    }
  }
  // clsact filters are never pinned: a clean slate, no earlier tcx link left on the devices.
  UnpinBpfDir(pin_dir);
  pin_dir_.clear();
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

void BpfEngine::Detach(bool keep_pinned) {
  if (!keep_pinned) {
    // Every pinned link off its device and unpinned, then the fds (the last references) close.
    UnpinBpfDir(pin_dir_);
    AttachBridge(0);
  }
  CloseFd(&bridge_link_fd_);
  bridge_ifindex_ = 0;
  pin_dir_.clear();
  pending_[0] = pending_[1] = false;
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
  for (int fd :
       {prog_fd_[0], prog_fd_[1], prog_fd_[2], config_fd_, peers4_fd_, peers6_fd_, sources_fd_,
        sources6_fd_, counters_fd_, ports_fd_, link_fd_[0], link_fd_[1], bridge_link_fd_})
    add(fd);
  return ids;
}

std::vector<std::string> BpfCounterNames() {
#define WEFT_COUNTER_NAME(slot, name) name,
  return {WEFT_BPF_COUNTERS(WEFT_COUNTER_NAME)};
#undef WEFT_COUNTER_NAME
}

std::vector<std::string> BpfProgramNames() {
#define WEFT_PROG_NAME(prog, pin) WEFT_BPF_NAME(prog),
  return {WEFT_BPF_PROGRAMS(WEFT_PROG_NAME)};
#undef WEFT_PROG_NAME
}

std::vector<std::string> BpfMapNames() {
#define WEFT_MAP_NAME(map) WEFT_BPF_NAME(map),
  return {WEFT_BPF_MAPS(WEFT_MAP_NAME)};
#undef WEFT_MAP_NAME
}

std::vector<BpfAbiStruct> BpfAbiStructs() {
  // Every member, as this compiler lays it out (the test fails on one missing from a list).
#define WEFT_MEMBER(type, m) \
  { #m, offsetof(type, m), sizeof(type::m) }
  return {
      {"weft_config",
       sizeof(weft_config),
       {WEFT_MEMBER(weft_config, format), WEFT_MEMBER(weft_config, vni),
        WEFT_MEMBER(weft_config, tun_ifindex), WEFT_MEMBER(weft_config, underlay_ifindex),
        WEFT_MEMBER(weft_config, local_v4), WEFT_MEMBER(weft_config, port),
        WEFT_MEMBER(weft_config, vtep_mac), WEFT_MEMBER(weft_config, local_v6)}},
      {"weft_addr6", sizeof(weft_addr6), {WEFT_MEMBER(weft_addr6, addr)}},
      {"weft_lpm_v4",
       sizeof(weft_lpm_v4),
       {WEFT_MEMBER(weft_lpm_v4, prefixlen), WEFT_MEMBER(weft_lpm_v4, addr)}},
      {"weft_lpm_v6",
       sizeof(weft_lpm_v6),
       {WEFT_MEMBER(weft_lpm_v6, prefixlen), WEFT_MEMBER(weft_lpm_v6, addr)}},
      {"weft_peer",
       sizeof(weft_peer),
       {WEFT_MEMBER(weft_peer, pub_family), WEFT_MEMBER(weft_peer, has_mac),
        WEFT_MEMBER(weft_peer, port), WEFT_MEMBER(weft_peer, mac), WEFT_MEMBER(weft_peer, pad),
        WEFT_MEMBER(weft_peer, pub)}},
  };
#undef WEFT_MEMBER
}

}  // namespace weft
