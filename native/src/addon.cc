// The only file that includes napi.h: it converts arguments, checks them and maps errors.
// Packet and netlink logic live in plain C++ files beside it.
#include <arpa/inet.h>
#include <libmnl/libmnl.h>
#include <malloc.h>
#include <napi.h>
#include <net/if.h>
#include <unistd.h>
#include <uv.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "bpf_loader.h"
#include "checksum.h"
#include "codec.h"
#include "engine.h"
#include "harness.h"
#include "netlink.h"
#include "offloads.h"
#include "sd_notify.h"
#include "tun.h"
#include "vxlan.h"
#include "wg_harness.h"
#include "wg_noise.h"

namespace weft {

// ---- netlink bindings (src/control/netlink/native-netlink.ts is the only caller) ----
namespace nlbind {

// A socket's state is shared with the batches in flight on the libuv pool (netlinkApplyAsync):
// one call at a time uses the socket (`mu`), and a close while a batch runs waits for it and
// leaves the batch's worker the last owner of nothing it still reads.
struct Socket {
  std::mutex mu;
  std::unique_ptr<Netlink> nl;
};

struct Handle {
  std::shared_ptr<Socket> sock;
};

Handle* GetHandle(const Napi::CallbackInfo& info) {
  if (info.Length() < 1 || !info[0].IsExternal()) {
    throw Napi::TypeError::New(info.Env(), "netlink: expected a handle");
  }
  return info[0].As<Napi::External<Handle>>().Data();
}

// The socket, locked for the caller's use (a batch in flight on the pool holds it until done).
class Locked {
 public:
  explicit Locked(const Napi::CallbackInfo& info) : sock_(GetHandle(info)->sock), lock_(sock_->mu) {
    if (!sock_->nl) throw Napi::Error::New(info.Env(), "netlink: handle is closed");
  }
  Netlink* operator->() const { return sock_->nl.get(); }

 private:
  std::shared_ptr<Socket> sock_;
  std::lock_guard<std::mutex> lock_;
};

Napi::Error ErrnoError(Napi::Env env, const std::string& what, int err) {
  Napi::Error e = Napi::Error::New(env, what + ": " + std::strerror(err));
  e.Set("errno", Napi::Number::New(env, err));
  return e;
}

int FamilyArg(const Napi::Value& v) {
  int f = v.IsNumber() ? v.As<Napi::Number>().Int32Value() : 4;
  return f == 6 ? AF_INET6 : AF_INET;
}

std::string StrProp(const Napi::Object& o, const char* key) {
  Napi::Value v = o.Get(key);
  return v.IsString() ? v.As<Napi::String>().Utf8Value() : std::string();
}

int64_t NumProp(const Napi::Object& o, const char* key, int64_t def) {
  Napi::Value v = o.Get(key);
  return v.IsNumber() ? v.As<Napi::Number>().Int64Value() : def;
}

IpAddr IpProp(Napi::Env env, const Napi::Object& o, const char* key) {
  IpAddr a;
  std::string s = StrProp(o, key);
  if (!s.empty() && !ParseIp(s, &a)) {
    throw Napi::TypeError::New(env, std::string("netlink: bad address in ") + key + ": " + s);
  }
  return a;
}

NlOp ToOp(Napi::Env env, const Napi::Object& o) {
  static const std::unordered_map<std::string, NlOpKind> kinds = {
      {"replaceRoute", NlOpKind::kReplaceRoute}, {"delRoute", NlOpKind::kDelRoute},
      {"replaceNeigh", NlOpKind::kReplaceNeigh}, {"delNeigh", NlOpKind::kDelNeigh},
      {"appendFdb", NlOpKind::kAppendFdb},       {"delFdb", NlOpKind::kDelFdb},
      {"replaceAddr", NlOpKind::kReplaceAddr},   {"delAddr", NlOpKind::kDelAddr},
      {"setLink", NlOpKind::kSetLink},           {"delLink", NlOpKind::kDelLink},
      {"addVxlan", NlOpKind::kAddVxlan},         {"addIpip", NlOpKind::kAddIpip},
  };
  NlOp op;
  std::string kind = StrProp(o, "op");
  auto it = kinds.find(kind);
  if (it == kinds.end()) throw Napi::TypeError::New(env, "netlink: unknown op " + kind);
  op.kind = it->second;
  // Only the fields this kind uses are read: each property read crosses into the JS engine, and
  // a 5,000-peer snapshot is 15,000 ops.
  auto read_mac = [&]() {
    std::string mac = StrProp(o, "mac");
    if (!mac.empty()) {
      if (!ParseMac(mac, op.mac)) throw Napi::TypeError::New(env, "netlink: bad MAC " + mac);
      op.has_mac = true;
    }
  };
  switch (op.kind) {
    case NlOpKind::kReplaceRoute:
    case NlOpKind::kDelRoute:
      op.dst = IpProp(env, o, "dst");
      op.dst_len = static_cast<int>(NumProp(o, "dstLen", -1));
      op.gw = IpProp(env, o, "gw");
      op.ifindex = static_cast<int>(NumProp(o, "ifindex", 0));
      op.onlink = o.Get("onlink").ToBoolean().Value();
      op.table = static_cast<uint32_t>(NumProp(o, "table", 0));
      op.route_type = static_cast<uint8_t>(NumProp(o, "routeType", 0));
      break;
    case NlOpKind::kReplaceNeigh:
    case NlOpKind::kDelNeigh:
    case NlOpKind::kAppendFdb:
    case NlOpKind::kDelFdb:
      op.dst = IpProp(env, o, "dst");
      op.ifindex = static_cast<int>(NumProp(o, "ifindex", 0));
      read_mac();
      break;
    case NlOpKind::kReplaceAddr:
    case NlOpKind::kDelAddr:
      op.dst = IpProp(env, o, "dst");
      op.dst_len = static_cast<int>(NumProp(o, "dstLen", -1));
      op.ifindex = static_cast<int>(NumProp(o, "ifindex", 0));
      break;
    case NlOpKind::kSetLink:
    case NlOpKind::kDelLink:
      op.ifindex = static_cast<int>(NumProp(o, "ifindex", 0));
      op.mtu = static_cast<int>(NumProp(o, "mtu", 0));
      op.up = static_cast<int>(NumProp(o, "up", -1));
      read_mac();
      break;
    case NlOpKind::kAddVxlan:
      op.name = StrProp(o, "name");
      op.mtu = static_cast<int>(NumProp(o, "mtu", 0));
      read_mac();
      op.vni = static_cast<uint32_t>(NumProp(o, "vni", 0));
      op.port = static_cast<uint16_t>(NumProp(o, "port", 0));
      op.local = IpProp(env, o, "local");
      op.link = static_cast<int>(NumProp(o, "link", 0));
      op.learning = o.Get("learning").ToBoolean().Value();
      op.gbp = o.Get("gbp").ToBoolean().Value();
      break;
    case NlOpKind::kAddIpip:
      op.name = StrProp(o, "name");
      op.mtu = static_cast<int>(NumProp(o, "mtu", 0));
      op.local = IpProp(env, o, "local");
      break;
  }
  if (op.kind != NlOpKind::kSetLink && op.kind != NlOpKind::kDelLink &&
      op.kind != NlOpKind::kAddVxlan && op.kind != NlOpKind::kAddIpip &&
      op.kind != NlOpKind::kAppendFdb && op.kind != NlOpKind::kDelFdb && op.dst.family == 0) {
    throw Napi::TypeError::New(env, "netlink: " + kind + " needs dst");
  }
  return op;
}

Napi::Value Open(const Napi::CallbackInfo& info) {
  std::string path = info.Length() > 0 && info[0].IsString()
                         ? info[0].As<Napi::String>().Utf8Value()
                         : std::string();
  std::string error;
  std::unique_ptr<Netlink> nl = Netlink::Open(path, &error);
  if (!nl) throw Napi::Error::New(info.Env(), "netlink open: " + error);
  auto* h = new Handle{std::make_shared<Socket>()};
  h->sock->nl = std::move(nl);
  return Napi::External<Handle>::New(info.Env(), h, [](Napi::Env, Handle* p) { delete p; });
}

Napi::Value Close(const Napi::CallbackInfo& info) {
  if (info.Length() > 0 && info[0].IsExternal()) {
    Socket& sock = *info[0].As<Napi::External<Handle>>().Data()->sock;
    std::lock_guard<std::mutex> lock(sock.mu);
    sock.nl.reset();
  }
  return info.Env().Undefined();
}

std::vector<NlOp> OpsArg(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 2 || !info[1].IsArray()) throw Napi::TypeError::New(env, "netlink: ops");
  Napi::Array arr = info[1].As<Napi::Array>();
  std::vector<NlOp> ops;
  ops.reserve(arr.Length());
  for (uint32_t i = 0; i < arr.Length(); i++) {
    Napi::Value v = arr.Get(i);
    if (!v.IsObject()) throw Napi::TypeError::New(env, "netlink: op is not an object");
    ops.push_back(ToOp(env, v.As<Napi::Object>()));
  }
  return ops;
}

Napi::Int32Array Errnos(Napi::Env env, const std::vector<int>& res) {
  Napi::Int32Array out = Napi::Int32Array::New(env, res.size());
  for (size_t i = 0; i < res.size(); i++) out[i] = res[i];
  return out;
}

// netlinkApplyAsync(handle, ops) → Promise<Int32Array> (0 or an errno per op): the ops are read
// here, on the JS thread; the batch is sent and its acknowledgements read on a libuv pool
// thread. rtnetlink does a request's work in the sender's sendmsg, so the kernel's part (5,000
// peers' routes, neighbours and FDB entries: ~0.3 s) runs there while the event loop goes on.
class ApplyWorker : public Napi::AsyncWorker {
 public:
  ApplyWorker(Napi::Env env, std::shared_ptr<Socket> sock, std::vector<NlOp> ops)
      : Napi::AsyncWorker(env, "weft:netlinkApply"),
        deferred_(Napi::Promise::Deferred::New(env)),
        sock_(std::move(sock)),
        ops_(std::move(ops)) {}

  Napi::Promise Promise() const { return deferred_.Promise(); }

  void Execute() override {
    std::lock_guard<std::mutex> lock(sock_->mu);
    if (!sock_->nl) return SetError("netlink: handle is closed");
    res_ = sock_->nl->Apply(ops_);
  }
  void OnOK() override { deferred_.Resolve(Errnos(Env(), res_)); }
  void OnError(const Napi::Error& e) override { deferred_.Reject(e.Value()); }

