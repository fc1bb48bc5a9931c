// rtnetlink operations over libmnl (see netlink.h for the contracts).
#include "netlink.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <libmnl/libmnl.h>
#include <linux/filter.h>
#include <linux/if.h>
#include <linux/if_link.h>
#include <linux/if_tun.h>
#include <linux/if_tunnel.h>
#include <linux/neighbour.h>
#include <linux/rtnetlink.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#ifndef NETLINK_CAP_ACK
#define NETLINK_CAP_ACK 10
#endif

namespace weft {

namespace {

constexpr size_t kMaxMessage = 1024;  // generous bound on one request we build
constexpr int kSocketBuffer = 16 << 20;

int AddrLen(int family) { return family == AF_INET6 ? 16 : 4; }

void SetBuffer(int fd, int force_opt, int opt, int size) {
  if (setsockopt(fd, SOL_SOCKET, force_opt, &size, sizeof(size)) != 0) {
    setsockopt(fd, SOL_SOCKET, opt, &size, sizeof(size));
  }
}

// Fills a create-exclusive RTM_NEWLINK for a device of `kind` (name, MTU, MAC from `op`) and
// opens its IFLA_LINKINFO (returned in *info) and IFLA_INFO_DATA (returned) nests.
nlattr* StartNewLink(nlmsghdr* nlh, const NlOp& op, const char* kind, nlattr** info) {
  nlh->nlmsg_type = RTM_NEWLINK;
  nlh->nlmsg_flags |= NLM_F_CREATE | NLM_F_EXCL;
  auto* ifi = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifinfomsg)));
  ifi->ifi_family = AF_UNSPEC;
  mnl_attr_put_strz(nlh, IFLA_IFNAME, op.name.c_str());
  if (op.mtu > 0) mnl_attr_put_u32(nlh, IFLA_MTU, op.mtu);
  if (op.has_mac) mnl_attr_put(nlh, IFLA_ADDRESS, 6, op.mac);
  *info = mnl_attr_nest_start(nlh, IFLA_LINKINFO);
  mnl_attr_put_strz(nlh, IFLA_INFO_KIND, kind);
  return mnl_attr_nest_start(nlh, IFLA_INFO_DATA);
}

