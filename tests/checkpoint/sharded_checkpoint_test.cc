// Sharded checkpoints: three ranks in one process (each its own
// Checkpointer on one directory), their commit, and reads of any layout.
#include "stoker/sharded_checkpoint.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <thread>

#include <gtest/gtest.h>

#include "fault_file_system.h"
#include "test_util.h"

namespace stoker {
namespace {

using testing::TempDir;

constexpr std::uint32_t kWorld = 3;
// The global tensors: "w" [6, 500] float (rows sharded 2 per rank), "b"
// [700] int64, replicated, written by rank 1 only, and "s" a scalar.
constexpr std::uint64_t kRows = 6, kCols = 500;

float W(std::uint64_t r, std::uint64_t c, std::int64_t step) {
  return static_cast<float>(step * 100000 + r * kCols + c);
}

struct RankState {
  std::vector<float> w;  // this rank's rows
  std::vector<std::int64_t> b;
  double s = 0;
  RankState(std::uint32_t rank, std::int64_t step) : w(2 * kCols), b(700) {
    for (std::uint64_t r = 0; r < 2; ++r)
      for (std::uint64_t c = 0; c < kCols; ++c) w[r * kCols + c] = W(2 * rank + r, c, step);
    std::iota(b.begin(), b.end(), step);
    s = static_cast<double>(step) + 0.5;
  }
  std::vector<TensorRef> Refs(std::uint32_t rank) const {
    std::vector<TensorRef> refs;
    refs.push_back({"w", TensorDType::kFloat32, {2, kCols}, w.data(), -1, {kRows, kCols}, {2 * rank, 0}});
    if (rank == 1) refs.push_back({"b", TensorDType::kInt64, {700}, b.data()});
    if (rank == 2) refs.push_back({"s", TensorDType::kFloat64, {}, &s});
    return refs;
  }
};

CheckpointOptions Options(const std::string& dir, std::uint32_t rank, FileSystem* fs = nullptr) {
  CheckpointOptions o;
  o.directory = dir;
  o.rank = rank;
  o.world_size = kWorld;
  o.keep_last = 0;
  o.commit_timeout_seconds = 20;
  o.file_system = fs;
  return o;
}

struct Ranks {
  std::vector<std::unique_ptr<Checkpointer>> ckpt;
  explicit Ranks(const std::string& dir, double timeout = 20, FileSystem* fs_of_rank2 = nullptr) {
    for (std::uint32_t r = 0; r < kWorld; ++r) {
      auto o = Options(dir, r, r == 2 ? fs_of_rank2 : nullptr);
      o.commit_timeout_seconds = timeout;
      auto c = Checkpointer::Open(o);
      EXPECT_TRUE(c.ok()) << c.error().ToString();
      ckpt.push_back(std::move(*c));
    }
  }
  // Every rank saves `step` (all ranks unless `skip_rank`), then waits.
  std::vector<Status> Save(std::int64_t step, const std::string& id, int skip_rank = -1) {
    std::vector<Status> out(kWorld);
    std::vector<std::thread> threads;
    for (std::uint32_t r = 0; r < kWorld; ++r) {
      if (static_cast<int>(r) == skip_rank) continue;
      threads.emplace_back([&, r] {
        RankState state(r, step);
        const auto refs = state.Refs(r);
        CheckpointExtras extras;
        extras.metadata["rank"] = std::to_string(r);
        extras.loader_state = LoaderState{.seed = 7, .epoch = 1, .global_batch_size = 12, .batches_consumed = r};
        auto saved = ckpt[r]->Save(step, refs, extras, id);
        if (!saved.ok()) {
          out[r] = saved.error();
          return;
        }
        out[r] = ckpt[r]->Wait();
      });
    }
    for (auto& t : threads) t.join();
    return out;
  }
};

std::vector<float> ReadW(ShardedCheckpoint& c, std::vector<std::uint64_t> offsets, std::vector<std::uint64_t> shape,
                         Status* status = nullptr) {
  std::vector<float> out(shape[0] * shape[1]);
  const RegionRequest request{"w", offsets, shape, std::as_writable_bytes(std::span(out))};
  Status s = c.ReadRegions(std::span(&request, 1));
  if (status)
    *status = s;
  else
    EXPECT_TRUE(s.ok()) << s.ToString();
  return out;
}

TEST(ShardedCheckpoint, ThreeRanksCommitOnceAndAnyLayoutReadsBack) {
  TempDir dir;
  Ranks ranks(dir.path());
  for (const auto& s : ranks.Save(10, "save-a")) ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(std::filesystem::exists(dir / "step-10/manifest.json"));
  EXPECT_EQ(testing::ReadFile(dir / "latest"), "step-10\n");
  // Each rank wrote only its own files; nothing is left in temporaries.
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    EXPECT_FALSE(e.path().filename().string().starts_with(".tmp-")) << e.path();
  EXPECT_TRUE(std::filesystem::exists(dir / "step-10/rank-00001.safetensors"));
  // Replicated "b" was written once: rank 0's file holds only its piece of "w".
  EXPECT_LT(std::filesystem::file_size(dir / "step-10/rank-00000.safetensors"), 2 * kCols * 4 + 1024);

  auto opened = ShardedCheckpoint::Open(dir / "step-10");
  ASSERT_TRUE(opened.ok()) << opened.error().ToString();
  ShardedCheckpoint& c = **opened;
  ASSERT_TRUE(c.VerifyFiles().ok());
  EXPECT_EQ(c.step(), 10);
  EXPECT_EQ(c.world_size(), kWorld);
  ASSERT_EQ(c.tensors().size(), 3u);
  ASSERT_NE(c.Find("w"), nullptr);
  EXPECT_EQ(c.Find("w")->pieces.size(), 3u);
  // The whole of "w", and a column block spanning all three ranks' pieces
  // (a new layout sharded along the other dimension).
  const auto whole = ReadW(c, {}, {kRows, kCols});
  for (std::uint64_t r = 0; r < kRows; ++r)
    for (std::uint64_t col = 0; col < kCols; ++col) ASSERT_EQ(whole[r * kCols + col], W(r, col, 10));
  const auto cols = ReadW(c, {1, 123}, {4, 77});
  for (std::uint64_t r = 0; r < 4; ++r)
    for (std::uint64_t col = 0; col < 77; ++col) ASSERT_EQ(cols[r * 77 + col], W(1 + r, 123 + col, 10));
  std::vector<std::int64_t> b(700);
  double s = 0;
  const RegionRequest more[] = {{"b", {}, {}, std::as_writable_bytes(std::span(b))},
                                {"s", {}, {}, std::as_writable_bytes(std::span(&s, 1))}};
  ASSERT_TRUE(c.ReadRegions(more, 2).ok());
  EXPECT_EQ(b[0], 10);
  EXPECT_EQ(b[699], 709);
  EXPECT_EQ(s, 10.5);
  auto extras = c.RankExtras(2);
  ASSERT_TRUE(extras.ok()) << extras.error().ToString();
  EXPECT_EQ(extras->metadata.at("rank"), "2");
  EXPECT_EQ(extras->loader_state->batches_consumed, 2u);

  // A plain load says what this is; listing and retention see it.
  auto plain = LoadCheckpoint(dir / "step-10");
  ASSERT_FALSE(plain.ok());
  EXPECT_EQ(plain.error().code(), StatusCode::kFailedPrecondition);
  auto listed = ListCheckpoints(dir.path());
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].step, 10);
}