 private:
  Napi::Promise::Deferred deferred_;
  std::shared_ptr<Socket> sock_;
  std::vector<NlOp> ops_;
  std::vector<int> res_;
};

Napi::Value ApplyAsync(const Napi::CallbackInfo& info) {
  std::shared_ptr<Socket> sock = GetHandle(info)->sock;
  std::vector<NlOp> ops = OpsArg(info);
  auto* w = new ApplyWorker(info.Env(), std::move(sock), std::move(ops));
  Napi::Promise p = w->Promise();
  w->Queue();
  return p;
}

Napi::Value Mac(Napi::Env env, bool has, const uint8_t* mac) {
  return has ? Napi::Value(Napi::String::New(env, FormatMac(mac))) : env.Null();
}

Napi::Value Ip(Napi::Env env, const IpAddr& a) {
  return a.family ? Napi::Value(Napi::String::New(env, FormatIp(a))) : env.Null();
}

Napi::Object LinkObject(Napi::Env env, const LinkEntry& l) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("index", l.index);
  o.Set("name", l.name);
  o.Set("mtu", l.mtu);
  o.Set("mac", Mac(env, l.has_mac, l.mac));
  o.Set("flags", l.flags);
  o.Set("master", l.master);
  o.Set("kind", l.kind);
  if (l.has_vxlan) {
    Napi::Object v = Napi::Object::New(env);
    v.Set("vni", l.vxlan.vni);
    v.Set("port", l.vxlan.port);
    v.Set("local", Ip(env, l.vxlan.local));
    v.Set("link", l.vxlan.link);
    v.Set("learning", l.vxlan.learning);
    v.Set("gbp", l.vxlan.gbp);
    o.Set("vxlan", v);
  } else {
    o.Set("vxlan", env.Null());
  }
  if (l.has_ipip) {
    Napi::Object t = Napi::Object::New(env);
    t.Set("local", Ip(env, l.ipip.local));
    t.Set("remote", Ip(env, l.ipip.remote));
    t.Set("ttl", l.ipip.ttl);
    t.Set("tos", l.ipip.tos);
    t.Set("pmtudisc", l.ipip.pmtudisc);
    o.Set("ipip", t);
  } else {
    o.Set("ipip", env.Null());
  }
  if (l.has_tun) {
    Napi::Object t = Napi::Object::New(env);
    t.Set("type", l.tun.tap ? "tap" : "tun");
    t.Set("pi", l.tun.pi);
    t.Set("vnetHdr", l.tun.vnet_hdr);
    t.Set("multiQueue", l.tun.multi_queue);
    t.Set("persist", l.tun.persist);
    t.Set("queues", l.tun.queues);
    o.Set("tun", t);
  } else {
    o.Set("tun", env.Null());
  }
  return o;
}

Napi::Value List(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string what = info.Length() > 1 && info[1].IsString()
                         ? info[1].As<Napi::String>().Utf8Value()
                         : std::string();
  int family = FamilyArg(info.Length() > 2 ? info[2] : env.Undefined());
  int ifindex =
      info.Length() > 3 && info[3].IsNumber() ? info[3].As<Napi::Number>().Int32Value() : 0;
  Napi::Array out = Napi::Array::New(env);
  uint32_t n = 0;
  int err = 0;
  Locked nl(info);
  if (what == "route") {
    std::vector<RouteEntry> v;
    err = nl->ListRoutes(family, &v);
    for (const RouteEntry& r : v) {
      Napi::Object o = Napi::Object::New(env);
      o.Set("dst", Ip(env, r.dst));
      o.Set("dstLen", r.dst_len);
      o.Set("gw", Ip(env, r.gw));
      o.Set("ifindex", r.oif);
      o.Set("table", r.table);
      o.Set("protocol", r.protocol);
      o.Set("scope", r.scope);
      o.Set("type", r.type);
      o.Set("flags", r.flags);
      out.Set(n++, o);
    }
  } else if (what == "neigh" || what == "fdb") {
    std::vector<NeighEntry> v;
    err = what == "fdb" ? nl->ListFdb(ifindex, &v) : nl->ListNeighs(family, ifindex, &v);
    for (const NeighEntry& e : v) {
      Napi::Object o = Napi::Object::New(env);
      o.Set("dst", Ip(env, e.dst));
      o.Set("ifindex", e.ifindex);
      o.Set("mac", Mac(env, e.has_lladdr, e.lladdr));
      o.Set("state", e.state);
      o.Set("flags", e.flags);
      out.Set(n++, o);
    }
  } else if (what == "addr") {
    std::vector<AddrEntry> v;
    err = nl->ListAddrs(family, ifindex, &v);
    for (const AddrEntry& a : v) {
      Napi::Object o = Napi::Object::New(env);
      o.Set("addr", Ip(env, a.addr));
      o.Set("prefix", a.prefix);
      o.Set("ifindex", a.ifindex);
      o.Set("scope", a.scope);
      out.Set(n++, o);
    }
  } else if (what == "link") {
    std::vector<LinkEntry> v;
    err = nl->ListLinks(&v);
    for (const LinkEntry& l : v) out.Set(n++, LinkObject(env, l));
  } else {
    throw Napi::TypeError::New(env, "netlink: unknown list " + what);
  }
  if (err != 0) throw ErrnoError(env, "list " + what, err);
  return out;
}

Napi::Value GetLink(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string name = info.Length() > 1 && info[1].IsString()
                         ? info[1].As<Napi::String>().Utf8Value()
                         : std::string();
  LinkEntry l;
  int err = Locked(info)->GetLink(name, &l);
  if (err == ENODEV) return env.Null();
  if (err != 0) throw ErrnoError(env, "get link " + name, err);
  return LinkObject(env, l);
}

// A change monitor: the NetlinkMonitor's socket polled by the event loop (uv_poll), so the
// control plane hears of kernel changes as they happen instead of re-reading every entry. Each
// wakeup drains what is queued and calls back once: (changes, overflowed, error). Like a socket,
// an open monitor keeps the event loop alive until it is closed.
struct Monitor {
  Napi::Env env;
  std::unique_ptr<NetlinkMonitor> mon;
  Napi::FunctionReference callback;
  std::unique_ptr<Napi::AsyncContext> context;
  uv_poll_t poll;
  bool closed = false;
  explicit Monitor(Napi::Env e) : env(e) {}
};

Napi::Object ChangeObject(Napi::Env env, const NlChange& c) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("deleted", c.deleted);
  o.Set("ifindex", c.ifindex);
  switch (c.kind) {
    case NlChange::kRoute:
      o.Set("kind", "route");
      o.Set("family", c.family == AF_INET6 ? 6 : 4);
      o.Set("dst", Ip(env, c.route.dst));
      o.Set("dstLen", c.route.dst_len);
      o.Set("gw", Ip(env, c.route.gw));
      o.Set("table", c.route.table);
      o.Set("type", c.route.type);
      o.Set("flags", c.route.flags);
      break;
    case NlChange::kNeigh:
    case NlChange::kFdb:
      o.Set("kind", c.kind == NlChange::kFdb ? "fdb" : "neigh");
      o.Set("family", c.family == AF_INET6 ? 6 : 4);
      o.Set("dst", Ip(env, c.neigh.dst));
      o.Set("mac", Mac(env, c.neigh.has_lladdr, c.neigh.lladdr));
      o.Set("state", c.neigh.state);
      o.Set("flags", c.neigh.flags);
      break;
    case NlChange::kLink:
      o.Set("kind", "link");
      o.Set("name", c.name);
      o.Set("flags", c.link_flags);
      o.Set("master", c.master);
      break;
    case NlChange::kAddr:
      o.Set("kind", "addr");
      o.Set("family", c.family == AF_INET6 ? 6 : 4);
      break;
  }
  return o;
}

void OnMonitorReadable(uv_poll_t* handle, int status, int events) {
  auto* m = static_cast<Monitor*>(handle->data);
  if (m->closed) return;
  Napi::Env env = m->env;
  Napi::HandleScope scope(env);
  std::vector<NlChange> changes;
  int err = status < 0 ? EIO : m->mon->Drain(&changes);
  Napi::Array arr = Napi::Array::New(env, changes.size());
  for (size_t i = 0; i < changes.size(); i++) arr.Set(i, ChangeObject(env, changes[i]));
  Napi::Value failure = env.Null();
  if (err != 0 && err != ENOBUFS) failure = ErrnoError(env, "netlink monitor", err).Value();
  try {
    m->callback.MakeCallback(env.Global(), {arr, Napi::Boolean::New(env, err == ENOBUFS), failure},
                             *m->context);
  } catch (const Napi::Error& e) {
    // The JS side catches its own errors; anything escaping is a bug: report it as uncaught.
    napi_fatal_exception(env, e.Value());
  }
}

void CloseMonitor(Monitor* m);

void CloseMonitorAtExit(void* arg) { CloseMonitor(static_cast<Monitor*>(arg)); }

void CloseMonitor(Monitor* m) {
  if (m->closed) return;
  m->closed = true;
  napi_remove_env_cleanup_hook(m->env, CloseMonitorAtExit, m);
  uv_poll_stop(&m->poll);
  // The socket is closed, and the Monitor freed, once libuv has let go of the handle.
  uv_close(reinterpret_cast<uv_handle_t*>(&m->poll),
           [](uv_handle_t* h) { delete static_cast<Monitor*>(h->data); });
}

