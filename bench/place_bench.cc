// Placement decisions per second: ChooseCards alone on an 8-card node with
// leases on it, and PlaceGpuRequest end to end (lock, read and rewrite the
// lease file, fsync) placing and releasing. Usage: stoker_place_bench [LEASE_DIR]
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include "core/rng.h"
#include "place/placement.h"
#include "stoker/gpu_place.h"

int main(int argc, char** argv) {
  using namespace stoker;
  using Clock = std::chrono::steady_clock;
  constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;
  std::vector<place::CardState> cards;
  GpuInventory inventory;
  for (int i = 0; i < 8; ++i) {
    place::CardState c;
    c.uuid = "GPU-" + std::to_string(i);
    c.index = i;
    c.numa_node = i / 4;
    c.total_bytes = 141 * kGiB;
    c.leased_bytes = static_cast<std::uint64_t>(i) * 10 * kGiB;
    c.leases = static_cast<std::uint32_t>(i);
    cards.push_back(c);
    GpuCard g;
    g.index = i;
    g.uuid = c.uuid;
    g.total_bytes = c.total_bytes;
    g.numa_node = c.numa_node;
    inventory.cards.push_back(g);
  }
  Rng rng(1, 2);
  const int decisions = 1'000'000;
  std::uint64_t checksum = 0;
  auto start = Clock::now();
  for (int n = 0; n < decisions; ++n) {
    GpuRequest r;
    r.memory_bytes = (1 + rng.Below(60)) * kGiB;
    r.compute_percent = static_cast<std::uint32_t>(rng.Below(50));
    r.count = 1 + static_cast<std::uint32_t>(rng.Below(2));
    r.policy = n % 2 ? GpuPolicy::kSpread : GpuPolicy::kBinpack;
    auto chosen = place::ChooseCards(r, cards);
    if (chosen.ok()) checksum += chosen->front();
  }
  const double pure = decisions / std::chrono::duration<double>(Clock::now() - start).count();

  const std::string dir = argc > 1 ? argv[1] : std::filesystem::temp_directory_path().string();
  GpuPlacementOptions options;
  options.leases = dir + "/stoker-place-bench-" + std::to_string(::getpid()) + ".json";
  options.ledger = dir + "/stoker-place-bench-ledger-" + std::to_string(::getpid());
  const int rounds = 2000, kept = 50;  // 50 leases stay on the node throughout
  std::vector<std::string> live;
  start = Clock::now();
  for (int n = 0; n < rounds; ++n) {
    GpuRequest r;
    r.memory_bytes = 2 * kGiB;
    auto lease = PlaceGpuRequest(r, inventory, options);
    if (!lease.ok()) {
      std::fprintf(stderr, "%s\n", lease.error().ToString().c_str());
      return 1;
    }
    live.push_back(lease->id);
    if (live.size() > kept) {
      if (!ReleaseGpuLease(live.front(), options.leases).ok()) return 1;
      live.erase(live.begin());
    }
  }
  const double whole = (rounds + rounds - kept) / std::chrono::duration<double>(Clock::now() - start).count();
  std::filesystem::remove(options.leases);
  std::filesystem::remove(options.leases + ".lock");
  std::printf(
      "{\"choose_cards_per_s\": %.0f, \"lease_file_operations_per_s\": %.0f, \"leases_kept\": %d, "
      "\"checksum\": %llu}\n",
      pure, whole, kept, static_cast<unsigned long long>(checksum));
  return 0;
}
