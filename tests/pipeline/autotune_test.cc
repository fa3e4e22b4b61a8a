// The autotuner's rules on synthetic windows, and a Loader tuning itself:
// within its budgets, and its batches unchanged by the threads it moves.
#include "pipeline/autotune.h"

#include <gtest/gtest.h>

#include "pipeline/loader_test_util.h"

namespace stoker {
namespace {

using pipeline::AutotuneLimits;
using pipeline::Autotuner;

// Feeds one window of `batches` batches, each `wall` seconds long with
// `wait` of it waiting and `busy` seconds of worker time; the last change.
std::optional<Autotuner::Change> Window(Autotuner& t, double wall, double wait, double busy,
                                        std::uint32_t batches = 8) {
  std::optional<Autotuner::Change> last;
  for (std::uint32_t i = 0; i < batches; ++i)
    if (auto c = t.Observe(wall, wait, busy)) last = c;
  return last;
}

TEST(Autotuner, AddsThreadsThenPrefetchWhileTheConsumerWaitsAndSaysWhenTheBudgetIsReached) {
  Autotuner t({.max_threads = 3, .max_prefetch = 4}, 1, 2);
  EXPECT_FALSE(Window(t, 0.01, 0.005, 0.01));  // warm-up window decides nothing
  EXPECT_EQ(Window(t, 0.01, 0.005, 0.01)->threads, 2u);
  EXPECT_EQ(Window(t, 0.01, 0.005, 0.01)->threads, 3u);
  auto c = Window(t, 0.01, 0.005, 0.01);
  EXPECT_EQ(c->threads, 3u);  // at the CPU budget
  EXPECT_EQ(c->prefetch, 3u);
  EXPECT_EQ(Window(t, 0.01, 0.005, 0.01)->prefetch, 4u);
  EXPECT_FALSE(Window(t, 0.01, 0.005, 0.01));  // at both budgets: nothing more to give
  EXPECT_FALSE(Window(t, 0.01, 0.005, 0.01));
  ASSERT_EQ(t.log().size(), 5u);
  EXPECT_NE(t.log().back().find("cannot keep up"), std::string::npos) << t.log().back();
  EXPECT_EQ(t.changes(), 4u);
  EXPECT_NE(t.log().front().find("threads 1 -> 2"), std::string::npos) << t.log().front();
}

TEST(Autotuner, SaturatedWorkersGetNoDeeperPrefetch) {
  Autotuner t({.max_threads = 2, .max_prefetch = 8}, 2, 2);
  Window(t, 0.01, 0.005, 0.02);                  // warm-up
  EXPECT_FALSE(Window(t, 0.01, 0.005, 0.0195));  // both threads 97% busy: more prefetch would not help
  EXPECT_EQ(t.prefetch(), 2u);
  ASSERT_EQ(t.log().size(), 1u);
  EXPECT_NE(t.log()[0].find("cannot keep up"), std::string::npos);
}

TEST(Autotuner, AWaitUnderTheTargetChangesNothing) {
  Autotuner t({.max_threads = 8, .max_prefetch = 8}, 4, 2);
  for (int i = 0; i < 20; ++i) EXPECT_FALSE(Window(t, 0.01, 0.0001, 0.03));  // 1% wait, workers 75% busy
  EXPECT_EQ(t.threads(), 4u);
  EXPECT_TRUE(t.log().empty());
}

TEST(Autotuner, FreesThreadsItDoesNotNeedAndStopsLoweringWhenThatBringsTheWaitBack) {
  Autotuner t({.max_threads = 8, .max_prefetch = 8}, 6, 2);
  Window(t, 0.01, 0, 0.01);  // warm-up
  // No wait, workers a sixth busy: three calm windows, then one thread fewer, again and again.
  EXPECT_FALSE(Window(t, 0.01, 0, 0.01));
  EXPECT_FALSE(Window(t, 0.01, 0, 0.01));
  EXPECT_EQ(Window(t, 0.01, 0, 0.01)->threads, 5u);  // the third calm window lowers
  for (int i = 0; i < 3; ++i) Window(t, 0.01, 0, 0.01);
  EXPECT_EQ(t.threads(), 4u);
  // That went too far: the wait comes back, the thread returns, and the tuner never lowers again.
  EXPECT_EQ(Window(t, 0.01, 0.002, 0.04)->threads, 5u);
  for (int i = 0; i < 12; ++i) Window(t, 0.01, 0, 0.01);
  EXPECT_EQ(t.threads(), 5u);
}

TEST(Autotuner, KeepsItsLogBounded) {
  Autotuner t({.max_threads = 1000, .max_prefetch = 2, .window_batches = 1}, 1, 2);
  for (int i = 0; i < 500; ++i) (void)t.Observe(0.01, 0.005, 0.01);
  EXPECT_EQ(t.log().size(), 64u);
  EXPECT_EQ(t.threads(), 500u);
}

TEST(LoaderAutotune, StaysWithinItsBudgetsAndItsBatchesDoNotDependOnTheThreads) {
  TempDir dir;
  auto dataset = MakeDataset(dir);
  auto options = SmallOptions();
  options.batch_size = 2;
  auto fixed = Loader::Create(dataset, options);
  ASSERT_TRUE(fixed.ok());
  Epoch expected = RunEpoch(**fixed);
  Epoch expected2 = RunEpoch(**fixed);

  options.autotune = true;
  options.autotune_max_threads = 3;
  auto tuned = Loader::Create(dataset, options);
  ASSERT_TRUE(tuned.ok()) << tuned.error().ToString();
  EXPECT_EQ((*tuned)->stats().threads, 1u);  // it starts from one thread
  // A consumer that never waits on anything but the loader: the tuner adds threads.
  Epoch got = RunEpoch(**tuned);
  Epoch got2 = RunEpoch(**tuned);
  EXPECT_EQ(got.indices, expected.indices);
  EXPECT_EQ(got.pixels, expected.pixels);
  EXPECT_EQ(got2.pixels, expected2.pixels);
  const LoaderStats s = (*tuned)->stats();
  EXPECT_TRUE(s.autotune);
  EXPECT_LE(s.threads, 3u);
  EXPECT_GE(s.threads, 1u);
  for (const auto& line : (*tuned)->AutotuneLog()) std::printf("autotune: %s\n", line.c_str());
  EXPECT_EQ((*tuned)->AutotuneLog().size() >= s.autotune_changes, true);
}

TEST(LoaderAutotune, TheMemoryBudgetBoundsTheBuffers) {
  TempDir dir;
  auto dataset = MakeDataset(dir);
  auto options = SmallOptions();
  options.autotune = true;
  const std::uint64_t buffer = 4ull * 32 * 32 * 3 * 4;  // a batch of 4 float32 32x32 images
  options.autotune_memory_bytes = 5 * buffer + 100;     // 5 buffers: prefetch at most 3
  options.prefetch = 8;
  auto tuned = Loader::Create(dataset, options);
  ASSERT_TRUE(tuned.ok()) << tuned.error().ToString();
  EXPECT_EQ((*tuned)->stats().prefetch, 3u);  // asked for 8: the budget's most
  EXPECT_LE((*tuned)->batch_buffer_bytes() * ((*tuned)->stats().prefetch + 2), options.autotune_memory_bytes);
  options.autotune_memory_bytes = 2 * buffer;
  auto refused = Loader::Create(dataset, options);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message().find("autotune_memory_bytes"), std::string::npos) << refused.error().message();
}

}  // namespace
}  // namespace stoker
