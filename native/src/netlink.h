// rtnetlink over libmnl: typed, idempotent kernel operations for the kernel backends (links,
// addresses, routes, neighbours, FDB), IPv4 and IPv6. Plain C++, no N-API: addon.cc converts.
//
// Batch contract: Apply() packs many requests (each NLM_F_ACK, its own sequence number) into few
// sendmsg calls (up to kBatchMessages each) and maps every ACK back to its request by sequence
// number, so the result vector has one errno (0 = success) per op, in op order. Requests are
// independent: one failing does not stop the others. Apply is synchronous and blocks only on the
// kernel's own processing of the batch; never call it from a packet path.
//
// A Netlink object is bound to the network namespace it was opened in (a netlink socket keeps
// the namespace of its creation), so a caller in one namespace can program another.
#ifndef WEFT_NATIVE_SRC_NETLINK_H_
#define WEFT_NATIVE_SRC_NETLINK_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

struct mnl_socket;
struct nlmsghdr;

namespace weft {

// An address of either family; family 0 means "absent".
struct IpAddr {
  int family = 0;  // AF_INET, AF_INET6 or 0
  uint8_t bytes[16] = {};
};

bool ParseIp(const std::string& text, IpAddr* out);
std::string FormatIp(const IpAddr& ip);
bool ParseMac(const std::string& text, uint8_t out[6]);
std::string FormatMac(const uint8_t mac[6]);

enum class NlOpKind {
  kReplaceRoute,
  kDelRoute,
  kReplaceNeigh,
  kDelNeigh,
  kAppendFdb,
  kDelFdb,
  kReplaceAddr,
  kDelAddr,
  kSetLink,
  kDelLink,
  kAddVxlan,
  kAddIpip,  // ipip device: name, mtu, local (IPv4); remote any, ttl inherit, tos 0, nopmtudisc
};

// One request. Fields a kind does not use are ignored.
struct NlOp {
  NlOpKind kind = NlOpKind::kReplaceRoute;
  IpAddr dst;        // route destination, neighbour/addr address, FDB remote
  int dst_len = -1;  // route / address prefix length (-1: full length)
  IpAddr gw;         // route gateway (family 0: none)
  int ifindex = 0;   // route oif / neighbour / FDB / address / link index
  bool onlink = false;
  uint32_t table = 0;      // 0: main
  uint8_t route_type = 0;  // RTN_*; 0: RTN_UNICAST (RTN_BLACKHOLE: no device, no gateway)
  bool has_mac = false;
  uint8_t mac[6] = {};  // neighbour lladdr, FDB MAC, link MAC, vxlan MAC
  int mtu = 0;          // set link / vxlan: 0 leaves it
  int up = -1;          // set link: -1 unchanged, 0 down, 1 up
  // vxlan
  std::string name;
  uint32_t vni = 0;
  uint16_t port = 0;
  IpAddr local;
  int link = 0;  // underlying device index (0: none)
  bool learning = false;
  bool gbp = false;  // IFLA_VXLAN_GBP (a flag attribute)
};

struct RouteEntry {
  int family = 0;
  IpAddr dst;
  int dst_len = 0;
  IpAddr gw;
  int oif = 0;
  uint32_t table = 0;
  uint8_t protocol = 0;
  uint8_t scope = 0;
  uint8_t type = 0;
  uint32_t flags = 0;  // RTNH_F_ONLINK = 4
};

struct NeighEntry {
  IpAddr dst;
  int ifindex = 0;
  bool has_lladdr = false;
  uint8_t lladdr[6] = {};
  uint16_t state = 0;
  uint8_t flags = 0;
};

struct AddrEntry {
  IpAddr addr;
  int prefix = 0;
  int ifindex = 0;
  uint8_t scope = 0;
};

struct VxlanInfo {
  uint32_t vni = 0;
  uint16_t port = 0;
  IpAddr local;
  int link = 0;
  bool learning = true;
  bool gbp = false;
};

struct IpipInfo {
  IpAddr local;
  IpAddr remote;  // family 0: any
  uint8_t ttl = 0;
  uint8_t tos = 0;
  bool pmtudisc = true;
};

// A TUN/TAP device (kind "tun"): its flags and how many queues a process holds now.
struct TunInfo {
  bool tap = false;
  bool pi = true;
  bool vnet_hdr = false;
  bool multi_queue = false;
  bool persist = false;
  uint32_t queues = 0;  // attached queues (multi-queue devices only; 0 otherwise)
};

struct LinkEntry {
  int index = 0;
  std::string name;
  int mtu = 0;
  bool has_mac = false;
  uint8_t mac[6] = {};
  unsigned flags = 0;  // IFF_UP etc.
  int master = 0;      // IFLA_MASTER: the bridge a port is enslaved to (0: none)
  std::string kind;    // "" for devices without IFLA_LINKINFO
  bool has_vxlan = false;
  VxlanInfo vxlan;
  bool has_ipip = false;
  IpipInfo ipip;
  bool has_tun = false;
  TunInfo tun;
};

// One change the kernel announced on the rtnetlink multicast groups (see NetlinkMonitor).
struct NlChange {
  enum Kind : uint8_t { kRoute, kNeigh, kFdb, kLink, kAddr };
  Kind kind = kRoute;
  bool deleted = false;     // RTM_DEL* (else RTM_NEW*)
  RouteEntry route;         // kRoute
  NeighEntry neigh;         // kNeigh, kFdb
  int ifindex = 0;          // kLink, kAddr (and the device of every other kind)
  std::string name;         // kLink
  unsigned link_flags = 0;  // kLink: IFF_* (IFF_UP: set up)
  int master = 0;           // kLink: IFLA_MASTER (0: none)
  int family = 0;           // kRoute, kNeigh, kAddr (AF_INET / AF_INET6)
};

class Netlink {
 public:
  static constexpr size_t kBatchMessages = 1024;
  // Receive buffer of every call, allocated once per handle (a 5,000-route dump fills it a few
  // times over; ACK batches fit many times): not allocated nor zeroed per call.
  static constexpr size_t kRxBytes = 1 << 20;