Napi::Value MonitorOpen(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string path = info.Length() > 0 && info[0].IsString()
                         ? info[0].As<Napi::String>().Utf8Value()
                         : std::string();
  if (info.Length() < 2 || !info[1].IsFunction())
    throw Napi::TypeError::New(env, "netlink monitor: callback");
  std::string error;
  std::unique_ptr<NetlinkMonitor> mon = NetlinkMonitor::Open(path, &error);
  if (!mon) throw Napi::Error::New(env, "netlink monitor open: " + error);
  // A Netlink handle given third: the changes it makes itself are not reported.
  if (info.Length() > 2 && info[2].IsExternal()) {
    Socket& sock = *info[2].As<Napi::External<Handle>>().Data()->sock;
    std::lock_guard<std::mutex> lock(sock.mu);
    if (sock.nl) mon->IgnorePort(sock.nl->portid());
  }
  uv_loop_t* loop = nullptr;
  if (napi_get_uv_event_loop(env, &loop) != napi_ok || loop == nullptr)
    throw Napi::Error::New(env, "netlink monitor: no event loop");
  auto* m = new Monitor(env);
  m->mon = std::move(mon);
  m->callback = Napi::Persistent(info[1].As<Napi::Function>());
  m->context = std::make_unique<Napi::AsyncContext>(env, "weft:netlinkMonitor");
  m->poll.data = m;
  int rc = uv_poll_init(loop, &m->poll, m->mon->fd());
  if (rc == 0) rc = uv_poll_start(&m->poll, UV_READABLE, OnMonitorReadable);
  if (rc != 0) {
    std::string why = uv_strerror(rc);
    m->closed = true;
    uv_close(reinterpret_cast<uv_handle_t*>(&m->poll),
             [](uv_handle_t* h) { delete static_cast<Monitor*>(h->data); });
    throw Napi::Error::New(env, "netlink monitor poll: " + why);
  }
  // Closed with the environment at the latest (a worker thread that exits, the process).
  napi_add_env_cleanup_hook(env, CloseMonitorAtExit, m);
  return Napi::External<Monitor>::New(env, m);
}

Napi::Value MonitorClose(const Napi::CallbackInfo& info) {
  if (info.Length() > 0 && info[0].IsExternal())
    CloseMonitor(info[0].As<Napi::External<Monitor>>().Data());
  return info.Env().Undefined();
}

void Define(Napi::Env env, Napi::Object exports) {
  exports.Set("netlinkOpen", Napi::Function::New(env, Open));
  exports.Set("netlinkClose", Napi::Function::New(env, Close));
  exports.Set("netlinkApplyAsync", Napi::Function::New(env, ApplyAsync));
  exports.Set("netlinkList", Napi::Function::New(env, List));
  exports.Set("netlinkGetLink", Napi::Function::New(env, GetLink));
  exports.Set("netlinkMonitorOpen", Napi::Function::New(env, MonitorOpen));
  exports.Set("netlinkMonitorClose", Napi::Function::New(env, MonitorClose));
}

}  // namespace nlbind
// ---- end netlink bindings ----

// ---- dataplane bindings (src/dataplane/binding.ts is the only caller) ----
namespace dpbind {

Napi::Buffer<uint8_t> BufArg(const Napi::CallbackInfo& info, size_t i, const char* what) {
  if (info.Length() <= i || !info[i].IsBuffer()) {
    throw Napi::TypeError::New(info.Env(), std::string("dataplane: ") + what + " must be a Buffer");
  }
  return info[i].As<Napi::Buffer<uint8_t>>();
}

std::unique_ptr<PeerTable> TableArg(const Napi::CallbackInfo& info, size_t i) {
  Napi::Buffer<uint8_t> b = BufArg(info, i, "peer table");
  std::string error;
  std::unique_ptr<PeerTable> t = PeerTable::Build(b.Data(), b.Length(), &error);
  if (!t) throw Napi::RangeError::New(info.Env(), "dataplane: " + error);
  return t;
}

// Two Buffers of records at info[i], info[i + 1] → a checked delta (peer_table.h).
PeerDelta DeltaArg(const Napi::CallbackInfo& info, size_t i, const char* who) {
  Napi::Buffer<uint8_t> removed = BufArg(info, i, "removed records");
  Napi::Buffer<uint8_t> upserts = BufArg(info, i + 1, "upserted records");
  PeerDelta d;
  std::string error;
  if (!PeerDelta::Parse(removed.Data(), removed.Length(), upserts.Data(), upserts.Length(), &d,
                        &error)) {
    throw Napi::RangeError::New(info.Env(), std::string(who) + ": " + error);
  }
  return d;
}

CodecConfig ConfigArg(const Napi::CallbackInfo& info, size_t i) {
  CodecConfig cfg;
  if (info.Length() <= i || !info[i].IsObject()) {
    throw Napi::TypeError::New(info.Env(), "dataplane: codec config must be an object");
  }
  Napi::Object o = info[i].As<Napi::Object>();
  cfg.vni = o.Get("vni").ToNumber().Uint32Value();
  cfg.tun_mtu = o.Get("tunMtu").ToNumber().Uint32Value();
  Napi::Value mac = o.Get("vtepMac");
  if (mac.IsBuffer() && mac.As<Napi::Buffer<uint8_t>>().Length() == 6) {
    std::memcpy(cfg.vtep_mac, mac.As<Napi::Buffer<uint8_t>>().Data(), 6);
  }
  Napi::Value local = o.Get("localIp");
  if (local.IsBuffer() && local.As<Napi::Buffer<uint8_t>>().Length() == 4) {
    std::memcpy(cfg.local_ip, local.As<Napi::Buffer<uint8_t>>().Data(), 4);
  }
  return cfg;
}

// "udp" | "vxlan" | "ipip" → the framing (codec.h)
Format FormatOf(Napi::Env env, const Napi::Value& v) {
  std::string f = v.IsString() ? v.As<Napi::String>().Utf8Value() : "";
  if (f == "udp") return Format::kUdp;
  if (f == "vxlan") return Format::kVxlan;
  if (f == "ipip") return Format::kIpip;
  if (f == "wireguard") return Format::kWireguard;
  throw Napi::TypeError::New(env, "dataplane: format must be udp, vxlan, ipip or wireguard");
}

// codecEncap(format, table, config, packet) → { drop, peer, payload, icmp }
Napi::Value CodecEncap(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Format format = FormatOf(env, info.Length() > 0 ? info[0] : env.Undefined());
  std::unique_ptr<PeerTable> table = TableArg(info, 1);
  CodecConfig cfg = ConfigArg(info, 2);
  Napi::Buffer<uint8_t> pkt = BufArg(info, 3, "packet");
  const size_t head = EncapHeadroom(format);
  std::vector<uint8_t> work(head + pkt.Length() + 1);
  uint8_t* p = work.data() + head;
  std::memcpy(p, pkt.Data(), pkt.Length());
  std::vector<uint8_t> icmp(kIcmpReplyMax);
  EncapResult r = Encap(format, p, pkt.Length(), *table, cfg, icmp.data(), icmp.size());
  Napi::Object o = Napi::Object::New(env);
  o.Set("drop", kDropReasonNames[static_cast<size_t>(r.drop)]);
  o.Set("peer",
        r.peer ? Napi::Value(Napi::Number::New(env, r.peer - table->records())) : env.Null());
  if (r.drop == DropReason::kNone) {
    o.Set("payload", Napi::Buffer<uint8_t>::Copy(env, p - head, r.payload_len));
  } else {
    o.Set("payload", env.Null());
  }
  o.Set("icmp", r.icmp_len ? Napi::Value(Napi::Buffer<uint8_t>::Copy(env, icmp.data(), r.icmp_len))
                           : env.Null());
  return o;
}

// codecDecap(format, table, config, outerSrc, datagram) → { drop, tun } (tun = vnet hdr + packet)
Napi::Value CodecDecap(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Format format = FormatOf(env, info.Length() > 0 ? info[0] : env.Undefined());
  std::unique_ptr<PeerTable> table = TableArg(info, 1);
  CodecConfig cfg = ConfigArg(info, 2);
  Napi::Buffer<uint8_t> src = BufArg(info, 3, "outer source");
  Napi::Buffer<uint8_t> dgram = BufArg(info, 4, "datagram");
  if (src.Length() != 4 && src.Length() != 16)
    throw Napi::RangeError::New(env, "dataplane: outer source must be 4 or 16 bytes");
  std::vector<uint8_t> work(dgram.Length() + 1);
  std::memcpy(work.data(), dgram.Data(), dgram.Length());
  DecapResult r = Decap(format, work.data(), dgram.Length(), src.Length(), src.Data(), *table, cfg);
  Napi::Object o = Napi::Object::New(env);
  o.Set("drop", kDropReasonNames[static_cast<size_t>(r.drop)]);
  if (r.drop == DropReason::kNone) {
    uint8_t* inner = work.data() + r.inner_off;
    VnetHdr h;
    PrepareTunWrite(inner, r.ip, cfg.tun_mtu, &h);
    Napi::Buffer<uint8_t> out = Napi::Buffer<uint8_t>::New(env, kVnetHdrLen + r.inner_len);
    StoreVnetHdr(out.Data(), h);
    std::memcpy(out.Data() + kVnetHdrLen, inner, r.inner_len);
    o.Set("tun", out);
  } else {
    o.Set("tun", env.Null());
  }
  return o;
}

// vxlanSourcePort(packet) → port, or -1 when the packet does not parse
Napi::Value SourcePort(const Napi::CallbackInfo& info) {
  Napi::Buffer<uint8_t> pkt = BufArg(info, 0, "packet");
  IpInfo ip;
  if (ParseIp(pkt.Data(), pkt.Length(), &ip) != DropReason::kNone)
    return Napi::Number::New(info.Env(), -1);
  return Napi::Number::New(info.Env(), VxlanSourcePort(pkt.Data(), ip));
}

// peerLookup(table, addr) → record index or -1; peerLookup(table, addr[]) → one per address
// (the table is built once for all of them).
Napi::Value PeerLookup(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::unique_ptr<PeerTable> table = TableArg(info, 0);
  auto lookup = [&](const Napi::Value& v) {
    if (!v.IsBuffer()) throw Napi::TypeError::New(env, "dataplane: address must be a Buffer");
    Napi::Buffer<uint8_t> addr = v.As<Napi::Buffer<uint8_t>>();
    if (addr.Length() != 4 && addr.Length() != 16)
      throw Napi::RangeError::New(env, "dataplane: address must be 4 or 16 bytes");
    const PeerRecord* r = table->Lookup(addr.Length(), addr.Data());
    return Napi::Number::New(env, r ? static_cast<double>(r - table->records()) : -1);
  };
  if (info.Length() > 1 && info[1].IsArray()) {
    Napi::Array in = info[1].As<Napi::Array>();
    Napi::Array out = Napi::Array::New(env, in.Length());
    for (uint32_t i = 0; i < in.Length(); i++) out.Set(i, lookup(in.Get(i)));
    return out;
  }
  return lookup(info.Length() > 1 ? info[1] : env.Undefined());
}

// peerTableApply(table, [[removed, upserts], ...], lookups: Buffer[], publics: Buffer[])
//   → { table, lookups, publics }: the table built from `table` with each delta applied in turn,
// as records (peer_table.h format, table order), the record index each lookup address matches
// (-1: none) and whether each public address is a record's. A delta that does not apply throws.
Napi::Value PeerTableApply(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::unique_ptr<PeerTable> table = TableArg(info, 0);
  if (info.Length() < 4 || !info[1].IsArray() || !info[2].IsArray() || !info[3].IsArray()) {
    throw Napi::TypeError::New(env, "peerTableApply(table, deltas, lookups, publics)");
  }
  Napi::Array steps = info[1].As<Napi::Array>();
  for (uint32_t i = 0; i < steps.Length(); i++) {
    Napi::Value step = steps.Get(i);
    if (!step.IsArray())
      throw Napi::TypeError::New(env, "dataplane: a delta is [removed, upserts]");
    Napi::Array pair = step.As<Napi::Array>();
    Napi::Value r = pair.Get(0u), u = pair.Get(1u);
    if (!r.IsBuffer() || !u.IsBuffer())
      throw Napi::TypeError::New(env, "dataplane: a delta is [removed, upserts]");
    auto rb = r.As<Napi::Buffer<uint8_t>>(), ub = u.As<Napi::Buffer<uint8_t>>();
    PeerDelta d;
    std::string error;
    if (!PeerDelta::Parse(rb.Data(), rb.Length(), ub.Data(), ub.Length(), &d, &error) ||
        !table->Check(d, &error)) {
      throw Napi::RangeError::New(env, "dataplane: delta " + std::to_string(i) + ": " + error);
    }
    table->Apply(d);
  }
  Napi::Object o = Napi::Object::New(env);
  Napi::Buffer<uint8_t> out = Napi::Buffer<uint8_t>::New(env, table->size() * kPeerRecordSize);
  std::memset(out.Data(), 0, out.Length());
  for (size_t i = 0; i < table->size(); i++) {
    const PeerRecord& r = table->records()[i];
    uint8_t* p = out.Data() + i * kPeerRecordSize;
    p[0] = r.family;
    p[1] = r.prefix;
    p[2] = r.flags;
    p[3] = r.public_family;
    p[4] = static_cast<uint8_t>(r.port >> 8);
    p[5] = static_cast<uint8_t>(r.port);
    std::memcpy(p + 6, r.vtep_mac, 6);
    std::memcpy(p + 16, r.subnet, 16);
    std::memcpy(p + 32, r.public_ip, 16);
  }
  o.Set("table", out);
  for (const char* what : {"lookups", "publics"}) {
    bool pub = what[0] == 'p';
    Napi::Array in = info[pub ? 3 : 2].As<Napi::Array>();
    Napi::Array res = Napi::Array::New(env, in.Length());
    for (uint32_t i = 0; i < in.Length(); i++) {
      Napi::Value v = in.Get(i);
      if (!v.IsBuffer()) throw Napi::TypeError::New(env, "dataplane: address must be a Buffer");
      auto a = v.As<Napi::Buffer<uint8_t>>();
      if (a.Length() != 4 && a.Length() != 16)
        throw Napi::RangeError::New(env, "dataplane: address must be 4 or 16 bytes");
      if (pub) {
        res.Set(i, Napi::Boolean::New(env, table->HasPublic(a.Length(), a.Data())));
      } else {
        const PeerRecord* r = table->Lookup(a.Length(), a.Data());
        res.Set(i, Napi::Number::New(env, r ? static_cast<double>(r - table->records()) : -1));
      }
    }
    o.Set(what, res);
  }
  return o;
}

Napi::Array BufferArray(Napi::Env env, const std::vector<Bytes>& bufs) {
  Napi::Array out = Napi::Array::New(env, bufs.size());
  for (size_t i = 0; i < bufs.size(); i++) {
    out.Set(static_cast<uint32_t>(i),
            Napi::Buffer<uint8_t>::Copy(env, bufs[i].data(), bufs[i].size()));
  }
  return out;
}

// tsoSplit(vnetHdrAndPacket, inPlace?) → Buffer[] segments (harness.h TsoSplitForTest)
Napi::Value TsoSplit(const Napi::CallbackInfo& info) {
  Napi::Buffer<uint8_t> b = BufArg(info, 0, "packet");
  bool in_place = info.Length() > 1 && info[1].ToBoolean().Value();
  return BufferArray(info.Env(), TsoSplitForTest(b.Data(), b.Length(), in_place));
}

// groCoalesce(packets, tunMtu, gather?, udp?, authenticated?) → Buffer[] TUN writes
// (harness.h GroCoalesceForTest)
Napi::Value GroCoalesce(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 2 || !info[0].IsArray())
    throw Napi::TypeError::New(env, "dataplane: packets");
  Napi::Array in = info[0].As<Napi::Array>();
  uint32_t mtu = info[1].ToNumber().Uint32Value();
  bool gather = info.Length() > 2 && info[2].ToBoolean().Value();
  bool udp = info.Length() > 3 && info[3].ToBoolean().Value();
  bool authenticated = info.Length() > 4 && info[4].ToBoolean().Value();
  std::vector<Bytes> packets(in.Length());
  for (uint32_t i = 0; i < in.Length(); i++) {
    Napi::Value v = in.Get(i);
    if (!v.IsBuffer()) throw Napi::TypeError::New(env, "dataplane: packet must be a Buffer");
    Napi::Buffer<uint8_t> b = v.As<Napi::Buffer<uint8_t>>();
    packets[i].assign(b.Data(), b.Data() + b.Length());
  }
  return BufferArray(env, GroCoalesceForTest(packets, mtu, gather, udp, authenticated));
}

