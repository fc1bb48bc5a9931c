// SPDX-License-Identifier: Apache-2.0
//
// The bpf engine's fast path: VXLAN, flannel-udp and IPIP encapsulation in the kernel, with the
// same formats and the same decisions as the reference codec (src/dataplane/js-codec.ts).
//
//   weft_tx  egress of weft's TUN (no MAC header; under BPF_PROG_TEST_RUN an Ethernet header is
//            in front): inner IPv4/IPv6 → peer (LPM trie) → adjust_room encap → outer IPv4 or
//            IPv6 (the peer record's underlay family: dual-stack nodes send IPv4 pods to the
//            peer's PublicIP, IPv6 pods to its PublicIPv6, as flannel.1 and flannel-v6.1 do),
//            UDP (and VXLAN + inner Ethernet; IPIP: the outer IPv4 header alone, protocol 4) →
//            bpf_redirect_neigh(underlay).
//   weft_rx  ingress of the underlay (Ethernet): UDP to our port (IPIP: protocol 4) on our IPv4
//            or IPv6 address from a peer's public address → VNI, inner MAC, anti-spoofing (TTL
//            for flannel-udp, ECN for IPIP) →
//            adjust_room decap → bpf_redirect(TUN, BPF_F_INGRESS): the inner packet enters the
//            stack as received on the TUN, as kernel vxlan's enter on flannel.1 (so strict
//            rp_filter, `-i flannel.1` rules and conntrack see what they see with kernel vxlan).
//            The TUN has no MAC header: the redirect strips the Ethernet header in front.
//   weft_bridge  egress of the pods' bridge (--pod-bridge): a GSO packet for a pod → straight
//            to the bridge port behind its MAC (the bridge would segment it in software).
//
// Anything either program does not handle exactly as the reference would (no peer, trailing
// bytes, TTL expiring, a bad header, an unknown sender, an outer IPv6 UDP checksum it cannot
// derive, ...) leaves the packet untouched and returns TC_ACT_UNSPEC (= TCX_NEXT): the next tc
// program on the hook runs (TC_ACT_OK would end a tcx chain and skip every program attached
// after weft's), then it reaches the TUN or the UDP socket, where the userspace engine handles
// it (or drops it with its usual reason). So the drop reasons are counted in one place, the
// userspace engine; this file counts what it moved, what it passed and the packets it changed
// half way and had to drop (tx_error / rx_error), each packet under one slot.
//
// Only stable helpers: map lookups, skb_load_bytes/store_bytes, skb_adjust_room, redirect_neigh,
// redirect, get_prandom_u32, loop (kernel 5.17).
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
// libbpf's headers after the uapi ones, whose types they use.
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

// The structs, map and program names, map sizes and counter slots the loader shares.
#include "weft_abi.h"

// Newer than this machine's 6.1 uapi headers (kernel 6.3+).
#define WEFT_ADJ_ROOM_DECAP_L3_IPV4 (1ULL << 7)
#define WEFT_ADJ_ROOM_DECAP_L3_IPV6 (1ULL << 8)

#define ETH_HLEN 14
#define IP4_HLEN 20
#define IP6_HLEN 40
#define UDP_HLEN 8
#define VXLAN_HLEN 8
#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD
#define PROTO_ICMP 1
#define PROTO_IPIP 4
#define PROTO_TCP 6
#define PROTO_UDP 17
#define PROTO_ICMPV6 58
#define MAX_UDP_PAYLOAD 65507
#define MAX_IP_LEN 65535
#define ECN_MASK 3
#define ECN_ECT0 2
#define ECN_CE 3
#define IP_DF 0x40  // in the first byte of the flags/fragment offset field
#define VXLAN_SRC_PORT_MIN 32768
#define VXLAN_SRC_PORT_MAX 61000

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct weft_config);
} WEFT_MAP_CONFIG SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_LPM_TRIE);
  __uint(max_entries, WEFT_PEER_MAP_ENTRIES);
  __uint(map_flags, BPF_F_NO_PREALLOC);
  __type(key, struct weft_lpm_v4);
  __type(value, struct weft_peer);
} WEFT_MAP_PEERS4 SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_LPM_TRIE);
  __uint(max_entries, WEFT_PEER_MAP_ENTRIES);
  __uint(map_flags, BPF_F_NO_PREALLOC);
  __type(key, struct weft_lpm_v6);
  __type(value, struct weft_peer);
} WEFT_MAP_PEERS6 SEC(".maps");

// Public IPv4 addresses holding a lease (value: how many peer records name it).
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, WEFT_PEER_MAP_ENTRIES);
  __type(key, __u32);
  __type(value, __u32);
} WEFT_MAP_SOURCES SEC(".maps");

// Public IPv6 addresses holding a lease (the same, for IPv6 underlays).
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, WEFT_PEER_MAP_ENTRIES);
  __type(key, struct weft_addr6);
  __type(value, __u32);
} WEFT_MAP_SOURCES6 SEC(".maps");

// The bridge's ports by the MAC behind them (its FDB, learnt entries only): MAC in the low six
// bytes of the key, the port's ifindex as the value.
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, WEFT_PORT_MAP_ENTRIES);
  __type(key, __u64);
  __type(value, __u32);
} WEFT_MAP_PORTS SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, WEFT_C_COUNT);
  __type(key, __u32);
  __type(value, __u64);
} WEFT_MAP_COUNTERS SEC(".maps");

