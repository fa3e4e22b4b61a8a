// The consumer's wait at an epoch's boundary against its wait within an
// epoch: a loader over a labels-only dataset of SAMPLES samples (so that
// reading and decoding cost little and the order's making shows), a full
// shuffle, two epochs and a few batches. Making an epoch's order is a pass
// over every sample; made under the loader's lock when scheduling reaches
// the epoch, the workers wait with it, and the consumer waits at the
// boundary; made ahead (pipeline/order_ahead.h), it does not.
//
//   stoker_epoch_boundary_bench DIR SAMPLES [BATCH] [--remote-plan]
//
// DIR is written (SAMPLES samples, a `cls` each) unless it holds a dataset
// of that size already. --remote-plan opens it through a file system that
// takes the loader's read plan as a remote dataset's cache does (it keeps
// the shard visits; nothing is downloaded): the loader then also lists each
// epoch's shard visits for it, and starts the next epoch's order at each
// epoch's start, so that the cache fetches the next epoch's first shards
// ahead.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "stoker/dataset.h"
#include "stoker/dataset_writer.h"
#include "stoker/loader.h"

namespace {

using Clock = std::chrono::steady_clock;

int Fail(const stoker::Status& status) {
  fmt::print(stderr, "{}\n", status.ToString());
  return 1;
}

double Ms(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

// The local file system, with a read planner that keeps the plan as the
// remote shard cache does (remote/shard_cache.cc: the visits appended to a
// vector, the visited part dropped as reading advances).
class PlanKeepingFileSystem final : public stoker::FileSystem, public stoker::ShardReadPlanner {
 public:
  std::uint64_t AppendPlan(std::span<const std::uint32_t> shards) override {
    const std::uint64_t at = base_ + plan_.size();
    plan_.insert(plan_.end(), shards.begin(), shards.end());
    return at;
  }
  void AdvancePlan(std::uint64_t position) override {
    const std::uint64_t done = std::min<std::uint64_t>(position - std::min(position, base_), plan_.size());
    if (done > 4096 && done * 2 > plan_.size()) {
      plan_.erase(plan_.begin(), plan_.begin() + static_cast<std::ptrdiff_t>(done));
      base_ += done;
    }
  }
  void ResetPlan() override {
    base_ += plan_.size();
    plan_.clear();
  }
  std::uint64_t working_set_bytes() const override { return 1ull << 50; }
  std::uint64_t largest_shard_bytes() const override { return 1ull << 30; }
  stoker::ShardReadPlanner* read_planner() override { return this; }

  stoker::Result<std::unique_ptr<stoker::ReadableFile>> OpenForRead(const std::string& path) override {
    return base().OpenForRead(path);
  }
  using FileSystem::Map;
  stoker::Result<std::unique_ptr<stoker::MappedFile>> Map(const std::string& path, stoker::MapAccess access) override {
    return base().Map(path, access);
  }
  using FileSystem::CreateForWrite;
  stoker::Result<std::unique_ptr<stoker::WritableFile>> CreateForWrite(const std::string& path,
                                                                       stoker::CreateMode mode) override {
    return base().CreateForWrite(path, mode);
  }
  stoker::Status Rename(const std::string& from, const std::string& to) override { return base().Rename(from, to); }
  stoker::Status Remove(const std::string& path) override { return base().Remove(path); }
  stoker::Status RemoveDirectory(const std::string& path) override { return base().RemoveDirectory(path); }
  stoker::Status CreateDirectories(const std::string& path) override { return base().CreateDirectories(path); }
  stoker::Status SyncDirectory(const std::string& path) override { return base().SyncDirectory(path); }
  stoker::Result<std::vector<stoker::DirEntry>> ListDirectory(const std::string& path) override {
    return base().ListDirectory(path);
  }
  stoker::Result<stoker::FileInfo> Stat(const std::string& path) override { return base().Stat(path); }
  void ReadBatch(std::span<stoker::ReadRequest> requests) override { base().ReadBatch(requests); }
  std::string ReadBatchMethod() override { return base().ReadBatchMethod(); }
  stoker::Result<std::unique_ptr<stoker::FileLock>> TryLock(const std::string& path) override {
    return base().TryLock(path);
  }

 private:
  static stoker::FileSystem& base() { return *stoker::FileSystem::Default(); }
  std::vector<std::uint32_t> plan_;
  std::uint64_t base_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args;
  bool remote_plan = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--remote-plan") {
      remote_plan = true;
    } else {
      args.emplace_back(argv[i]);
    }
  }
  if (args.size() < 2) {
    fmt::print(stderr, "usage: stoker_epoch_boundary_bench DIR SAMPLES [BATCH] [--remote-plan]\n");
    return 1;
  }
  const std::string dir = args[0];
  const std::uint64_t samples = std::strtoull(args[1].c_str(), nullptr, 10);
  const std::uint32_t batch =
      args.size() > 2 ? static_cast<std::uint32_t>(std::strtoul(args[2].c_str(), nullptr, 10)) : 4096;
  auto dataset = stoker::Dataset::Open(dir);
  if (!dataset.ok() || (*dataset)->num_samples() != samples) {
    stoker::DatasetWriterOptions options;
    options.overwrite = true;
    auto writer = stoker::DatasetWriter::Create(dir, options);
    if (!writer.ok()) return Fail(writer.error());
    std::string cls;
    for (std::uint64_t i = 0; i < samples; ++i) {
      const std::string key = fmt::format("{:010d}", i);
      cls = std::to_string(i % 1000);
      const stoker::SampleField fields[] = {{"cls", std::as_bytes(std::span(cls.data(), cls.size()))}};
      if (auto s = (*writer)->Add(key, fields); !s.ok()) return Fail(s);
    }
    if (auto summary = (*writer)->Finish(); !summary.ok()) return Fail(summary.error());
    dataset = stoker::Dataset::Open(dir);
    if (!dataset.ok()) return Fail(dataset.error());
  }
  PlanKeepingFileSystem planning;
  if (remote_plan) {
    dataset.value().reset();
    dataset = stoker::Dataset::Open(dir, &planning);
    if (!dataset.ok()) return Fail(dataset.error());
  }
  stoker::LoaderOptions options;
  options.batch_size = batch;
  options.order = stoker::Order::kShuffle;
  stoker::FieldSpec label;
  label.name = "cls";
  label.kind = stoker::FieldKind::kInt;
  label.keys = {"cls"};
  options.fields = {label};
  const auto made = Clock::now();
  auto loader = stoker::Loader::Create(std::shared_ptr<const stoker::Dataset>(std::move(*dataset)), options);
  if (!loader.ok()) return Fail(loader.error());
  fmt::print("{} samples, batches of {}{}: loader made in {:.0f} ms\n", samples, batch,
             remote_plan ? ", the read plan kept as a remote cache does" : "", Ms(Clock::now() - made));

