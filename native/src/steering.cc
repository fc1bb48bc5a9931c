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

constexpr bpf_insn kCpu[] = {
    Call(BPF_FUNC_get_smp_processor_id),
    Exit(),
};

}  // namespace

int AttachSteering(int tun_fd, Steering kind, std::string* error) {
  const bpf_insn* insns = kind == Steering::kCpu ? kCpu : kFlowHash;
  size_t count = kind == Steering::kCpu ? sizeof(kCpu) / sizeof(kCpu[0])
                                        : sizeof(kFlowHash) / sizeof(kFlowHash[0]);
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
  if (prog < 0) {
    int e = errno;
    *error = std::string("steering program load: ") + std::strerror(e) + (log[0] ? ": " : "") + log;
    return e;
  }
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