static __always_inline void count(__u32 slot, __u64 n) {
  __u64* c = bpf_map_lookup_elem(&WEFT_MAP_COUNTERS, &slot);
  if (c) *c += n;
}

static __always_inline struct weft_config* config(void) {
  __u32 zero = 0;
  return bpf_map_lookup_elem(&WEFT_MAP_CONFIG, &zero);
}

static __always_inline __u32 fold(__u32 sum) {
  sum = (sum & 0xffff) + (sum >> 16);
  sum = (sum & 0xffff) + (sum >> 16);
  return sum;
}

// What parse_ip learns about the inner packet at `off`.
struct ip_info {
  __u32 len;     // IPv4 total length / 40 + IPv6 payload length
  __u32 l4_off;  // from the start of the IP header
  __u8 version;
  __u8 proto;
  __u8 ttl;
  __u8 tos;  // IPv4 only (IPIP carries no IPv6)
  __u8 df;   // IPv4 only: the DF bit (IP_DF) of the flags byte
  __u8 first_fragment;
  __u8 more_fragments;  // IPv4 only: MF set
  __u32 hsum;           // IPv6 only: the header's word sum, the payload length left out
  __u8 src[16];
  __u8 dst[16];
  __u8 ports[4];
  __u8 has_ports;
};

// Reads the inner IP header (and the first 4 L4 bytes) at `off`; 0 if it parses as the reference
// codec's parseIp would accept it with exactly `avail` bytes, -1 otherwise.
static __noinline int parse_ip(struct __sk_buff* skb, __u32 off, __u32 avail, struct ip_info* ip) {
  __u8 h[IP6_HLEN];
  if (avail < IP4_HLEN) return -1;
  if (bpf_skb_load_bytes(skb, off, h, IP4_HLEN) < 0) return -1;
  ip->version = h[0] >> 4;
  if (ip->version == 4) {
    __u32 ihl = (h[0] & 0x0f) * 4;
    __u32 tot = ((__u32)h[2] << 8) | h[3];
    if (ihl < IP4_HLEN || tot < ihl || tot != avail) return -1;
    ip->len = tot;
    ip->l4_off = ihl;
    ip->proto = h[9];
    ip->ttl = h[8];
    ip->tos = h[1];
    ip->df = h[6] & IP_DF;
    ip->first_fragment = ((((__u32)h[6] << 8) | h[7]) & 0x1fff) == 0;
    ip->more_fragments = (h[6] & 0x20) != 0;
    __builtin_memcpy(ip->src, h + 12, 4);
    __builtin_memcpy(ip->dst, h + 16, 4);
  } else if (ip->version == 6) {
    if (avail < IP6_HLEN) return -1;
    if (bpf_skb_load_bytes(skb, off, h, IP6_HLEN) < 0) return -1;
    __u32 tot = IP6_HLEN + (((__u32)h[4] << 8) | h[5]);
    if (tot != avail) return -1;
    ip->len = tot;
    ip->l4_off = IP6_HLEN;
    ip->proto = h[6];
    ip->ttl = h[7];
    ip->first_fragment = 1;
    __u32 hs = ((__u32)h[0] << 8 | h[1]) + ((__u32)h[2] << 8 | h[3]) + ((__u32)h[6] << 8 | h[7]);
#pragma unroll
    for (int i = 8; i < IP6_HLEN; i += 2) hs += ((__u32)h[i] << 8) | h[i + 1];
    ip->hsum = hs;
    __builtin_memcpy(ip->src, h + 8, 16);
    __builtin_memcpy(ip->dst, h + 24, 16);
  } else {
    return -1;
  }
  ip->has_ports = 0;
  if ((ip->proto == PROTO_TCP || ip->proto == PROTO_UDP) && ip->first_fragment &&
      ip->len >= ip->l4_off + 4) {
    __u32 l4 = ip->l4_off & 0x3f;  // ≤ 60 for IPv4, 40 for IPv6
    if (bpf_skb_load_bytes(skb, off + l4, ip->ports, 4) < 0) return -1;
    ip->has_ports = 1;
  }
  return 0;
}

static __always_inline struct weft_peer* lookup_peer(struct ip_info* ip, const __u8* addr) {
  if (ip->version == 4) {
    struct weft_lpm_v4 k = {.prefixlen = 32};
    __builtin_memcpy(k.addr, addr, 4);
    return bpf_map_lookup_elem(&WEFT_MAP_PEERS4, &k);
  }
  struct weft_lpm_v6 k = {.prefixlen = 128};
  __builtin_memcpy(k.addr, addr, 16);
  return bpf_map_lookup_elem(&WEFT_MAP_PEERS6, &k);
}

#define FNV_STEP(h, b) ((h) = ((h) ^ (__u8)(b)) * 16777619u)

// The inner flow's hash: FNV-1a over the inner addresses, protocol and ports (js-codec.ts
// vxlanSourcePort, native/src/vxlan.cc).
static __always_inline __u32 flow_hash(struct ip_info* ip) {
  __u32 h = 0x811c9dc5u;
  if (ip->version == 4) {
#pragma unroll
    for (int i = 0; i < 4; i++) FNV_STEP(h, ip->src[i]);
#pragma unroll
    for (int i = 0; i < 4; i++) FNV_STEP(h, ip->dst[i]);
  } else {
#pragma unroll
    for (int i = 0; i < 16; i++) FNV_STEP(h, ip->src[i]);
#pragma unroll
    for (int i = 0; i < 16; i++) FNV_STEP(h, ip->dst[i]);
  }
  FNV_STEP(h, ip->proto);
  if (ip->has_ports) {
#pragma unroll
    for (int i = 0; i < 4; i++) FNV_STEP(h, ip->ports[i]);
  }
  return h;
}