TEST(ShardedCheckpoint, ReadsOnlyTheBlocksASliceNeeds) {
  TempDir dir;
  // One rank of two writes a 12 MiB piece; reading 1 KiB of it reads one
  // 4 MiB block, not the file.
  std::vector<float> big(3 << 20);
  std::iota(big.begin(), big.end(), 0.0f);
  std::vector<float> other(3 << 20, -1.0f);
  std::vector<std::unique_ptr<Checkpointer>> ck;
  for (std::uint32_t r = 0; r < 2; ++r) {
    CheckpointOptions ro = Options(dir.path(), r);
    ro.world_size = 2;
    ck.push_back(std::move(*Checkpointer::Open(ro)));
  }
  const std::vector<TensorRef> mine = {{"t", TensorDType::kFloat32, {3 << 20}, big.data(), -1, {6 << 20}, {0}}};
  const std::vector<TensorRef> theirs = {
      {"t", TensorDType::kFloat32, {3 << 20}, other.data(), -1, {6 << 20}, {3 << 20}}};
  ASSERT_TRUE(ck[1]->Save(1, theirs, {}, "x").ok());
  ASSERT_TRUE(ck[0]->Save(1, mine, {}, "x").ok());
  ASSERT_TRUE(ck[1]->Wait().ok());
  ASSERT_TRUE(ck[0]->Wait().ok());
  auto c = ShardedCheckpoint::Open(dir / "step-1");
  ASSERT_TRUE(c.ok()) << c.error().ToString();
  std::vector<float> slice(256);
  const std::uint64_t off[] = {(2 << 20) + 5}, shape[] = {256};
  const RegionRequest r{"t", off, shape, std::as_writable_bytes(std::span(slice))};
  ASSERT_TRUE((*c)->ReadRegions(std::span(&r, 1)).ok());
  EXPECT_EQ(slice[0], static_cast<float>((2 << 20) + 5));
  EXPECT_EQ((*c)->stats().blocks_checked, 1u);
  EXPECT_LE((*c)->stats().bytes_read, std::uint64_t{4} << 20);
}

