// Offload bits, the one vocabulary across the native boundary: the TUN_F_* bits the kernel takes
// (TUNSETOFFLOAD) and the engine's own, each with the name the kill switch, the
// --dataplane-offloads flag and weft_dataplane_offload_enabled{feature} use
// (src/dataplane/offloads.ts OFFLOAD_NAMES lists the same names in the same order; the addon's
// offloadNames() export is checked against it at engine start).
#ifndef WEFT_NATIVE_OFFLOADS_H_
#define WEFT_NATIVE_OFFLOADS_H_

#include <cstddef>
#include <cstring>

namespace weft {

// TUN_F_* (linux/if_tun.h). This machine's headers are 6.1: USO (kernel >= 6.2) is spelled here.
constexpr unsigned kTunFCsum = 0x01;
constexpr unsigned kTunFTso4 = 0x02;
constexpr unsigned kTunFTso6 = 0x04;
constexpr unsigned kTunFUso4 = 0x20;
constexpr unsigned kTunFUso6 = 0x40;
constexpr unsigned kTunFAll = kTunFCsum | kTunFTso4 | kTunFTso6 | kTunFUso4 | kTunFUso6;

// The engine's own, above the TUN bits.
constexpr unsigned kOffloadGro = 0x10000;  // received TCP (and UDP with USO) coalesced (coalesce.h)
constexpr unsigned kOffloadUdpGso = 0x20000;  // UDP_SEGMENT on send
constexpr unsigned kOffloadUdpGro = 0x40000;  // UDP_GRO on receive
// TCP (TSO super-packets whole) sent through the egress TAP with tunnel GSO (tap_tx.h)
constexpr unsigned kOffloadTapGso = 0x80000;

struct OffloadName {
  const char* name;
  unsigned bit;
};

inline constexpr OffloadName kOffloadNames[] = {
    {"csum", kTunFCsum},         {"tso4", kTunFTso4},         {"tso6", kTunFTso6},
    {"uso4", kTunFUso4},         {"uso6", kTunFUso6},         {"gro", kOffloadGro},
    {"udp_gso", kOffloadUdpGso}, {"udp_gro", kOffloadUdpGro}, {"tap_gso", kOffloadTapGso},
};
inline constexpr size_t kOffloadCount = sizeof(kOffloadNames) / sizeof(kOffloadNames[0]);

// The bit named `name`, or 0 for an unknown name.
inline unsigned OffloadBit(const char* name) {
  for (const OffloadName& o : kOffloadNames) {
    if (std::strcmp(o.name, name) == 0) return o.bit;
  }
  return 0;
}

}  // namespace weft

#endif  // WEFT_NATIVE_OFFLOADS_H_