// The VXLAN outer source port: the flow hash scaled into [32768, 61000).
static __always_inline __u16 vxlan_src_port(__u32 h) {
  __u64 range = VXLAN_SRC_PORT_MAX - VXLAN_SRC_PORT_MIN;
  return (__u16)(VXLAN_SRC_PORT_MIN + (((__u64)h * range) >> 32));
}

// Rewrites the 16-bit word at `off + at` (even) of the IPv4 header at `off` and updates its header
// checksum (RFC 1624 eqn. 3, as js-codec.ts checksumUpdate16).
static __always_inline int rewrite_ip4_word(struct __sk_buff* skb, __u32 off, __u32 at,
                                            __u32 new_word) {
  __u8 w[2];
  __u16 old_check;
  if (bpf_skb_load_bytes(skb, off + at, w, 2) < 0) return -1;
  if (bpf_skb_load_bytes(skb, off + 10, &old_check, 2) < 0) return -1;
  __u32 old_word = ((__u32)w[0] << 8) | w[1];
  __u32 check = bpf_ntohs(old_check);
  __u32 sum = fold((~check & 0xffff) + (~old_word & 0xffff) + (new_word & 0xffff));
  __u16 new_check = bpf_htons(~sum & 0xffff);
  __u16 word = bpf_htons(new_word & 0xffff);
  if (bpf_skb_store_bytes(skb, off + at, &word, 2, 0) < 0) return -1;
  return bpf_skb_store_bytes(skb, off + 10, &new_check, 2, 0);
}

// Decrements the TTL / hop limit of the IP header at `off` (ttl > 1 checked by the caller).
static __always_inline int decrement_ttl(struct __sk_buff* skb, __u32 off, struct ip_info* ip) {
  __u8 ttl = ip->ttl - 1;
  if (ip->version == 6) return bpf_skb_store_bytes(skb, off + 7, &ttl, 1, 0);
  // TTL, then the protocol: the word at 8.
  return rewrite_ip4_word(skb, off, 8, ((__u32)ttl << 8) | ip->proto);
}

static __always_inline int same_mac(const __u8* a, const __u8* b) {
  __u8 diff = 0;
#pragma unroll
  for (int i = 0; i < 6; i++) diff |= a[i] ^ b[i];
  return diff == 0;
}

// The one's-complement sum, not folded, of the 16-bit words of `n` bytes (n even).
#define WORD_AT(b, i) (((__u32)(b)[i] << 8) | (b)[(i) + 1])

static __always_inline __u32 sum_addr(const __u8* a, int v6) {
  __u32 s = WORD_AT(a, 0) + WORD_AT(a, 2);
  if (v6) {
#pragma unroll
    for (int i = 4; i < 16; i += 2) s += WORD_AT(a, i);
  }
  return s;
}

// The outer UDP checksum over an IPv6 underlay, where it is mandatory (RFC 8200 8.1; kernel vxlan
// sends one and refuses a zero one unless its device has udp6zerocsumrx, which flannel never
// sets). The program cannot sum a whole packet (up to 64 KB, maybe still partially checksummed),
// and need not: an inner TCP, UDP or ICMPv6 packet whose own checksum is right (or left
// CHECKSUM_PARTIAL, to be finished by the device or GSO: the field then holds the inner
// pseudo-header sum) sums, from its L4 header on, to the complement of its inner pseudo-header
// sum; an inner ICMP (IPv4) message to zero; an inner IPv4 header to zero (its checksum is right:
// the stack wrote or checked it). So the sum is the outer pseudo-header, the UDP header, the
// VXLAN header and inner Ethernet header, the inner IPv6 header (IPv4: nothing) and the
// complement of the inner pseudo-header sum — headers only. The lengths are those of one
// segment (`l4_len` bytes from the inner L4 header on): a GSO super-packet whose segments are all
// gso_size long is cut by the kernel or the device into datagrams that each carry this same
// checksum, right for every one of them (the tunnel GSO adjust_room sets, SKB_GSO_UDP_TUNNEL,
// copies the outer checksum to each segment). An inner packet whose checksum is wrong gets an
// outer checksum wrong by as much: the receiver drops it, as it would drop the inner packet.
// Returns the checksum (never 0), or 0 when it cannot be derived so (other protocols,
// fragments, a zero UDP checksum, an L4 header shorter than its checksum field).
static __always_inline __u32 udp6_checksum(struct __sk_buff* skb, __u32 inner_off,
                                           struct ip_info* ip, __u32 l4_len, const __u8* local6,
                                           const __u8* peer6, const __u8* udp, const __u8* head,
                                           __u32 head_len, int ttl_dec) {
  int v6 = ip->version == 6;
  if (!ip->first_fragment || ip->more_fragments) return 0;
  __u32 min = ip->proto == PROTO_TCP ? 18 : ip->proto == PROTO_UDP ? 8 : 4;
  if (ip->len < ip->l4_off + min) return 0;
  __u32 sum = 0;
  if (ip->proto == PROTO_TCP || ip->proto == PROTO_UDP || (v6 && ip->proto == PROTO_ICMPV6)) {
    if (ip->proto == PROTO_UDP) {
      __u16 field;
      if (bpf_skb_load_bytes(skb, inner_off + (ip->l4_off & 0x3f) + 6, &field, 2) < 0) return 0;
      if (field == 0) return 0;  // no checksum (IPv4): its sum is unknown
    }
    __u32 pseudo = sum_addr(ip->src, v6) + sum_addr(ip->dst, v6) + ip->proto + l4_len;
    sum += ~fold(pseudo) & 0xffff;
  } else if (v6 || ip->proto != PROTO_ICMP) {
    return 0;
  }
  if (v6) sum += ip->hsum + l4_len - (ttl_dec ? 1 : 0);
  __u32 udp_len = UDP_HLEN + head_len + ip->l4_off + l4_len;
  sum += sum_addr(local6, 1) + sum_addr(peer6, 1) + PROTO_UDP + udp_len;
  sum += WORD_AT(udp, 0) + WORD_AT(udp, 2) + udp_len;
  if (head_len) {
#pragma unroll
    for (int i = 0; i < VXLAN_HLEN + ETH_HLEN; i += 2) sum += WORD_AT(head, i);
  }
  __u32 check = ~fold(sum) & 0xffff;
  return check ? check : 0xffff;
}