// checksum(buf) → the Internet checksum of buf
Napi::Value InetChecksum(const Napi::CallbackInfo& info) {
  Napi::Buffer<uint8_t> b = BufArg(info, 0, "data");
  return Napi::Number::New(info.Env(), Checksum(b.Data(), b.Length()));
}

Napi::Value DropReasons(const Napi::CallbackInfo& info) {
  Napi::Array a = Napi::Array::New(info.Env());
  for (size_t i = 0; i < static_cast<size_t>(DropReason::kCount); i++)
    a.Set(static_cast<uint32_t>(i), kDropReasonNames[i]);
  return a;
}

void DefineCodec(Napi::Env env, Napi::Object exports) {
  exports.Set("codecEncap", Napi::Function::New(env, CodecEncap));
  exports.Set("codecDecap", Napi::Function::New(env, CodecDecap));
  exports.Set("vxlanSourcePort", Napi::Function::New(env, SourcePort));
  exports.Set("peerLookup", Napi::Function::New(env, PeerLookup));
  exports.Set("peerTableApply", Napi::Function::New(env, PeerTableApply));
  exports.Set("checksum", Napi::Function::New(env, InetChecksum));
  exports.Set("tsoSplit", Napi::Function::New(env, TsoSplit));
  exports.Set("groCoalesce", Napi::Function::New(env, GroCoalesce));
  exports.Set("dropReasons", Napi::Function::New(env, DropReasons));
}

// Engines are process-wide: the main thread creates one and sets its peers, worker threads
// (each with its own addon instance) enter Run by id. shared_ptr keeps an engine (and its fds)
// alive until the last Run returns after engineClose.
std::mutex g_engines_mu;
std::map<uint32_t, std::shared_ptr<Engine>> g_engines;
uint32_t g_next_engine = 1;

std::shared_ptr<Engine> EngineArg(const Napi::CallbackInfo& info) {
  if (info.Length() < 1 || !info[0].IsNumber())
    throw Napi::TypeError::New(info.Env(), "dataplane: engine id");
  uint32_t id = info[0].As<Napi::Number>().Uint32Value();
  std::lock_guard<std::mutex> lock(g_engines_mu);
  auto it = g_engines.find(id);
  if (it == g_engines.end())
    throw Napi::Error::New(info.Env(), "dataplane: engine " + std::to_string(id) + " is closed");
  return it->second;
}

// offloads: an array of offloads.h names → their bits (unknown names refused)
unsigned OffloadsArg(Napi::Env env, const Napi::Value& v) {
  if (v.IsUndefined()) return 0;
  if (!v.IsArray())
    throw Napi::TypeError::New(env, "dataplane: offloads must be an array of names");
  Napi::Array a = v.As<Napi::Array>();
  unsigned bits = 0;
  for (uint32_t i = 0; i < a.Length(); i++) {
    std::string name = a.Get(i).ToString().Utf8Value();
    unsigned bit = OffloadBit(name.c_str());
    if (bit == 0) throw Napi::TypeError::New(env, "dataplane: unknown offload " + name);
    bits |= bit;
  }
  return bits;
}

// The names of the offloads.h bits set in `bits`, in kOffloadNames order.
Napi::Array OffloadNames(Napi::Env env, unsigned bits) {
  Napi::Array a = Napi::Array::New(env);
  uint32_t n = 0;
  for (const OffloadName& o : kOffloadNames) {
    if ((bits & o.bit) != 0) a.Set(n++, o.name);
  }
  return a;
}

// offloadNames() → every offload name the engine knows (offloads.h), in order
Napi::Value AllOffloadNames(const Napi::CallbackInfo& info) {
  return OffloadNames(info.Env(), ~0u);
}

