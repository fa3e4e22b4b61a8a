#include "stoker/loader.h"

#include <chrono>
#include <filesystem>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/cuda_runtime.h"
#include "pipeline/loader_test_util.h"
#include "stoker/pack.h"
#include "test_util.h"

namespace stoker {
namespace {

using testing::TempDir;
using testing::WriteFile;

TEST(Loader, EpochCoversEveryoneOnceWithLabels) {
  TempDir dir;
  auto dataset = MakeDataset(dir);
  auto loader = Loader::Create(dataset, SmallOptions());
  ASSERT_TRUE(loader.ok()) << loader.error().ToString();
  EXPECT_EQ((*loader)->batches_per_epoch(), 8u);  // ceil(30 / 4): the last batch holds 2
  Epoch e = RunEpoch(**loader);
  std::set<std::uint64_t> unique(e.indices.begin(), e.indices.end());
  EXPECT_EQ(unique.size(), 30u);
  EXPECT_EQ(e.indices.size(), 30u);
  for (std::size_t i = 0; i < e.indices.size(); ++i)
    EXPECT_EQ(e.labels[i], static_cast<std::int64_t>(e.indices[i] / 10));
  EXPECT_EQ((*loader)->epoch(), 1u);  // advanced at the end
  auto stats = (*loader)->stats();
  EXPECT_EQ(stats.batches, 8u);
  EXPECT_EQ(stats.samples, 30u);
  EXPECT_GT(stats.bytes_read, 0u);
  EXPECT_NE(stats.Summary(1.0).find("30 images"), std::string::npos);
  // Every sample read once or more (batches read ahead count too): the bytes an image took.
  EXPECT_GE(stats.samples_read, 30u);
  EXPECT_NE(
      stats.Summary(1.0).find(fmt::format(
          "{:.1f} KB an image", static_cast<double>(stats.bytes_read) / static_cast<double>(stats.samples_read) / 1e3)),
      std::string::npos)
      << stats.Summary(1.0);
}

TEST(Loader, DeterministicAcrossThreadCounts) {
  TempDir dir;
  auto dataset = MakeDataset(dir);
  auto one = SmallOptions();
  one.threads = 1;
  auto many = SmallOptions();
  many.threads = 5;
  many.prefetch = 4;
  auto a = Loader::Create(dataset, one);
  auto b = Loader::Create(dataset, many);
  ASSERT_TRUE(a.ok() && b.ok());
  for (int epoch = 0; epoch < 2; ++epoch) {
    Epoch ea = RunEpoch(**a), eb = RunEpoch(**b);
    EXPECT_EQ(ea.indices, eb.indices);
    EXPECT_TRUE(ea.pixels == eb.pixels);
  }
  // A different epoch gives a different order.
  (*a)->SetEpoch(0);
  Epoch e0 = RunEpoch(**a), e1 = RunEpoch(**a);
  EXPECT_NE(e0.indices, e1.indices);
}

// Consumes `consumed` global batches with world size w1, then resumes the
// rest of the epoch with w2; every sample of the epoch is seen exactly once.
void CheckResume(std::uint32_t w1, std::uint32_t w2, std::uint64_t consumed) {
  TempDir dir;
  auto dataset = MakeDataset(dir);
  const std::uint32_t global = 12;
  std::multiset<std::uint64_t> seen;
  LoaderState state;
  for (std::uint32_t r = 0; r < w1; ++r) {
    auto o = SmallOptions();
    o.batch_size = global / w1;
    o.rank = static_cast<int>(r);
    o.world_size = static_cast<int>(w1);
    o.drop_last = true;
    o.prefetch = 3;  // batches in flight beyond the consumed ones must not count
    auto loader = Loader::Create(dataset, o);
    ASSERT_TRUE(loader.ok());
    for (std::uint64_t k = 0; k < consumed; ++k) {
      auto next = (*loader)->Next();
      ASSERT_TRUE(next.ok() && next->has_value());
      seen.insert((**next).indices(), (**next).indices() + (**next).size());
    }
    state = (*loader)->state();
  }
  for (std::uint32_t r = 0; r < w2; ++r) {
    auto o = SmallOptions();
    o.batch_size = global / w2;
    o.rank = static_cast<int>(r);
    o.world_size = static_cast<int>(w2);
    o.drop_last = true;
    auto loader = Loader::Create(dataset, o);
    ASSERT_TRUE(loader.ok());
    ASSERT_TRUE((*loader)->Restore(state).ok());
    Epoch rest = RunEpoch(**loader);
    seen.insert(rest.indices.begin(), rest.indices.end());
  }
  // drop_last: 30 samples -> 2 global batches of 12 = 24 distinct samples.
  EXPECT_EQ(seen.size(), 24u);
  EXPECT_EQ(std::set<std::uint64_t>(seen.begin(), seen.end()).size(), 24u);
}

TEST(Loader, ResumesExactlyUnderAWorldSizeChange) {
  CheckResume(4, 2, 1);
  CheckResume(2, 3, 1);
  CheckResume(3, 1, 2);
  CheckResume(2, 4, 0);
}

// Elastic training: one process per rank, the world size changing between
// batches (3 -> 2 -> 4 -> 1), every process resharded in place. The ranks'
// batches, taken in rank order, are the one-process epoch in order: each
// sample exactly once, the same pixels, nothing padded at the short end.
TEST(Loader, ReshardKeepsTheGlobalOrderAcrossWorldSizeChanges) {
  TempDir dir;
  auto dataset = MakeDataset(dir);
  LoaderOptions single = SmallOptions();
  single.global_batch_size = 7;  // 30 samples: 4 full batches and one of 2
  auto whole = Loader::Create(dataset, single);
  ASSERT_TRUE(whole.ok()) << whole.error().ToString();
  const Epoch reference = RunEpoch(**whole);
  ASSERT_EQ(reference.indices.size(), 30u);

  const std::uint32_t kMaxRanks = 4;
  std::vector<std::unique_ptr<Loader>> ranks;
  for (std::uint32_t r = 0; r < kMaxRanks; ++r) {
    LoaderOptions o = single;
    o.rank = static_cast<int>(r % 3);
    o.world_size = 3;
    o.min_world_size = 1;
    auto l = Loader::Create(dataset, o);
    ASSERT_TRUE(l.ok()) << l.error().ToString();
    EXPECT_EQ((*l)->batch_capacity(), 7u);
    ranks.push_back(std::move(l).value());
  }
  const std::uint32_t worlds[] = {3, 2, 4, 1, 4};
  Epoch combined;
  std::size_t image_bytes = reference.pixels.size() / 30;
  for (std::uint64_t k = 0; k < 5; ++k) {
    const std::uint32_t w = worlds[k];
    std::size_t sizes_min = SIZE_MAX, sizes_max = 0;
    for (std::uint32_t r = 0; r < w; ++r) {
      ASSERT_TRUE(ranks[r]->Reshard(r, w).ok());
      LoaderState at = ranks[r]->state();
      at.batches_consumed = k;  // a rank that sat out earlier batches catches up, as after a rendezvous
      ASSERT_TRUE(ranks[r]->Restore(at).ok());
      auto next = ranks[r]->Next();
      ASSERT_TRUE(next.ok() && next->has_value()) << "batch " << k << " rank " << r;
      const Batch& b = **next;
      EXPECT_EQ(b.batch_index(), k);
      sizes_min = std::min<std::size_t>(sizes_min, b.size());
      sizes_max = std::max<std::size_t>(sizes_max, b.size());
      combined.indices.insert(combined.indices.end(), b.indices(), b.indices() + b.size());
      auto* p = static_cast<const std::byte*>(b.images());
      combined.pixels.insert(combined.pixels.end(), p, p + b.size() * image_bytes);
    }
    EXPECT_LE(sizes_max - sizes_min, 1u);
  }
  EXPECT_EQ(combined.indices, reference.indices);
  EXPECT_TRUE(combined.pixels == reference.pixels);
}

TEST(Loader, ReshardRejectsWhatItsBuffersCannotHold) {
  TempDir dir;
  auto dataset = MakeDataset(dir);
  LoaderOptions o = SmallOptions();
  o.global_batch_size = 12;
  o.world_size = 4;
  o.min_world_size = 3;
  auto loader = Loader::Create(dataset, o);
  ASSERT_TRUE(loader.ok()) << loader.error().ToString();
  EXPECT_EQ((*loader)->batch_capacity(), 4u);
  Status st = (*loader)->Reshard(0, 2);  // 6 samples per rank, buffers hold 4
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("min_world_size 2 or less"), std::string::npos) << st.message();
  EXPECT_EQ((*loader)->Reshard(3, 3).code(), StatusCode::kInvalidArgument);  // rank out of range
  EXPECT_TRUE((*loader)->Reshard(2, 3).ok());
  EXPECT_EQ((*loader)->world_size(), 3u);