// A TCP super-packet whose last segment is short cannot carry one outer IPv6 UDP checksum right
// for every segment (the tunnel GSO copies it to each, and the lengths it covers differ). It can
// when cut into equal segments instead: the segment size, below gso_size and at least a quarter
// of it, that divides its `data` payload bytes exactly (the fewest segments), or 0 if there is
// none. (TCP takes any segment up to the MSS; the receiver sees smaller ones, no other change.)
#define RECUT_MAX_SEGS 184  // 4 x the 46 segments a 64 KB packet holds at a 1400-byte MSS

struct recut_search {
  __u32 data;
  __u32 gso;
  __u32 k0;   // the first segment count tried: one more than the packet has now
  __u32 seg;  // the answer (0: none)
};

// One step of the search, under bpf_loop: `k0 + i` segments. The verifier checks this function
// once, not once per iteration: unrolled (or as a bounded loop) the search took it past its
// 8,192 pending branches without CAP_PERFMON, where it also explores speculative paths.
static long recut_step(__u32 i, void* arg) {
  struct recut_search* r = arg;
  __u32 k = r->k0 + i;
  __u32 seg = r->data / k;
  if (seg * 4 < r->gso) return 1;  // below a quarter of the MSS: give up
  if (seg * k != r->data) return 0;
  r->seg = seg;
  return 1;
}

static __always_inline __u32 equal_segment(__u32 data, __u32 gso) {
  if (gso == 0 || data <= gso || data > MAX_IP_LEN) return 0;
  struct recut_search r = {.data = data, .gso = gso, .k0 = data / gso + 1, .seg = 0};
  if (bpf_loop(RECUT_MAX_SEGS, recut_step, &r, 0) < 0) return 0;
  return r.seg;
}

// Sets a GSO packet's gso_size to `gso - by`: adjust_room changes gso_size only by the room it
// adds (without BPF_F_ADJ_ROOM_FIXED_GSO), so add `by` bytes in front of the network header, then
// take them away again with the size fixed. The packet's bytes are as they were. 0, or -1 if the
// first step was refused (nothing changed), -2 if the second was (the packet is broken).
static __noinline int shrink_gso(struct __sk_buff* skb, __u32 by) {
  if (bpf_skb_adjust_room(skb, by, BPF_ADJ_ROOM_MAC, 0) < 0) return -1;
  if (bpf_skb_adjust_room(skb, -(__s32)by, BPF_ADJ_ROOM_MAC, BPF_F_ADJ_ROOM_FIXED_GSO) < 0)
    return -2;
  return 0;
}

struct outer_hdrs {
  __u8 ip[IP4_HLEN];
  __u8 udp[UDP_HLEN];
  __u8 vxlan[VXLAN_HLEN];
  __u8 eth[ETH_HLEN];
};

struct outer6_hdrs {
  __u8 ip[IP6_HLEN];
  __u8 udp[UDP_HLEN];
  __u8 vxlan[VXLAN_HLEN];
  __u8 eth[ETH_HLEN];
};

/** The VXLAN header (flags, our VNI) and the inner Ethernet header to the peer's VTEP MAC. */
static __always_inline void put_vxlan(__u8* vxlan, __u8* eth, const struct weft_config* cfg,
                                      const __u8* peer_mac, __u8 version) {
  vxlan[0] = 0x08;
  vxlan[4] = cfg->vni >> 16;
  vxlan[5] = cfg->vni >> 8;
  vxlan[6] = cfg->vni;
  __builtin_memcpy(eth, peer_mac, 6);
  __builtin_memcpy(eth + 6, cfg->vtep_mac, 6);
  eth[12] = version == 4 ? 0x08 : 0x86;
  eth[13] = version == 4 ? 0x00 : 0xdd;
}

static __always_inline int has_v6(const struct weft_config* cfg) {
  __u64 a, b;
  __builtin_memcpy(&a, cfg->local_v6, 8);
  __builtin_memcpy(&b, cfg->local_v6 + 8, 8);
  return (a | b) != 0;
}

