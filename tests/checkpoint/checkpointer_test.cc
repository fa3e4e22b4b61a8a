#include "stoker/checkpoint.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "checkpoint/interval.h"
#include "fault_file_system.h"
#include "stoker/device.h"
#include "test_util.h"

namespace stoker {
namespace {

using testing::TempDir;

// A state whose every element encodes the step, so a loaded checkpoint can be
// checked for being exactly one step's state.
struct State {
  std::vector<float> weights;
  std::vector<std::int64_t> counters;
  std::vector<std::uint16_t> half;
  std::vector<std::uint8_t> f8;

  explicit State(std::int64_t step, std::size_t n = 1000)
      : weights(n, static_cast<float>(step)),
        counters(7, step),
        half(n / 2, static_cast<std::uint16_t>(step)),
        f8(33, static_cast<std::uint8_t>(step)) {}

  std::vector<TensorRef> Refs() const {
    return {{"model.weights", TensorDType::kFloat32, {weights.size() / 10, 10}, weights.data()},
            {"optimizer.counters", TensorDType::kInt64, {counters.size()}, counters.data()},
            {"model.half", TensorDType::kBFloat16, {half.size()}, half.data()},
            {"model.f8", TensorDType::kFloat8E4M3, {3, 11}, f8.data()},
            {"empty", TensorDType::kFloat32, {0, 4}, nullptr}};
  }
};

const LoadedTensor* Find(const LoadedCheckpoint& c, const std::string& name) {
  for (const auto& t : c.tensors)
    if (t.name == name) return &t;
  return nullptr;
}

// Checks that `c` is exactly State(c.step).
void ExpectStateOfItsStep(const LoadedCheckpoint& c, std::size_t n = 1000) {
  const State expected(c.step, n);
  const auto* w = Find(c, "model.weights");
  ASSERT_NE(w, nullptr);
  ASSERT_EQ(w->data.size(), n * 4);
  EXPECT_EQ(std::memcmp(w->data.data(), expected.weights.data(), w->data.size()), 0) << c.path;
  EXPECT_EQ(w->shape, (std::vector<std::uint64_t>{n / 10, 10}));
  const auto* k = Find(c, "optimizer.counters");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(std::memcmp(k->data.data(), expected.counters.data(), k->data.size()), 0);
  const auto* h = Find(c, "model.half");
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->dtype, TensorDType::kBFloat16);
  EXPECT_EQ(std::memcmp(h->data.data(), expected.half.data(), h->data.size()), 0);
  const auto* f = Find(c, "model.f8");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->dtype, TensorDType::kFloat8E4M3);
  EXPECT_EQ(std::memcmp(f->data.data(), expected.f8.data(), f->data.size()), 0);
  const auto* e = Find(c, "empty");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->data.size(), 0u);
}

CheckpointOptions Options(const std::string& dir) {
  CheckpointOptions o;
  o.directory = dir;
  return o;
}

