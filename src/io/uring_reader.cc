#include "io/uring_reader.h"

#include <liburing.h>

#include <cerrno>
#include <deque>

#include <fmt/format.h>

// liburing maps and unmaps its rings with raw system calls, which
// ThreadSanitizer does not see: a ring mapped where another thread's ring
// was unmapped would look like that thread's memory. The annotations give
// TSan the order the kernel provides (a ring is gone before its address is
// handed out again).
#if defined(__SANITIZE_THREAD__)
#define STOKER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define STOKER_TSAN 1
#endif
#endif
#if defined(STOKER_TSAN)
extern "C" void __tsan_acquire(void* address);
extern "C" void __tsan_release(void* address);
#endif

namespace stoker {
namespace {

void RingAcquired([[maybe_unused]] io_uring* ring) {
#if defined(STOKER_TSAN)
  for (void* a :
       {static_cast<void*>(ring->sq.sqes), static_cast<void*>(ring->sq.khead), static_cast<void*>(ring->cq.khead)})
    __tsan_acquire(a);
#endif
}

void RingReleased([[maybe_unused]] io_uring* ring) {
#if defined(STOKER_TSAN)
  for (void* a :
       {static_cast<void*>(ring->sq.sqes), static_cast<void*>(ring->sq.khead), static_cast<void*>(ring->cq.khead)})
    __tsan_release(a);
#endif
}

}  // namespace

Result<std::unique_ptr<UringReader>> UringReader::Create(unsigned depth) {
  auto ring = std::make_unique<io_uring>();
  const int rc = io_uring_queue_init(depth, ring.get(), 0);
  if (rc < 0) return Status::FromErrno(-rc, "io_uring_queue_init").WithContext("io_uring unavailable");
  RingAcquired(ring.get());
  return std::unique_ptr<UringReader>(new UringReader(std::move(ring), depth));
}

UringReader::UringReader(std::unique_ptr<io_uring> ring, unsigned depth) : ring_(std::move(ring)), depth_(depth) {}

UringReader::~UringReader() {
  RingReleased(ring_.get());
  io_uring_queue_exit(ring_.get());
}

Status UringReader::ReadAll(std::span<Read> reads) {
  std::deque<std::size_t> pending;
  for (std::size_t i = 0; i < reads.size(); ++i) {
    reads[i].done = 0;
    reads[i].error = 0;
    if (!reads[i].out.empty()) pending.push_back(i);
  }
  unsigned in_flight = 0;
  while (!pending.empty() || in_flight > 0) {
    while (!pending.empty() && in_flight < depth_) {
      io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
      if (sqe == nullptr) break;  // the queue is full; submit what we have
      Read& r = reads[pending.front()];
      io_uring_prep_read(sqe, r.fd, r.out.data() + r.done, static_cast<unsigned>(r.out.size() - r.done),
                         r.offset + r.done);
      io_uring_sqe_set_data64(sqe, pending.front());
      pending.pop_front();
      ++in_flight;
    }
    int rc = io_uring_submit_and_wait(ring_.get(), 1);
    if (rc < 0 && rc != -EINTR) return Status::FromErrno(-rc, "io_uring_submit_and_wait");
    io_uring_cqe* cqe = nullptr;
    unsigned head = 0, seen = 0;
    io_uring_for_each_cqe(ring_.get(), head, cqe) {
      ++seen;
      --in_flight;
      const auto index = static_cast<std::size_t>(io_uring_cqe_get_data64(cqe));
      Read& r = reads[index];
      const int res = cqe->res;
      if (res == -EINTR || res == -EAGAIN) {
        pending.push_back(index);
      } else if (res < 0) {
        r.error = -res;
      } else if (res > 0) {
        r.done += static_cast<std::size_t>(res);
        if (r.done < r.out.size()) pending.push_back(index);  // a short read: ask for the rest
      }
      // res == 0: end of file; r.done stays short and the caller reports it.
    }
    io_uring_cq_advance(ring_.get(), seen);
  }
  return Status::Ok();
}

}  // namespace stoker
