#include "sd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>

namespace weft {

int SdNotify(const std::string& socket_path, const std::string& state) {
  sockaddr_un addr;
  std::memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  if (socket_path.size() < 2 || socket_path.size() >= sizeof(addr.sun_path)) return EINVAL;
  if (socket_path[0] != '/' && socket_path[0] != '@') return EINVAL;
  std::memcpy(addr.sun_path, socket_path.data(), socket_path.size());
  if (socket_path[0] == '@') addr.sun_path[0] = '\0';
  socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + socket_path.size());

  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  ssize_t n;
  do {
    n = sendto(fd, state.data(), state.size(), MSG_NOSIGNAL, reinterpret_cast<sockaddr*>(&addr),
               len);
  } while (n < 0 && errno == EINTR);
  int err = n < 0 ? errno : (static_cast<size_t>(n) == state.size() ? 0 : EMSGSIZE);
  close(fd);
  return err;
}

}  // namespace weft