  // Each Next()'s wait, within epoch 0 and around its end.
  std::vector<double> within, boundary;
  const std::uint64_t per_epoch = (*loader)->batches_per_epoch();
  for (std::uint64_t epoch = 0; epoch < 2; ++epoch) {
    std::uint64_t k = 0;
    const auto epoch_start = Clock::now();
    for (;;) {
      const auto asked = Clock::now();
      auto next = (*loader)->Next();
      const double waited = Ms(Clock::now() - asked);
      if (!next.ok()) return Fail(next.error());
      if (!next->has_value()) break;
      // Scheduling runs a few batches ahead of delivery: it reaches epoch 1
      // while epoch 0's last batches are delivered.
      if ((epoch == 0 && k + 8 >= per_epoch) || (epoch == 1 && k < 8)) boundary.push_back(waited);
      if (epoch == 0 && k >= 8 && k + 8 < per_epoch) within.push_back(waited);
      ++k;
    }
    fmt::print("epoch {}: {} batches in {:.2f} s\n", epoch, k, Ms(Clock::now() - epoch_start) / 1000);
  }
  std::sort(within.begin(), within.end());
  const double median = within.empty() ? 0 : within[within.size() / 2];
  const double worst_within = within.empty() ? 0 : within.back();
  fmt::print("wait within epoch 0: median {:.2f} ms, longest {:.1f} ms\n", median, worst_within);
  fmt::print(
      "wait at the boundary (epoch 0's last 8 batches, epoch 1's first 8): longest {:.1f} ms, summed {:.1f} ms\n",
      *std::max_element(boundary.begin(), boundary.end()), std::accumulate(boundary.begin(), boundary.end(), 0.0));
  return 0;
}
