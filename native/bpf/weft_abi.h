// SPDX-License-Identifier: Apache-2.0
//
// The bpf engine's ABI: what native/bpf/weft.bpf.c (clang -target bpf) and its loader
// (native/src/bpf_loader.cc, in the addon) must agree on — the map values and keys, the
// programs' and maps' names, the map sizes and the counter slots. Both include this file; the
// counter slots come from weft_counters.gen.h (generated from src/dataplane/stats.ts).
// test/native/bpf-abi.test.ts compares the addon's view of every struct here (bpfAbi()) with the
// BTF of the built object, member by member.
//
// C and C++, with the kernel's fixed-width types (<linux/types.h>: __u8, __u16, __u32, __u64),
// which both the BPF target and the host compiler have.
#ifndef WEFT_NATIVE_BPF_WEFT_ABI_H_
#define WEFT_NATIVE_BPF_WEFT_ABI_H_

#include <linux/types.h>

#include "weft_counters.gen.h"

// The programs (function names; SEC("tc")), as X(name, pin): `pin` is the name of the program's
// tcx link in the engine's pin directory (bpf_loader.h). Their order is BpfProgram's.
#define WEFT_PROG_TX weft_tx
#define WEFT_PROG_RX weft_rx
#define WEFT_PROG_BRIDGE weft_bridge
#define WEFT_BPF_PROGRAMS(X) \
  X(WEFT_PROG_TX, "tx")      \
  X(WEFT_PROG_RX, "rx")      \
  X(WEFT_PROG_BRIDGE, "bridge")

// The maps (variable names in SEC(".maps")).
#define WEFT_MAP_CONFIG weft_config
#define WEFT_MAP_PEERS4 weft_peers4
#define WEFT_MAP_PEERS6 weft_peers6
#define WEFT_MAP_SOURCES weft_sources
#define WEFT_MAP_SOURCES6 weft_sources6
#define WEFT_MAP_PORTS weft_ports
#define WEFT_MAP_COUNTERS weft_counters
#define WEFT_BPF_MAPS(X) \
  X(WEFT_MAP_CONFIG)     \
  X(WEFT_MAP_PEERS4)     \
  X(WEFT_MAP_PEERS6)     \
  X(WEFT_MAP_SOURCES)    \
  X(WEFT_MAP_SOURCES6)   \
  X(WEFT_MAP_PORTS)      \
  X(WEFT_MAP_COUNTERS)

// A name above as a string literal.
#define WEFT_BPF_NAME(n) WEFT_BPF_NAME_(n)
#define WEFT_BPF_NAME_(n) #n

// Entries each peer map (per family) and each source map (per family) hold; the port map's.
#define WEFT_PEER_MAP_ENTRIES 65536
#define WEFT_PORT_MAP_ENTRIES 4096

// weft_config.format
#define WEFT_FORMAT_UDP 0
#define WEFT_FORMAT_VXLAN 1
#define WEFT_FORMAT_IPIP 2

// The counter slots: WEFT_C_<SLOT>, then WEFT_C_COUNT (weft_counters' entries).
enum weft_bpf_counter {
#define WEFT_BPF_COUNTER_SLOT(slot, name) WEFT_C_##slot,
  WEFT_BPF_COUNTERS(WEFT_BPF_COUNTER_SLOT)
#undef WEFT_BPF_COUNTER_SLOT
      WEFT_C_COUNT,
};

// weft_config's one value.
struct weft_config {
  __u32 format;  // WEFT_FORMAT_*
  __u32 vni;
  __u32 tun_ifindex;  // where weft_tx runs with no MAC header; weft_rx delivers into its ingress
  __u32 underlay_ifindex;  // where encapsulated packets leave
  __u32 local_v4;          // our underlay IPv4 address (network order); 0: none
  __u16 port;              // backend port (network order); 0 for IPIP
  __u8 vtep_mac[6];
  __u8 local_v6[16];  // our underlay IPv6 address; all zero: none (IPv4 underlay only)
};

// weft_sources6's key: a public IPv6 address holding a lease.
struct weft_addr6 {
  __u8 addr[16];
};

// The peer maps' LPM keys (prefixlen in host order, then the address).
struct weft_lpm_v4 {
  __u32 prefixlen;
  __u8 addr[4];
};

struct weft_lpm_v6 {
  __u32 prefixlen;
  __u8 addr[16];
};

// One peer, as the native peer table has it (native/src/peer_table.h), trimmed to what the
// programs use. pub_family 4 or 6: the underlay family its packets ride (pub: the address, IPv4
// in the first 4 bytes).
struct weft_peer {
  __u8 pub_family;
  __u8 has_mac;
  __u16 port;  // network order
  __u8 mac[6];
  __u8 pad[2];
  __u8 pub[16];
};

#endif  // WEFT_NATIVE_BPF_WEFT_ABI_H_