  // Opens a NETLINK_ROUTE socket, inside `netns_path` when not empty (e.g. /run/netns/x).
  // Returns null and sets *error on failure (never falls back to the current namespace).
  static std::unique_ptr<Netlink> Open(const std::string& netns_path, std::string* error);
  ~Netlink();
  Netlink(const Netlink&) = delete;
  Netlink& operator=(const Netlink&) = delete;

  // One errno per op (0 on success), in op order.
  std::vector<int> Apply(const std::vector<NlOp>& ops);

  // Dumps; each returns 0 or an errno. `family` is AF_INET or AF_INET6; ifindex 0 = all.
  int ListRoutes(int family, std::vector<RouteEntry>* out);
  int ListNeighs(int family, int ifindex, std::vector<NeighEntry>* out);
  int ListFdb(int ifindex, std::vector<NeighEntry>* out);
  int ListAddrs(int family, int ifindex, std::vector<AddrEntry>* out);
  int ListLinks(std::vector<LinkEntry>* out);
  // ENODEV when no such link.
  int GetLink(const std::string& name, LinkEntry* out);

  // The socket's netlink port id: the kernel stamps it on the notifications of the changes this
  // socket requested (routes, neighbours, addresses), so a monitor can tell them apart.
  uint32_t portid() const { return portid_; }

 private:
  explicit Netlink(mnl_socket* sock);
  int Dump(nlmsghdr* req, int (*cb)(const nlmsghdr*, void*), void* data);
  int Request(nlmsghdr* req, int (*cb)(const nlmsghdr*, void*), void* data);

  mnl_socket* sock_;
  uint32_t portid_;
  uint32_t seq_;
  std::vector<char> buf_;  // Apply's requests, sized on the first Apply (a dump socket has none)
  std::unique_ptr<char[]> rx_;
};

// A NETLINK_ROUTE socket subscribed to the link, address, IPv4/IPv6 route and neighbour groups
// (FDB changes come on the neighbour group, family AF_BRIDGE: of a VXLAN device's own entries
// (NTF_SELF) only removals are reported; a bridge's learnt entries both ways), in the network
// namespace it was opened in. Non-blocking: Drain() reads
// whatever is queued.
class NetlinkMonitor {
 public:
  static std::unique_ptr<NetlinkMonitor> Open(const std::string& netns_path, std::string* error);
  ~NetlinkMonitor();
  NetlinkMonitor(const NetlinkMonitor&) = delete;
  NetlinkMonitor& operator=(const NetlinkMonitor&) = delete;

  int fd() const;
  // Notifications stamped with this port id (a Netlink's portid(): the changes it made itself)
  // are dropped by a socket filter (and skipped by Drain). 0: none (the kernel's own changes
  // carry 0). FDB additions with NTF_SELF (a VXLAN device's own entries) are always dropped.
  void IgnorePort(uint32_t portid);
  // Appends every change queued now. Returns 0 when it read all of them; ENOBUFS when the kernel
  // dropped notifications since the last call (the socket buffer was full: the caller must
  // re-read the state it cares about; what was still queued is appended too); another errno on
  // a socket error.
  int Drain(std::vector<NlChange>* out);

 private:
  explicit NetlinkMonitor(mnl_socket* sock);
  mnl_socket* sock_;
  uint32_t ignore_portid_ = 0;
  std::unique_ptr<char[]> rx_;
};

}  // namespace weft

#endif  // WEFT_NATIVE_SRC_NETLINK_H_