// engineCreate({format, tunName, workers, bindIp, port, sockBufBytes, offloads, busyPollUs, vni,
// vtepMac, tunMtu, cpuAffine, steering, steeringGapUs, tapName, tapProbeFail, fifoPriority,
// persist}) → {id, tunName, offloadsAccepted, offloadsEnabled, steering, affinityNote, tapName,
// tapNote, fifoNote}; offloads are names (offloads.h) both ways.
Napi::Value EngineCreate(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsObject())
    throw Napi::TypeError::New(env, "dataplane: engine config");
  Napi::Object o = info[0].As<Napi::Object>();
  EngineConfig cfg;
  cfg.format = FormatOf(env, o.Get("format"));
  cfg.tun_name = o.Get("tunName").ToString().Utf8Value();
  cfg.workers = o.Get("workers").ToNumber().Int32Value();
  cfg.bind_ip = o.Get("bindIp").ToString().Utf8Value();
  if (o.Get("bindIp6").IsString()) cfg.bind_ip6 = o.Get("bindIp6").ToString().Utf8Value();
  cfg.port = static_cast<uint16_t>(o.Get("port").ToNumber().Uint32Value());
  if (o.Get("sockBufBytes").IsNumber())
    cfg.sock_buf_bytes = o.Get("sockBufBytes").ToNumber().Int32Value();
  cfg.offloads = OffloadsArg(env, o.Get("offloads"));
  cfg.cpu_affine = o.Get("cpuAffine").ToBoolean().Value();
  if (o.Get("steering").IsBoolean()) cfg.steering = o.Get("steering").ToBoolean().Value();
  if (o.Get("steeringGapUs").IsNumber()) {
    int64_t us = o.Get("steeringGapUs").ToNumber().Int64Value();
    if (us < 0) throw Napi::RangeError::New(env, "dataplane: steeringGapUs must be >= 0");
    cfg.steering_gap_ns = static_cast<uint64_t>(us) * 1000;
  }
  cfg.persist = o.Get("persist").ToBoolean().Value();
  if (o.Get("busyPollUs").IsNumber())
    cfg.busy_poll_us = o.Get("busyPollUs").ToNumber().Int32Value();
  if (o.Get("tapName").IsString()) cfg.tap_name = o.Get("tapName").ToString().Utf8Value();
  cfg.tap_probe_fail = o.Get("tapProbeFail").ToBoolean().Value();
  if (o.Get("tapFailAt").IsNumber()) cfg.tap_fail_at = o.Get("tapFailAt").ToNumber().Int64Value();
  if (o.Get("fifoPriority").IsNumber())
    cfg.fifo_priority = o.Get("fifoPriority").ToNumber().Int32Value();
  cfg.codec = ConfigArg(info, 0);
  if (cfg.format == Format::kWireguard) {
    Napi::Value key = o.Get("wgPrivateKey");
    if (!key.IsBuffer() || key.As<Napi::Buffer<uint8_t>>().Length() != 32)
      throw Napi::TypeError::New(env, "dataplane: wgPrivateKey must be a 32-byte Buffer");
    std::memcpy(cfg.wg_private_key, key.As<Napi::Buffer<uint8_t>>().Data(), 32);
    Napi::Value psk = o.Get("wgPsk");
    if (psk.IsBuffer()) {
      if (psk.As<Napi::Buffer<uint8_t>>().Length() != 32)
        throw Napi::TypeError::New(env, "dataplane: wgPsk must be a 32-byte Buffer");
      std::memcpy(cfg.wg_psk, psk.As<Napi::Buffer<uint8_t>>().Data(), 32);
      cfg.wg_has_psk = true;
    }
    cfg.wg_greet = o.Get("wgGreet").ToBoolean().Value();
  }
  std::string error;
  std::unique_ptr<Engine> e = Engine::Create(cfg, &error);
  wg::Wipe(cfg.wg_private_key, sizeof(cfg.wg_private_key));
  wg::Wipe(cfg.wg_psk, sizeof(cfg.wg_psk));
  if (!e) throw Napi::Error::New(env, "dataplane: " + error);
  Napi::Object out = Napi::Object::New(env);
  out.Set("tunName", e->tun_name());
  out.Set("offloadsAccepted", OffloadNames(env, e->offloads_accepted()));
  out.Set("offloadsEnabled", OffloadNames(env, e->offloads_enabled()));
  out.Set("steering", e->steering());
  out.Set("affinityNote", e->affinity_note());
  out.Set("tapName", e->tap_name());
  out.Set("tapNote", e->tap_note());
  out.Set("fifoNote", e->fifo_note());
  if (e->wg_public_key() != nullptr)
    out.Set("wgPublicKey", Napi::Buffer<uint8_t>::Copy(env, e->wg_public_key(), 32));
  std::lock_guard<std::mutex> lock(g_engines_mu);
  uint32_t id = g_next_engine++;
  g_engines[id] = std::shared_ptr<Engine>(e.release());
  out.Set("id", id);
  return out;
}

// engineRun(id, worker, direction = 0) → 0 or an errno; blocks until engineStop/engineClose.
// direction: 0 both, 1 TUN → UDP only, 2 UDP → TUN only (a queue runs 0, or 1 and 2).
Napi::Value EngineRun(const Napi::CallbackInfo& info) {
  std::shared_ptr<Engine> e = EngineArg(info);
  int w = info.Length() > 1 ? info[1].ToNumber().Int32Value() : -1;
  int dir = info.Length() > 2 ? info[2].ToNumber().Int32Value() : 0;
  if (dir < 0 || dir > 2) return Napi::Number::New(info.Env(), EINVAL);
  int rc = e->Run(w, static_cast<Direction>(dir));
  return Napi::Number::New(info.Env(), rc);
}

Napi::Value EngineStop(const Napi::CallbackInfo& info) {
  EngineArg(info)->Stop();
  return info.Env().Undefined();
}

Napi::Value EngineClose(const Napi::CallbackInfo& info) {
  std::shared_ptr<Engine> e;
  if (info.Length() > 0 && info[0].IsNumber()) {
    uint32_t id = info[0].As<Napi::Number>().Uint32Value();
    std::lock_guard<std::mutex> lock(g_engines_mu);
    auto it = g_engines.find(id);
    if (it != g_engines.end()) {
      e = it->second;
      g_engines.erase(it);
    }
  }
  if (e) e->Stop();
  return info.Env().Undefined();
}

// engineStopAll() → how many engines were told to stop: every loop of every engine leaves. For
// process exit: Node joins its worker threads, which it cannot while they sit in a loop.
Napi::Value EngineStopAll(const Napi::CallbackInfo& info) {
  std::vector<std::shared_ptr<Engine>> all;
  {
    std::lock_guard<std::mutex> lock(g_engines_mu);
    for (auto& kv : g_engines) all.push_back(kv.second);
  }
  for (auto& e : all) e->Stop();
  return Napi::Number::New(info.Env(), static_cast<double>(all.size()));
}

// exitWatchdog(ms, code): a detached thread ends the process with `code` after `ms` unless it
// has ended by then (_exit: no exit handlers, no thread joins). Armed when the process exits.
Napi::Value ExitWatchdog(const Napi::CallbackInfo& info) {
  int ms = info.Length() > 0 ? info[0].ToNumber().Int32Value() : 2000;
  int code = info.Length() > 1 ? info[1].ToNumber().Int32Value() : 1;
  std::thread([ms, code] {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    _exit(code);
  }).detach();
  return info.Env().Undefined();
}

Napi::Value EngineSetPeers(const Napi::CallbackInfo& info) {
  std::shared_ptr<Engine> e = EngineArg(info);
  Napi::Buffer<uint8_t> b = BufArg(info, 1, "peer table");
  std::string error;
  if (!e->SetPeers(b.Data(), b.Length(), &error))
    throw Napi::RangeError::New(info.Env(), "dataplane: " + error);
  return Napi::Number::New(info.Env(), static_cast<double>(e->peer_count()));
}

// engineSetWgPeers(id, records) → WireGuard peers after the change (wg_engine.h records)
Napi::Value EngineSetWgPeers(const Napi::CallbackInfo& info) {
  std::shared_ptr<Engine> e = EngineArg(info);
  Napi::Buffer<uint8_t> b = BufArg(info, 1, "wireguard peers");
  std::string error;
  if (!e->SetWgPeers(b.Data(), b.Length(), &error))
    throw Napi::RangeError::New(info.Env(), "dataplane: " + error);
  return Napi::Number::New(info.Env(), static_cast<double>(e->wg_peer_count()));
}

// An address (family 4 | 6) as text: inet_ntop's form (IPv6 compressed, no brackets).
std::string AddrText(uint8_t family, const uint8_t* addr) {
  char text[INET6_ADDRSTRLEN] = {};
  inet_ntop(family == 4 ? AF_INET : AF_INET6, addr, text, sizeof(text));
  return text;
}

// engineWgState(id) → the WireGuard device as `wg show` reports it, or null (another format):
// {publicKey, listenPort, peers: [{publicKey, hasPsk, endpoint: {address, port} | null,
// allowedIps: ["net/len"], lastHandshakeSec, lastHandshakeNsec, rxBytes, txBytes,
// persistentKeepalive}]}. A copy (Engine::WgState); byte counts are exact below 2^53.
Napi::Value EngineWgState(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::shared_ptr<Engine> e = EngineArg(info);
  WgDeviceState st;
  if (!e->WgState(&st)) return env.Null();
  Napi::Object out = Napi::Object::New(env);
  out.Set("publicKey", Napi::Buffer<uint8_t>::Copy(env, st.public_key, wg::kKeyLen));
  out.Set("listenPort", st.listen_port);
  Napi::Array peers = Napi::Array::New(env, st.peers.size());
  for (size_t i = 0; i < st.peers.size(); i++) {
    const WgPeerState& p = st.peers[i];
    Napi::Object o = Napi::Object::New(env);
    o.Set("publicKey", Napi::Buffer<uint8_t>::Copy(env, p.public_key, wg::kKeyLen));
    o.Set("hasPsk", p.has_psk);
    if (p.family == 4 || p.family == 6) {
      Napi::Object ep = Napi::Object::New(env);
      ep.Set("address", AddrText(p.family, p.addr));
      ep.Set("port", p.port);
      o.Set("endpoint", ep);
    } else {
      o.Set("endpoint", env.Null());
    }
    Napi::Array allowed = Napi::Array::New(env, st.allowed_ips[i].size());
    for (size_t k = 0; k < st.allowed_ips[i].size(); k++) {
      const WgAllowedIp& a = st.allowed_ips[i][k];
      allowed.Set(static_cast<uint32_t>(k),
                  AddrText(a.family, a.addr) + "/" + std::to_string(a.prefix));
    }
    o.Set("allowedIps", allowed);
    o.Set("lastHandshakeSec", static_cast<double>(p.last_handshake_wall_ns / 1000000000ull));
    o.Set("lastHandshakeNsec", static_cast<double>(p.last_handshake_wall_ns % 1000000000ull));
    o.Set("rxBytes", static_cast<double>(p.rx_bytes));
    o.Set("txBytes", static_cast<double>(p.tx_bytes));
    o.Set("persistentKeepalive", p.keepalive_s);
    peers.Set(static_cast<uint32_t>(i), o);
  }
  out.Set("peers", peers);
  return out;
}

// engineUpdatePeers(id, removed, upserts) → peers in the table after the change
Napi::Value EngineUpdatePeers(const Napi::CallbackInfo& info) {
  std::shared_ptr<Engine> e = EngineArg(info);
  PeerDelta d = DeltaArg(info, 1, "dataplane");
  std::string error;
  if (!e->UpdatePeers(d, &error)) throw Napi::RangeError::New(info.Env(), "dataplane: " + error);
  return Napi::Number::New(info.Env(), static_cast<double>(e->peer_count()));
}