// Builds one request at `at`; returns its header.
nlmsghdr* BuildOp(char* at, const NlOp& op, uint32_t seq) {
  nlmsghdr* nlh = mnl_nlmsg_put_header(at);
  nlh->nlmsg_seq = seq;
  nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK;
  switch (op.kind) {
    case NlOpKind::kReplaceRoute:
    case NlOpKind::kDelRoute: {
      bool add = op.kind == NlOpKind::kReplaceRoute;
      nlh->nlmsg_type = add ? RTM_NEWROUTE : RTM_DELROUTE;
      // A blackhole is only added where no route for dst exists (never replaces the bridge's
      // connected route): create-exclusive, EEXIST counts as done (netlink.ts isAlreadyDone).
      if (add) {
        nlh->nlmsg_flags |=
            NLM_F_CREATE | (op.route_type == RTN_BLACKHOLE ? NLM_F_EXCL : NLM_F_REPLACE);
      }
      auto* rtm = static_cast<rtmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(rtmsg)));
      int family = op.dst.family;
      rtm->rtm_family = family;
      rtm->rtm_dst_len = op.dst_len < 0 ? AddrLen(family) * 8 : op.dst_len;
      uint32_t table = op.table == 0 ? RT_TABLE_MAIN : op.table;
      rtm->rtm_table = table < 256 ? table : RT_TABLE_UNSPEC;
      rtm->rtm_protocol = add ? RTPROT_BOOT : 0;
      rtm->rtm_type = op.route_type != 0 ? op.route_type : RTN_UNICAST;
      if (add) {
        bool link_scope = op.gw.family == 0 && rtm->rtm_type == RTN_UNICAST;
        rtm->rtm_scope = link_scope ? RT_SCOPE_LINK : RT_SCOPE_UNIVERSE;
      } else {
        rtm->rtm_scope = RT_SCOPE_NOWHERE;
      }
      if (op.onlink) rtm->rtm_flags |= RTNH_F_ONLINK;
      mnl_attr_put(nlh, RTA_DST, AddrLen(family), op.dst.bytes);
      if (op.gw.family != 0) mnl_attr_put(nlh, RTA_GATEWAY, AddrLen(op.gw.family), op.gw.bytes);
      if (op.ifindex > 0) mnl_attr_put_u32(nlh, RTA_OIF, op.ifindex);
      if (table >= 256) mnl_attr_put_u32(nlh, RTA_TABLE, table);
      break;
    }
    case NlOpKind::kReplaceNeigh:
    case NlOpKind::kDelNeigh:
    case NlOpKind::kAppendFdb:
    case NlOpKind::kDelFdb: {
      bool fdb = op.kind == NlOpKind::kAppendFdb || op.kind == NlOpKind::kDelFdb;
      bool add = op.kind == NlOpKind::kReplaceNeigh || op.kind == NlOpKind::kAppendFdb;
      nlh->nlmsg_type = add ? RTM_NEWNEIGH : RTM_DELNEIGH;
      if (op.kind == NlOpKind::kReplaceNeigh) nlh->nlmsg_flags |= NLM_F_CREATE | NLM_F_REPLACE;
      if (op.kind == NlOpKind::kAppendFdb) nlh->nlmsg_flags |= NLM_F_CREATE | NLM_F_APPEND;
      auto* nd = static_cast<ndmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ndmsg)));
      nd->ndm_family = fdb ? AF_BRIDGE : op.dst.family;
      nd->ndm_ifindex = op.ifindex;
      nd->ndm_state = NUD_PERMANENT;
      if (fdb) nd->ndm_flags = NTF_SELF;
      if (op.dst.family != 0) mnl_attr_put(nlh, NDA_DST, AddrLen(op.dst.family), op.dst.bytes);
      if (op.has_mac) mnl_attr_put(nlh, NDA_LLADDR, 6, op.mac);
      break;
    }
    case NlOpKind::kReplaceAddr:
    case NlOpKind::kDelAddr: {
      bool add = op.kind == NlOpKind::kReplaceAddr;
      nlh->nlmsg_type = add ? RTM_NEWADDR : RTM_DELADDR;
      if (add) nlh->nlmsg_flags |= NLM_F_CREATE | NLM_F_REPLACE;
      auto* ifa = static_cast<ifaddrmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifaddrmsg)));
      ifa->ifa_family = op.dst.family;
      ifa->ifa_prefixlen = op.dst_len < 0 ? AddrLen(op.dst.family) * 8 : op.dst_len;
      ifa->ifa_index = op.ifindex;
      ifa->ifa_scope = RT_SCOPE_UNIVERSE;
      mnl_attr_put(nlh, IFA_LOCAL, AddrLen(op.dst.family), op.dst.bytes);
      mnl_attr_put(nlh, IFA_ADDRESS, AddrLen(op.dst.family), op.dst.bytes);
      break;
    }
    case NlOpKind::kSetLink:
    case NlOpKind::kDelLink: {
      nlh->nlmsg_type = op.kind == NlOpKind::kSetLink ? RTM_NEWLINK : RTM_DELLINK;
      auto* ifi = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifinfomsg)));
      ifi->ifi_family = AF_UNSPEC;
      ifi->ifi_index = op.ifindex;
      if (op.kind == NlOpKind::kSetLink) {
        if (op.up >= 0) {
          ifi->ifi_change = IFF_UP;
          ifi->ifi_flags = op.up ? IFF_UP : 0;
        }
        if (op.mtu > 0) mnl_attr_put_u32(nlh, IFLA_MTU, op.mtu);
        if (op.has_mac) mnl_attr_put(nlh, IFLA_ADDRESS, 6, op.mac);
      }
      break;
    }
    case NlOpKind::kAddVxlan: {
      nlattr* info = nullptr;
      nlattr* data = StartNewLink(nlh, op, "vxlan", &info);
      mnl_attr_put_u32(nlh, IFLA_VXLAN_ID, op.vni);
      if (op.link > 0) mnl_attr_put_u32(nlh, IFLA_VXLAN_LINK, op.link);
      if (op.local.family == AF_INET) mnl_attr_put(nlh, IFLA_VXLAN_LOCAL, 4, op.local.bytes);
      if (op.local.family == AF_INET6) mnl_attr_put(nlh, IFLA_VXLAN_LOCAL6, 16, op.local.bytes);
      mnl_attr_put_u16(nlh, IFLA_VXLAN_PORT, htons(op.port));
      mnl_attr_put_u8(nlh, IFLA_VXLAN_LEARNING, op.learning ? 1 : 0);
      if (op.gbp) mnl_attr_put(nlh, IFLA_VXLAN_GBP, 0, nullptr);
      mnl_attr_nest_end(nlh, data);
      mnl_attr_nest_end(nlh, info);
      break;
    }
    case NlOpKind::kAddIpip: {
      // As flannel creates flannel.ipip: local set, no remote, and PMTUDISC, TTL and TOS all
      // written as 0 (nopmtudisc, ttl inherit, tos 0).
      nlattr* info = nullptr;
      nlattr* data = StartNewLink(nlh, op, "ipip", &info);
      if (op.local.family == AF_INET) mnl_attr_put(nlh, IFLA_IPTUN_LOCAL, 4, op.local.bytes);
      mnl_attr_put_u8(nlh, IFLA_IPTUN_PMTUDISC, 0);
      mnl_attr_put_u8(nlh, IFLA_IPTUN_TTL, 0);
      mnl_attr_put_u8(nlh, IFLA_IPTUN_TOS, 0);
      mnl_attr_nest_end(nlh, data);
      mnl_attr_nest_end(nlh, info);
      break;
    }
  }
  return nlh;
}