SEC("tc")
int WEFT_PROG_TX(struct __sk_buff* skb) {
  struct weft_config* cfg = config();
  if (!cfg) return TC_ACT_UNSPEC;
  // On the TUN there is no MAC header; under BPF_PROG_TEST_RUN (and on any Ethernet device)
  // the packet starts with one.
  __u32 l2 = skb->ifindex == cfg->tun_ifindex ? 0 : ETH_HLEN;
  if (skb->len < l2) return TC_ACT_UNSPEC;
  int vx = cfg->format == WEFT_FORMAT_VXLAN;
  int ipip = cfg->format == WEFT_FORMAT_IPIP;
  int udp = !vx && !ipip;
  __u32 head = vx ? VXLAN_HLEN + ETH_HLEN : 0;
  struct ip_info ip = {};
  if (parse_ip(skb, l2, skb->len - l2, &ip) < 0) goto pass;
  if (ipip ? ip.version != 4 || ip.len + IP4_HLEN > MAX_IP_LEN : ip.len + head > MAX_UDP_PAYLOAD)
    goto pass;
  struct weft_peer* p = lookup_peer(&ip, ip.dst);
  if (!p || (vx && !p->has_mac)) goto pass;
  // The peer's underlay family: IPv4 (IPIP only there), or IPv6 where we have an address.
  int v6 = p->pub_family == 6;
  if (v6 ? ipip || !has_v6(cfg) : p->pub_family != 4 || cfg->local_v4 == 0) goto pass;
  if (udp && ip.ttl <= 1) goto pass;
  struct weft_peer peer = *p;
  __u32 segs = skb->gso_segs ? skb->gso_segs : 1;  // adjust_room zeroes it
  __u32 h = flow_hash(&ip);
  // UDP: VXLAN from a flow-hashed port, flannel-udp from the backend port.
  __u16 sport = vx ? bpf_htons(vxlan_src_port(h)) : cfg->port;
  __u64 flags = BPF_F_ADJ_ROOM_FIXED_GSO;
  if (vx) flags |= BPF_F_ADJ_ROOM_ENCAP_L2_ETH | BPF_F_ADJ_ROOM_ENCAP_L2(ETH_HLEN);
  __u32 outer_len;
  __u32 written;
  // One buffer for either outer family (the stack is 512 bytes).
  union {
    struct outer_hdrs v4;
    struct outer6_hdrs v6;
  } u;
  __builtin_memset(&u, 0, sizeof(u));

  if (v6) {
    // Outer IPv6 as kernel vxlan (and the native engine's socket) sends it: traffic class 0,
    // hop limit 64, a flow label from the inner flow (as the kernel's auto flow labels), no
    // extension headers; UDP with its checksum (udp6_checksum).
    struct outer6_hdrs* op = &u.v6;
#define o (*op)
    outer_len = IP6_HLEN + UDP_HLEN + head;
    __u32 udp_len = UDP_HLEN + head + ip.len;
    // One segment's L4 length: the whole packet's, or a GSO super-packet's segment (all alike:
    // a TCP one with a short last segment is re-cut into equal ones, equal_segment; what cannot
    // be goes to the userspace engine, which sends each segment with its own checksum).
    __u32 l4_len = ip.len - ip.l4_off;
    __u32 gso = skb->gso_size;
    if (gso) {
      __u32 thl = UDP_HLEN;
      if (ip.proto == PROTO_TCP) {
        __u8 doff;
        if (bpf_skb_load_bytes(skb, l2 + (ip.l4_off & 0x3f) + 12, &doff, 1) < 0) goto pass;
        thl = (doff >> 4) * 4;
      } else if (ip.proto != PROTO_UDP) {
        goto pass;
      }
      if (l4_len < thl) goto pass;
      __u32 data = l4_len - thl;
      if (data > gso) {
        if (data % gso != 0) {
          // A short last segment: TCP can be cut into equal ones (UDP's datagrams cannot).
          __u32 seg = ip.proto == PROTO_TCP ? equal_segment(data, gso) : 0;
          if (!seg) goto pass;
          int r = shrink_gso(skb, gso - seg);
          if (r == -1) goto pass;
          if (r < 0) goto broken;
          // Counted here: should a later step leave it to userspace, it goes re-cut (still a
          // cut of the same bytes into valid segments).
          count(WEFT_C_TX_RECUT, 1);
          gso = seg;
          segs = data / seg;
        }
        l4_len = thl + gso;
      }
    }
    o.ip[0] = 0x60;
    o.ip[1] = (h >> 16) & 0x0f;
    o.ip[2] = h >> 8;
    o.ip[3] = h;
    o.ip[4] = udp_len >> 8;
    o.ip[5] = udp_len & 0xff;
    o.ip[6] = PROTO_UDP;
    o.ip[7] = 64;
    __builtin_memcpy(o.ip + 8, cfg->local_v6, 16);
    __builtin_memcpy(o.ip + 24, peer.pub, 16);
    __builtin_memcpy(o.udp, &sport, 2);
    __builtin_memcpy(o.udp + 2, &peer.port, 2);
    o.udp[4] = udp_len >> 8;
    o.udp[5] = udp_len & 0xff;
    if (vx) put_vxlan(o.vxlan, o.eth, cfg, peer.mac, ip.version);
    const __u8* after_udp = (const __u8*)&o + IP6_HLEN + UDP_HLEN;
    __u32 check =
        udp6_checksum(skb, l2, &ip, l4_len, cfg->local_v6, peer.pub, o.udp, after_udp, head, udp);
    if (!check) goto pass;
    o.udp[6] = check >> 8;
    o.udp[7] = check & 0xff;
    flags |= BPF_F_ADJ_ROOM_ENCAP_L3_IPV6 | BPF_F_ADJ_ROOM_ENCAP_L4_UDP;
    // A refusal here (e.g. a GSO type adjust_room does not take) leaves the packet as it was.
    if (bpf_skb_adjust_room(skb, outer_len, BPF_ADJ_ROOM_MAC, flags) < 0) goto pass;
    written = vx ? sizeof(o) : IP6_HLEN + UDP_HLEN;
    if (bpf_skb_store_bytes(skb, l2, &o, written, 0) < 0) goto broken;
#undef o
  } else {
    struct outer_hdrs* op = &u.v4;
#define o (*op)
    outer_len = IP4_HLEN + (ipip ? 0 : UDP_HLEN + head);
    __u32 total = outer_len + ip.len;
    // Outer IPv4, no options, checksum computed here. UDP framings: DF clear, TTL 64, a random
    // ID (so GSO segments and fragments of different packets do not share one). IPIP as the
    // kernel's flannel.ipip (ttl inherit, tos 0, nopmtudisc; native/src/ipip.h): the inner TTL
    // and DF, DSCP 0 with the inner ECN (CE sent as ECT(0), RFC 6040 normal mode), and the ID
    // the kernel gives a packet without one (ip_select_ident): 0 with DF, else a random one.
    o.ip[0] = 0x45;
    o.ip[2] = total >> 8;
    o.ip[3] = total & 0xff;
    __u16 id = ipip && ip.df ? 0 : bpf_get_prandom_u32();
    __builtin_memcpy(o.ip + 4, &id, 2);
    o.ip[8] = 64;
    o.ip[9] = PROTO_UDP;
    if (ipip) {
      __u8 ecn = ip.tos & ECN_MASK;
      o.ip[1] = ecn == ECN_CE ? ECN_ECT0 : ecn;
      o.ip[6] = ip.df;
      o.ip[8] = ip.ttl;
      o.ip[9] = PROTO_IPIP;
    }
    __builtin_memcpy(o.ip + 12, &cfg->local_v4, 4);
    __builtin_memcpy(o.ip + 16, peer.pub, 4);
    __u32 sum = 0;
#pragma unroll
    for (int i = 0; i < IP4_HLEN; i += 2) sum += WORD_AT(o.ip, i);
    __u16 csum = ~fold(sum) & 0xffff;
    o.ip[10] = csum >> 8;
    o.ip[11] = csum & 0xff;
    // UDP checksum 0 (as kernel vxlan sends over IPv4).
    __builtin_memcpy(o.udp, &sport, 2);
    __builtin_memcpy(o.udp + 2, &peer.port, 2);
    __u32 udp_len = total - IP4_HLEN;
    o.udp[4] = udp_len >> 8;
    o.udp[5] = udp_len & 0xff;
    // IPIP: no L4 flag, so a GSO packet becomes SKB_GSO_IPXIP4 and goes whole where the device
    // takes it (veth does), as the kernel's ipip device sends it.
    flags |= BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 | (ipip ? 0 : BPF_F_ADJ_ROOM_ENCAP_L4_UDP);
    if (vx) put_vxlan(o.vxlan, o.eth, cfg, peer.mac, ip.version);
    // A refusal here (e.g. a GSO type adjust_room does not take) leaves the packet as it was.
    if (bpf_skb_adjust_room(skb, outer_len, BPF_ADJ_ROOM_MAC, flags) < 0) goto pass;
    written = vx ? sizeof(o) : ipip ? IP4_HLEN : IP4_HLEN + UDP_HLEN;
    if (bpf_skb_store_bytes(skb, l2, &o, written, 0) < 0) goto broken;
#undef o
  }
  // flannel-udp forwards the inner packet: one hop, as flanneld's proxy counts it.
  if (udp && decrement_ttl(skb, l2 + outer_len, &ip) < 0) goto broken;
  if (l2 != 0) {
    // An Ethernet header in front (test runs): it now carries the outer family.
    __u16 proto = bpf_htons(v6 ? ETH_P_IPV6 : ETH_P_IP);
    if (bpf_skb_store_bytes(skb, 12, &proto, 2, 0) < 0) goto broken;
  } else if (bpf_skb_change_head(skb, ETH_HLEN, 0) < 0) {
    // bpf_redirect_neigh needs a MAC header in front of the network header (it replaces it
    // with the neighbour's): on the TUN there is none, so push an empty one.
    goto broken;
  }
  // Test runs: report the decision, send nothing.
  long verdict = l2 != 0 ? TC_ACT_REDIRECT : bpf_redirect_neigh(cfg->underlay_ifindex, 0, 0, 0);
  if (verdict != TC_ACT_REDIRECT) goto broken;
  count(WEFT_C_TX_PACKETS, segs);
  count(WEFT_C_TX_BYTES, ip.len);
  return TC_ACT_REDIRECT;
broken:
  // Changed half way: no longer the packet that came in, and not one that can be sent.
  count(WEFT_C_TX_ERROR, 1);
  return TC_ACT_SHOT;
pass:
  count(WEFT_C_TX_PASSED, 1);
  return TC_ACT_UNSPEC;
}

