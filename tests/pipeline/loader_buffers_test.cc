// The loader's batch buffers under an automatic prefetch depth: a loop
// holding one batch touches two, batches read ahead wait for a used buffer
// and take it, and none of that changes what is delivered.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/host_buffer.h"
#include "fault_file_system.h"
#include "pipeline/loader_test_util.h"

namespace stoker {
namespace {

// Runs `epochs` epochs keeping the last `kept` batches while asking for the
// next (a loop holding one keeps the batch it used while it asks).
Epoch RunKeeping(Loader& loader, int epochs, std::size_t kept) {
  Epoch e;
  std::deque<Batch> held;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    while (true) {
      auto next = loader.Next();
      EXPECT_TRUE(next.ok()) << next.error().ToString();
      if (!next.ok() || !next->has_value()) break;
      Append(e, **next);
      held.push_back(std::move(**next));
      while (held.size() > kept) held.pop_front();
    }
  }
  return e;
}

LoaderOptions SixteenAThread() {
  auto o = SmallOptions();
  o.batch_size = 16;  // 16 samples for its one thread: warm buffers only
  o.threads = 1;
  return o;
}

TEST(LoaderBuffers, ALoopHoldingOneBatchTouchesTwoBuffersAndGetsTheSameEpochs) {
  TempDir dir;
  auto dataset = MakeDataset(dir);
  auto automatic = Loader::Create(dataset, SixteenAThread());
  auto o = SixteenAThread();
  o.prefetch = 2;  // asked for: two batches decoded ahead, whatever the memory
  auto explicit_depth = Loader::Create(dataset, o);
  ASSERT_TRUE(automatic.ok() && explicit_depth.ok());
  const Epoch a = RunKeeping(**automatic, 6, /*kept=*/1), b = RunKeeping(**explicit_depth, 6, 1);
  EXPECT_EQ(a.indices, b.indices);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_TRUE(a.pixels == b.pixels);
  EXPECT_EQ((*automatic)->stats().batch_buffers_touched, 2u);
  EXPECT_EQ((*explicit_depth)->stats().batch_buffers_touched, 3u);
  EXPECT_EQ((*automatic)->stats().prefetch, 2u);  // still read two ahead
}

TEST(LoaderBuffers, ALoopKeepingMoreTouchesMoreAndNeverStalls) {
  TempDir dir;
  auto dataset = MakeDataset(dir);
  auto reference = Loader::Create(dataset, SixteenAThread());
  ASSERT_TRUE(reference.ok());
  const Epoch expected = RunKeeping(**reference, 4, 0);
  for (std::size_t kept : {2, 3}) {
    SCOPED_TRACE(fmt::format("keeping {}", kept));
    auto loader = Loader::Create(dataset, SixteenAThread());
    ASSERT_TRUE(loader.ok());
    const Epoch got = RunKeeping(**loader, 4, kept);
    EXPECT_EQ(got.indices, expected.indices);
    EXPECT_TRUE(got.pixels == expected.pixels);
    EXPECT_EQ((*loader)->stats().batch_buffers_touched, kept + 1);
  }
}

TEST(LoaderBuffers, MovingThePositionDropsBatchesWaitingForABuffer) {
  TempDir dir;
  auto dataset = MakeDataset(dir);
  auto reference = Loader::Create(dataset, SixteenAThread());
  ASSERT_TRUE(reference.ok());
  (*reference)->SetEpoch(3);
  const Epoch expected = RunKeeping(**reference, 1, 0);
  for (int round = 0; round < 6; ++round) {
    auto loader = Loader::Create(dataset, SixteenAThread());
    ASSERT_TRUE(loader.ok());
    {
      // One batch taken and held: the batch read after the next waits.
      auto first = (*loader)->Next();
      ASSERT_TRUE(first.ok() && first->has_value());
      // Odd rounds give that read time to finish (and its batch to wait).
      if (round % 2 == 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      (*loader)->SetEpoch(3);
    }
    const Epoch got = RunKeeping(**loader, 1, 1);
    EXPECT_EQ(got.indices, expected.indices);
    EXPECT_TRUE(got.pixels == expected.pixels);
  }
}

TEST(LoaderBuffers, MovingThePositionWhileABatchIsBeingReadDropsItOnceRead) {
  // The batch read after the next is still being read when SetEpoch drains
  // the loader; read, it has no buffer to decode into (the loop holds one,
  // the next has the other): the drain drops it rather than wait for it.
  TempDir dir;
  MakeDataset(dir);
  testing::FaultFileSystem fs;
  auto opened = Dataset::Open(dir / "out", &fs);
  ASSERT_TRUE(opened.ok()) << opened.error().ToString();
  std::shared_ptr<const Dataset> dataset(std::move(opened).value());
  auto reference = Loader::Create(dataset, SixteenAThread());
  ASSERT_TRUE(reference.ok());
  (*reference)->SetEpoch(3);
  const Epoch expected = RunKeeping(**reference, 1, 0);

  auto loader = Loader::Create(dataset, SixteenAThread());
  ASSERT_TRUE(loader.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // batches 0 and 1 read and decoded
  fs.reads_held = true;
  std::jthread releaser([&fs] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    fs.ReleaseReads();
  });
  auto first = (*loader)->Next();  // schedules batch 2, whose read now waits
  ASSERT_TRUE(first.ok() && first->has_value());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the thread takes that read
  (*loader)->SetEpoch(3);                                      // while batch 2 is being read
  first->reset();
  const Epoch got = RunKeeping(**loader, 1, 1);
  EXPECT_EQ(got.indices, expected.indices);
  EXPECT_TRUE(got.pixels == expected.pixels);
}

TEST(LoaderBuffers, FewSamplesAThreadDecodeAheadAsAsked) {
  // 8 samples for one thread: the threads would idle through too much of
  // each batch's end; every batch in flight decodes at once.
  TempDir dir;
  auto dataset = MakeDataset(dir);
  auto o = SixteenAThread();
  o.batch_size = 8;
  auto loader = Loader::Create(dataset, o);
  ASSERT_TRUE(loader.ok());
  (void)RunKeeping(**loader, 4, 1);
  EXPECT_EQ((*loader)->stats().batch_buffers_touched, 3u);
}

// Page-locking without a GPU: a fake allocator in CUDA's place, counting
// the buffers it pins and those still pinned.
std::atomic<int> pinned_total{0}, pinned_live{0};
void* FakePin(std::size_t bytes) {
  ++pinned_total;
  ++pinned_live;
  return std::aligned_alloc(4096, bytes);  // bytes: whole pages
}
void FakeUnpin(void* p) {
  --pinned_live;
  std::free(p);
}
const PinnedAllocatorForTesting kFakePinning{FakePin, FakeUnpin};

// Pins `o`'s buffers through the fake, runs `epochs` keeping `kept`, and
// returns what it delivered and how many buffers it pinned.
std::pair<Epoch, int> RunPinned(const std::shared_ptr<const Dataset>& dataset, const LoaderOptions& o, int epochs,
                                std::size_t kept, int* pinned_at_creation) {
  pinned_total = 0;
  SetPinnedAllocatorForTesting(&kFakePinning);
  Epoch got;
  {
    auto loader = Loader::Create(dataset, o);
    EXPECT_TRUE(loader.ok());
    if (!loader.ok()) return {got, -1};
    *pinned_at_creation = pinned_total;
    EXPECT_TRUE((*loader)->stats().pinned_memory);
    got = RunKeeping(**loader, epochs, kept);
  }
  SetPinnedAllocatorForTesting(nullptr);
  EXPECT_EQ(pinned_live, 0);  // every buffer unpinned with its loader
  return {got, pinned_total.load()};
}

TEST(LoaderBuffers, APinnedPoolPinsOnlyTheBuffersTheLoopUses) {
  TempDir dir;
  auto dataset = MakeDataset(dir);
  auto reference = Loader::Create(dataset, SixteenAThread());
  ASSERT_TRUE(reference.ok());
  EXPECT_FALSE((*reference)->stats().pinned_memory);
  const Epoch expected = RunKeeping(**reference, 4, 0);
  for (std::size_t kept : {1, 2, 3}) {
    SCOPED_TRACE(fmt::format("keeping {}", kept));
    int at_creation = 0;
    const auto [got, pinned] = RunPinned(dataset, SixteenAThread(), 4, kept, &at_creation);
    EXPECT_EQ(got.indices, expected.indices);
    EXPECT_TRUE(got.pixels == expected.pixels);
    EXPECT_EQ(at_creation, 2);  // of a pool of four (prefetch 2, plus the loop's and the reserve)
    EXPECT_EQ(pinned, static_cast<int>(kept) + 1);
  }
  // An explicit depth decodes ahead into as many buffers: pinned as they are first used.
  auto o = SixteenAThread();
  o.prefetch = 3;
  int at_creation = 0;
  const auto [got, pinned] = RunPinned(dataset, o, 4, 1, &at_creation);
  EXPECT_EQ(got.indices, expected.indices);
  // Two at creation; a third batch read before the caller looks may have pinned another (a slow
  // build's threads: CI's ThreadSanitizer run saw 3).
  EXPECT_GE(at_creation, 2);
  EXPECT_LE(at_creation, 4);
  EXPECT_EQ(pinned, 4);
}

}  // namespace
}  // namespace stoker