void CopyAddr(const nlattr* a, int family, IpAddr* out) {
  size_t len = mnl_attr_get_payload_len(a);
  if (len != static_cast<size_t>(AddrLen(family))) return;
  out->family = family;
  std::memcpy(out->bytes, mnl_attr_get_payload(a), len);
}

struct AttrTable {
  const nlattr* tb[IFLA_MAX + RTA_MAX + NDA_MAX + 64] = {};
  int max;
};

int CollectAttr(const nlattr* attr, void* data) {
  auto* t = static_cast<AttrTable*>(data);
  int type = mnl_attr_get_type(attr);
  if (type >= 0 && type <= t->max) t->tb[type] = attr;
  return MNL_CB_OK;
}

struct RouteDump {
  int family;
  std::vector<RouteEntry>* out;
};

void ParseRoute(const nlmsghdr* nlh, RouteEntry* e) {
  const auto* rtm = static_cast<const rtmsg*>(mnl_nlmsg_get_payload(nlh));
  AttrTable t;
  t.max = RTA_MAX;
  mnl_attr_parse(nlh, sizeof(*rtm), CollectAttr, &t);
  e->family = rtm->rtm_family;
  e->dst_len = rtm->rtm_dst_len;
  e->table = rtm->rtm_table;
  e->protocol = rtm->rtm_protocol;
  e->scope = rtm->rtm_scope;
  e->type = rtm->rtm_type;
  e->flags = rtm->rtm_flags;
  e->dst.family = e->family;  // a default route has no RTA_DST: all zeros
  if (t.tb[RTA_DST]) CopyAddr(t.tb[RTA_DST], e->family, &e->dst);
  if (t.tb[RTA_GATEWAY]) CopyAddr(t.tb[RTA_GATEWAY], e->family, &e->gw);
  if (t.tb[RTA_OIF]) e->oif = mnl_attr_get_u32(t.tb[RTA_OIF]);
  if (t.tb[RTA_TABLE]) e->table = mnl_attr_get_u32(t.tb[RTA_TABLE]);
}

int OnRoute(const nlmsghdr* nlh, void* data) {
  auto* d = static_cast<RouteDump*>(data);
  if (nlh->nlmsg_type != RTM_NEWROUTE) return MNL_CB_OK;
  const auto* rtm = static_cast<const rtmsg*>(mnl_nlmsg_get_payload(nlh));
  if (rtm->rtm_family != d->family) return MNL_CB_OK;
  d->out->emplace_back();
  ParseRoute(nlh, &d->out->back());
  return MNL_CB_OK;
}

struct NeighDump {
  int family;
  int ifindex;
  std::vector<NeighEntry>* out;
};

void ParseNeigh(const nlmsghdr* nlh, NeighEntry* e) {
  const auto* nd = static_cast<const ndmsg*>(mnl_nlmsg_get_payload(nlh));
  AttrTable t;
  t.max = NDA_MAX;
  mnl_attr_parse(nlh, sizeof(*nd), CollectAttr, &t);
  e->ifindex = nd->ndm_ifindex;
  e->state = nd->ndm_state;
  e->flags = nd->ndm_flags;
  if (t.tb[NDA_DST]) {
    size_t len = mnl_attr_get_payload_len(t.tb[NDA_DST]);
    CopyAddr(t.tb[NDA_DST], len == 16 ? AF_INET6 : AF_INET, &e->dst);
  }
  if (t.tb[NDA_LLADDR] && mnl_attr_get_payload_len(t.tb[NDA_LLADDR]) == 6) {
    e->has_lladdr = true;
    std::memcpy(e->lladdr, mnl_attr_get_payload(t.tb[NDA_LLADDR]), 6);
  }
}

int OnNeigh(const nlmsghdr* nlh, void* data) {
  auto* d = static_cast<NeighDump*>(data);
  if (nlh->nlmsg_type != RTM_NEWNEIGH) return MNL_CB_OK;
  const auto* nd = static_cast<const ndmsg*>(mnl_nlmsg_get_payload(nlh));
  if (nd->ndm_family != d->family) return MNL_CB_OK;
  if (d->ifindex > 0 && nd->ndm_ifindex != d->ifindex) return MNL_CB_OK;
  d->out->emplace_back();
  ParseNeigh(nlh, &d->out->back());
  return MNL_CB_OK;
}