// engineCounters(id) → Float64Array of workers × counterNames().length
Napi::Value EngineCounters(const Napi::CallbackInfo& info) {
  std::shared_ptr<Engine> e = EngineArg(info);
  Napi::Float64Array out =
      Napi::Float64Array::New(info.Env(), static_cast<size_t>(e->workers()) * kCounterCount);
  uint64_t tmp[kCounterCount];
  for (int w = 0; w < e->workers(); w++) {
    e->ReadCounters(w, tmp);
    for (uint32_t i = 0; i < kCounterCount; i++)
      out[w * kCounterCount + i] = static_cast<double>(tmp[i]);
  }
  return out;
}

Napi::Value CounterNames(const Napi::CallbackInfo& info) {
  Napi::Array a = Napi::Array::New(info.Env());
  uint32_t n = 0;
  for (const char* s : kCounterNames) a.Set(n++, s);
  for (size_t i = 0; i < static_cast<size_t>(DropReason::kCount); i++)
    a.Set(n++, std::string("drop_") + kDropReasonNames[i]);
  return a;
}

// tunOpen(name) → { fd, name }: a plain TUN queue (IFF_TUN | IFF_NO_PI, non-blocking) for the
// js engine, which cannot issue TUNSETIFF itself.
Napi::Value TunOpen(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string name =
      info.Length() > 0 && info[0].IsString() ? info[0].As<Napi::String>().Utf8Value() : "";
  std::string actual, error;
  int fd = OpenPlainTun(name, &actual, &error);
  if (fd < 0) throw Napi::Error::New(env, "dataplane: " + error);
  Napi::Object o = Napi::Object::New(env);
  o.Set("fd", fd);
  o.Set("name", actual);
  return o;
}

void DefineEngine(Napi::Env env, Napi::Object exports) {
  exports.Set("tunOpen", Napi::Function::New(env, TunOpen));
  exports.Set("engineCreate", Napi::Function::New(env, EngineCreate));
  exports.Set("engineRun", Napi::Function::New(env, EngineRun));
  exports.Set("engineStop", Napi::Function::New(env, EngineStop));
  exports.Set("engineClose", Napi::Function::New(env, EngineClose));
  exports.Set("engineStopAll", Napi::Function::New(env, EngineStopAll));
  exports.Set("exitWatchdog", Napi::Function::New(env, ExitWatchdog));
  exports.Set("engineSetPeers", Napi::Function::New(env, EngineSetPeers));
  exports.Set("engineSetWgPeers", Napi::Function::New(env, EngineSetWgPeers));
  exports.Set("engineWgState", Napi::Function::New(env, EngineWgState));
  exports.Set("engineUpdatePeers", Napi::Function::New(env, EngineUpdatePeers));
  exports.Set("engineCounters", Napi::Function::New(env, EngineCounters));
  exports.Set("counterNames", Napi::Function::New(env, CounterNames));
  exports.Set("offloadNames", Napi::Function::New(env, AllOffloadNames));
}

}  // namespace dpbind
// ---- end dataplane bindings ----

// ---- bpf engine bindings (src/dataplane/bpf-engine.ts is the only caller) ----
namespace bpfbind {

std::mutex g_mu;
std::map<uint32_t, std::shared_ptr<BpfEngine>> g_bpf;
uint32_t g_next_id = 1;

std::shared_ptr<BpfEngine> Arg(const Napi::CallbackInfo& info) {
  uint32_t id =
      info.Length() > 0 && info[0].IsNumber() ? info[0].As<Napi::Number>().Uint32Value() : 0;
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_bpf.find(id);
  if (it == g_bpf.end()) throw Napi::Error::New(info.Env(), "bpf: no such engine");
  return it->second;
}

uint32_t IfindexOf(Napi::Env env, const Napi::Value& v, const char* what) {
  if (v.IsNumber()) return v.As<Napi::Number>().Uint32Value();
  if (!v.IsString())
    throw Napi::TypeError::New(env, std::string("bpf: ") + what + " must be a device name");
  std::string name = v.As<Napi::String>().Utf8Value();
  uint32_t i = if_nametoindex(name.c_str());
  if (!i)
    throw Napi::Error::New(env,
                           std::string("bpf: ") + what + " " + name + ": " + std::strerror(errno));
  return i;
}

// bpfLoad(objectPath) → id: opens and loads the programs (the verifier runs here).
Napi::Value Load(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsString())
    throw Napi::TypeError::New(env, "bpfLoad(objectPath)");
  std::string error;
  std::unique_ptr<BpfEngine> e = BpfEngine::Load(info[0].As<Napi::String>().Utf8Value(), &error);
  if (!e) throw Napi::Error::New(env, "bpf: " + error);
  std::lock_guard<std::mutex> lock(g_mu);
  uint32_t id = g_next_id++;
  g_bpf[id] = std::shared_ptr<BpfEngine>(e.release());
  return Napi::Number::New(env, id);
}

// bpfConfigure(id, { format, vni, vtepMac, port, localV4?, localV6?, tun?, underlay? })
Napi::Value Configure(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::shared_ptr<BpfEngine> e = Arg(info);
  if (info.Length() < 2 || !info[1].IsObject())
    throw Napi::TypeError::New(env, "bpfConfigure(id, config)");
  Napi::Object o = info[1].As<Napi::Object>();
  BpfConfig c;
  switch (dpbind::FormatOf(env, o.Get("format"))) {
    case Format::kUdp:
      c.format = WEFT_FORMAT_UDP;
      break;
    case Format::kVxlan:
      c.format = WEFT_FORMAT_VXLAN;
      break;
    case Format::kIpip:
      c.format = WEFT_FORMAT_IPIP;
      break;
    case Format::kWireguard:
      throw Napi::TypeError::New(env, "bpfConfigure: the programs have no WireGuard framing");
  }
  c.vni = o.Get("vni").ToNumber().Uint32Value();
  c.port = static_cast<uint16_t>(o.Get("port").ToNumber().Uint32Value());
  Napi::Value mac = o.Get("vtepMac");
  if (!mac.IsBuffer() || mac.As<Napi::Buffer<uint8_t>>().Length() != 6)
    throw Napi::TypeError::New(env, "bpf: vtepMac must be 6 bytes");
  std::memcpy(c.vtep_mac, mac.As<Napi::Buffer<uint8_t>>().Data(), 6);
  // Our underlay addresses: IPv4, IPv6 or both (dual-stack); at least one.
  bool any = false;
  if (o.Has("localV4") && !o.Get("localV4").IsUndefined()) {
    std::string local = o.Get("localV4").ToString().Utf8Value();
    if (inet_pton(AF_INET, local.c_str(), c.local_v4) != 1)
      throw Napi::TypeError::New(env, "bpf: localV4 " + local + " is not an IPv4 address");
    any = true;
  }
  if (o.Has("localV6") && !o.Get("localV6").IsUndefined()) {
    std::string local = o.Get("localV6").ToString().Utf8Value();
    if (inet_pton(AF_INET6, local.c_str(), c.local_v6) != 1)
      throw Napi::TypeError::New(env, "bpf: localV6 " + local + " is not an IPv6 address");
    any = true;
  }
  if (!any) throw Napi::TypeError::New(env, "bpf: localV4 or localV6 is required");
  if (o.Has("tun")) c.tun_ifindex = IfindexOf(env, o.Get("tun"), "tun");
  if (o.Has("underlay")) c.underlay_ifindex = IfindexOf(env, o.Get("underlay"), "underlay");
  int rc = e->Configure(c);
  if (rc < 0) throw Napi::Error::New(env, std::string("bpf: config map: ") + std::strerror(-rc));
  return env.Undefined();
}

Napi::Value SetPeers(const Napi::CallbackInfo& info) {
  std::shared_ptr<BpfEngine> e = Arg(info);
  if (info.Length() < 2 || !info[1].IsBuffer())
    throw Napi::TypeError::New(info.Env(), "bpfSetPeers(id, table)");
  Napi::Buffer<uint8_t> b = info[1].As<Napi::Buffer<uint8_t>>();
  std::string error;
  if (!e->SetPeers(b.Data(), b.Length(), &error))
    throw Napi::RangeError::New(info.Env(), "bpf: " + error);
  return info.Env().Undefined();
}

// bpfUpdatePeers(id, removed, upserts): the peer maps changed by the delta alone
Napi::Value UpdatePeers(const Napi::CallbackInfo& info) {
  std::shared_ptr<BpfEngine> e = Arg(info);
  PeerDelta d = dpbind::DeltaArg(info, 1, "bpf");
  std::string error;
  if (!e->UpdatePeers(d, &error)) throw Napi::RangeError::New(info.Env(), "bpf: " + error);
  return info.Env().Undefined();
}

// bpfTestRun(id, 'tx' | 'rx', frame, gsoSize = 0, gsoSegs = 0) → { verdict, data }
Napi::Value TestRun(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::shared_ptr<BpfEngine> e = Arg(info);
  if (info.Length() < 3 || !info[1].IsString() || !info[2].IsBuffer())
    throw Napi::TypeError::New(env, "bpfTestRun(id, 'tx'|'rx', frame)");
  BpfProgram p = info[1].As<Napi::String>().Utf8Value() == "rx" ? BpfProgram::kRx : BpfProgram::kTx;
  Napi::Buffer<uint8_t> in = info[2].As<Napi::Buffer<uint8_t>>();
  uint32_t gso_size = info.Length() > 3 ? info[3].ToNumber().Uint32Value() : 0;
  uint32_t gso_segs = info.Length() > 4 ? info[4].ToNumber().Uint32Value() : 0;
  int verdict = 0;
  std::vector<uint8_t> out;
  int rc = e->TestRun(p, in.Data(), in.Length(), gso_size, gso_segs, &verdict, &out);
  if (rc < 0) throw Napi::Error::New(env, std::string("bpf: test run: ") + std::strerror(-rc));
  Napi::Object o = Napi::Object::New(env);
  o.Set("verdict", verdict);
  o.Set("data", Napi::Buffer<uint8_t>::Copy(env, out.data(), out.size()));
  return o;
}