std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(Checkpointer, SavesPublishesAndLoadsBack) {
  TempDir dir;
  auto ck = Checkpointer::Open(Options(dir.path()));
  ASSERT_TRUE(ck.ok()) << ck.error().ToString();
  State state(42);
  CheckpointExtras extras;
  extras.loader_state = LoaderState{7, 3, 256, 11, 5000};
  extras.rng_states["torch"] = "AAEC";
  extras.metadata["run"] = "unit";
  extras.metric = 0.25;
  extras.user_json = R"({"tree":[1,2,{"k":"v"}]})";
  auto refs = state.Refs();
  auto outcome = (*ck)->Save(42, refs, extras);
  ASSERT_TRUE(outcome.ok()) << outcome.error().ToString();
  EXPECT_EQ(*outcome, SaveOutcome::kStarted);
  state.weights.assign(state.weights.size(), -1.0f);  // training goes on: the snapshot must not see this
  ASSERT_TRUE((*ck)->Wait().ok());

  EXPECT_EQ(testing::ReadFile(dir / "latest"), "step-42\n");
  EXPECT_EQ(Entries(dir / "step-42"), (std::vector<std::string>{"manifest.json", "model.safetensors"}));
  auto loaded = LoadLatestCheckpoint(dir.path());
  ASSERT_TRUE(loaded.ok()) << loaded.error().ToString();
  EXPECT_EQ(loaded->step, 42);
  ExpectStateOfItsStep(*loaded);
  ASSERT_TRUE(loaded->extras.loader_state.has_value());
  EXPECT_EQ(loaded->extras.loader_state->batches_consumed, 11u);
  EXPECT_EQ(loaded->extras.loader_state->num_samples, 5000u);
  EXPECT_EQ(loaded->extras.rng_states.at("torch"), "AAEC");
  EXPECT_EQ(loaded->extras.metadata.at("run"), "unit");
  EXPECT_EQ(loaded->extras.metric, 0.25);
  EXPECT_EQ(loaded->extras.user_json, R"({"tree":[1,2,{"k":"v"}]})");
  // Loaded tensors are private copies on write: changing one leaves the file alone.
  Find(*loaded, "model.weights")->data[0] = std::byte{0xff};
  auto again = LoadCheckpoint(dir / "step-42");
  ASSERT_TRUE(again.ok()) << again.error().ToString();
  ExpectStateOfItsStep(*again);

  auto stats = (*ck)->stats();
  EXPECT_EQ(stats.saves_published, 1u);
  EXPECT_EQ(stats.last_published_step, 42);
  EXPECT_GT(stats.last_persist_seconds, 0);
  EXPECT_EQ(stats.last_bytes, 4000u + 56 + 1000 + 33);
}

TEST(Checkpointer, SplitsLargeStatesAcrossFilesWithAnIndex) {
  TempDir dir;
  auto options = Options(dir.path());
  options.max_file_bytes = 1500;  // int64 first, then weights (4000 B) alone, then bf16 + f8
  auto ck = Checkpointer::Open(options);
  ASSERT_TRUE(ck.ok());
  State state(5);
  ASSERT_TRUE((*ck)->Save(5, state.Refs(), {}).ok());
  ASSERT_TRUE((*ck)->Wait().ok());
  auto names = Entries(dir / "step-5");
  EXPECT_EQ(names, (std::vector<std::string>{"manifest.json", "model-00001-of-00003.safetensors",
                                             "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors",
                                             "model.safetensors.index.json"}));
  const std::string index = testing::ReadFile(dir / "step-5/model.safetensors.index.json");
  EXPECT_NE(index.find(R"("total_size": 5089)"), std::string::npos) << index;
  EXPECT_NE(index.find(R"("model.weights": "model-00002-of-00003.safetensors")"), std::string::npos) << index;
  auto loaded = LoadLatestCheckpoint(dir.path());
  ASSERT_TRUE(loaded.ok()) << loaded.error().ToString();
  ExpectStateOfItsStep(*loaded);
}

