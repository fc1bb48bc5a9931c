#include "tun.h"

#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "offloads.h"
#include "packet.h"
#include "tap_tx.h"

namespace weft {

namespace {

int Open(const std::string& name, short flags, std::string* actual_name, std::string* error) {
  if (name.size() >= IFNAMSIZ) {
    *error = "tun name too long: " + name;
    return -EINVAL;
  }
  int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    *error = std::string("open /dev/net/tun: ") + std::strerror(e);
    return -e;
  }
  struct ifreq ifr;
  std::memset(&ifr, 0, sizeof(ifr));
  ifr.ifr_flags = flags;
  std::memcpy(ifr.ifr_name, name.data(), name.size());
  if (ioctl(fd, TUNSETIFF, &ifr) < 0) {
    int e = errno;
    close(fd);
    *error = "TUNSETIFF " + name + ": " + std::strerror(e);
    return -e;
  }
  int hdr = static_cast<int>(kVnetHdrLen);
  if ((flags & IFF_VNET_HDR) != 0 && ioctl(fd, TUNSETVNETHDRSZ, &hdr) < 0) {
    int e = errno;
    close(fd);
    *error = "TUNSETVNETHDRSZ " + name + ": " + std::strerror(e);
    return -e;
  }
  *actual_name = ifr.ifr_name;
  return fd;
}

}  // namespace

int OpenTunQueue(const std::string& name, std::string* actual_name, std::string* error) {
  return Open(name, IFF_TUN | IFF_NO_PI | IFF_VNET_HDR | IFF_MULTI_QUEUE, actual_name, error);
}

int OpenPlainTun(const std::string& name, std::string* actual_name, std::string* error) {
  return Open(name, IFF_TUN | IFF_NO_PI, actual_name, error);
}

int OpenEgressTap(const std::string& name, std::string* actual_name, uint8_t mac[6],
                  std::string* error) {
  int fd = Open(name, IFF_TAP | IFF_NO_PI | IFF_VNET_HDR, actual_name, error);
  if (fd < 0) return fd;
  int hdr = static_cast<int>(kTapVnetHdrLen);
  const unsigned offloads =
      kTunFCsum | kTunFTso4 | kTunFTso6 | kTunFUdpTunnelGso | kTunFUdpTunnelGsoCsum;
  struct ifreq ifr;
  std::memset(&ifr, 0, sizeof(ifr));
  const char* step = "TUNSETVNETHDRSZ 24";
  int rc = ioctl(fd, TUNSETVNETHDRSZ, &hdr);
  if (rc == 0) {
    step = "TUNSETOFFLOAD (UDP tunnel GSO, kernel >= 6.17)";
    rc = ioctl(fd, TUNSETOFFLOAD, static_cast<unsigned long>(offloads));
  }
  if (rc == 0) {
    step = "SIOCGIFHWADDR";
    rc = ioctl(fd, SIOCGIFHWADDR, &ifr);
  }
  if (rc != 0) {
    int e = errno;
    close(fd);
    *error = std::string(step) + " " + *actual_name + ": " + std::strerror(e);
    return -e;
  }
  std::memcpy(mac, ifr.ifr_hwaddr.sa_data, 6);
  return fd;
}

int SetTunPersist(int fd, bool persist, std::string* error) {
  if (ioctl(fd, TUNSETPERSIST, persist ? 1ul : 0ul) == 0) return 0;
  int e = errno;
  *error = std::string("TUNSETPERSIST: ") + std::strerror(e);
  return e;
}

unsigned ProbeTunOffloads(int fd, unsigned enable) {
  static const unsigned kSets[] = {
      kTunFCsum,
      kTunFCsum | kTunFTso4 | kTunFTso6,
      kTunFCsum | kTunFUso4 | kTunFUso6,
  };
  unsigned accepted = 0;
  for (unsigned set : kSets) {
    if (ioctl(fd, TUNSETOFFLOAD, static_cast<unsigned long>(set)) == 0) accepted |= set;
  }
  unsigned want = enable & accepted;
  if (ioctl(fd, TUNSETOFFLOAD, static_cast<unsigned long>(want)) != 0) {
    ioctl(fd, TUNSETOFFLOAD, 0ul);
  }
  return accepted;
}

}  // namespace weft