struct AddrDump {
  int family;
  int ifindex;
  std::vector<AddrEntry>* out;
};

int OnAddr(const nlmsghdr* nlh, void* data) {
  auto* d = static_cast<AddrDump*>(data);
  if (nlh->nlmsg_type != RTM_NEWADDR) return MNL_CB_OK;
  const auto* ifa = static_cast<const ifaddrmsg*>(mnl_nlmsg_get_payload(nlh));
  if (ifa->ifa_family != d->family) return MNL_CB_OK;
  if (d->ifindex > 0 && static_cast<int>(ifa->ifa_index) != d->ifindex) return MNL_CB_OK;
  AttrTable t;
  t.max = IFA_MAX;
  mnl_attr_parse(nlh, sizeof(*ifa), CollectAttr, &t);
  AddrEntry e;
  e.prefix = ifa->ifa_prefixlen;
  e.ifindex = ifa->ifa_index;
  e.scope = ifa->ifa_scope;
  const nlattr* a = t.tb[IFA_LOCAL] ? t.tb[IFA_LOCAL] : t.tb[IFA_ADDRESS];
  if (a) CopyAddr(a, ifa->ifa_family, &e.addr);
  d->out->push_back(e);
  return MNL_CB_OK;
}

int ParseLink(const nlmsghdr* nlh, LinkEntry* e) {
  const auto* ifi = static_cast<const ifinfomsg*>(mnl_nlmsg_get_payload(nlh));
  AttrTable t;
  t.max = IFLA_MAX;
  mnl_attr_parse(nlh, sizeof(*ifi), CollectAttr, &t);
  e->index = ifi->ifi_index;
  e->flags = ifi->ifi_flags;
  if (t.tb[IFLA_IFNAME]) e->name = mnl_attr_get_str(t.tb[IFLA_IFNAME]);
  if (t.tb[IFLA_MTU]) e->mtu = mnl_attr_get_u32(t.tb[IFLA_MTU]);
  if (t.tb[IFLA_MASTER]) e->master = static_cast<int>(mnl_attr_get_u32(t.tb[IFLA_MASTER]));
  if (t.tb[IFLA_ADDRESS] && mnl_attr_get_payload_len(t.tb[IFLA_ADDRESS]) == 6) {
    e->has_mac = true;
    std::memcpy(e->mac, mnl_attr_get_payload(t.tb[IFLA_ADDRESS]), 6);
  }
  if (t.tb[IFLA_LINKINFO]) {
    AttrTable info;
    info.max = IFLA_INFO_MAX;
    mnl_attr_parse_nested(t.tb[IFLA_LINKINFO], CollectAttr, &info);
    if (info.tb[IFLA_INFO_KIND]) e->kind = mnl_attr_get_str(info.tb[IFLA_INFO_KIND]);
    if (e->kind == "vxlan" && info.tb[IFLA_INFO_DATA]) {
      AttrTable vx;
      vx.max = IFLA_VXLAN_MAX;
      mnl_attr_parse_nested(info.tb[IFLA_INFO_DATA], CollectAttr, &vx);
      e->has_vxlan = true;
      if (vx.tb[IFLA_VXLAN_ID]) e->vxlan.vni = mnl_attr_get_u32(vx.tb[IFLA_VXLAN_ID]);
      if (vx.tb[IFLA_VXLAN_PORT]) e->vxlan.port = ntohs(mnl_attr_get_u16(vx.tb[IFLA_VXLAN_PORT]));
      if (vx.tb[IFLA_VXLAN_LOCAL]) CopyAddr(vx.tb[IFLA_VXLAN_LOCAL], AF_INET, &e->vxlan.local);
      if (vx.tb[IFLA_VXLAN_LOCAL6]) CopyAddr(vx.tb[IFLA_VXLAN_LOCAL6], AF_INET6, &e->vxlan.local);
      if (vx.tb[IFLA_VXLAN_LINK]) e->vxlan.link = mnl_attr_get_u32(vx.tb[IFLA_VXLAN_LINK]);
      if (vx.tb[IFLA_VXLAN_LEARNING]) {
        e->vxlan.learning = mnl_attr_get_u8(vx.tb[IFLA_VXLAN_LEARNING]) != 0;
      }
      e->vxlan.gbp = vx.tb[IFLA_VXLAN_GBP] != nullptr;
    }
    if (e->kind == "ipip" && info.tb[IFLA_INFO_DATA]) {
      AttrTable tun;
      tun.max = IFLA_IPTUN_MAX;
      mnl_attr_parse_nested(info.tb[IFLA_INFO_DATA], CollectAttr, &tun);
      e->has_ipip = true;
      if (tun.tb[IFLA_IPTUN_LOCAL]) CopyAddr(tun.tb[IFLA_IPTUN_LOCAL], AF_INET, &e->ipip.local);
      if (tun.tb[IFLA_IPTUN_REMOTE]) CopyAddr(tun.tb[IFLA_IPTUN_REMOTE], AF_INET, &e->ipip.remote);
      if (tun.tb[IFLA_IPTUN_TTL]) e->ipip.ttl = mnl_attr_get_u8(tun.tb[IFLA_IPTUN_TTL]);
      if (tun.tb[IFLA_IPTUN_TOS]) e->ipip.tos = mnl_attr_get_u8(tun.tb[IFLA_IPTUN_TOS]);
      if (tun.tb[IFLA_IPTUN_PMTUDISC]) {
        e->ipip.pmtudisc = mnl_attr_get_u8(tun.tb[IFLA_IPTUN_PMTUDISC]) != 0;
      }
    }
    if (e->kind == "tun" && info.tb[IFLA_INFO_DATA]) {
      AttrTable tun;
      tun.max = IFLA_TUN_MAX;
      mnl_attr_parse_nested(info.tb[IFLA_INFO_DATA], CollectAttr, &tun);
      e->has_tun = true;
      auto flag = [&](int attr, bool dflt) {
        return tun.tb[attr] ? mnl_attr_get_u8(tun.tb[attr]) != 0 : dflt;
      };
      if (tun.tb[IFLA_TUN_TYPE]) e->tun.tap = mnl_attr_get_u8(tun.tb[IFLA_TUN_TYPE]) == IFF_TAP;
      e->tun.pi = flag(IFLA_TUN_PI, true);
      e->tun.vnet_hdr = flag(IFLA_TUN_VNET_HDR, false);
      e->tun.multi_queue = flag(IFLA_TUN_MULTI_QUEUE, false);
      e->tun.persist = flag(IFLA_TUN_PERSIST, false);
      if (tun.tb[IFLA_TUN_NUM_QUEUES])
        e->tun.queues = mnl_attr_get_u32(tun.tb[IFLA_TUN_NUM_QUEUES]);
    }
  }
  return MNL_CB_OK;
}

