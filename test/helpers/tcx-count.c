// A counting tc program for the tests of the bpf engine's place in a tcx chain
// (test/netns/bpf-hardened.test.ts): it counts every packet it sees in an array map and returns
// TC_ACT_UNSPEC (TCX_NEXT), so it never changes what happens to the packet.
//
//   tcx-count <ifindex> ingress|egress first|last
//
// Loads the program (eleven instructions, no object file), attaches it with a tcx link to the
// hook, at the front of the chain (BPF_F_BEFORE) or at its end, prints "ready", then prints the
// count for every line read on stdin. On EOF it exits: the link (held by its fd only, never
// pinned) and the program go with it. Raw bpf(2) calls: the machine's uapi headers (6.1) and
// libbpf predate tcx.
#include <errno.h>
#include <linux/bpf.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define TCX_INGRESS 46
#define TCX_EGRESS 47
#define F_BEFORE (1U << 3)

static long sys_bpf(int cmd, void* attr, unsigned size) { return syscall(__NR_bpf, cmd, attr, size); }

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: tcx-count <ifindex> ingress|egress first|last\n");
    return 2;
  }
  uint32_t ifindex = (uint32_t)strtoul(argv[1], NULL, 10);
  int ingress = strcmp(argv[2], "ingress") == 0;
  int first = strcmp(argv[3], "first") == 0;

  union bpf_attr m;
  memset(&m, 0, sizeof(m));
  m.map_type = BPF_MAP_TYPE_ARRAY;
  m.key_size = 4;
  m.value_size = 8;
  m.max_entries = 1;
  int map = (int)sys_bpf(BPF_MAP_CREATE, &m, sizeof(m));
  if (map < 0) {
    perror("map create");
    return 1;
  }
  // *(u32 *)(fp - 4) = 0; r0 = lookup(map, fp - 4); if r0: atomic *(u64 *)r0 += 1;
  // return TC_ACT_UNSPEC (-1).
  struct bpf_insn prog[] = {
      {.code = BPF_ST | BPF_MEM | BPF_W, .dst_reg = BPF_REG_10, .off = -4, .imm = 0},
      {.code = BPF_ALU64 | BPF_MOV | BPF_X, .dst_reg = BPF_REG_2, .src_reg = BPF_REG_10},
      {.code = BPF_ALU64 | BPF_ADD | BPF_K, .dst_reg = BPF_REG_2, .imm = -4},
      {.code = BPF_LD | BPF_DW | BPF_IMM, .dst_reg = BPF_REG_1, .src_reg = BPF_PSEUDO_MAP_FD,
       .imm = map},
      {.code = 0},
      {.code = BPF_JMP | BPF_CALL, .imm = BPF_FUNC_map_lookup_elem},
      {.code = BPF_JMP | BPF_JEQ | BPF_K, .dst_reg = BPF_REG_0, .off = 2, .imm = 0},
      {.code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = BPF_REG_1, .imm = 1},
      {.code = BPF_STX | BPF_ATOMIC | BPF_DW, .dst_reg = BPF_REG_0, .src_reg = BPF_REG_1,
       .imm = BPF_ADD},
      {.code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = BPF_REG_0, .imm = -1},
      {.code = BPF_JMP | BPF_EXIT},
  };
  static char log[65536];
  union bpf_attr p;
  memset(&p, 0, sizeof(p));
  p.prog_type = BPF_PROG_TYPE_SCHED_CLS;
  p.insns = (uint64_t)(uintptr_t)prog;
  p.insn_cnt = sizeof(prog) / sizeof(prog[0]);
  p.license = (uint64_t)(uintptr_t) "GPL";
  p.log_buf = (uint64_t)(uintptr_t)log;
  p.log_size = sizeof(log);
  p.log_level = 1;
  p.expected_attach_type = ingress ? TCX_INGRESS : TCX_EGRESS;
  strncpy(p.prog_name, "tcx_count", sizeof(p.prog_name) - 1);
  int fd = (int)sys_bpf(BPF_PROG_LOAD, &p, sizeof(p));
  if (fd < 0) {
    fprintf(stderr, "prog load: %s\n%s\n", strerror(errno), log);
    return 1;
  }
  // link_create: prog_fd, target_ifindex, attach_type, flags, then tcx's relative_fd (0: the
  // whole chain) and expected_revision (0: any).
  uint32_t l[16];
  memset(l, 0, sizeof(l));
  l[0] = (uint32_t)fd;
  l[1] = ifindex;
  l[2] = ingress ? TCX_INGRESS : TCX_EGRESS;
  l[3] = first ? F_BEFORE : 0;
  int link = (int)sys_bpf(BPF_LINK_CREATE, l, sizeof(l));
  if (link < 0) {
    perror("tcx link create");
    return 1;
  }
  printf("ready\n");
  fflush(stdout);
  char line[64];
  while (fgets(line, sizeof(line), stdin)) {
    uint32_t key = 0;
    uint64_t value = 0;
    union bpf_attr e;
    memset(&e, 0, sizeof(e));
    e.map_fd = (uint32_t)map;
    e.key = (uint64_t)(uintptr_t)&key;
    e.value = (uint64_t)(uintptr_t)&value;
    if (sys_bpf(BPF_MAP_LOOKUP_ELEM, &e, sizeof(e)) < 0) {
      perror("map lookup");
      return 1;
    }
    printf("%llu\n", (unsigned long long)value);
    fflush(stdout);
  }
  return 0;
}