// bpfAttach(id, tun, underlay, mode = 'auto' | 'tcx' | 'clsact', pinDir = '')
//   → { mode: 'tcx' | 'clsact', adopted: string[], replaced: string[] } (bpf_loader.h Attach)
Napi::Value Attach(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::shared_ptr<BpfEngine> e = Arg(info);
  if (info.Length() < 3)
    throw Napi::TypeError::New(env, "bpfAttach(id, tun, underlay, mode, pinDir)");
  uint32_t tun = IfindexOf(env, info[1], "tun");
  uint32_t underlay = IfindexOf(env, info[2], "underlay");
  std::string want =
      info.Length() > 3 && info[3].IsString() ? info[3].As<Napi::String>().Utf8Value() : "auto";
  std::string pin_dir =
      info.Length() > 4 && info[4].IsString() ? info[4].As<Napi::String>().Utf8Value() : "";
  BpfAttachMode m = want == "tcx"      ? BpfAttachMode::kTcx
                    : want == "clsact" ? BpfAttachMode::kClsact
                                       : BpfAttachMode::kNone;
  std::string error;
  std::vector<std::string> adopted, replaced;
  BpfAttachMode got = e->Attach(tun, underlay, m, pin_dir, &adopted, &replaced, &error);
  if (got == BpfAttachMode::kNone) throw Napi::Error::New(env, "bpf: attach: " + error);
  auto list = [&](const std::vector<std::string>& v) {
    Napi::Array a = Napi::Array::New(env, v.size());
    for (size_t i = 0; i < v.size(); i++) a.Set(static_cast<uint32_t>(i), v[i]);
    return a;
  };
  Napi::Object o = Napi::Object::New(env);
  o.Set("mode", got == BpfAttachMode::kTcx ? "tcx" : "clsact");
  o.Set("adopted", list(adopted));
  o.Set("replaced", list(replaced));
  return o;
}

// bpfTakeOver(id) → n: this engine's programs on the links bpfAttach adopted.
Napi::Value TakeOver(const Napi::CallbackInfo& info) {
  int rc = Arg(info)->TakeOver();
  if (rc < 0)
    throw Napi::Error::New(info.Env(), std::string("bpf: link update: ") + std::strerror(-rc));
  return Napi::Number::New(info.Env(), rc);
}

// bpfPinInfo(path) → { kind, id, linkType, progId, progName, ifindex, attachType } | null
Napi::Value PinInfo(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsString()) throw Napi::TypeError::New(env, "bpfPinInfo(path)");
  BpfPinInfo p = DescribeBpfPin(info[0].As<Napi::String>().Utf8Value());
  if (p.kind.empty()) return env.Null();
  Napi::Object o = Napi::Object::New(env);
  o.Set("kind", p.kind);
  o.Set("id", p.id);
  o.Set("linkType", p.link_type);
  o.Set("progId", p.prog_id);
  o.Set("progName", p.prog_name);
  o.Set("ifindex", p.ifindex);
  o.Set("attachType", p.attach_type);
  return o;
}

// bpfTcxProgs(dev, 'ingress' | 'egress') → program ids attached there with tcx (this namespace).
Napi::Value TcxProgs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 2 || !info[1].IsString())
    throw Napi::TypeError::New(env, "bpfTcxProgs(dev, 'ingress'|'egress')");
  uint32_t ifindex = IfindexOf(env, info[0], "dev");
  std::vector<uint32_t> ids;
  int rc = TcxProgIds(ifindex, info[1].As<Napi::String>().Utf8Value() == "ingress", &ids);
  if (rc < 0) throw Napi::Error::New(env, std::string("bpf: tcx query: ") + std::strerror(-rc));
  Napi::Array a = Napi::Array::New(env, ids.size());
  for (size_t i = 0; i < ids.size(); i++) a.Set(static_cast<uint32_t>(i), ids[i]);
  return a;
}

// bpfUnpin(dir) → n: weft's pins in dir (tx, rx, bridge) removed (links detached first), and
// dir once empty; throws (nothing touched) for a directory UntrustedPinDir refuses.
Napi::Value Unpin(const Napi::CallbackInfo& info) {
  if (info.Length() < 1 || !info[0].IsString())
    throw Napi::TypeError::New(info.Env(), "bpfUnpin(dir)");
  std::string dir = info[0].As<Napi::String>().Utf8Value();
  int n = UnpinBpfDir(dir);
  if (n < 0) throw Napi::Error::New(info.Env(), "bpfUnpin: " + UntrustedPinDir(dir));
  return Napi::Number::New(info.Env(), n);
}

// bpfSetPorts(id, records): the bridge's ports by MAC (12-byte records, bpf_loader.h SetPorts).
Napi::Value SetPorts(const Napi::CallbackInfo& info) {
  std::shared_ptr<BpfEngine> e = Arg(info);
  if (info.Length() < 2 || !info[1].IsBuffer())
    throw Napi::TypeError::New(info.Env(), "bpfSetPorts(id, records)");
  Napi::Buffer<uint8_t> b = info[1].As<Napi::Buffer<uint8_t>>();
  std::string error;
  if (!e->SetPorts(b.Data(), b.Length(), &error))
    throw Napi::RangeError::New(info.Env(), "bpf: " + error);
  return info.Env().Undefined();
}

// bpfAttachBridge(id, bridge) → ifindex: weft_bridge on that device's egress (tcx; a name is
// resolved in this process's network namespace); 0 detaches it.
Napi::Value AttachBridge(const Napi::CallbackInfo& info) {
  std::shared_ptr<BpfEngine> e = Arg(info);
  if (info.Length() < 2) throw Napi::TypeError::New(info.Env(), "bpfAttachBridge(id, bridge)");
  uint32_t ifindex = IfindexOf(info.Env(), info[1], "bridge");
  int rc = e->AttachBridge(ifindex);
  if (rc < 0)
    throw Napi::Error::New(info.Env(), std::string("bpf: bridge tcx link: ") + std::strerror(-rc));
  return Napi::Number::New(info.Env(), ifindex);
}

Napi::Value Counters(const Napi::CallbackInfo& info) {
  std::vector<uint64_t> c = Arg(info)->Counters();
  Napi::Float64Array out = Napi::Float64Array::New(info.Env(), c.size());
  for (size_t i = 0; i < c.size(); i++) out[i] = static_cast<double>(c[i]);
  return out;
}

Napi::Value ObjectIds(const Napi::CallbackInfo& info) {
  std::vector<uint32_t> ids = Arg(info)->ObjectIds();
  Napi::Array a = Napi::Array::New(info.Env(), ids.size());
  for (size_t i = 0; i < ids.size(); i++) a.Set(static_cast<uint32_t>(i), ids[i]);
  return a;
}

// bpfCounterNames() → the programs' counter slots, in order (weft_abi.h).
Napi::Value CounterNames(const Napi::CallbackInfo& info) {
  std::vector<std::string> names = BpfCounterNames();
  Napi::Array a = Napi::Array::New(info.Env(), names.size());
  for (size_t i = 0; i < names.size(); i++) a.Set(static_cast<uint32_t>(i), names[i]);
  return a;
}

// bpfAbi() → { structs: [{ name, size, members: [{ name, offset, size }] }], programs, maps }:
// the loader's view of weft_abi.h (test/native/bpf-abi.test.ts compares it with the BTF).
Napi::Value Abi(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto strings = [&](const std::vector<std::string>& v) {
    Napi::Array a = Napi::Array::New(env, v.size());
    for (size_t i = 0; i < v.size(); i++) a.Set(static_cast<uint32_t>(i), v[i]);
    return a;
  };
  std::vector<BpfAbiStruct> structs = BpfAbiStructs();
  Napi::Array sa = Napi::Array::New(env, structs.size());
  for (size_t i = 0; i < structs.size(); i++) {
    Napi::Object so = Napi::Object::New(env);
    so.Set("name", structs[i].name);
    so.Set("size", static_cast<double>(structs[i].size));
    Napi::Array ma = Napi::Array::New(env, structs[i].members.size());
    for (size_t j = 0; j < structs[i].members.size(); j++) {
      const BpfAbiMember& m = structs[i].members[j];
      Napi::Object mo = Napi::Object::New(env);
      mo.Set("name", m.name);
      mo.Set("offset", static_cast<double>(m.offset));
      mo.Set("size", static_cast<double>(m.size));
      ma.Set(static_cast<uint32_t>(j), mo);
    }
    so.Set("members", ma);
    sa.Set(static_cast<uint32_t>(i), so);
  }
  Napi::Object o = Napi::Object::New(env);
  o.Set("structs", sa);
  o.Set("programs", strings(BpfProgramNames()));
  o.Set("maps", strings(BpfMapNames()));
  return o;
}

// bpfClose(id, keepPinned = false): detaches and frees programs, maps and links, and removes
// their pins (idempotent); keepPinned: the pinned links stay attached (bpf_loader.h Detach).
Napi::Value Close(const Napi::CallbackInfo& info) {
  std::shared_ptr<BpfEngine> e;
  if (info.Length() > 0 && info[0].IsNumber()) {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_bpf.find(info[0].As<Napi::Number>().Uint32Value());
    if (it != g_bpf.end()) {
      e = it->second;
      g_bpf.erase(it);
    }
  }
  if (e) e->Detach(info.Length() > 1 && info[1].ToBoolean().Value());
  return info.Env().Undefined();
}

void Define(Napi::Env env, Napi::Object exports) {
  exports.Set("bpfLoad", Napi::Function::New(env, Load));
  exports.Set("bpfConfigure", Napi::Function::New(env, Configure));
  exports.Set("bpfSetPeers", Napi::Function::New(env, SetPeers));
  exports.Set("bpfUpdatePeers", Napi::Function::New(env, UpdatePeers));
  exports.Set("bpfTestRun", Napi::Function::New(env, TestRun));
  exports.Set("bpfAttach", Napi::Function::New(env, Attach));
  exports.Set("bpfSetPorts", Napi::Function::New(env, SetPorts));
  exports.Set("bpfAttachBridge", Napi::Function::New(env, AttachBridge));
  exports.Set("bpfCounters", Napi::Function::New(env, Counters));
  exports.Set("bpfObjectIds", Napi::Function::New(env, ObjectIds));
  exports.Set("bpfClose", Napi::Function::New(env, Close));
  exports.Set("bpfTakeOver", Napi::Function::New(env, TakeOver));
  exports.Set("bpfPinInfo", Napi::Function::New(env, PinInfo));
  exports.Set("bpfUnpin", Napi::Function::New(env, Unpin));
  exports.Set("bpfTcxProgs", Napi::Function::New(env, TcxProgs));
  exports.Set("bpfCounterNames", Napi::Function::New(env, CounterNames));
  exports.Set("bpfAbi", Napi::Function::New(env, Abi));
}

}  // namespace bpfbind
// ---- end bpf engine bindings ----