int OnLinks(const nlmsghdr* nlh, void* data) {
  if (nlh->nlmsg_type != RTM_NEWLINK) return MNL_CB_OK;
  auto* out = static_cast<std::vector<LinkEntry>*>(data);
  out->emplace_back();
  return ParseLink(nlh, &out->back());
}

int OnLink(const nlmsghdr* nlh, void* data) {
  if (nlh->nlmsg_type != RTM_NEWLINK) return MNL_CB_OK;
  return ParseLink(nlh, static_cast<LinkEntry*>(data));
}

}  // namespace

bool ParseIp(const std::string& text, IpAddr* out) {
  IpAddr a;
  if (inet_pton(AF_INET, text.c_str(), a.bytes) == 1) {
    a.family = AF_INET;
  } else if (inet_pton(AF_INET6, text.c_str(), a.bytes) == 1) {
    a.family = AF_INET6;
  } else {
    return false;
  }
  *out = a;
  return true;
}

std::string FormatIp(const IpAddr& ip) {
  if (ip.family == 0) return "";
  char buf[INET6_ADDRSTRLEN];
  if (!inet_ntop(ip.family, ip.bytes, buf, sizeof(buf))) return "";
  return buf;
}

bool ParseMac(const std::string& text, uint8_t out[6]) {
  unsigned v[6];
  char tail;
  if (std::sscanf(text.c_str(), "%2x:%2x:%2x:%2x:%2x:%2x%c", &v[0], &v[1], &v[2], &v[3], &v[4],
                  &v[5], &tail) != 6) {
    return false;
  }
  for (int i = 0; i < 6; i++) out[i] = static_cast<uint8_t>(v[i]);
  return true;
}

std::string FormatMac(const uint8_t mac[6]) {
  char buf[18];
  std::snprintf(buf, sizeof(buf), "%02x:%02x:%02x:%02x:%02x:%02x", mac[0], mac[1], mac[2], mac[3],
                mac[4], mac[5]);
  return buf;
}

