#include "pipeline/order_choice.h"

#include <algorithm>
#include <functional>
#include <vector>

#include <fmt/format.h>

#include "order/cache_model.h"
#include "order/read_plan.h"
#include "stoker/byte_size.h"

namespace stoker::pipeline {
namespace {
constexpr double kWarnAboveDataset = 1.5;
// Batches with under half the labels a global shuffle gives: said.
constexpr double kFewLabelsShare = 0.5;
}  // namespace

order::OrderMode ModeOf(Order order) {
  switch (order) {
    case Order::kSequential:
      return order::OrderMode::kSequential;
    case Order::kShardBlockShuffle:
      return order::OrderMode::kShardBlockShuffle;
    case Order::kShuffle:
    case Order::kAuto:
      break;
  }
  return order::OrderMode::kShuffle;
}

namespace {

// Bytes of the n largest shards: what must fit when n shards are read at once.
class LargestShards {
 public:
  explicit LargestShards(std::vector<std::uint64_t> sizes) {
    std::sort(sizes.begin(), sizes.end(), std::greater<>());
    prefix_.assign(sizes.size() + 1, 0);
    for (std::size_t i = 0; i < sizes.size(); ++i) prefix_[i + 1] = prefix_[i] + sizes[i];
  }
  [[nodiscard]] std::uint64_t Bytes(std::size_t n) const { return prefix_[std::min(n, prefix_.size() - 1)]; }