TEST(ShardedCheckpoint, ACorruptBlockIsNamedAndOtherBlocksStillRead) {
  TempDir dir;
  Ranks ranks(dir.path());
  for (const auto& s : ranks.Save(3, "c")) ASSERT_TRUE(s.ok()) << s.ToString();
  {
    // Flip the last byte of rank 1's file (its data: rows 2-3 of "w" or "b").
    std::fstream f(dir / "step-3/rank-00001.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(-1, std::ios::end);
    f.write(&c, 1);
  }
  auto c = ShardedCheckpoint::Open(dir / "step-3");
  ASSERT_TRUE(c.ok()) << c.error().ToString();
  const Status verified = (*c)->VerifyFiles();
  EXPECT_EQ(verified.code(), StatusCode::kCorruption);
  EXPECT_NE(verified.message().find("rank-00001.safetensors' block 0"), std::string::npos) << verified.ToString();
  Status s;
  (void)ReadW(**c, {0, 0}, {kRows, kCols}, &s);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_NE(s.message().find("rank-00001.safetensors"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("block 0"), std::string::npos) << s.ToString();
  // Rank 0's rows do not touch that file.
  (void)ReadW(**c, {0, 0}, {2, kCols}, &s);
  EXPECT_TRUE(s.ok()) << s.ToString();
  // Without verification the bytes are served as they are.
  LoadOptions unverified;
  unverified.verify_checksums = false;
  auto raw = ShardedCheckpoint::Open(dir / "step-3", unverified);
  ASSERT_TRUE(raw.ok());
  (void)ReadW(**raw, {0, 0}, {kRows, kCols}, &s);
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST(ShardedCheckpoint, MissingOrTruncatedFilesAreNamedAtOpen) {
  TempDir dir;
  Ranks ranks(dir.path());
  for (const auto& s : ranks.Save(7, "m")) ASSERT_TRUE(s.ok()) << s.ToString();
  std::filesystem::resize_file(dir / "step-7/rank-00002.safetensors",
                               std::filesystem::file_size(dir / "step-7/rank-00002.safetensors") - 1);
  auto truncated = ShardedCheckpoint::Open(dir / "step-7");
  ASSERT_FALSE(truncated.ok());
  EXPECT_EQ(truncated.error().code(), StatusCode::kCorruption);
  EXPECT_NE(truncated.error().message().find("rank-00002.safetensors' has"), std::string::npos)
      << truncated.error().ToString();
  std::filesystem::remove(dir / "step-7/rank-00002.safetensors");
  auto missing = ShardedCheckpoint::Open(dir / "step-7");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message().find("missing 'rank-00002.safetensors'"), std::string::npos)
      << missing.error().ToString();
  // A folder renamed to another step is caught too.
  std::filesystem::rename(dir / "step-7", dir / "step-8");
  auto renamed = ShardedCheckpoint::Open(dir / "step-8");
  ASSERT_FALSE(renamed.ok());
  EXPECT_NE(renamed.error().message().find("named step 8 but its manifest says step 7"), std::string::npos);
}

TEST(ShardedCheckpoint, RetentionIsRankZerosAndKeepsTheNewest) {
  TempDir dir;
  Ranks ranks(dir.path());
  for (std::int64_t step : {1, 2, 3}) {
    for (const auto& s : ranks.Save(step, "keep" + std::to_string(step))) ASSERT_TRUE(s.ok()) << s.ToString();
  }
  // keep_last = 0 in Options(): all kept; a new set of ranks with keep_last = 2 prunes on its first save.
  ranks.ckpt.clear();
  for (std::uint32_t r = 0; r < kWorld; ++r) {
    auto o = Options(dir.path(), r);
    o.keep_last = 2;
    ranks.ckpt.push_back(std::move(*Checkpointer::Open(o)));
  }
  for (const auto& s : ranks.Save(4, "keep4")) ASSERT_TRUE(s.ok()) << s.ToString();
  auto listed = ListCheckpoints(dir.path());
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].step, 3);
  EXPECT_EQ((*listed)[1].step, 4);
}