// What weft_rx learns from the outer headers of a datagram (packet, IPIP) for us.
struct outer_info {
  __u32 off;  // the inner packet's (flannel-udp, IPIP) or the VXLAN header's offset
  __u8 family;
  __u8 tos;  // IPv4: the outer TOS (IPIP's ECN)
  __u8 src[16];
};

// The outer IPv4 headers in `h` (loaded from the frame's start): 1 if they are a datagram (IPIP:
// a packet) for us, filling `out`; 0 if not ours at all; -1 if ours but not exactly one.
static __always_inline int outer_v4(struct __sk_buff* skb, struct weft_config* cfg, const __u8* h,
                                    int ipip, struct outer_info* out) {
  // IPv4 without options and not a fragment, to our address; UDP to our port, or (IPIP)
  // protocol 4.
  const __u8* o = h + ETH_HLEN;
  if (o[0] != 0x45 || o[9] != (ipip ? PROTO_IPIP : PROTO_UDP)) return 0;
  if (((((__u32)o[6] << 8) | o[7]) & 0x3fff) != 0) return 0;
  __u32 dst;
  __builtin_memcpy(&dst, o + 16, 4);
  if (cfg->local_v4 == 0 || dst != cfg->local_v4) return 0;
  const __u8* u = o + IP4_HLEN;
  __u16 dport;
  __builtin_memcpy(&dport, u + 2, 2);
  if (!ipip && dport != cfg->port) return 0;
  __u32 outer_tot = ((__u32)o[2] << 8) | o[3];
  __u32 udp_len = ((__u32)u[4] << 8) | u[5];
  // Exactly one datagram (packet), nothing after it (GSO trains and padding go to the socket).
  if (outer_tot + ETH_HLEN != skb->len || (!ipip && udp_len + IP4_HLEN != outer_tot)) return -1;
  __builtin_memcpy(out->src, o + 12, 4);
  if (!bpf_map_lookup_elem(&WEFT_MAP_SOURCES, out->src)) return -1;
  out->family = 4;
  out->tos = o[1];
  out->off = ETH_HLEN + IP4_HLEN + (ipip ? 0 : UDP_HLEN);
  return 1;
}

