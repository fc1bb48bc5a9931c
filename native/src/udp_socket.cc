#include "udp_socket.h"

#include <arpa/inet.h>
#include <linux/filter.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace weft {

bool MakeSockaddr(const std::string& ip, uint16_t port, sockaddr_storage* out, socklen_t* len) {
  std::memset(out, 0, sizeof(*out));
  auto* v4 = reinterpret_cast<sockaddr_in*>(out);
  if (inet_pton(AF_INET, ip.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
    *len = sizeof(sockaddr_in);
    return true;
  }
  auto* v6 = reinterpret_cast<sockaddr_in6*>(out);
  if (inet_pton(AF_INET6, ip.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
    *len = sizeof(sockaddr_in6);
    return true;
  }
  return false;
}

int OpenUdpSocket(const sockaddr_storage& addr, socklen_t len, int buf_bytes, std::string* error,
                  int rcv_buf_bytes) {
  if (rcv_buf_bytes < 0) rcv_buf_bytes = buf_bytes;
  int family = addr.ss_family;
  int fd = socket(family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    int e = errno;
    *error = std::string("socket: ") + std::strerror(e);
    return -e;
  }
  int one = 1;
  auto fail = [&](const char* what) {
    int e = errno;
    close(fd);
    *error = std::string(what) + ": " + std::strerror(e);
    return -e;
  };
  if (setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) < 0) return fail("SO_REUSEPORT");
  if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcv_buf_bytes, sizeof(rcv_buf_bytes)) < 0) {
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv_buf_bytes, sizeof(rcv_buf_bytes));
  }
  if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &buf_bytes, sizeof(buf_bytes)) < 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf_bytes, sizeof(buf_bytes));
  }
  if (family == AF_INET) {
    int pmtu = IP_PMTUDISC_DONT;
    if (setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof(pmtu)) < 0) {
      return fail("IP_MTU_DISCOVER");
    }
  } else {
    int pmtu = IPV6_PMTUDISC_DONT;
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    if (setsockopt(fd, IPPROTO_IPV6, IPV6_MTU_DISCOVER, &pmtu, sizeof(pmtu)) < 0) {
      return fail("IPV6_MTU_DISCOVER");
    }
  }
  if (bind(fd, reinterpret_cast<const sockaddr*>(&addr), len) < 0) return fail("bind");
  return fd;
}

int OpenRawIpipSocket(const sockaddr_storage& addr, socklen_t len, int buf_bytes,
                      std::string* error) {
  int fd = socket(AF_INET, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, IPPROTO_IPIP);
  if (fd < 0) {
    int e = errno;
    *error = std::string("socket(SOCK_RAW, IPPROTO_IPIP): ") + std::strerror(e);
    return -e;
  }
  auto fail = [&](const char* what) {
    int e = errno;
    close(fd);
    *error = std::string(what) + ": " + std::strerror(e);
    return -e;
  };
  int one = 1;
  if (setsockopt(fd, IPPROTO_IP, IP_HDRINCL, &one, sizeof(one)) < 0) return fail("IP_HDRINCL");
  if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buf_bytes, sizeof(buf_bytes)) < 0) {
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf_bytes, sizeof(buf_bytes));
  }
  if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &buf_bytes, sizeof(buf_bytes)) < 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf_bytes, sizeof(buf_bytes));
  }
  if (bind(fd, reinterpret_cast<const sockaddr*>(&addr), len) < 0) return fail("bind");
  return fd;
}

bool AttachRawSpread(int fd, int k, int n, bool by_cpu, std::string* error) {
  const uint32_t accept = 0xffffffffu;
  const uint32_t uk = static_cast<uint32_t>(k);
  const uint32_t un = static_cast<uint32_t>(n);
  std::vector<sock_filter> code;
  if (by_cpu) {
    code = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, static_cast<uint32_t>(SKF_AD_OFF + SKF_AD_CPU)),
        BPF_STMT(BPF_ALU | BPF_MOD | BPF_K, un),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, uk, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, accept),
        BPF_STMT(BPF_RET | BPF_K, 0),
    };
  } else {
    code = {
        BPF_STMT(BPF_LD | BPF_W | BPF_LEN, 0),
        BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 40, 2, 0),
        // short: queue 0 takes it
        BPF_STMT(BPF_LD | BPF_IMM, 0),
        BPF_JUMP(BPF_JMP | BPF_JA, 10, 0, 0),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, 32),  // inner source
        BPF_STMT(BPF_MISC | BPF_TAX, 0),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, 36),  // inner destination
        BPF_STMT(BPF_ALU | BPF_XOR | BPF_X, 0),
        BPF_STMT(BPF_MISC | BPF_TAX, 0),
        BPF_STMT(BPF_ALU | BPF_RSH | BPF_K, 16),
        BPF_STMT(BPF_ALU | BPF_XOR | BPF_X, 0),
        BPF_STMT(BPF_MISC | BPF_TAX, 0),
        BPF_STMT(BPF_ALU | BPF_RSH | BPF_K, 8),
        BPF_STMT(BPF_ALU | BPF_XOR | BPF_X, 0),
        // A = queue index candidate
        BPF_STMT(BPF_ALU | BPF_MOD | BPF_K, un),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, uk, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, accept),
        BPF_STMT(BPF_RET | BPF_K, 0),
    };
  }
  sock_fprog prog = {static_cast<unsigned short>(code.size()), code.data()};
  if (setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof(prog)) < 0) {
    *error = std::string("SO_ATTACH_FILTER: ") + std::strerror(errno);
    return false;
  }
  return true;
}

}  // namespace weft