namespace {

// A NETLINK_ROUTE socket opened inside `netns_path` (the current namespace when empty), bound to
// the multicast `groups` (0: none), with 16 MiB buffers. Null and *error on failure.
mnl_socket* OpenRouteSocket(const std::string& netns_path, unsigned groups, std::string* error) {
  int self_ns = -1;
  if (!netns_path.empty()) {
    self_ns = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (self_ns < 0) {
      *error = std::string("open /proc/thread-self/ns/net: ") + std::strerror(errno);
      return nullptr;
    }
    int target = open(netns_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (target < 0) {
      *error = "open " + netns_path + ": " + std::strerror(errno);
      close(self_ns);
      return nullptr;
    }
    int rc = setns(target, CLONE_NEWNET);
    int saved = errno;
    close(target);
    if (rc != 0) {
      *error = "setns " + netns_path + ": " + std::strerror(saved);
      close(self_ns);
      return nullptr;
    }
  }
  mnl_socket* sock = mnl_socket_open2(NETLINK_ROUTE, SOCK_CLOEXEC);
  int open_errno = errno;
  if (self_ns >= 0) {
    // Back to our own namespace before anything else runs on this thread. If that fails the
    // thread would silently keep operating in the other namespace: stop the process instead.
    if (setns(self_ns, CLONE_NEWNET) != 0) {
      std::fprintf(stderr, "weft: setns back to own namespace failed: %s\n", std::strerror(errno));
      std::abort();
    }
    close(self_ns);
  }
  if (!sock) {
    *error = std::string("netlink socket: ") + std::strerror(open_errno);
    return nullptr;
  }
  if (mnl_socket_bind(sock, groups, MNL_SOCKET_AUTOPID) < 0) {
    *error = std::string("netlink bind: ") + std::strerror(errno);
    mnl_socket_close(sock);
    return nullptr;
  }
  int fd = mnl_socket_get_fd(sock);
  SetBuffer(fd, SO_SNDBUFFORCE, SO_SNDBUF, kSocketBuffer);
  SetBuffer(fd, SO_RCVBUFFORCE, SO_RCVBUF, kSocketBuffer);
  return sock;
}

}  // namespace

std::unique_ptr<Netlink> Netlink::Open(const std::string& netns_path, std::string* error) {
  mnl_socket* sock = OpenRouteSocket(netns_path, 0, error);
  if (!sock) return nullptr;
  int on = 1;
  mnl_socket_setsockopt(sock, NETLINK_CAP_ACK, &on, sizeof(on));
  return std::unique_ptr<Netlink>(new Netlink(sock));
}

Netlink::Netlink(mnl_socket* sock)
    : sock_(sock),
      portid_(mnl_socket_get_portid(sock)),
      seq_(static_cast<uint32_t>(time(nullptr))),
      rx_(new char[kRxBytes]) {}

Netlink::~Netlink() { mnl_socket_close(sock_); }

std::vector<int> Netlink::Apply(const std::vector<NlOp>& ops) {
  std::vector<int> results(ops.size(), 0);
  if (buf_.empty()) buf_.resize(kBatchMessages * kMaxMessage);
  size_t i = 0;
  while (i < ops.size()) {
    size_t first = i;
    uint32_t base = seq_;
    size_t len = 0;
    while (i < ops.size() && i - first < kBatchMessages) {
      nlmsghdr* nlh = BuildOp(buf_.data() + len, ops[i], base + static_cast<uint32_t>(i - first));
      len += NLMSG_ALIGN(nlh->nlmsg_len);
      i++;
    }
    size_t count = i - first;
    seq_ = base + static_cast<uint32_t>(count);
    std::vector<bool> done(count, false);
    size_t pending = count;
    if (mnl_socket_sendto(sock_, buf_.data(), len) < 0) {
      int err = errno;
      for (size_t k = first; k < i; k++) results[k] = err;
      continue;
    }
    while (pending > 0) {
      ssize_t n = mnl_socket_recvfrom(sock_, rx_.get(), kRxBytes);
      if (n < 0) {
        if (errno == EINTR) continue;
        // Lost ACKs (ENOBUFS): their outcome is unknown; report the errno so callers retry.
        int err = errno;
        for (size_t k = 0; k < count; k++) {
          if (!done[k]) results[first + k] = err;
        }
        break;
      }
      auto* nlh = reinterpret_cast<nlmsghdr*>(rx_.get());
      int left = static_cast<int>(n);
      while (mnl_nlmsg_ok(nlh, left)) {
        uint32_t k = nlh->nlmsg_seq - base;
        if (nlh->nlmsg_type == NLMSG_ERROR && k < count && !done[k]) {
          const auto* e = static_cast<const nlmsgerr*>(mnl_nlmsg_get_payload(nlh));
          results[first + k] = -e->error;
          done[k] = true;
          pending--;
        }
        nlh = mnl_nlmsg_next(nlh, &left);
      }
    }
  }
  return results;
}

int Netlink::Dump(nlmsghdr* req, int (*cb)(const nlmsghdr*, void*), void* data) {
  req->nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  req->nlmsg_seq = ++seq_;
  if (mnl_socket_sendto(sock_, req, req->nlmsg_len) < 0) return errno;
  while (true) {
    ssize_t n = mnl_socket_recvfrom(sock_, rx_.get(), kRxBytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    int rc = mnl_cb_run(rx_.get(), n, req->nlmsg_seq, portid_, cb, data);
    if (rc == MNL_CB_STOP) return 0;
    if (rc < 0) return errno;
  }
}

int Netlink::Request(nlmsghdr* req, int (*cb)(const nlmsghdr*, void*), void* data) {
  req->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK;
  req->nlmsg_seq = ++seq_;
  if (mnl_socket_sendto(sock_, req, req->nlmsg_len) < 0) return errno;
  while (true) {
    ssize_t n = mnl_socket_recvfrom(sock_, rx_.get(), kRxBytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    int rc = mnl_cb_run(rx_.get(), n, req->nlmsg_seq, portid_, cb, data);
    if (rc == MNL_CB_STOP) return 0;
    if (rc < 0) return errno;
  }
}

int Netlink::ListRoutes(int family, std::vector<RouteEntry>* out) {
  char buf[256];
  nlmsghdr* nlh = mnl_nlmsg_put_header(buf);
  nlh->nlmsg_type = RTM_GETROUTE;
  auto* rtm = static_cast<rtmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(rtmsg)));
  rtm->rtm_family = family;
  RouteDump d{family, out};
  return Dump(nlh, OnRoute, &d);
}

int Netlink::ListNeighs(int family, int ifindex, std::vector<NeighEntry>* out) {
  char buf[256];
  nlmsghdr* nlh = mnl_nlmsg_put_header(buf);
  nlh->nlmsg_type = RTM_GETNEIGH;
  auto* nd = static_cast<ndmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ndmsg)));
  nd->ndm_family = family;
  NeighDump d{family, ifindex, out};
  return Dump(nlh, OnNeigh, &d);
}