// The same for outer IPv6 (UDP framings): no extension headers, to our address and port.
static __always_inline int outer_v6(struct __sk_buff* skb, struct weft_config* cfg, const __u8* h,
                                    struct outer_info* out) {
  const __u8* o = h + ETH_HLEN;
  if ((o[0] >> 4) != 6 || o[6] != PROTO_UDP || !has_v6(cfg)) return 0;
  __u64 d[2], l[2];
  __builtin_memcpy(d, o + 24, 16);
  __builtin_memcpy(l, cfg->local_v6, 16);
  if (d[0] != l[0] || d[1] != l[1]) return 0;
  const __u8* u = o + IP6_HLEN;
  __u16 dport;
  __builtin_memcpy(&dport, u + 2, 2);
  if (dport != cfg->port) return 0;
  __u32 plen = ((__u32)o[4] << 8) | o[5];
  __u32 udp_len = ((__u32)u[4] << 8) | u[5];
  if (plen + ETH_HLEN + IP6_HLEN != skb->len || udp_len != plen) return -1;
  // A zero UDP checksum is invalid over IPv6: the socket drops it, as kernel vxlan does.
  if (u[6] == 0 && u[7] == 0) return -1;
  __builtin_memcpy(out->src, o + 8, 16);
  if (!bpf_map_lookup_elem(&WEFT_MAP_SOURCES6, out->src)) return -1;
  out->family = 6;
  out->tos = 0;
  out->off = ETH_HLEN + IP6_HLEN + UDP_HLEN;
  return 1;
}

