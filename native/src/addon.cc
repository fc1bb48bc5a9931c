// The only file that includes napi.h: it converts arguments, checks them and maps errors.
// Packet and netlink logic live in plain C++ files beside it.
#include <napi.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <libmnl/libmnl.h>

#include "netlink.h"

namespace weft {

// ---- netlink bindings (src/control/netlink/native-netlink.ts is the only caller) ----
namespace nlbind {

struct Handle {
  std::unique_ptr<Netlink> nl;
};

Netlink* GetNetlink(const Napi::CallbackInfo& info) {
  if (info.Length() < 1 || !info[0].IsExternal()) {
    throw Napi::TypeError::New(info.Env(), "netlink: expected a handle");
  }
  Handle* h = info[0].As<Napi::External<Handle>>().Data();
  if (!h->nl) throw Napi::Error::New(info.Env(), "netlink: handle is closed");
  return h->nl.get();
}

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
      {"addVxlan", NlOpKind::kAddVxlan},
  };
  NlOp op;
  std::string kind = StrProp(o, "op");
  auto it = kinds.find(kind);
  if (it == kinds.end()) throw Napi::TypeError::New(env, "netlink: unknown op " + kind);
  op.kind = it->second;
  op.dst = IpProp(env, o, "dst");
  op.dst_len = static_cast<int>(NumProp(o, "dstLen", -1));
  op.gw = IpProp(env, o, "gw");
  op.ifindex = static_cast<int>(NumProp(o, "ifindex", 0));
  op.onlink = o.Get("onlink").ToBoolean().Value();
  op.table = static_cast<uint32_t>(NumProp(o, "table", 0));
  std::string mac = StrProp(o, "mac");
  if (!mac.empty()) {
    if (!ParseMac(mac, op.mac)) throw Napi::TypeError::New(env, "netlink: bad MAC " + mac);
    op.has_mac = true;
  }
  op.mtu = static_cast<int>(NumProp(o, "mtu", 0));
  op.up = static_cast<int>(NumProp(o, "up", -1));
  op.name = StrProp(o, "name");
  op.vni = static_cast<uint32_t>(NumProp(o, "vni", 0));
  op.port = static_cast<uint16_t>(NumProp(o, "port", 0));
  op.local = IpProp(env, o, "local");
  op.link = static_cast<int>(NumProp(o, "link", 0));
  op.learning = o.Get("learning").ToBoolean().Value();
  if (op.kind != NlOpKind::kSetLink && op.kind != NlOpKind::kDelLink &&
      op.kind != NlOpKind::kAddVxlan && op.kind != NlOpKind::kAppendFdb &&
      op.kind != NlOpKind::kDelFdb && op.dst.family == 0) {
    throw Napi::TypeError::New(env, "netlink: " + kind + " needs dst");
  }
  return op;
}

Napi::Value Open(const Napi::CallbackInfo& info) {
  std::string path = info.Length() > 0 && info[0].IsString() ? info[0].As<Napi::String>().Utf8Value() : std::string();
  std::string error;
  std::unique_ptr<Netlink> nl = Netlink::Open(path, &error);
  if (!nl) throw Napi::Error::New(info.Env(), "netlink open: " + error);
  auto* h = new Handle{std::move(nl)};
  return Napi::External<Handle>::New(info.Env(), h, [](Napi::Env, Handle* p) { delete p; });
}

Napi::Value Close(const Napi::CallbackInfo& info) {
  if (info.Length() > 0 && info[0].IsExternal()) {
    info[0].As<Napi::External<Handle>>().Data()->nl.reset();
  }
  return info.Env().Undefined();
}

Napi::Value Apply(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Netlink* nl = GetNetlink(info);
  if (info.Length() < 2 || !info[1].IsArray()) throw Napi::TypeError::New(env, "netlink: ops");
  Napi::Array arr = info[1].As<Napi::Array>();
  std::vector<NlOp> ops;
  ops.reserve(arr.Length());
  for (uint32_t i = 0; i < arr.Length(); i++) {
    Napi::Value v = arr.Get(i);
    if (!v.IsObject()) throw Napi::TypeError::New(env, "netlink: op is not an object");
    ops.push_back(ToOp(env, v.As<Napi::Object>()));
  }
  std::vector<int> res = nl->Apply(ops);
  Napi::Int32Array out = Napi::Int32Array::New(env, res.size());
  for (size_t i = 0; i < res.size(); i++) out[i] = res[i];
  return out;
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
  o.Set("kind", l.kind);
  if (l.has_vxlan) {
    Napi::Object v = Napi::Object::New(env);
    v.Set("vni", l.vxlan.vni);
    v.Set("port", l.vxlan.port);
    v.Set("local", Ip(env, l.vxlan.local));
    v.Set("link", l.vxlan.link);
    v.Set("learning", l.vxlan.learning);
    o.Set("vxlan", v);
  } else {
    o.Set("vxlan", env.Null());
  }
  return o;
}

Napi::Value List(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Netlink* nl = GetNetlink(info);
  std::string what = info.Length() > 1 && info[1].IsString() ? info[1].As<Napi::String>().Utf8Value() : std::string();
  int family = FamilyArg(info.Length() > 2 ? info[2] : env.Undefined());
  int ifindex = info.Length() > 3 && info[3].IsNumber() ? info[3].As<Napi::Number>().Int32Value() : 0;
  Napi::Array out = Napi::Array::New(env);
  uint32_t n = 0;
  int err = 0;
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
  Netlink* nl = GetNetlink(info);
  std::string name = info.Length() > 1 && info[1].IsString() ? info[1].As<Napi::String>().Utf8Value() : std::string();
  LinkEntry l;
  int err = nl->GetLink(name, &l);
  if (err == ENODEV) return env.Null();
  if (err != 0) throw ErrnoError(env, "get link " + name, err);
  return LinkObject(env, l);
}

void Define(Napi::Env env, Napi::Object exports) {
  exports.Set("netlinkOpen", Napi::Function::New(env, Open));
  exports.Set("netlinkClose", Napi::Function::New(env, Close));
  exports.Set("netlinkApply", Napi::Function::New(env, Apply));
  exports.Set("netlinkList", Napi::Function::New(env, List));
  exports.Set("netlinkGetLink", Napi::Function::New(env, GetLink));
}

}  // namespace nlbind
// ---- end netlink bindings ----

class Addon : public Napi::Addon<Addon> {
 public:
  Addon(Napi::Env env, Napi::Object exports) {
    DefineAddon(exports, {
                             InstanceMethod("version", &Addon::Version),
                         });
    nlbind::Define(env, exports);
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