 private:
  std::vector<std::uint64_t> prefix_;
};

// The largest value in [lo, hi] that `holds` (a property that holds up to
// some value and not beyond: what the batches in flight read grows with
// their number and the window), or lo when none does. Each test replays an
// epoch's order, so a binary search rather than a walk.
template <typename Holds>
std::uint32_t LargestThat(std::uint32_t lo, std::uint32_t hi, const Holds& holds) {
  if (holds(hi)) return hi;
  while (lo + 1 < hi) {
    const std::uint32_t mid = lo + (hi - lo) / 2;
    (holds(mid) ? lo : hi) = mid;
  }
  return lo;
}

// Mean distinct labels per global batch of `order`, over up to 256 batches
// spread across it; 0 when the samples carry no labels.
double LabelsPerBatch(const order::Permutation& order, const Dataset& dataset, std::uint64_t batch) {
  const std::uint64_t batches = batch ? order.size() / batch : 0;
  if (batches == 0) return 0;
  const std::uint64_t step = std::max<std::uint64_t>(1, batches / 256);
  std::uint64_t seen = 0, counted = 0;
  std::vector<std::int64_t> labels;
  for (std::uint64_t b = 0; b < batches; b += step) {
    labels.clear();
    for (std::uint64_t i = b * batch; i < (b + 1) * batch; ++i) {
      auto sample = dataset.Sample(order[i]);
      if (!sample.ok() || sample->label == kNoLabel) return 0;
      labels.push_back(sample->label);
    }
    std::sort(labels.begin(), labels.end());
    seen += static_cast<std::uint64_t>(std::unique(labels.begin(), labels.end()) - labels.begin());
    ++counted;
  }
  return static_cast<double>(seen) / static_cast<double>(counted);
}

std::string Percent(std::uint64_t part, std::uint64_t whole) {
  return fmt::format("{:.0f}%", whole ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0);
}

}  // namespace

std::string_view OrderName(Order order) {
  switch (order) {
    case Order::kSequential:
      return "sequential";
    case Order::kShuffle:
      return "shuffle";
    case Order::kShardBlockShuffle:
      return "shard_block";
    case Order::kAuto:
      return "auto";
  }
  return "?";
}

std::uint32_t ShardsTouchedAtOnce(const order::Permutation& order, const std::vector<std::uint32_t>& shard_of_sample,
                                  std::uint64_t span) {
  std::vector<std::uint32_t> count;
  std::uint32_t distinct = 0, most = 0;
  span = std::max<std::uint64_t>(span, 1);
  for (std::size_t i = 0; i < order.size(); ++i) {
    const std::uint32_t s = shard_of_sample[order[i]];
    if (s >= count.size()) count.resize(s + 1, 0);
    if (count[s]++ == 0) ++distinct;
    if (i >= span) {
      const std::uint32_t gone = shard_of_sample[order[i - span]];
      if (--count[gone] == 0) --distinct;
    }
    most = std::max(most, distinct);
  }
  return most;
}

Result<OrderChoice> ChooseOrder(const LoaderOptions& options, const order::BatchPlan& plan, const Dataset& dataset,
                                const ShardReadPlanner* planner, std::uint32_t prefetch) {
  OrderChoice choice;
  choice.spec.seed = options.seed;
  const Order requested = options.shuffle ? options.order : Order::kSequential;
  const std::uint64_t largest = planner ? planner->largest_shard_bytes() : 0;
  if (largest == 0) {  // local data
    choice.order = requested == Order::kAuto ? Order::kShuffle : requested;
    choice.spec.mode = ModeOf(choice.order);
    choice.spec.shard_window = options.shard_window ? options.shard_window : 8;
    return choice;
  }

  const std::uint64_t cache = planner->working_set_bytes();
  std::vector<std::uint64_t> sizes;
  std::vector<order::ShardSpan> spans;
  std::vector<std::uint32_t> shard_of_sample(dataset.num_samples());
  std::uint64_t total = 0;
  for (const auto& s : dataset.shards()) {
    for (std::uint64_t i = 0; i < s.num_samples && s.first_sample + i < shard_of_sample.size(); ++i)
      shard_of_sample[s.first_sample + i] = static_cast<std::uint32_t>(sizes.size());
    sizes.push_back(s.size);
    spans.push_back({s.first_sample, s.num_samples});
    total += s.size;
  }
  const LargestShards biggest(sizes);
  const bool holds_all = cache >= total;
  choice.order = requested != Order::kAuto ? requested : holds_all ? Order::kShuffle : Order::kShardBlockShuffle;
  choice.spec.mode = ModeOf(choice.order);
  choice.spec.shard_window = options.shard_window ? options.shard_window : 8;
  const std::string sizes_said =
      fmt::format("the cache ({}) holds {} of the dataset ({} in {} shards, the largest {})", FormatBytes(cache),
                  Percent(cache, total), FormatBytes(total), sizes.size(), FormatBytes(largest));
  const std::string repack = "or repack into smaller shards (stoker pack --shard-size)";
  if (cache < largest)
    return Status::InvalidArgument(
        fmt::format("{}: a shard is downloaded whole before it is read, so the smallest cache that works is {} (two "
                    "shards, {}, let one download while the other is read); raise the cache size, {}",
                    sizes_said, FormatBytes(largest), FormatBytes(biggest.Bytes(2)), repack));

  std::string prefetch_said;
  if (choice.order != Order::kShuffle) {
    // What the batches in flight read at once, from the cache's view: from
    // the batch delivered last (the cache's position) to the reading front,
    // `p` prefetched and one more being read; each a global batch.
    order::Permutation epoch_order;
    std::uint32_t order_window = 0;
    auto in_use = [&](std::uint32_t window, std::uint32_t p) {
      if (window != order_window || epoch_order.size() == 0) {
        order::OrderSpec spec = choice.spec;
        spec.shard_window = window;
        epoch_order = order::EpochOrder(spec, 0, spans);
        order_window = window;
      }
      return ShardsTouchedAtOnce(epoch_order, shard_of_sample, (std::uint64_t{p} + 2) * plan.global_batch);
    };
    std::uint32_t window = choice.spec.shard_window;
    if (choice.order == Order::kShardBlockShuffle && options.shard_window == 0) {
      // The largest window whose working set and the next window fit: the
      // next window downloads while this one is read.
      const auto widest = static_cast<std::uint32_t>(std::clamp<std::uint64_t>(cache / (3 * largest), 1, 64));
      window = LargestThat(1, widest, [&](std::uint32_t w) { return biggest.Bytes(in_use(w, prefetch) + w) <= cache; });
    }
    choice.spec.shard_window = window;
    const std::string order_said =
        choice.order == Order::kShardBlockShuffle
            ? fmt::format("order=shard_block with a window of {} shard{}", window, window == 1 ? "" : "s")
            : "order=sequential";
    auto fits = [&](std::uint32_t p) { return biggest.Bytes(in_use(window, p) + 1) <= cache; };
    const std::uint32_t p = LargestThat(1, std::max<std::uint32_t>(prefetch, 1), fits);
    if (!fits(p)) {
      const std::uint32_t at_once = in_use(window, 1);
      return Status::InvalidArgument(fmt::format(
          "{}: {} reads up to {} shards at once (with one batch prefetched, three batches of {} samples can be in "
          "flight{}), and the next must download meanwhile, so the smallest cache that works is {}; raise the cache "
          "size, or lower the batch size{}, {}",
          sizes_said, order_said, at_once, plan.global_batch,
          choice.order == Order::kShardBlockShuffle ? ", more shards where windows meet" : "",
          FormatBytes(biggest.Bytes(at_once + 1)), window > 1 ? " or shard_window" : "", repack));
    }
    // Autotune may prefetch more, as far as the cache allows.
    choice.max_prefetch = LargestThat(p, kMaxPrefetch, fits);
    if (p < prefetch)
      prefetch_said =
          fmt::format("; prefetch lowered from {} to {} batches so that their reads fit the cache", prefetch, p);
  }

  // Replay the cache over epoch 0's visits of this rank.
  const auto epoch_order = order::EpochOrder(choice.spec, 0, spans);
  // A shard-aware order over shards that each hold few labels (packed from
  // an ImageFolder tree in class order) gives batches of few labels.
  std::string labels_said;
  if (choice.order == Order::kShardBlockShuffle) {
    const double ours = LabelsPerBatch(epoch_order, dataset, plan.global_batch);
    order::OrderSpec global = choice.spec;
    global.mode = order::OrderMode::kShuffle;
    const double shuffled =
        ours > 0 ? LabelsPerBatch(order::EpochOrder(global, 0, spans), dataset, plan.global_batch) : 0;
    if (shuffled > 0 && ours < kFewLabelsShare * shuffled) {
      choice.warning = true;
      labels_said = fmt::format(
          "; its batches hold {:.1f} labels on average against {:.1f} under a global shuffle: each shard holds few "
          "labels (packed in class order?), so repack with `stoker pack --shuffle` to mix them (or a larger cache "
          "allows a wider shard_window; stoker.order_quality measures it)",
          ours, shuffled);
    }
  }
  const auto visits = order::ShardVisits(epoch_order, plan, spans, 0);
  choice.predicted_epoch_download_bytes = order::ReplayDownloads(visits, sizes, cache);
  const double times = total ? static_cast<double>(choice.predicted_epoch_download_bytes) / total : 0;
  choice.warning = choice.warning || times > kWarnAboveDataset;
  const std::string why = requested == Order::kAuto ? (holds_all ? " (auto: the cache holds the whole dataset)"
                                                                 : " (auto: the cache is smaller than the dataset)")
                                                    : "";
  const std::string window_said =
      choice.order == Order::kShardBlockShuffle
          ? fmt::format(", window {} shard{}", choice.spec.shard_window, choice.spec.shard_window == 1 ? "" : "s")
          : "";
  choice.note = fmt::format("order={}{}{}: {}; an epoch is predicted to download {} ({:.2f}x the dataset){}{}",
                            OrderName(choice.order), why, window_said, sizes_said,
                            FormatBytes(choice.predicted_epoch_download_bytes), times, prefetch_said, labels_said);
  if (times > kWarnAboveDataset)
    choice.note += choice.order == Order::kShardBlockShuffle
                       ? "; a smaller shard_window (or a larger cache) lowers it"
                       : "; order=\"shard_block\" (or \"auto\") reads each shard once per epoch";
  return choice;
}

}  // namespace stoker::pipeline

namespace stoker {

Result<std::vector<std::uint64_t>> EpochSampleOrder(const Dataset& dataset, Order order, std::uint32_t shard_window,
                                                    std::uint64_t seed, std::uint64_t epoch) {
  if (order == Order::kAuto)
    return Status::InvalidArgument(
        "order auto depends on where the data is read from: give the order a Loader chose (its stats' order and "
        "shard_window)");
  order::OrderSpec spec;
  spec.mode = pipeline::ModeOf(order);
  spec.seed = seed;
  spec.shard_window = shard_window ? shard_window : 8;
  std::vector<order::ShardSpan> spans;
  for (const auto& s : dataset.shards()) spans.push_back({s.first_sample, s.num_samples});
  return order::EpochOrder(spec, epoch, spans).ToVector();
}

}  // namespace stoker
