// The loader's counters: relaxed atomics that worker threads add to and
// stats() reads. Shared with the sample finishers, which time their stages.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace stoker::pipeline {

struct LoaderCounters {
  std::atomic<std::uint64_t> batches{0}, samples{0}, bytes{0}, samples_read{0}, corrupt_skipped{0};
  std::atomic<std::uint64_t> read_ns{0}, decode_ns{0}, transform_ns{0}, wait_ns{0};
  std::atomic<std::uint64_t> ready_sum{0}, next_calls{0}, read_requests{0};
  // Seekable JPEGs: decodes that read only the crop's restart intervals, and
  // tables that disagreed with their JPEG (decoded whole instead).
  std::atomic<std::uint64_t> seekable_decodes{0}, seekable_fallbacks{0};
  // Images read in part (the crop's MCU rows), and those read whole after all.
  std::atomic<std::uint64_t> seekable_part_reads{0}, seekable_part_rereads{0};

  static void Add(std::atomic<std::uint64_t>& counter, std::chrono::steady_clock::duration d) {
    counter.fetch_add(static_cast<std::uint64_t>(d.count()), std::memory_order_relaxed);
  }
};

}  // namespace stoker::pipeline