  LoaderOptions fixed = SmallOptions();  // batch_size per rank: the split is fixed
  auto plain = Loader::Create(dataset, fixed);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ((*plain)->Reshard(0, 2).code(), StatusCode::kFailedPrecondition);

  LoaderOptions below = o;
  below.world_size = 2;  // below min_world_size at creation
  EXPECT_FALSE(Loader::Create(dataset, below).ok());
  LoaderOptions stray = SmallOptions();
  stray.min_world_size = 2;  // without global_batch_size
  EXPECT_FALSE(Loader::Create(dataset, stray).ok());
}

TEST(Loader, RestoreRejectsAnotherGlobalBatch) {
  TempDir dir;
  auto dataset = MakeDataset(dir);
  auto loader = Loader::Create(dataset, SmallOptions());
  ASSERT_TRUE(loader.ok());
  LoaderState s = (*loader)->state();
  s.global_batch_size = 8;
  Status st = (*loader)->Restore(s);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("global batch 8"), std::string::npos);
}

TEST(Loader, ShutsDownMidEpochWithoutHanging) {
  TempDir dir;
  auto dataset = MakeDataset(dir);
  for (int i = 0; i < 5; ++i) {
    auto o = SmallOptions();
    o.threads = 3;
    o.prefetch = 4;
    auto loader = Loader::Create(dataset, o);
    ASSERT_TRUE(loader.ok());
    auto next = (*loader)->Next();
    ASSERT_TRUE(next.ok());
    next->reset();  // batches must go before their loader
    loader->reset();
  }
}