TEST(ShardedCheckpoint, AMissingRankLeavesThePreviousCheckpointAndItsFilesAreCleanedNextSave) {
  TempDir dir;
  Ranks ranks(dir.path(), /*timeout=*/0.3);
  for (const auto& s : ranks.Save(1, "one")) ASSERT_TRUE(s.ok()) << s.ToString();
  auto statuses = ranks.Save(2, "two", /*skip_rank=*/2);
  ASSERT_FALSE(statuses[0].ok());
  EXPECT_EQ(statuses[0].code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(statuses[0].message().find("rank(s) 2 "), std::string::npos) << statuses[0].ToString();
  EXPECT_TRUE(statuses[1].ok());
  EXPECT_FALSE(std::filesystem::exists(dir / "step-2"));
  EXPECT_EQ(testing::ReadFile(dir / "latest"), "step-1\n");
  EXPECT_TRUE(std::filesystem::exists(dir / ".tmp-sharded-step-2-two/rank-00001.safetensors"));
  // The next save (all ranks) publishes, and rank 0 removed the leftovers.
  for (const auto& s : ranks.Save(3, "three")) ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_FALSE(std::filesystem::exists(dir / ".tmp-sharded-step-2-two"));
  EXPECT_TRUE(std::filesystem::exists(dir / "step-3/manifest.json"));
}

TEST(ShardedCheckpoint, ARankThatFailsStopsRankZeroAtOnceNamingIt) {
  TempDir dir;
  testing::FaultFileSystem full;
  full.disk_full_for_path_part = "rank-00002.safetensors";
  Ranks ranks(dir.path(), /*timeout=*/60, &full);
  const auto start = std::chrono::steady_clock::now();
  auto statuses = ranks.Save(5, "full");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  ASSERT_FALSE(statuses[2].ok());
  ASSERT_FALSE(statuses[0].ok());
  EXPECT_NE(statuses[0].message().find("rank 2 failed"), std::string::npos) << statuses[0].ToString();
  EXPECT_FALSE(std::filesystem::exists(dir / "step-5"));
}

TEST(ShardedCheckpoint, PiecesThatDoNotTileAreRefusedAtCommit) {
  TempDir dir;
  std::vector<std::unique_ptr<Checkpointer>> ck;
  for (std::uint32_t r = 0; r < 2; ++r) {
    CheckpointOptions o = Options(dir.path(), r);
    o.world_size = 2;
    ck.push_back(std::move(*Checkpointer::Open(o)));
  }
  std::vector<float> x(10, 1.0f);
  // Rank 0 holds [0, 10) of 30; rank 1 holds [15, 25): a gap and no overlap.
  const std::vector<TensorRef> a = {{"t", TensorDType::kFloat32, {10}, x.data(), -1, {30}, {0}}};
  const std::vector<TensorRef> b = {{"t", TensorDType::kFloat32, {10}, x.data(), -1, {30}, {15}}};
  ASSERT_TRUE(ck[1]->Save(1, b, {}, "gap").ok());
  ASSERT_TRUE(ck[0]->Save(1, a, {}, "gap").ok());
  ASSERT_TRUE(ck[1]->Wait().ok());
  Status s = ck[0]->Wait();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_NE(s.message().find("cover 20 of its 30 elements"), std::string::npos) << s.ToString();
  // Overlapping pieces, and ranks that disagree on a global shape.
  const std::vector<TensorRef> c = {{"t", TensorDType::kFloat32, {10}, x.data(), -1, {20}, {5}}};
  const std::vector<TensorRef> d = {{"t", TensorDType::kFloat32, {10}, x.data(), -1, {20}, {0}}};
  ASSERT_TRUE(ck[1]->Save(2, c, {}, "overlap").ok());
  ASSERT_TRUE(ck[0]->Save(2, d, {}, "overlap").ok());
  ASSERT_TRUE(ck[1]->Wait().ok());
  s = ck[0]->Wait();
  EXPECT_NE(s.message().find("overlap"), std::string::npos) << s.ToString();
  ASSERT_TRUE(ck[1]->Save(3, b, {}, "shape").ok());
  ASSERT_TRUE(ck[0]->Save(3, d, {}, "shape").ok());
  ASSERT_TRUE(ck[1]->Wait().ok());
  s = ck[0]->Wait();
  EXPECT_NE(s.message().find("ranks disagree on tensor 't'"), std::string::npos) << s.ToString();
  EXPECT_FALSE(std::filesystem::exists(dir / "step-1"));
  EXPECT_FALSE(std::filesystem::exists(dir / "step-3"));
}

TEST(ShardedCheckpoint, BadArgumentsAreRefusedNamingWhat) {
  TempDir dir;
  CheckpointOptions o = Options(dir.path(), 3);
  auto bad_rank = Checkpointer::Open(o);
  ASSERT_FALSE(bad_rank.ok());
  EXPECT_NE(bad_rank.error().message().find("rank 3 is not in a world of size 3"), std::string::npos);
  o.rank = 0;
  auto c = Checkpointer::Open(o);
  ASSERT_TRUE(c.ok());
  // Two processes (here: two Checkpointers) claiming one rank.
  auto twin = Checkpointer::Open(o);
  ASSERT_FALSE(twin.ok());
  EXPECT_EQ(twin.error().code(), StatusCode::kUnavailable);
  float x[4] = {};
  const std::vector<TensorRef> outside = {{"t", TensorDType::kFloat32, {4}, x, -1, {6}, {3}}};
  auto s = (*c)->Save(1, outside, {}, "id");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message().find("does not fit in the global shape [6]"), std::string::npos)
      << s.error().ToString();
  const std::vector<TensorRef> fine = {{"t", TensorDType::kFloat32, {4}, x}};
  auto no_id = (*c)->Save(1, fine, {}, "bad id!");
  ASSERT_FALSE(no_id.ok());
  EXPECT_NE(no_id.error().message().find("save id"), std::string::npos);
  // A plain Checkpointer refuses shards.
  TempDir other;
  CheckpointOptions plain;
  plain.directory = other.path();
  auto p = Checkpointer::Open(plain);
  ASSERT_TRUE(p.ok());
  const std::vector<TensorRef> shard = {{"t", TensorDType::kFloat32, {4}, x, -1, {8}, {4}}};
  auto refused = (*p)->Save(1, shard, {});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message().find("not sharded"), std::string::npos);
}

