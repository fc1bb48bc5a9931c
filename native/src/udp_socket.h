// The engine's UDP sockets: one per worker, SO_REUSEPORT on the same address and port so the
// kernel spreads flows across workers, never connect()ed (kernel vxlan peers send from
// flow-hashed source ports; peers are matched by source address only).
#ifndef WEFT_NATIVE_UDP_SOCKET_H_
#define WEFT_NATIVE_UDP_SOCKET_H_

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <string>

namespace weft {

// Parses an IPv4/IPv6 literal and port into `out`; false when it is not one.
bool MakeSockaddr(const std::string& ip, uint16_t port, sockaddr_storage* out, socklen_t* len);

// Opens a non-blocking UDP socket bound to `addr` with SO_REUSEPORT, receive and send buffers
// of `buf_bytes` (SO_*BUFFORCE, falling back to SO_*BUF) and path-MTU discovery off (outer DF
// clear, as kernel vxlan sends). Returns the fd or -errno with `error` set.
// `rcv_buf_bytes` < 0: the receive buffer is `buf_bytes` too.
int OpenUdpSocket(const sockaddr_storage& addr, socklen_t len, int buf_bytes, std::string* error,
                  int rcv_buf_bytes = -1);

// Opens a non-blocking raw IPv4 socket for IP protocol 4 (IPIP) bound to `addr` (our address:
// it receives the protocol-4 packets sent to it, outer header included) with IP_HDRINCL (what
// it sends carries the outer header the codec wrote; the kernel fills in a zero ID and
// recomputes the header checksum) and buffers of `buf_bytes`. Returns the fd or -errno with
// `error` set. Needs CAP_NET_RAW.
int OpenRawIpipSocket(const sockaddr_storage& addr, socklen_t len, int buf_bytes,
                      std::string* error);

// Attaches a classic BPF filter to raw socket `fd` (queue `k` of `n`) so each received packet
// is taken by exactly one of the n sockets: the one whose k equals the receiving CPU mod n
// (`by_cpu`), else a hash of the inner IPv4 addresses (bytes 32..39 of a packet with a 20-byte
// outer header) mod n; packets too short to hold them go to queue 0 (which counts them).
bool AttachRawSpread(int fd, int k, int n, bool by_cpu, std::string* error);

}  // namespace weft

#endif  // WEFT_NATIVE_UDP_SOCKET_H_
