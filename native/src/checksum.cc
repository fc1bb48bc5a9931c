#include "checksum.h"

#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "checksum.cc assumes a little-endian host"
#endif

namespace weft {

namespace {

inline uint64_t AddCarry(uint64_t acc, uint64_t v) {
  uint64_t r = acc + v;
  return r + (r < v ? 1 : 0);
}

#if defined(__x86_64__)
// Sums `blocks` 32-byte blocks as little-endian 32-bit words into 64-bit lanes (no carries to
// track: a lane stays below 2^32 · 2 · blocks). AVX2 when the CPU has it: the checksum of a
// whole TSO packet per segment is one of the sender's biggest costs.
__attribute__((target("avx2"))) uint64_t SumBlocksAvx2(const uint8_t* p, size_t blocks) {
  __m256i a0 = _mm256_setzero_si256();
  __m256i a1 = _mm256_setzero_si256();
  for (size_t i = 0; i < blocks; i++, p += 32) {
    a0 = _mm256_add_epi64(
        a0, _mm256_cvtepu32_epi64(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
    a1 = _mm256_add_epi64(
        a1, _mm256_cvtepu32_epi64(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16))));
  }
  a0 = _mm256_add_epi64(a0, a1);
  uint64_t l[4];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(l), a0);
  return l[0] + l[1] + l[2] + l[3];
}

bool HasAvx2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return has;
}
#endif

}  // namespace

uint16_t ChecksumSum(const uint8_t* data, size_t len, uint32_t initial) {
  // Sum host-order (little-endian) 64-bit words; the ones'-complement sum is byte-order
  // independent up to a final byte swap (RFC 1071 §2(B)).
  uint64_t acc = 0;
  const uint8_t* p = data;
#if defined(__x86_64__)
  if (len >= 128 && HasAvx2()) {
    // Chunks of ≤ 2^20 blocks keep every lane far from overflowing.
    while (len >= 32) {
      size_t blocks = len / 32 < (size_t{1} << 20) ? len / 32 : (size_t{1} << 20);
      acc = AddCarry(acc, SumBlocksAvx2(p, blocks));
      p += blocks * 32;
      len -= blocks * 32;
    }
  }
#endif
  while (len >= 32) {
    uint64_t w0, w1, w2, w3;
    std::memcpy(&w0, p, 8);
    std::memcpy(&w1, p + 8, 8);
    std::memcpy(&w2, p + 16, 8);
    std::memcpy(&w3, p + 24, 8);
    acc = AddCarry(acc, w0);
    acc = AddCarry(acc, w1);
    acc = AddCarry(acc, w2);
    acc = AddCarry(acc, w3);
    p += 32;
    len -= 32;
  }
  while (len >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    acc = AddCarry(acc, w);
    p += 8;
    len -= 8;
  }
  if (len > 0) {
    // The last 1-7 bytes as a zero-padded little-endian word, from 4/2/1-byte loads (a memcpy of
    // a variable length here stores bytewise and stalls the wide reload: every pseudo-header
    // sum of an IPv4 address went through it).
    uint64_t w = 0;
    unsigned shift = 0;
    if ((len & 4) != 0) {
      uint32_t v;
      std::memcpy(&v, p, 4);
      w = v;
      p += 4;
      shift = 32;
    }
    if ((len & 2) != 0) {
      uint16_t v;
      std::memcpy(&v, p, 2);
      w |= static_cast<uint64_t>(v) << shift;
      p += 2;
      shift += 16;
    }
    if ((len & 1) != 0) w |= static_cast<uint64_t>(*p) << shift;
    acc = AddCarry(acc, w);
  }
  uint16_t le = ChecksumFold(acc);
  uint16_t be = static_cast<uint16_t>((le >> 8) | (le << 8));
  return ChecksumFold(static_cast<uint64_t>(be) + initial);
}

uint16_t PseudoHeaderSum(size_t addr_len, const uint8_t* src, const uint8_t* dst, uint8_t proto,
                         uint32_t l4_len) {
  uint32_t sum = ChecksumSum(src, addr_len, 0);
  sum = ChecksumSum(dst, addr_len, sum);
  if (addr_len == 4) {
    sum += proto;
    sum += l4_len & 0xffff;
  } else {
    sum += (l4_len >> 16) + (l4_len & 0xffff);
    sum += proto;
  }
  return ChecksumFold(sum);
}

}  // namespace weft