SEC("tc")
int WEFT_PROG_RX(struct __sk_buff* skb) {
  struct weft_config* cfg = config();
  if (!cfg) return TC_ACT_UNSPEC;
  __u8 h[ETH_HLEN + IP6_HLEN + UDP_HLEN];
  // Shorter frames cannot hold an IPv6 datagram: read what an IPv4 one needs.
  if (bpf_skb_load_bytes(skb, 0, h, sizeof(h)) < 0 &&
      bpf_skb_load_bytes(skb, 0, h, ETH_HLEN + IP4_HLEN + UDP_HLEN) < 0)
    return TC_ACT_UNSPEC;
  int vx = cfg->format == WEFT_FORMAT_VXLAN;
  int ipip = cfg->format == WEFT_FORMAT_IPIP;
  int udp = !vx && !ipip;
  struct outer_info out = {};
  int ours;
  if (h[12] == 0x08 && h[13] == 0x00)
    ours = outer_v4(skb, cfg, h, ipip, &out);
  else if (h[12] == 0x86 && h[13] == 0xdd && !ipip && skb->len >= sizeof(h))
    ours = outer_v6(skb, cfg, h, &out);
  else
    return TC_ACT_UNSPEC;
  if (ours == 0) return TC_ACT_UNSPEC;
  if (ours < 0) goto pass;

  __u32 off = out.off;
  __u16 inner_type = 0;
  if (vx) {
    __u8 v[VXLAN_HLEN + ETH_HLEN];
    if (bpf_skb_load_bytes(skb, off, v, sizeof(v)) < 0) goto pass;
    if (v[0] != 0x08 || v[1] || v[2] || v[3] || v[7]) goto pass;
    __u32 vni = ((__u32)v[4] << 16) | ((__u32)v[5] << 8) | v[6];
    if (vni != cfg->vni) goto pass;
    if (!same_mac(v + VXLAN_HLEN, cfg->vtep_mac)) goto pass;
    inner_type = ((__u16)v[20] << 8) | v[21];
    if (inner_type != ETH_P_IP && inner_type != ETH_P_IPV6) goto pass;
    off += VXLAN_HLEN + ETH_HLEN;
  }
  if (skb->len < off) goto pass;
  struct ip_info ip = {};
  if (parse_ip(skb, off, skb->len - off, &ip) < 0) goto pass;
  if (vx && ip.version != (inner_type == ETH_P_IP ? 4 : 6)) goto pass;
  if (ipip && ip.version != 4) goto pass;
  // Anti-spoofing: the inner source must be inside a subnet leased to the outer source, in the
  // underlay family that lease's peer record names.
  struct weft_peer* p = lookup_peer(&ip, ip.src);
  if (!p || p->pub_family != out.family) goto pass;
  // (IPv4: the first 4 bytes of both, the rest zero.)
  __u64 a[2], b[2];
  __builtin_memcpy(a, p->pub, 16);
  __builtin_memcpy(b, out.src, 16);
  if (a[0] != b[0] || a[1] != b[1]) goto pass;
  if (udp && ip.ttl <= 1) goto pass;
  // IPIP, ECN decapsulation (RFC 6040, INET_ECN_decapsulate): outer CE on a Not-ECT inner packet
  // is dropped (by the userspace engine, counted), on an ECN-capable one marks it CE.
  __u8 inner_ecn = ip.tos & ECN_MASK;
  int mark_ce = ipip && (out.tos & ECN_MASK) == ECN_CE && inner_ecn != ECN_CE;
  if (mark_ce && inner_ecn == 0) goto pass;
  // From here on the packet changes: a failure drops it, counted once as rx_error.
  if (udp && decrement_ttl(skb, off, &ip) < 0) goto broken;
  // The first word: version and IHL, then the TOS.
  __u32 first = ((0x40 | (ip.l4_off >> 2)) << 8) | ip.tos | ECN_CE;
  if (mark_ce && rewrite_ip4_word(skb, off, 0, first) < 0) goto broken;
  __u32 segs = skb->gso_segs ? skb->gso_segs : 1;
  __u64 flags = BPF_F_ADJ_ROOM_FIXED_GSO |
                (ip.version == 4 ? WEFT_ADJ_ROOM_DECAP_L3_IPV4 : WEFT_ADJ_ROOM_DECAP_L3_IPV6);
  if (bpf_skb_adjust_room(skb, -(__s32)(off - ETH_HLEN), BPF_ADJ_ROOM_MAC, flags) < 0) goto broken;
  __u16 proto = bpf_htons(ip.version == 4 ? ETH_P_IP : ETH_P_IPV6);
  if (bpf_skb_store_bytes(skb, 12, &proto, 2, 0) < 0) goto broken;
  // Into the TUN's ingress, as kernel vxlan delivers on its device: the TUN has no MAC header
  // (ARPHRD_NONE), so the redirect pulls the Ethernet header and the packet enters the IP stack
  // with iif = the TUN (netif_rx). Test runs (no TUN configured) report the verdict only.
  long verdict = bpf_redirect(cfg->tun_ifindex, BPF_F_INGRESS);
  if (verdict != TC_ACT_REDIRECT) goto broken;
  count(WEFT_C_RX_PACKETS, segs);
  count(WEFT_C_RX_BYTES, ip.len);
  return TC_ACT_REDIRECT;
broken:
  count(WEFT_C_RX_ERROR, 1);
  return TC_ACT_SHOT;
pass:
  count(WEFT_C_RX_PASSED, 1);
  return TC_ACT_UNSPEC;
}

// weft_bridge: egress of the pods' bridge (--pod-bridge, cni0 by default). weft_rx's decapsulation
// cannot clear the GSO super-packet's tunnel state (skb->encapsulation, SKB_GSO_UDP_TUNNEL:
// kernel 6.18 has no flag for it), and a bridge has no tunnel offloads, so the bridge would segment
// it in software with a checksum per segment. The node's IP stack (netfilter, routing, the
// neighbour entry that wrote the destination MAC) has already run here; this hands such packets to
// the bridge port that owns the destination MAC (a veth, which carries tunnel GSO to the pod
// whole). Everything else, and any MAC the port map does not hold, goes on to the next program and
// through the bridge.
SEC("tc")
int WEFT_PROG_BRIDGE(struct __sk_buff* skb) {
  if (skb->gso_size == 0) return TC_ACT_UNSPEC;
  __u64 mac = 0;
  if (bpf_skb_load_bytes(skb, 0, &mac, 6) < 0) return TC_ACT_UNSPEC;
  if (mac & 1) return TC_ACT_UNSPEC;  // group address (the first byte's low bit)
  __u32* port = bpf_map_lookup_elem(&WEFT_MAP_PORTS, &mac);
  if (!port) return TC_ACT_UNSPEC;
  count(WEFT_C_BRIDGE_BYPASS, 1);
  return bpf_redirect(*port, 0);
}

// No GPL-only helper is used.
char LICENSE[] SEC("license") = "Apache-2.0";

// Which sources this object was built from (scripts/build-native.mjs passes the SHA-256 of this
// file and its headers): the engine refuses an object built from another weft.bpf.c (a stale build
// would load, pass the probe and still differ from the code that drives it). Not a map: libbpf
// skips it.
#ifndef WEFT_SOURCE_SHA256
#define WEFT_SOURCE_SHA256 "none"
#endif
__attribute__((used))
const char weft_source[] SEC(".weft.source") = "weft-bpf-source-sha256:" WEFT_SOURCE_SHA256;