// Takes `count` batches from `loader` and keeps them.
std::vector<Batch> HoldBatches(Loader& loader, int count) {
  std::vector<Batch> held;
  for (int i = 0; i < count; ++i) {
    auto next = loader.Next();
    EXPECT_TRUE(next.ok() && next->has_value()) << "batch " << i;
    if (next.ok() && next->has_value()) held.push_back(std::move(**next));
  }
  return held;
}

TEST(Loader, ThePoolIsPrefetchPlusTwoAndHoldingItAllIsReported) {
  // prefetch + 2 buffers: `prefetch` in flight, the batch in use and a
  // reserve for a consumer that holds more. Holding every buffer is
  // reported rather than a deadlock.
  TempDir dir;
  auto dataset = MakeDataset(dir);
  for (const auto& [prefetch, pool] : {std::pair{1, 3}, std::pair{2, 4}, std::pair{4, 6}}) {
    SCOPED_TRACE(fmt::format("prefetch {}", prefetch));
    auto o = SmallOptions();
    o.prefetch = static_cast<std::uint32_t>(prefetch);
    auto loader = Loader::Create(dataset, o);
    ASSERT_TRUE(loader.ok());
    std::vector<Batch> held = HoldBatches(**loader, pool);
    auto blocked = (*loader)->Next();
    ASSERT_FALSE(blocked.ok());
    EXPECT_EQ(blocked.error().code(), StatusCode::kResourceExhausted);
    EXPECT_NE(blocked.error().message().find(fmt::format("all {} batch buffers", pool)), std::string::npos)
        << blocked.error().message();
    held.erase(held.begin());  // releasing one schedules the next batch at once
    auto again = (*loader)->Next();
    EXPECT_TRUE(again.ok() && again->has_value());
  }
}

