// An epoch order's memory and the time to make it, at the sizes of the
// largest datasets (hundreds of millions of samples): held in 4 bytes a
// position (what EpochOrder does below 2^32 samples) against 8 (what it did
// before, and still does above). The order is the same either way.
//
//   stoker_epoch_order_bench SAMPLES [SHARD_SAMPLES]
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "order/sampler.h"

namespace {

// Anonymous memory now (RssAnon, /proc/self/status), in MiB.
double RssAnonMiB() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  double kib = 0;
  while (std::fgets(line, sizeof line, f) != nullptr)
    if (std::sscanf(line, "RssAnon: %lf kB", &kib) == 1) break;
  std::fclose(f);
  return kib / 1024;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fmt::print(stderr, "usage: stoker_epoch_order_bench SAMPLES [SHARD_SAMPLES]\n");
    return 1;
  }
  const std::uint64_t samples = std::strtoull(argv[1], nullptr, 10);
  const std::uint64_t per_shard = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 10'000;
  std::vector<stoker::order::ShardSpan> shards;
  for (std::uint64_t first = 0; first < samples; first += per_shard)
    shards.push_back({first, std::min(per_shard, samples - first)});
  for (auto mode : {stoker::order::OrderMode::kShuffle, stoker::order::OrderMode::kShardBlockShuffle})
    for (bool wide : {true, false}) {
      const stoker::order::OrderSpec spec{mode, 1, 8};
      const double before = RssAnonMiB();
      const auto start = std::chrono::steady_clock::now();
      const stoker::order::Permutation order = stoker::order::EpochOrderIn(wide, spec, 0, shards);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const double held = RssAnonMiB() - before;
      fmt::print("{:>19} {} samples, {} bytes a position: {:.2f} s, {:.0f} MiB held ({:.2f} B a sample); order[0] {}\n",
                 mode == stoker::order::OrderMode::kShuffle ? "shuffle" : "shard-block shuffle", samples, wide ? 8 : 4,
                 seconds, held, held * 1048576.0 / static_cast<double>(samples), order[0]);
    }
  return 0;
}
