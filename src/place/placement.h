// Choosing cards for a request: a pure function of the cards' state, so
// that the CLI, the device plugin and the scheduler extender decide alike
// and the property tests can drive it without a node. The scoring is the
// one stoker/gpu_place.h documents.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "stoker/gpu_place.h"

namespace stoker::place {

// What is taken on one card.
struct CardState {
  std::string uuid;
  int index = 0;
  int numa_node = -1;
  bool healthy = true;
  std::uint64_t total_bytes = 0;
  std::uint64_t other_bytes = 0;   // used by processes outside any lease
  std::uint64_t leased_bytes = 0;  // promised to leases
  std::uint32_t leased_compute = 0;
  std::uint32_t leases = 0;
  bool exclusive = false;        // a whole-card lease holds it
  std::vector<int> link_levels;  // NVML topology level to each card (by position); empty: unknown

  [[nodiscard]] std::uint64_t FreeBytes() const;
  [[nodiscard]] std::uint32_t FreeCompute() const { return leased_compute >= 100 ? 0 : 100 - leased_compute; }
};

// Whether `request` (one of its cards) fits on `card` now.
[[nodiscard]] bool Fits(const GpuRequest& request, const CardState& card);
// max(memory taken / physical, compute taken / 100) after adding `request`.
[[nodiscard]] double FullnessAfter(const GpuRequest& request, const CardState& card);

// The positions in `cards` chosen for `request` (request.count of them),
// or ResourceExhausted naming what each card has free. A request that no
// state of these cards could ever hold (more cards than there are, more
// memory than the largest) is InvalidArgument, so a waiter does not wait
// for what cannot come.
[[nodiscard]] Result<std::vector<std::size_t>> ChooseCards(const GpuRequest& request, std::span<const CardState> cards);

// "GPU-1a2b.. (0): 12.0 GiB of 16.0 GiB free, 70% compute free; ..."
[[nodiscard]] std::string DescribeFree(std::span<const CardState> cards);
// "20.0 GiB and 30% compute on 1 card" / "2 whole cards"
[[nodiscard]] std::string DescribeRequest(const GpuRequest& request);

}  // namespace stoker::place
