#include "core/host_buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include <fmt/format.h>

#include "core/cuda_runtime.h"

namespace stoker {
namespace {

std::atomic<const PinnedAllocatorForTesting*> test_allocator{nullptr};

}  // namespace

void SetPinnedAllocatorForTesting(const PinnedAllocatorForTesting* allocator) {
  test_allocator.store(allocator);
}

Result<HostBuffer> HostBuffer::Allocate(std::size_t bytes) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  HostBuffer buffer;
  buffer.size_ = (std::max<std::size_t>(bytes, 1) + page - 1) / page * page;
  // cudaHostAlloc pins (and therefore faults in) every page itself.
  if (const PinnedAllocatorForTesting* fake = test_allocator.load()) {
    buffer.data_ = static_cast<std::byte*>(fake->allocate(buffer.size_));
    buffer.test_allocator_ = buffer.data_ != nullptr ? fake : nullptr;
  } else {
    buffer.data_ = static_cast<std::byte*>(CudaRuntime::Get().HostAlloc(buffer.size_));
  }
  if (buffer.data_ != nullptr) {
    buffer.pinned_ = true;
    return buffer;
  }
  void* p = ::mmap(nullptr, buffer.size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    const int error = errno;
    buffer.size_ = 0;
    return Status::FromErrno(error, fmt::format("allocate a host buffer of {} bytes", bytes));
  }
  buffer.data_ = static_cast<std::byte*>(p);
  // Huge pages cut page faults and TLB misses for big copies; advice only.
  constexpr std::size_t kHugePageWorthwhile = std::size_t{8} << 20;
  if (buffer.size_ >= kHugePageWorthwhile) (void)::madvise(p, buffer.size_, MADV_HUGEPAGE);
  return buffer;
}

HostBuffer::~HostBuffer() {
  if (data_ == nullptr) return;
  if (test_allocator_ != nullptr) {
    test_allocator_->free(data_);
  } else if (pinned_) {
    CudaRuntime::Get().HostFree(data_);
  } else {
    ::munmap(data_, size_);
  }
}

}  // namespace stoker