// describe_snapshots: each tensor saved, by its index in the span given to
// Save(), with its bytes in the snapshot buffer, unchanged by the persist
// and by the caller changing its tensors after Save() returned.
TEST(ShardedCheckpoint, TheLastSnapshotDescribesEachTensorsBytes) {
  TempDir dir;
  auto o = Options(dir.path(), 0);
  o.world_size = 1;
  o.describe_snapshots = true;
  auto ck = Checkpointer::Open(o);
  ASSERT_TRUE(ck.ok()) << ck.error().ToString();
  EXPECT_TRUE((*ck)->LastSnapshot().empty());
  RankState state(1, 7);
  std::vector<TensorRef> refs{{"b", TensorDType::kInt64, {700}, state.b.data()},
                              {"w", TensorDType::kFloat32, {2, kCols}, state.w.data()},
                              {"s", TensorDType::kFloat64, {}, &state.s}};
  ASSERT_TRUE((*ck)->Save(7, refs, {}).ok());
  const RankState expected(1, 7);
  state = RankState(1, 8);  // the caller's tensors move on; the snapshot does not
  ASSERT_TRUE((*ck)->Wait().ok());
  const auto snapshot = (*ck)->LastSnapshot();
  ASSERT_EQ(snapshot.size(), 3u);
  std::vector<bool> seen(3);
  for (const SnapshotTensor& t : snapshot) {
    ASSERT_LT(t.source, 3u);
    seen[t.source] = true;
    const void* want = t.source == 0   ? static_cast<const void*>(expected.b.data())
                       : t.source == 1 ? static_cast<const void*>(expected.w.data())
                                       : static_cast<const void*>(&expected.s);
    const std::size_t bytes = t.source == 0 ? 700 * 8 : t.source == 1 ? 2 * kCols * 4 : 8;
    ASSERT_EQ(t.data.size(), bytes) << t.source;
    EXPECT_EQ(std::memcmp(t.data.data(), want, bytes), 0) << t.source;
  }
  EXPECT_EQ(seen, std::vector<bool>(3, true));
  // Without the option, nothing is described.
  TempDir other;
  auto plain = Checkpointer::Open(Options(other.path(), 0));
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE((*plain)->LastSnapshot().empty());
}

}  // namespace
}  // namespace stoker