TEST(Loader, CorruptSamplesErrorOrAreSkipped) {
  TempDir dir;
  auto dataset = MakeDataset(dir, /*with_corrupt=*/true);
  auto o = SmallOptions();
  o.shuffle = false;
  // Scheduling runs up to `prefetch` batches into the next epoch; keep that
  // short of the corrupt sample 15 (batch 3) whatever the machine's core count.
  o.prefetch = 2;
  auto loader = Loader::Create(dataset, o);
  ASSERT_TRUE(loader.ok());
  Status error;
  while (true) {
    auto next = (*loader)->Next();
    if (!next.ok()) {
      error = next.error();
      break;
    }
    if (!next->has_value()) break;
  }
  ASSERT_FALSE(error.ok()) << "the corrupt sample must stop the epoch by default";
  EXPECT_EQ(error.code(), StatusCode::kCorruption);
  EXPECT_NE(error.message().find("sample 'c1/5'"), std::string::npos) << error.message();
  EXPECT_NE(error.message().find(".tar:"), std::string::npos) << error.message();

  o.on_corrupt = CorruptPolicy::kSkip;
  auto skipping = Loader::Create(dataset, o);
  ASSERT_TRUE(skipping.ok());
  Epoch e = RunEpoch(**skipping);
  EXPECT_EQ(e.indices.size(), 30u);  // shapes hold: a substitute fills the corrupt sample's place
  EXPECT_EQ(std::count(e.indices.begin(), e.indices.end(), 15u), 0);
  EXPECT_EQ((*skipping)->stats().corrupt_skipped, 1u);
}

TEST(Loader, RejectsBadOptions) {
  TempDir dir;
  auto dataset = MakeDataset(dir);
  auto o = SmallOptions();
  o.batch_size = 0;
  EXPECT_FALSE(Loader::Create(dataset, o).ok());
  o = SmallOptions();
  o.world_size = 3;
  o.rank = 3;
  EXPECT_FALSE(Loader::Create(dataset, o).ok());
  o = SmallOptions();
  o.image_field = "png";
  auto r = Loader::Create(dataset, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("its fields: cls, jpg"), std::string::npos) << r.error().message();
}

}  // namespace
}  // namespace stoker

namespace stoker {
namespace {

TEST(Loader, PinsBatchBuffersExactlyWhenCudaIsUsable) {
  TempDir dir;
  auto dataset = MakeDataset(dir);
  auto loader = Loader::Create(dataset, SmallOptions());
  ASSERT_TRUE(loader.ok());
  const auto& cuda = CudaRuntime::Get();
  EXPECT_EQ((*loader)->stats().pinned_memory, cuda.available());
  if (!cuda.available()) {
    EXPECT_FALSE(cuda.reason().empty());
  }
  auto next = (*loader)->Next();  // works either way
  ASSERT_TRUE(next.ok() && next->has_value());
}

}  // namespace
}  // namespace stoker