int Netlink::ListFdb(int ifindex, std::vector<NeighEntry>* out) {
  return ListNeighs(AF_BRIDGE, ifindex, out);
}

int Netlink::ListAddrs(int family, int ifindex, std::vector<AddrEntry>* out) {
  char buf[256];
  nlmsghdr* nlh = mnl_nlmsg_put_header(buf);
  nlh->nlmsg_type = RTM_GETADDR;
  auto* ifa = static_cast<ifaddrmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifaddrmsg)));
  ifa->ifa_family = family;
  AddrDump d{family, ifindex, out};
  return Dump(nlh, OnAddr, &d);
}

int Netlink::ListLinks(std::vector<LinkEntry>* out) {
  char buf[256];
  nlmsghdr* nlh = mnl_nlmsg_put_header(buf);
  nlh->nlmsg_type = RTM_GETLINK;
  auto* ifi = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifinfomsg)));
  ifi->ifi_family = AF_UNSPEC;
  return Dump(nlh, OnLinks, out);
}

int Netlink::GetLink(const std::string& name, LinkEntry* out) {
  if (name.empty() || name.size() >= IFNAMSIZ) return ENODEV;
  char buf[256];
  nlmsghdr* nlh = mnl_nlmsg_put_header(buf);
  nlh->nlmsg_type = RTM_GETLINK;
  auto* ifi = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifinfomsg)));
  ifi->ifi_family = AF_UNSPEC;
  mnl_attr_put_strz(nlh, IFLA_IFNAME, name.c_str());
  return Request(nlh, OnLink, out);
}

std::unique_ptr<NetlinkMonitor> NetlinkMonitor::Open(const std::string& netns_path,
                                                     std::string* error) {
  unsigned groups = RTMGRP_LINK | RTMGRP_NEIGH | RTMGRP_IPV4_IFADDR | RTMGRP_IPV4_ROUTE |
                    RTMGRP_IPV6_IFADDR | RTMGRP_IPV6_ROUTE;
  mnl_socket* sock = OpenRouteSocket(netns_path, groups, error);
  if (!sock) return nullptr;
  int fd = mnl_socket_get_fd(sock);
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0) {
    *error = std::string("netlink monitor: O_NONBLOCK: ") + std::strerror(errno);
    mnl_socket_close(sock);
    return nullptr;
  }
  std::unique_ptr<NetlinkMonitor> mon(new NetlinkMonitor(sock));
  mon->IgnorePort(0);
  return mon;
}

