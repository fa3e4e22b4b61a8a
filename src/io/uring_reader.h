// Batched positional reads through io_uring: every read of a batch is in
// flight at once, so a device with many queues (NVMe, network block
// storage) works on all of them together, with one system call per batch
// instead of one per read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "stoker/status.h"

struct io_uring;

namespace stoker {

class UringReader {
 public:
  struct Read {
    int fd = -1;
    std::uint64_t offset = 0;
    std::span<std::byte> out;
    // Results: bytes read (short only at end of file), and the errno of a failure.
    std::size_t done = 0;
    int error = 0;
  };

  // An error when the kernel or a seccomp policy refuses io_uring; callers
  // then use pread.
  [[nodiscard]] static Result<std::unique_ptr<UringReader>> Create(unsigned depth = 64);
  ~UringReader();
  UringReader(const UringReader&) = delete;
  UringReader& operator=(const UringReader&) = delete;

  // Performs every read to completion: short reads are resubmitted for the
  // rest until end of file; EINTR/EAGAIN are retried. Per-read outcomes go to
  // Read::done and Read::error; a non-OK Status means the ring itself failed.
  [[nodiscard]] Status ReadAll(std::span<Read> reads);

 private:
  UringReader(std::unique_ptr<io_uring> ring, unsigned depth);
  std::unique_ptr<io_uring> ring_;
  unsigned depth_;
};

}  // namespace stoker