// Large tensors are copied with non-temporal stores: every byte arrives,
// whatever the alignment of source and destination and the odd sizes.
TEST(Checkpointer, LargeTensorsAtAnyAlignmentArriveWhole) {
  TempDir dir;
  auto ck = Checkpointer::Open(Options(dir.path()));
  ASSERT_TRUE(ck.ok());
  std::vector<std::uint8_t> bytes(3 * 100'003 + 7);
  std::mt19937 rng(5);
  for (auto& b : bytes) b = static_cast<std::uint8_t>(rng());
  // U8 tensors from odd offsets, odd lengths above the streaming threshold,
  // then one that leaves the next tensor's destination unaligned.
  std::vector<TensorRef> refs = {{"a", TensorDType::kUInt8, {100'003}, bytes.data() + 1},
                                 {"b", TensorDType::kUInt8, {65'537}, bytes.data() + 100'007},
                                 {"c", TensorDType::kUInt8, {3}, bytes.data() + 3},
                                 {"d", TensorDType::kUInt8, {120'001}, bytes.data() + 165'551}};
  ASSERT_TRUE((*ck)->Save(1, refs, {}).ok());
  ASSERT_TRUE((*ck)->Wait().ok());
  auto loaded = LoadLatestCheckpoint(dir.path());
  ASSERT_TRUE(loaded.ok()) << loaded.error().ToString();
  for (const auto& ref : refs) {
    const auto* t = Find(*loaded, ref.name);
    ASSERT_NE(t, nullptr) << ref.name;
    ASSERT_EQ(t->data.size(), ref.shape[0]);
    EXPECT_EQ(std::memcmp(t->data.data(), ref.data, t->data.size()), 0) << ref.name;
  }
  // Above 64 MiB two threads split the copy, here in the middle of a tensor
  // and at an odd offset.
  auto options = Options(dir / "threads");
  options.copy_threads = 2;
  auto two = Checkpointer::Open(options);
  ASSERT_TRUE(two.ok());
  std::vector<std::uint8_t> big((std::size_t{64} << 20) + 9);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<std::uint8_t>(i * 2654435761u >> 13);
  const std::vector<TensorRef> one = {{"big", TensorDType::kUInt8, {big.size() - 2}, big.data() + 1}};
  ASSERT_TRUE((*two)->Save(1, one, {}).ok());
  ASSERT_TRUE((*two)->Wait().ok());
  auto again = LoadLatestCheckpoint(dir / "threads");
  ASSERT_TRUE(again.ok()) << again.error().ToString();
  ASSERT_EQ(again->tensors.size(), 1u);
  ASSERT_EQ(again->tensors[0].data.size(), big.size() - 2);
  EXPECT_EQ(std::memcmp(again->tensors[0].data.data(), big.data() + 1, big.size() - 2), 0);
}

TEST(Checkpointer, RefusesBadTensorsWithClearErrors) {
  TempDir dir;
  auto ck = Checkpointer::Open(Options(dir.path()));
  ASSERT_TRUE(ck.ok());
  float x = 1;
  std::vector<TensorRef> dup = {{"a", TensorDType::kFloat32, {1}, &x}, {"a", TensorDType::kFloat32, {1}, &x}};
  auto r = (*ck)->Save(1, dup, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("duplicate tensor name 'a'"), std::string::npos);
  std::vector<TensorRef> null = {{"n", TensorDType::kFloat32, {4}, nullptr}};
  EXPECT_FALSE((*ck)->Save(1, null, {}).ok());
  EXPECT_FALSE((*ck)->Save(-1, {}, {}).ok());
  // Nothing was started, so nothing is in flight and nothing was written.
  EXPECT_TRUE((*ck)->Wait().ok());
  EXPECT_FALSE(std::filesystem::exists(dir / "latest"));
  // Invalid user JSON is found by the persist, off the training thread: it
  // fails that checkpoint and publishes nothing.
  CheckpointExtras bad_json;
  bad_json.user_json = "{";
  ASSERT_TRUE((*ck)->Save(1, {}, bad_json).ok());
  const Status failed = (*ck)->Wait();
  EXPECT_EQ(failed.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(failed.message().find("user_json is not valid JSON"), std::string::npos) << failed.ToString();
  EXPECT_FALSE(std::filesystem::exists(dir / "latest"));
  EXPECT_FALSE(std::filesystem::exists(dir / "step-1"));
  EXPECT_TRUE((*ck)->Save(2, {}, {}).ok());
  EXPECT_TRUE((*ck)->Wait().ok());
  EXPECT_TRUE(std::filesystem::exists(dir / "step-2"));
}

TEST(Checkpointer, KeepsTheLastNAndTheBestKAndNeverTheNewestDeleted) {
  TempDir dir;
  auto options = Options(dir.path());
  options.keep_last = 2;
  options.keep_best = 1;
  options.higher_metric_is_better = false;  // a loss
  auto ck = Checkpointer::Open(options);
  ASSERT_TRUE(ck.ok());
  const std::vector<double> loss = {5, 1, 4, 3, 2, 6};
  for (std::int64_t step = 0; step < 6; ++step) {
    State state(step, 10);
    CheckpointExtras extras;
    extras.metric = loss[step];
    ASSERT_TRUE((*ck)->Save(step, state.Refs(), extras).ok());
    ASSERT_TRUE((*ck)->Wait().ok());
  }
  auto list = ListCheckpoints(dir.path());
  ASSERT_TRUE(list.ok());
  std::vector<std::int64_t> steps;
  for (const auto& c : *list) steps.push_back(c.step);
  EXPECT_EQ(steps, (std::vector<std::int64_t>{1, 4, 5}));  // best (loss 1), then the last two
  for (const auto& name : Entries(dir.path())) EXPECT_FALSE(name.starts_with(".tmp-")) << name;
}

TEST(Checkpointer, SkipPolicyCountsSavesThatFindAPersistInFlight) {
  TempDir dir;
  auto options = Options(dir.path());
  options.when_busy = WhenBusy::kSkip;
  auto ck = Checkpointer::Open(options);
  ASSERT_TRUE(ck.ok());
  State big(1, 4 << 20);  // 16 MiB of weights: the persist (with fsync) outlasts the next call
  int skipped = 0;
  for (int i = 0; i < 5; ++i) {
    auto r = (*ck)->Save(1 + i, big.Refs(), {});
    ASSERT_TRUE(r.ok());
    skipped += *r == SaveOutcome::kSkippedBusy;
  }
  ASSERT_TRUE((*ck)->Wait().ok());
  const auto stats = (*ck)->stats();
  EXPECT_GE(skipped, 1);
  EXPECT_EQ(stats.skipped_busy, static_cast<std::uint64_t>(skipped));
  EXPECT_EQ(stats.saves_published + stats.skipped_busy, 5u);
}

TEST(Checkpointer, WaitPolicyWaitsAndSavesEveryCall) {
  TempDir dir;
  auto options = Options(dir.path());
  options.keep_last = 0;  // keep all
  auto ck = Checkpointer::Open(options);
  ASSERT_TRUE(ck.ok());
  State big(1, 4 << 20);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*ck)->Save(i, big.Refs(), {}).ok());
  ASSERT_TRUE((*ck)->Wait().ok());
  EXPECT_EQ((*ck)->stats().saves_published, 3u);
  EXPECT_EQ(ListCheckpoints(dir.path())->size(), 3u);
}

TEST(Checkpointer, DiskFullFailsThatSaveKeepsThePreviousAndReportsOnce) {
  TempDir dir;
  testing::FaultFileSystem fs;
  auto options = Options(dir.path());
  options.file_system = &fs;
  auto ck = Checkpointer::Open(options);
  ASSERT_TRUE(ck.ok());
  State one(1);
  ASSERT_TRUE((*ck)->Save(1, one.Refs(), {}).ok());
  ASSERT_TRUE((*ck)->Wait().ok());
  fs.disk_full_for_path_part = ".safetensors";
  State two(2);
  ASSERT_TRUE((*ck)->Save(2, two.Refs(), {}).ok());  // the snapshot succeeds; the persist fails later
  Status failed = (*ck)->Wait();
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(failed.message().find("checkpoint step 2 was not saved"), std::string::npos) << failed.ToString();
  EXPECT_TRUE((*ck)->Wait().ok());  // reported once
  EXPECT_EQ(Entries(dir.path()), (std::vector<std::string>{".lock", "latest", "step-1"}));
  auto loaded = LoadLatestCheckpoint(dir.path());
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(loaded->step, 1);
  EXPECT_EQ((*ck)->stats().saves_failed, 1u);

  // A failure not yet collected by Wait() is returned by the next Save().
  ASSERT_TRUE((*ck)->Save(3, two.Refs(), {}).ok());
  while ((*ck)->stats().saves_failed < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto next = (*ck)->Save(4, two.Refs(), {});
  ASSERT_FALSE(next.ok());
  EXPECT_NE(next.error().message().find("step 3"), std::string::npos);
  fs.disk_full_for_path_part.clear();
  ASSERT_TRUE((*ck)->Save(4, two.Refs(), {}).ok());
  ASSERT_TRUE((*ck)->Wait().ok());
  EXPECT_EQ(LoadLatestCheckpoint(dir.path())->step, 4);
}

TEST(Checkpointer, OneWriterPerDirectoryAndLeftoversAreCleanedOnOpen) {
  TempDir dir;
  testing::WriteFile(dir / ".tmp-step-9-123-0/model.safetensors", "partial");
  testing::WriteFile(dir / "latest.tmp", "step-");
  {
    auto ck = Checkpointer::Open(Options(dir.path()));
    ASSERT_TRUE(ck.ok());
    EXPECT_EQ(Entries(dir.path()), (std::vector<std::string>{".lock"}));
    // flock conflicts between open file descriptions, so a second open in
    // this process stands in for a second process.
    auto second = Checkpointer::Open(Options(dir.path()));
    ASSERT_FALSE(second.ok());
    EXPECT_EQ(second.error().code(), StatusCode::kUnavailable);
    EXPECT_NE(second.error().message().find("another process"), std::string::npos);
  }
  EXPECT_TRUE(Checkpointer::Open(Options(dir.path())).ok());  // released with the first
}

TEST(Checkpointer, CorruptNewestIsNamedAndCanBeSkipped) {
  TempDir dir;
  {
    auto options = Options(dir.path());
    options.keep_last = 0;
    auto ck = Checkpointer::Open(options);
    ASSERT_TRUE(ck.ok());
    for (std::int64_t step : {10, 20}) {
      State s(step);
      ASSERT_TRUE((*ck)->Save(step, s.Refs(), {}).ok());
      ASSERT_TRUE((*ck)->Wait().ok());
    }
  }
  const std::string file = dir / "step-20/model.safetensors";
  std::string bytes = testing::ReadFile(file);
  bytes[bytes.size() - 100] ^= 0x01;  // one flipped bit in the data
  testing::WriteFile(file, bytes);

  auto strict = LoadLatestCheckpoint(dir.path());
  ASSERT_FALSE(strict.ok());
  EXPECT_EQ(strict.error().code(), StatusCode::kCorruption);
  EXPECT_NE(strict.error().message().find("step-20/model.safetensors' fails its xxh3 checksum"), std::string::npos)
      << strict.error().message();
  EXPECT_NE(strict.error().message().find("skip_corrupt"), std::string::npos);

  LoadOptions skip;
  skip.skip_corrupt = true;
  auto fallback = LoadLatestCheckpoint(dir.path(), skip);
  ASSERT_TRUE(fallback.ok()) << fallback.error().ToString();
  EXPECT_EQ(fallback->step, 10);
  ExpectStateOfItsStep(*fallback);
  ASSERT_EQ(fallback->skipped.size(), 1u);
  EXPECT_NE(fallback->skipped[0].find("step-20"), std::string::npos);

  // Truncation and a missing file are named too.
  testing::WriteFile(file, bytes.substr(0, 100));
  auto truncated = LoadCheckpoint(dir / "step-20");
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.error().message().find("truncated or replaced"), std::string::npos);
  std::filesystem::remove(file);
  auto missing = LoadCheckpoint(dir / "step-20");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message().find("missing 'model.safetensors'"), std::string::npos);
  EXPECT_EQ(LoadLatestCheckpoint(dir / "nothing-here").error().code(), StatusCode::kNotFound);
}

TEST(IntervalPolicy, StepsSecondsAndYoungDaly) {
  IntervalPolicy steps(IntervalMode::kSteps, 100, 0, 1, 0);
  EXPECT_TRUE(steps.Due(0, 0));
  EXPECT_FALSE(steps.Due(50, 0));
  EXPECT_TRUE(steps.Due(200, 0));
  steps.OnSaveStarted(200, 0);
  EXPECT_FALSE(steps.Due(200, 0));  // not twice for one step

  IntervalPolicy seconds(IntervalMode::kSeconds, 1, 60, 1, 0);
  EXPECT_FALSE(seconds.Due(1, 59));
  EXPECT_TRUE(seconds.Due(2, 60));
  seconds.OnSaveStarted(2, 60);
  EXPECT_FALSE(seconds.Due(3, 100));
  EXPECT_TRUE(seconds.Due(4, 121));

  // Auto: 0.5 s of stall and a one-day MTBF: T = sqrt(2 * 0.5 * 86400) = 293.9 s.
  IntervalPolicy automatic(IntervalMode::kAuto, 1, 600, 86400, 0);
  EXPECT_DOUBLE_EQ(automatic.interval_seconds(), 600);  // nothing measured yet
  automatic.OnSaveStarted(0, 0);
  automatic.OnCostMeasured(0.5, 20);
  EXPECT_NEAR(automatic.interval_seconds(), 293.94, 0.01);
  EXPECT_NEAR(automatic.expected_overhead(), 0.5 / 293.94 + (293.94 / 2 + 20) / 86400, 1e-6);
  EXPECT_FALSE(automatic.Due(1, 290));
  EXPECT_TRUE(automatic.Due(1, 294));
  // A persist slower than Young/Daly's interval bounds it from below.
  IntervalPolicy slow(IntervalMode::kAuto, 1, 600, 100, 0);
  slow.OnCostMeasured(0.01, 30);
  EXPECT_DOUBLE_EQ(slow.interval_seconds(), 30);
}

// Kills a process that saves checkpoints in a loop with SIGKILL at random
// moments, many times; after every kill the newest checkpoint must load
// intact (exactly some step's state) and the next Open must clean up.
TEST(Checkpointer, SurvivesSigkillAtRandomMomentsDuringPersist) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer does not support threads started in a forked child; runs in the other builds";
#endif
  TempDir dir;
  std::mt19937 rng(20261129);
  constexpr std::size_t kElements = 1'000'000;  // 4 MB of weights, split across files
  int iterations = 0, loaded_newer = 0, killed_mid_persist = 0;
  std::int64_t last_step = -1;
  for (; iterations < 40; ++iterations) {
    int ready[2];
    ASSERT_EQ(::pipe(ready), 0);
    pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ::close(ready[0]);
      auto options = Options(dir.path());
      options.keep_last = 2;
      options.max_file_bytes = 3 << 20;
      auto ck = Checkpointer::Open(options);
      if (!ck.ok()) ::_exit(2);
      // Start the parent's clock only now, so slow builds still get kills during persists.
      if (::write(ready[1], "r", 1) != 1) ::_exit(4);
      auto latest = LoadLatestCheckpoint(dir.path(), {.verify_checksums = false});
      std::int64_t step = latest.ok() ? latest->step + 1 : 0;
      for (bool first = true;; ++step, first = false) {
        State state(step, kElements);
        if (!(*ck)->Save(step, state.Refs(), {}).ok() || !(*ck)->Wait().ok()) ::_exit(3);
        if (first && ::write(ready[1], "s", 1) != 1) ::_exit(4);  // a save is done: the parent's measure
      }
    }
    ::close(ready[1]);
    char byte = 0;
    ASSERT_EQ(::read(ready[0], &byte, 1), 1) << "the saving process died before it started";
    // Half the kills come at a random moment from the start (opening, loading, the first persist); the
    // other half at a random moment after the first save, within twice the time that save took, so that
    // they land in later persists however slow this build or machine is (sanitizers, a loaded CI).
    const auto started = std::chrono::steady_clock::now();
    if (iterations % 2 == 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(std::uniform_int_distribution<int>(2000, 60000)(rng)));
    } else {
      ASSERT_EQ(::read(ready[0], &byte, 1), 1) << "the saving process died before its first save";
      const auto save_us =
          std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - started).count();
      std::this_thread::sleep_for(std::chrono::microseconds(
          std::uniform_int_distribution<std::int64_t>(0, std::max<std::int64_t>(2 * save_us, 1000))(rng)));
    }
    ::close(ready[0]);
    ::kill(child, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the saver exited by itself with " << WEXITSTATUS(status);
    for (const auto& name : Entries(dir.path())) killed_mid_persist += name.starts_with(".tmp-step-");

    auto loaded = LoadLatestCheckpoint(dir.path());
    if (!loaded.ok()) {
      ASSERT_EQ(loaded.error().code(), StatusCode::kNotFound) << loaded.error().ToString();
      ASSERT_EQ(last_step, -1) << "a published checkpoint disappeared";
      continue;
    }
    ASSERT_GE(loaded->step, last_step) << "went back in time";
    loaded_newer += loaded->step > last_step;
    last_step = loaded->step;
    ExpectStateOfItsStep(*loaded, kElements);
  }
  std::printf("%d kills: %d during a persist, %d found a newer checkpoint, newest step %lld\n", iterations,
              killed_mid_persist, loaded_newer, static_cast<long long>(last_step));
  // Temporaries of the last kill are removed by the next writer.
  ASSERT_TRUE(Checkpointer::Open(Options(dir.path())).ok());
  for (const auto& name : Entries(dir.path())) EXPECT_FALSE(name.starts_with(".tmp-")) << name;
  EXPECT_GE(loaded_newer, 5) << "the kills rarely let a checkpoint complete; the test is not exercising much";
  EXPECT_GE(killed_mid_persist, 5) << "the kills rarely landed during a persist";
}

}  // namespace
}  // namespace stoker

