#include "checksum.h"

#include <cstring>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "checksum.cc assumes a little-endian host"
#endif

namespace weft {

namespace {

inline uint64_t AddCarry(uint64_t acc, uint64_t v) {
  uint64_t r = acc + v;
  return r + (r < v ? 1 : 0);
}

}  // namespace

uint16_t ChecksumSum(const uint8_t* data, size_t len, uint32_t initial) {
  // Sum host-order (little-endian) 64-bit words; the ones'-complement sum is byte-order
  // independent up to a final byte swap (RFC 1071 §2(B)).
  uint64_t acc = 0;
  const uint8_t* p = data;
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
    uint64_t w = 0;
    std::memcpy(&w, p, len);
    acc = AddCarry(acc, w);
  }
  uint16_t le = ChecksumFold(acc);
  uint16_t be = static_cast<uint16_t>((le >> 8) | (le << 8));
  return ChecksumFold(static_cast<uint64_t>(be) + initial);
}

uint16_t PseudoHeaderSum(size_t addr_len, const uint8_t* src, const uint8_t* dst,
                         uint8_t proto, uint32_t l4_len) {
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