void NetlinkMonitor::IgnorePort(uint32_t portid) {
  ignore_portid_ = portid;
  // What Drain would skip is dropped by the kernel before it is queued (a classic BPF socket
  // filter: a notification is one message, the filter sees its nlmsghdr): the changes `portid`
  // made, and FDB additions with NTF_SELF (a VXLAN device's own entries: they carry no port id).
  // A 5,000-peer snapshot's 15,000 notifications then cost no reads. A bridge's entries (learnt
  // behind its ports: NTF_SELF unset) pass.
  // Absolute loads are big-endian: the constants are compared in network order.
  constexpr uint32_t kAccept = 0xffffffff;
  sock_filter code[] = {
      // nlmsg_pid == portid (0 matches nothing: skipped below) → drop
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(nlmsghdr, nlmsg_pid)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, htonl(portid), 0, 1),
      BPF_STMT(BPF_RET | BPF_K, portid != 0 ? 0 : kAccept),
      // RTM_NEWNEIGH with ndm_family AF_BRIDGE and NTF_SELF (a device's own FDB entry) → drop
      BPF_STMT(BPF_LD | BPF_H | BPF_ABS, offsetof(nlmsghdr, nlmsg_type)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, htons(RTM_NEWNEIGH), 0, 5),
      BPF_STMT(BPF_LD | BPF_B | BPF_ABS, NLMSG_HDRLEN + offsetof(ndmsg, ndm_family)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AF_BRIDGE, 0, 3),
      BPF_STMT(BPF_LD | BPF_B | BPF_ABS, NLMSG_HDRLEN + offsetof(ndmsg, ndm_flags)),
      BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, NTF_SELF, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, 0),
      BPF_STMT(BPF_RET | BPF_K, kAccept),
  };
  sock_fprog prog = {static_cast<unsigned short>(sizeof(code) / sizeof(code[0])), code};
  // Without the filter (it cannot fail on a kernel weft runs on) Drain skips the same messages.
  setsockopt(mnl_socket_get_fd(sock_), SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof(prog));
}

// Notifications come one per datagram (at most a page or two each): a small buffer holds any.
constexpr size_t kMonitorRxBytes = 64 << 10;

NetlinkMonitor::NetlinkMonitor(mnl_socket* sock) : sock_(sock), rx_(new char[kMonitorRxBytes]) {}

NetlinkMonitor::~NetlinkMonitor() { mnl_socket_close(sock_); }

int NetlinkMonitor::fd() const { return mnl_socket_get_fd(sock_); }

int NetlinkMonitor::Drain(std::vector<NlChange>* out) {
  int result = 0;
  while (true) {
    ssize_t n = mnl_socket_recvfrom(sock_, rx_.get(), kMonitorRxBytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return result;
      if (errno == ENOBUFS) {  // notifications were dropped; the socket goes on
        result = ENOBUFS;
        continue;
      }
      return errno;
    }
    auto* nlh = reinterpret_cast<nlmsghdr*>(rx_.get());
    int left = static_cast<int>(n);
    for (; mnl_nlmsg_ok(nlh, left); nlh = mnl_nlmsg_next(nlh, &left)) {
      if (ignore_portid_ != 0 && nlh->nlmsg_pid == ignore_portid_) continue;
      NlChange c;
      switch (nlh->nlmsg_type) {
        case RTM_NEWROUTE:
        case RTM_DELROUTE:
          c.kind = NlChange::kRoute;
          c.deleted = nlh->nlmsg_type == RTM_DELROUTE;
          ParseRoute(nlh, &c.route);
          c.family = c.route.family;
          c.ifindex = c.route.oif;
          break;
        case RTM_NEWNEIGH:
        case RTM_DELNEIGH: {
          const auto* nd = static_cast<const ndmsg*>(mnl_nlmsg_get_payload(nlh));
          c.kind = nd->ndm_family == AF_BRIDGE ? NlChange::kFdb : NlChange::kNeigh;
          c.deleted = nlh->nlmsg_type == RTM_DELNEIGH;
          // A device's own FDB additions (NTF_SELF) are not reported: a VXLAN device's FDB
          // notifications carry no port id, so its owner's own appends (one per peer) would be
          // nearly all of them. A removal, or an entry pointed elsewhere (the old destination is
          // announced deleted), is reported; so is what a bridge learns behind its ports.
          if (c.kind == NlChange::kFdb && !c.deleted && (nd->ndm_flags & NTF_SELF) != 0) continue;
          c.family = nd->ndm_family;
          ParseNeigh(nlh, &c.neigh);
          c.ifindex = c.neigh.ifindex;
          break;
        }
        case RTM_NEWLINK:
        case RTM_DELLINK: {
          c.kind = NlChange::kLink;
          c.deleted = nlh->nlmsg_type == RTM_DELLINK;
          LinkEntry l;
          ParseLink(nlh, &l);
          c.ifindex = l.index;
          c.name = l.name;
          c.link_flags = l.flags;
          c.master = l.master;
          break;
        }
        case RTM_NEWADDR:
        case RTM_DELADDR: {
          const auto* ifa = static_cast<const ifaddrmsg*>(mnl_nlmsg_get_payload(nlh));
          c.kind = NlChange::kAddr;
          c.deleted = nlh->nlmsg_type == RTM_DELADDR;
          c.family = ifa->ifa_family;
          c.ifindex = static_cast<int>(ifa->ifa_index);
          break;
        }
        default:
          continue;
      }
      out->push_back(std::move(c));
    }
  }
}

}  // namespace weft
