// The Internet checksum (RFC 1071) over byte spans: a 64-bit add-with-carry core, the
// pseudo-header sums for TCP/UDP/ICMPv6 and RFC 1624 incremental updates. No allocation.
#ifndef WEFT_NATIVE_CHECKSUM_H_
#define WEFT_NATIVE_CHECKSUM_H_

#include <cstddef>
#include <cstdint>

namespace weft {

// Ones'-complement sum of `len` bytes read as big-endian 16-bit words (an odd tail byte is the
// high byte of a last word), added to `initial` and folded to 16 bits. Not inverted.
uint16_t ChecksumSum(const uint8_t* data, size_t len, uint32_t initial = 0);

// The checksum to store in a header: ~ChecksumSum(...).
inline uint16_t Checksum(const uint8_t* data, size_t len, uint32_t initial = 0) {
  return static_cast<uint16_t>(~ChecksumSum(data, len, initial));
}

// Folds a wide ones'-complement accumulator to 16 bits (not inverted).
inline uint16_t ChecksumFold(uint64_t sum) {
  sum = (sum & 0xffffffffu) + (sum >> 32);
  sum = (sum & 0xffffffffu) + (sum >> 32);
  sum = (sum & 0xffffu) + (sum >> 16);
  sum = (sum & 0xffffu) + (sum >> 16);
  sum = (sum & 0xffffu) + (sum >> 16);
  return static_cast<uint16_t>(sum);
}

// Pseudo-header sum (not inverted) for an L4 protocol. `addr_len` is 4 (IPv4) or 16 (IPv6);
// src/dst point at the addresses in network order; `l4_len` is the L4 header+payload length.
uint16_t PseudoHeaderSum(size_t addr_len, const uint8_t* src, const uint8_t* dst, uint8_t proto,
                         uint32_t l4_len);

// RFC 1624 eqn. 3: the checksum after one 16-bit word changes from `old_word` to `new_word`.
inline uint16_t ChecksumUpdate16(uint16_t check, uint16_t old_word, uint16_t new_word) {
  uint32_t sum = static_cast<uint16_t>(~check);
  sum += static_cast<uint16_t>(~old_word);
  sum += new_word;
  return static_cast<uint16_t>(~ChecksumFold(sum));
}

inline uint16_t LoadBe16(const uint8_t* p) { return static_cast<uint16_t>((p[0] << 8) | p[1]); }
inline void StoreBe16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}
inline uint32_t LoadBe32(const uint8_t* p) {
  return (static_cast<uint32_t>(p[0]) << 24) | (static_cast<uint32_t>(p[1]) << 16) |
         (static_cast<uint32_t>(p[2]) << 8) | p[3];
}
inline void StoreBe32(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v >> 24);
  p[1] = static_cast<uint8_t>(v >> 16);
  p[2] = static_cast<uint8_t>(v >> 8);
  p[3] = static_cast<uint8_t>(v);
}

}  // namespace weft

#endif  // WEFT_NATIVE_CHECKSUM_H_