namespace stoker {
namespace {

// Waits until the loader has nothing left to read ahead (its bytes read stay
// the same for a while), so that two loaders can be compared at rest.
std::uint64_t BytesReadAtRest(Loader& loader) {
  std::uint64_t last = loader.stats().bytes_read;
  for (int same = 0; same < 10;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const std::uint64_t now = loader.stats().bytes_read;
    same = now == last ? same + 1 : 0;
    last = now;
  }
  return last;
}

// A loop that takes batches_per_epoch() batches and then calls SetEpoch for
// the next epoch, without asking Next for the end of the epoch, keeps what
// the loader already read ahead into that epoch (was: dropped and read and
// decoded again), and gets the same batches as a loop that reads the end.
TEST(Loader, SetEpochToTheNextKeepsWhatWasReadAhead) {
  TempDir dir;
  auto dataset = MakeDataset(dir);
  auto o = SmallOptions();
  o.prefetch = 4;
  auto ends = Loader::Create(dataset, o);
  auto counts = Loader::Create(dataset, o);
  ASSERT_TRUE(ends.ok() && counts.ok());
  std::vector<Epoch> by_end, by_count;
  for (std::uint64_t epoch = 0; epoch < 3; ++epoch) {
    by_end.push_back(RunEpoch(**ends));
    Epoch e;
    for (std::uint64_t i = 0; i < (*counts)->batches_per_epoch(); ++i) {
      auto next = (*counts)->Next();
      ASSERT_TRUE(next.ok() && next->has_value());
      const Batch& b = **next;
      e.indices.insert(e.indices.end(), b.indices(), b.indices() + b.size());
    }
    by_count.push_back(std::move(e));
    EXPECT_EQ(BytesReadAtRest(**counts), BytesReadAtRest(**ends)) << "epoch " << epoch;
    (*counts)->SetEpoch(epoch + 1);
  }
  for (std::size_t i = 0; i < by_end.size(); ++i) EXPECT_EQ(by_count[i].indices, by_end[i].indices) << i;
  EXPECT_EQ((*counts)->stats().bytes_read, (*ends)->stats().bytes_read);
}

TEST(Loader, ReadsEachBatchTogetherMergingNeighbours) {
  TempDir dir;
  auto dataset = MakeDataset(dir);
  auto sequential = SmallOptions();
  sequential.shuffle = false;
  sequential.prefetch = 2;  // the next epoch's run-ahead reads: at most this many
  auto loader = Loader::Create(dataset, sequential);
  ASSERT_TRUE(loader.ok());
  Epoch e = RunEpoch(**loader);
  auto stats = (*loader)->stats();
  // In dataset order, a batch's samples lie side by side: one request per
  // batch (two where a batch straddles shards).
  EXPECT_GE(stats.read_requests, stats.batches);
  EXPECT_LE(stats.read_requests, stats.batches + dataset->shards().size() + sequential.prefetch);
  EXPECT_TRUE(stats.read_method == "io_uring" || stats.read_method == "pread") << stats.read_method;
  EXPECT_NE(stats.Summary(1.0).find("read requests (" + stats.read_method + ")"), std::string::npos);

  // The pixels do not depend on how the bytes were fetched: shuffled order,
  // where little merges, equals the same shuffled order read one by one.
  auto shuffled = SmallOptions();
  auto merged = Loader::Create(dataset, shuffled);
  ASSERT_TRUE(merged.ok());
  Epoch a = RunEpoch(**merged);
  EXPECT_EQ(a.indices.size(), 30u);
  ::setenv("STOKER_DISABLE_IO_URING", "1", 1);  // new worker threads read with pread
  auto plain = Loader::Create(dataset, shuffled);
  ASSERT_TRUE(plain.ok());
  Epoch b = RunEpoch(**plain);
  ::unsetenv("STOKER_DISABLE_IO_URING");
  EXPECT_EQ((*plain)->stats().read_method, "pread");
  EXPECT_EQ(a.indices, b.indices);
  EXPECT_EQ(a.pixels, b.pixels);
}

}  // namespace
}  // namespace stoker

namespace stoker {
namespace {

TEST(Loader, LooseImageFolderGivesTheSameEpochAsItsPackedShards) {
  TempDir dir;
  auto packed = MakeDataset(dir);  // packs dir/src into dir/out
  auto loose = Dataset::OpenImageFolder(dir / "src");
  ASSERT_TRUE(loose.ok()) << loose.error().ToString();
  EXPECT_TRUE((*loose)->loose_files());
  EXPECT_FALSE(packed->loose_files());
  ASSERT_EQ((*loose)->num_samples(), packed->num_samples());
  for (std::uint64_t i = 0; i < packed->num_samples(); ++i) {
    EXPECT_EQ((*loose)->Sample(i)->key, packed->Sample(i)->key);
    EXPECT_EQ((*loose)->Sample(i)->label, packed->Sample(i)->label);
  }
  std::shared_ptr<const Dataset> loose_dataset = std::move(*loose);
  auto a = Loader::Create(packed, SmallOptions());
  auto b = Loader::Create(loose_dataset, SmallOptions());
  ASSERT_TRUE(a.ok() && b.ok());
  Epoch from_packed = RunEpoch(**a);
  Epoch from_loose = RunEpoch(**b);
  EXPECT_EQ(from_packed.indices, from_loose.indices);
  EXPECT_EQ(from_packed.labels, from_loose.labels);
  EXPECT_EQ(from_packed.pixels, from_loose.pixels);
  // Loose files have no checksums: verify says so rather than failing them.
  auto report = Verify(*loose_dataset);
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.error().message().find("loose files"), std::string::npos);
  // A folder that is not an ImageFolder is named.
  EXPECT_FALSE(Dataset::OpenImageFolder(dir / "out").ok());
}

}  // namespace
}  // namespace stoker
