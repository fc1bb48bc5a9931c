#include "steering.h"

#include <linux/bpf.h>
#include <linux/if_tun.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <vector>

namespace weft {

namespace {

// eBPF instruction encoders (the kernel's filter.h macros, which no uapi header carries).
constexpr bpf_insn Insn(uint8_t code, uint8_t dst, uint8_t src, int16_t off, int32_t imm) {
  return bpf_insn{code, dst, src, off, imm};
}
constexpr bpf_insn MovReg(uint8_t dst, uint8_t src) {
  return Insn(BPF_ALU64 | BPF_MOV | BPF_X, dst, src, 0, 0);
}
constexpr bpf_insn LdxW(uint8_t dst, uint8_t src, int16_t off) {
  return Insn(BPF_LDX | BPF_MEM | BPF_W, dst, src, off, 0);
}
constexpr bpf_insn LdAbs(uint8_t size, int32_t off) {  // r0 = packet[off] (r6 = skb), big-endian
  return Insn(BPF_LD | BPF_ABS | size, 0, 0, 0, off);
}
constexpr bpf_insn JneImm(uint8_t dst, int32_t imm, int16_t off) {
  return Insn(BPF_JMP | BPF_JNE | BPF_K, dst, 0, off, imm);
}
constexpr bpf_insn JeqImm(uint8_t dst, int32_t imm, int16_t off) {
  return Insn(BPF_JMP | BPF_JEQ | BPF_K, dst, 0, off, imm);
}
constexpr bpf_insn Ja(int16_t off) { return Insn(BPF_JMP | BPF_JA, 0, 0, off, 0); }
constexpr bpf_insn RshImm(uint8_t dst, int32_t imm) {
  return Insn(BPF_ALU64 | BPF_RSH | BPF_K, dst, 0, 0, imm);
}
constexpr bpf_insn XorReg(uint8_t dst, uint8_t src) {
  return Insn(BPF_ALU64 | BPF_XOR | BPF_X, dst, src, 0, 0);
}
constexpr bpf_insn Call(int32_t fn) { return Insn(BPF_JMP | BPF_CALL, 0, 0, 0, fn); }
constexpr bpf_insn LdxDW(uint8_t dst, uint8_t src, int16_t off) {
  return Insn(BPF_LDX | BPF_MEM | BPF_DW, dst, src, off, 0);
}
constexpr bpf_insn StxW(uint8_t dst, uint8_t src, int16_t off) {
  return Insn(BPF_STX | BPF_MEM | BPF_W, dst, src, off, 0);
}
constexpr bpf_insn StxDW(uint8_t dst, uint8_t src, int16_t off) {
  return Insn(BPF_STX | BPF_MEM | BPF_DW, dst, src, off, 0);
}
constexpr bpf_insn AndImm(uint8_t dst, int32_t imm) {
  return Insn(BPF_ALU64 | BPF_AND | BPF_K, dst, 0, 0, imm);
}
constexpr bpf_insn AddImm(uint8_t dst, int32_t imm) {
  return Insn(BPF_ALU64 | BPF_ADD | BPF_K, dst, 0, 0, imm);
}
constexpr bpf_insn SubReg(uint8_t dst, uint8_t src) {
  return Insn(BPF_ALU64 | BPF_SUB | BPF_X, dst, src, 0, 0);
}
constexpr bpf_insn JsgtReg(uint8_t dst, uint8_t src, int16_t off) {
  return Insn(BPF_JMP | BPF_JSGT | BPF_X, dst, src, off, 0);
}
// A 64-bit immediate (two instructions); with BPF_PSEUDO_MAP_FD as src, the map behind fd `imm`.
constexpr bpf_insn LdImm64Lo(uint8_t dst, uint8_t src, uint64_t imm) {
  return Insn(BPF_LD | BPF_DW | BPF_IMM, dst, src, 0, static_cast<int32_t>(imm & 0xffffffffu));
}
constexpr bpf_insn LdImm64Hi(uint64_t imm) {
  return Insn(0, 0, 0, 0, static_cast<int32_t>(imm >> 32));
}
constexpr bpf_insn Exit() { return Insn(BPF_JMP | BPF_EXIT, 0, 0, 0, 0); }

// The TUN's skb starts at the inner IP header (no link layer).
constexpr bpf_insn kFlowHash[] = {
    MovReg(6, 1),                                                 // 0: r6 = skb (LD_ABS needs it)
    LdxW(0, 1, static_cast<int16_t>(offsetof(__sk_buff, hash))),  // 1: r0 = skb->hash
    JneImm(0, 0, 12),                                             // 2: a hash: return it
    LdAbs(BPF_B, 0),                                              // 3: r0 = version << 4 | ihl
    RshImm(0, 4),                                                 // 4
    JeqImm(0, 6, 5),                                              // 5: IPv6 → 11
    LdAbs(BPF_W, 12),                                             // 6: IPv4 source
    MovReg(7, 0),                                                 // 7
    LdAbs(BPF_W, 16),                                             // 8: IPv4 destination
    XorReg(0, 7),                                                 // 9
    Ja(4),                                                        // 10 → 15
    LdAbs(BPF_W, 20),                                             // 11: IPv6 source, last word
    MovReg(7, 0),                                                 // 12
    LdAbs(BPF_W, 36),                                             // 13: IPv6 destination, last
    XorReg(0, 7),                                                 // 14
    Exit(),                                                       // 15
};

// kCpu: the flow's key is kFlowHash's value (its instructions 0-14, which end at 15 with the
// hash in r0) modulo kFlowletSlots; its slot holds {u64 last packet ns, u32 queue}. A packet
// within `gap` of its slot's last one takes the slot's queue; after a longer pause (and first)
// the slot takes the current CPU's. The difference is compared signed: another CPU may have
// stored a later time meanwhile. Two flows that share a slot only stay on one queue longer: a
// queue changes only after a pause of everything in the slot.
constexpr uint32_t kFlowletSlots = 4096;
constexpr size_t kFlowKeyInsns = 15;

std::vector<bpf_insn> CpuFlowletProgram(int map_fd, uint64_t gap_ns) {
  std::vector<bpf_insn> p(kFlowHash, kFlowHash + kFlowKeyInsns);  // 0-14: r0 = the flow's hash
  const bpf_insn rest[] = {
      AndImm(0, kFlowletSlots - 1),                                    // 15: r0 = slot
      StxW(10, 0, -4),                                                 // 16: key on the stack
      Call(BPF_FUNC_get_smp_processor_id),                             // 17
      MovReg(7, 0),                                                    // 18: r7 = cpu
      Call(BPF_FUNC_ktime_get_ns),                                     // 19
      MovReg(8, 0),                                                    // 20: r8 = now
      LdImm64Lo(1, BPF_PSEUDO_MAP_FD, static_cast<uint32_t>(map_fd)),  // 21: r1 = map
      LdImm64Hi(0),                                                    // 22
      MovReg(2, 10),                                                   // 23
      AddImm(2, -4),                                                   // 24: r2 = &key
      Call(BPF_FUNC_map_lookup_elem),                                  // 25
      JeqImm(0, 0, 10),                                                // 26: no slot → 37
      LdxDW(1, 0, 0),                                                  // 27: r1 = last
      MovReg(2, 8),                                                    // 28
      SubReg(2, 1),                                                    // 29: r2 = now - last
      LdImm64Lo(3, 0, gap_ns),                                         // 30: r3 = gap
      LdImm64Hi(gap_ns),                                               // 31
      StxDW(0, 8, 0),                                                  // 32: last = now
      JsgtReg(2, 3, 2),                                                // 33: paused → 36
      LdxW(0, 0, 8),                                                   // 34: r0 = the slot's queue
      Exit(),                                                          // 35
      StxW(0, 7, 8),                                                   // 36: queue = cpu
      MovReg(0, 7),                                                    // 37: r0 = cpu
      Exit(),                                                          // 38
  };
  p.insert(p.end(), std::begin(rest), std::end(rest));
  return p;
}

// A program fd, or -errno with `error` set.
int LoadProgram(const bpf_insn* insns, size_t count, std::string* error) {
  static const char kLicense[] = "GPL";
  char log[4096] = {0};
  bpf_attr attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.prog_type = BPF_PROG_TYPE_SOCKET_FILTER;
  attr.insns = reinterpret_cast<uint64_t>(insns);
  attr.insn_cnt = static_cast<uint32_t>(count);
  attr.license = reinterpret_cast<uint64_t>(kLicense);
  attr.log_buf = reinterpret_cast<uint64_t>(log);
  attr.log_size = sizeof(log);
  attr.log_level = 1;
  int prog = static_cast<int>(syscall(SYS_bpf, BPF_PROG_LOAD, &attr, sizeof(attr)));
  if (prog >= 0) return prog;
  int e = errno;
  *error = std::string("steering program load: ") + std::strerror(e) + (log[0] ? ": " : "") + log;
  return -e;
}

// The flowlet slots: an array map of {u64, u32, u32 pad}, zeroed (every flow starts paused).
// A map fd, or -errno with `error` set.
int CreateSlots(std::string* error) {
  bpf_attr attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.map_type = BPF_MAP_TYPE_ARRAY;
  attr.key_size = 4;
  attr.value_size = 16;
  attr.max_entries = kFlowletSlots;
  int fd = static_cast<int>(syscall(SYS_bpf, BPF_MAP_CREATE, &attr, sizeof(attr)));
  if (fd >= 0) return fd;
  int e = errno;
  *error = std::string("steering map: ") + std::strerror(e);
  return -e;
}

}  // namespace

int AttachSteering(int tun_fd, Steering kind, uint64_t gap_ns, std::string* error) {
  int prog;
  if (kind == Steering::kCpu) {
    int slots = CreateSlots(error);
    if (slots < 0) return -slots;
    std::vector<bpf_insn> insns = CpuFlowletProgram(slots, gap_ns);
    prog = LoadProgram(insns.data(), insns.size(), error);
    close(slots);  // the program holds the map
  } else {
    prog = LoadProgram(kFlowHash, sizeof(kFlowHash) / sizeof(kFlowHash[0]), error);
  }
  if (prog < 0) return -prog;
  // The TUN holds its own reference; ours is closed either way.
  int rc = ioctl(tun_fd, TUNSETSTEERINGEBPF, &prog);
  int e = errno;
  close(prog);
  if (rc < 0) {
    *error = std::string("TUNSETSTEERINGEBPF: ") + std::strerror(e);
    return e;
  }
  return 0;
}

void DetachSteering(int tun_fd) {
  int none = -1;
  ioctl(tun_fd, TUNSETSTEERINGEBPF, &none);
}

}  // namespace weft
