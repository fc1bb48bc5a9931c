// A packet loop's large buffers (the TX arena, the TUN read buffers, the RX batch): anonymous
// memory mapped once, which the kernel fills with zeros page by page on first touch. A
// zero-filled std::vector wrote every byte when the loop started, so an idle node held ~6 MB per
// loop resident; here a loop holds only the pages its traffic has used. Same contents (zeros
// until written), same addresses for the loop's life; only the first write to a page costs a
// minor fault.
#ifndef WEFT_PAGE_BUFFER_H_
#define WEFT_PAGE_BUFFER_H_

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <new>

namespace weft {

class PageBuffer {
 public:
  PageBuffer() = default;
  explicit PageBuffer(size_t n) { Allocate(n); }
  ~PageBuffer() { Release(); }
  PageBuffer(const PageBuffer&) = delete;
  PageBuffer& operator=(const PageBuffer&) = delete;

  // n zero bytes in place of the old ones (std::bad_alloc when the mapping is refused).
  void Allocate(size_t n) {
    Release();
    if (n == 0) return;
    void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    data_ = static_cast<uint8_t*>(p);
    size_ = n;
  }

  uint8_t* data() { return data_; }
  size_t size() const { return size_; }
  uint8_t& operator[](size_t i) { return data_[i]; }

 private:
  void Release() {
    if (data_ != nullptr) munmap(data_, size_);
    data_ = nullptr;
    size_ = 0;
  }

  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace weft

#endif  // WEFT_PAGE_BUFFER_H_
