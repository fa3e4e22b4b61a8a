// HostBuffer: a page-aligned host allocation that is page-locked
// (cudaHostAlloc) when a CUDA device is present, so that copies to and from
// the GPU can be asynchronous, and an anonymous mapping otherwise. Used for
// the loader's batch pool and the checkpointer's snapshot buffers.
#pragma once

#include <cstddef>
#include <utility>

#include "stoker/status.h"

namespace stoker {

// Page-locked allocation for tests, which have no GPU: while one is set,
// HostBuffer::Allocate pins through it as it would through CUDA.
struct PinnedAllocatorForTesting {
  void* (*allocate)(std::size_t bytes);
  void (*free)(void* p);
};
void SetPinnedAllocatorForTesting(const PinnedAllocatorForTesting* allocator);

class HostBuffer {
 public:
  HostBuffer() = default;
  // Allocates at least `bytes` (rounded up to whole pages); large pageable
  // buffers are advised to use transparent huge pages.
  [[nodiscard]] static Result<HostBuffer> Allocate(std::size_t bytes);

  HostBuffer(HostBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        pinned_(std::exchange(other.pinned_, false)),
        test_allocator_(std::exchange(other.test_allocator_, nullptr)) {}
  HostBuffer& operator=(HostBuffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    std::swap(pinned_, other.pinned_);
    std::swap(test_allocator_, other.test_allocator_);
    return *this;
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer();

  [[nodiscard]] std::byte* data() const { return data_; }
  // The usable size: the requested size rounded up to whole pages.
  [[nodiscard]] std::size_t size() const { return size_; }
  [[nodiscard]] bool pinned() const { return pinned_; }

 private:
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  bool pinned_ = false;
  const PinnedAllocatorForTesting* test_allocator_ = nullptr;  // what pinned it, when a test's
};

}  // namespace stoker