#include "../device/fake_runtime.h"
#include "checkpoint/checkpointer_internal.h"

namespace stoker {
namespace {

TEST(Checkpointer, SnapshotsDeviceTensorsWithAsynchronousCopies) {
  TempDir dir;
  testing::FakeDeviceRuntime fake;
  auto options = Options(dir.path());
  auto ck = checkpoint::OpenCheckpointer(options, {&fake, nullptr});
  ASSERT_TRUE(ck.ok());
  std::vector<float> host_values(1000, 3.5f);
  auto device_memory = fake.DeviceAlloc(host_values.size() * 4);
  ASSERT_TRUE(device_memory.ok());
  std::memcpy(*device_memory, host_values.data(), host_values.size() * 4);
  std::vector<std::int64_t> on_host = {1, 2, 3};
  fake.current_device = 3;  // the caller's; Save must put it back
  std::vector<TensorRef> refs = {{"gpu.w", TensorDType::kFloat32, {10, 100}, *device_memory, 0},
                                 {"cpu.step", TensorDType::kInt64, {3}, on_host.data(), -1}};
  ASSERT_TRUE((*ck)->Save(9, refs, {}).ok());
  EXPECT_EQ(fake.current_device, 3);
  std::memset(*device_memory, 0, host_values.size() * 4);  // the device tensor changes after Save returned
  ASSERT_TRUE((*ck)->Wait().ok());
  // One asynchronous device-to-host copy on a stream, then the host waited for that stream.
  ASSERT_GE(fake.log.size(), 2u);
  EXPECT_TRUE(fake.log[0].starts_with("copy 4000 bytes to host on stream")) << fake.log[0];
  EXPECT_TRUE(fake.log[1].starts_with("host waits for stream")) << fake.log[1];
  auto loaded = LoadLatestCheckpoint(dir.path());
  ASSERT_TRUE(loaded.ok()) << loaded.error().ToString();
  const auto* w = Find(*loaded, "gpu.w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(std::memcmp(w->data.data(), host_values.data(), 4000), 0);
  EXPECT_EQ(std::memcmp(Find(*loaded, "cpu.step")->data.data(), on_host.data(), 24), 0);
  fake.DeviceFree(*device_memory);
}

TEST(Checkpointer, DeviceTensorsWithoutCudaAreRefusedWithAReason) {
  if (QueryCuda().device_count > 0) GTEST_SKIP() << "this machine has a GPU";
  TempDir dir;
  auto ck = Checkpointer::Open(Options(dir.path()));
  ASSERT_TRUE(ck.ok());
  float x = 0;
  std::vector<TensorRef> refs = {{"w", TensorDType::kFloat32, {1}, &x, 0}};
  auto r = (*ck)->Save(1, refs, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.error().message().find("tensor 'w' is on cuda:0 but CUDA is not usable here"), std::string::npos)
      << r.error().message();
}

}  // namespace
}  // namespace stoker
