// Test exports' logic, kept out of the binding (addon.cc only converts): each runs one piece of
// the engine over plain byte vectors, as the packet loop would, so the tests in test/native/ can
// compare it with the reference codec. Not used by the engine; allocates freely.
#ifndef WEFT_NATIVE_HARNESS_H_
#define WEFT_NATIVE_HARNESS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace weft {

using Bytes = std::vector<uint8_t>;

// The segments a TCP GSO packet (10-byte virtio_net_hdr + packet) is cut into: by SplitTso, or
// with `in_place` by SplitTsoHeaders (each segment reassembled from its headers and its payload
// left in the packet, as the engine sends it: an iovec pair). Empty when it is not a valid TCP
// GSO packet.
std::vector<Bytes> TsoSplitForTest(const uint8_t* vnet_hdr_and_packet, size_t len, bool in_place);

// The TUN writes (vnet header + packet) the receive path makes of these inner packets in this
// order: `gather`, with the gathering coalescer the engine uses (later payloads read in place);
// `udp`, UDP datagrams merge too (as on a TUN that took USO4 and USO6); `authenticated`, as
// WireGuard's receive path adds them (checksums not summed: the Coalescer constructor).
std::vector<Bytes> GroCoalesceForTest(const std::vector<Bytes>& packets, uint32_t tun_mtu,
                                      bool gather, bool udp, bool authenticated = false);

}  // namespace weft

#endif  // WEFT_NATIVE_HARNESS_H_