// sdNotify(socketPath, state) → 0 or an errno: one sd_notify datagram (see sd_notify.h).
Napi::Value SdNotifyBinding(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 2 || !info[0].IsString() || !info[1].IsString()) {
    throw Napi::TypeError::New(env, "sdNotify(socketPath: string, state: string)");
  }
  return Napi::Number::New(env, SdNotify(info[0].As<Napi::String>().Utf8Value(),
                                         info[1].As<Napi::String>().Utf8Value()));
}

// mallocTrim() → whether memory went back to the kernel: glibc's malloc_trim(0), which returns
// the free pages of every arena (not only the top of the main heap). false where it is missing.
Napi::Value MallocTrimBinding(const Napi::CallbackInfo& info) {
#ifdef __GLIBC__
  return Napi::Boolean::New(info.Env(), malloc_trim(0) != 0);
#else
  return Napi::Boolean::New(info.Env(), false);
#endif
}

// ---- WireGuard test exports (wg_harness.h; test/native/wireguard-*.test.ts) ----
namespace wgbind {

wg::Bytes Bytes(const Napi::Value& v, const char* what) {
  if (!v.IsBuffer()) throw Napi::TypeError::New(v.Env(), std::string("wireguard: ") + what);
  Napi::Buffer<uint8_t> b = v.As<Napi::Buffer<uint8_t>>();
  return wg::Bytes(b.Data(), b.Data() + b.Length());
}

Napi::Value Buf(Napi::Env env, const wg::Bytes& b) {
  return Napi::Buffer<uint8_t>::Copy(env, b.data(), b.size());
}

uint64_t U64(const Napi::Value& v, const char* what) {
  if (v.IsBigInt()) {
    bool lossless = true;
    uint64_t x = v.As<Napi::BigInt>().Uint64Value(&lossless);
    if (!lossless) throw Napi::RangeError::New(v.Env(), std::string("wireguard: ") + what);
    return x;
  }
  if (!v.IsNumber() || v.As<Napi::Number>().DoubleValue() < 0)
    throw Napi::TypeError::New(v.Env(), std::string("wireguard: ") + what);
  return static_cast<uint64_t>(v.As<Napi::Number>().DoubleValue());
}

// wgCrypto(op, ...buffers) → Buffer, or null when the primitive refused
Napi::Value Crypto(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsString())
    throw Napi::TypeError::New(env, "wireguard: op must be a string");
  std::vector<wg::Bytes> args;
  for (size_t i = 1; i < info.Length(); i++) args.push_back(Bytes(info[i], "argument"));
  wg::Bytes out;
  std::string error;
  bool ok = wg::CryptoForTest(info[0].As<Napi::String>().Utf8Value(), args, &out, &error);
  if (!error.empty()) throw Napi::RangeError::New(env, "wireguard: " + error);
  return ok ? Buf(env, out) : env.Null();
}

// wgReplay(counters, limit?) → boolean[]: each counter fed to one fresh window in turn
Napi::Value Replay(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsArray())
    throw Napi::TypeError::New(env, "wireguard: counters");
  Napi::Array in = info[0].As<Napi::Array>();
  std::vector<uint64_t> counters;
  for (uint32_t i = 0; i < in.Length(); i++) counters.push_back(U64(in.Get(i), "counter"));
  uint64_t limit = info.Length() > 1 ? U64(info[1], "limit") : wg::kRejectAfterMessages;
  std::vector<bool> got = wg::ReplayForTest(counters, limit);
  Napi::Array out = Napi::Array::New(env, got.size());
  for (size_t i = 0; i < got.size(); i++)
    out.Set(static_cast<uint32_t>(i), Napi::Boolean::New(env, got[i]));
  return out;
}

int Int(const Napi::CallbackInfo& info, size_t i, const char* what) {
  if (info.Length() <= i || !info[i].IsNumber())
    throw Napi::TypeError::New(info.Env(), std::string("wireguard: ") + what);
  return info[i].As<Napi::Number>().Int32Value();
}

// wgDevice(op, ...) — a test device on a manual clock (wg_harness.h); see native-addon.ts
Napi::Value Device(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsString())
    throw Napi::TypeError::New(env, "wireguard: op must be a string");
  std::string op = info[0].As<Napi::String>().Utf8Value();
  if (op == "create") {
    std::string error;
    int id = wg::TestDeviceCreate(Bytes(info[1], "private key"), &error);
    if (id < 0) throw Napi::Error::New(env, "wireguard: " + error);
    return Napi::Number::New(env, id);
  }
  int id = Int(info, 1, "device id");
  if (op == "close") return Napi::Boolean::New(env, wg::TestDeviceClose(id));
  if (op == "publicKey") return Buf(env, wg::TestDevicePublicKey(id));
  if (op == "addPeer") {
    wg::Bytes psk = info.Length() > 3 && info[3].IsBuffer() ? Bytes(info[3], "psk") : wg::Bytes();
    uint64_t keepalive = info.Length() > 4 ? U64(info[4], "keepalive") : 0;
    return Napi::Number::New(
        env, wg::TestDeviceAddPeer(id, Bytes(info[2], "public key"), psk, keepalive));
  }
  if (op == "clock") {
    if (info.Length() < 4) throw Napi::TypeError::New(env, "wireguard: clock needs mono and wall");
    return Napi::Boolean::New(
        env, wg::TestDeviceSetClock(id, U64(info[2], "mono"), U64(info[3], "wall")));
  }
  if (op == "underLoad")
    return Napi::Boolean::New(env, wg::TestDeviceSetUnderLoad(id, info[2].ToBoolean().Value()));
  if (op == "initiate") {
    wg::Bytes out = wg::TestDeviceInitiate(id, Int(info, 2, "peer"));
    return out.empty() ? env.Null() : Buf(env, out);
  }
  if (op == "send") {
    wg::Bytes packet;
    size_t mtu = info.Length() > 4 ? U64(info[4], "mtu") : 0;
    std::string status =
        wg::TestDeviceSend(id, Int(info, 2, "peer"), Bytes(info[3], "payload"), mtu, &packet);
    Napi::Object o = Napi::Object::New(env);
    o.Set("status", status);
    o.Set("packet", packet.empty() ? env.Null() : Buf(env, packet));
    return o;
  }
  if (op == "receive") {
    wg::TestReceived r = wg::TestDeviceReceive(id, Bytes(info[2], "packet"), Bytes(info[3], "src"));
    Napi::Object o = Napi::Object::New(env);
    o.Set("verdict", r.verdict);
    o.Set("peer", r.peer);
    o.Set("packet", r.packet.empty() ? env.Null() : Buf(env, r.packet));
    return o;
  }
  if (op == "receiveSplit") {
    if (info.Length() < 5 || !info[4].IsString())
      throw Napi::TypeError::New(env, "wireguard: between must be a string");
    std::vector<std::string> v =
        wg::TestDeviceReceiveSplit(id, Bytes(info[2], "packet"), Bytes(info[3], "src"),
                                   info[4].As<Napi::String>().Utf8Value());
    Napi::Array a = Napi::Array::New(env, v.size());
    for (size_t i = 0; i < v.size(); i++) a.Set(static_cast<uint32_t>(i), v[i]);
    return a;
  }
  if (op == "tick") {
    std::vector<std::string> due = wg::TestDeviceTick(id, Int(info, 2, "peer"));
    Napi::Array a = Napi::Array::New(env, due.size());
    for (size_t i = 0; i < due.size(); i++) a.Set(static_cast<uint32_t>(i), due[i]);
    return a;
  }
  if (op == "peer") {
    wg::TestPeerState s;
    if (!wg::TestDevicePeerState(id, Int(info, 2, "peer"), &s)) return env.Null();
    Napi::Object o = Napi::Object::New(env);
    o.Set("handshake", s.handshake);
    o.Set("previous", s.has_previous);
    o.Set("current", s.has_current);
    o.Set("next", s.has_next);
    o.Set("currentInitiator", s.current_initiator);
    o.Set("sendCounter", Napi::BigInt::New(env, s.current_send_counter));
    o.Set("attempts", s.attempts);
    o.Set("nextDeadline", static_cast<double>(s.next_deadline));
    o.Set("indices", static_cast<double>(s.indices));
    o.Set("endpoint", Buf(env, s.endpoint));
    return o;
  }
  if (op == "removePeer")
    return Napi::Boolean::New(env, wg::TestDeviceRemovePeer(id, Int(info, 2, "peer")));
  if (op == "setSendCounter")
    return Napi::Boolean::New(
        env, wg::TestDeviceSetSendCounter(id, Int(info, 2, "peer"), U64(info[3], "counter")));
  throw Napi::RangeError::New(env, "wireguard: unknown op " + op);
}

void Define(Napi::Env env, Napi::Object exports) {
  exports.Set("wgCrypto", Napi::Function::New(env, Crypto));
  exports.Set("wgReplay", Napi::Function::New(env, Replay));
  exports.Set("wgDevice", Napi::Function::New(env, Device));
}

}  // namespace wgbind

class Addon : public Napi::Addon<Addon> {
 public:
  Addon(Napi::Env env, Napi::Object exports) {
    DefineAddon(exports, {
                             InstanceMethod("version", &Addon::Version),
                         });
    nlbind::Define(env, exports);
    dpbind::DefineCodec(env, exports);
    dpbind::DefineEngine(env, exports);
    bpfbind::Define(env, exports);
    wgbind::Define(env, exports);
    exports.Set("sdNotify", Napi::Function::New(env, SdNotifyBinding));
    exports.Set("mallocTrim", Napi::Function::New(env, MallocTrimBinding));
  }

 private:
  Napi::Value Version(const Napi::CallbackInfo& info) {
    // The netlink socket type is referenced so the libmnl link is exercised at load time.
    (void)&mnl_socket_open;
    return Napi::String::New(info.Env(), "weft-native 0.1.0");
  }
};

}  // namespace weft

// The macro pastes its argument into an identifier, so it needs an unqualified name.
using weft::Addon;
NODE_API_ADDON(Addon)
