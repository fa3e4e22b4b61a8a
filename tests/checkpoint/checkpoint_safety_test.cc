// The checkpointer against hostile directories and mistakes: links where
// temporaries and step folders are expected, a step saved twice, folders
// whose names or manifests lie, a structure naming a missing tensor, and
// the interval on a fake clock.
#include <filesystem>

#include <gtest/gtest.h>

#include "checkpoint/checkpointer_internal.h"
#include "fake_clock.h"
#include "stoker/checkpoint.h"
#include "test_util.h"

namespace stoker {
namespace {

using testing::ReadFile;
using testing::TempDir;
using testing::WriteFile;
namespace fs = std::filesystem;

CheckpointOptions SafetyOptions(const std::string& dir) {
  CheckpointOptions o;
  o.directory = dir;
  o.copy_threads = 1;
  return o;
}

Status SaveFloats(Checkpointer& ck, std::int64_t step, float value = 1.5f) {
  static std::vector<float> data(16);
  std::fill(data.begin(), data.end(), value);
  const TensorRef refs[] = {{"w", TensorDType::kFloat32, {16}, data.data()}};
  STOKER_RETURN_IF_ERROR(ck.Save(step, refs, {}).status());
  return ck.Wait();
}

// Open's clean-up of leftover temporaries, retention, and replacing a step
// each delete folders: a link in their place goes itself, never what it
// points to.
TEST(CheckpointSafety, DeletionsNeverFollowLinksOutOfTheDirectory) {
  TempDir dir;
  WriteFile(dir / "outside/precious.txt", "keep me");
  WriteFile(dir / "outside/sub/also.txt", "keep me too");
  const std::string ck_dir = dir / "ck";
  fs::create_directories(ck_dir);
  fs::create_directory_symlink(dir / "outside", ck_dir + "/.tmp-step-3-99-0");
  fs::create_directories(ck_dir + "/.tmp-nested");
  fs::create_directory_symlink(dir / "outside", ck_dir + "/.tmp-nested/link");
  fs::create_symlink(dir / "outside/precious.txt", ck_dir + "/latest.tmp");
  {
    auto options = SafetyOptions(ck_dir);
    options.keep_last = 1;
    ASSERT_OK_AND_ASSIGN(auto ck, Checkpointer::Open(options));
    EXPECT_FALSE(fs::exists(fs::symlink_status(ck_dir + "/.tmp-step-3-99-0")));
    EXPECT_FALSE(fs::exists(fs::symlink_status(ck_dir + "/.tmp-nested")));
    EXPECT_FALSE(fs::exists(fs::symlink_status(ck_dir + "/latest.tmp")));
    ASSERT_OK(SaveFloats(*ck, 1));
    // An old step that is a link to an outside folder holding a real
    // checkpoint: retention removes the link only.
    fs::rename(ck_dir + "/step-1", dir / "outside/step-1-real");
    fs::create_directory_symlink(dir / "outside/step-1-real", ck_dir + "/step-1");
    ASSERT_OK(SaveFloats(*ck, 2));
    EXPECT_FALSE(fs::exists(fs::symlink_status(ck_dir + "/step-1")));
    EXPECT_TRUE(fs::exists(dir / "outside/step-1-real/manifest.json"));
  }
  {
    // Replacing a step that is a link: the link is moved aside and removed.
    auto options = SafetyOptions(ck_dir);
    options.keep_last = 0;
    options.replace_existing = true;
    ASSERT_OK_AND_ASSIGN(auto ck, Checkpointer::Open(options));
    fs::create_directory_symlink(dir / "outside/step-1-real", ck_dir + "/step-7");
    ASSERT_OK(SaveFloats(*ck, 7));
    EXPECT_FALSE(fs::is_symlink(ck_dir + "/step-7"));
    EXPECT_TRUE(fs::exists(dir / "outside/step-1-real/manifest.json"));
  }
  EXPECT_EQ(ReadFile(dir / "outside/precious.txt"), "keep me");
  EXPECT_EQ(ReadFile(dir / "outside/sub/also.txt"), "keep me too");
}

TEST(CheckpointSafety, SavingAnExistingStepIsRefusedUnlessAskedFor) {
  TempDir dir;
  {
    ASSERT_OK_AND_ASSIGN(auto ck, Checkpointer::Open(SafetyOptions(dir.path())));
    ASSERT_OK(SaveFloats(*ck, 5, 1.0f));
    Status again = SaveFloats(*ck, 5, 2.0f);
    ASSERT_EQ(again.code(), StatusCode::kAlreadyExists);
    EXPECT_NE(again.message().find("step-5' exists already"), std::string::npos) << again.message();
    EXPECT_NE(again.message().find("replace_existing"), std::string::npos);
  }
  ASSERT_OK_AND_ASSIGN(auto first, LoadCheckpoint(dir / "step-5"));
  EXPECT_EQ(reinterpret_cast<const float*>(first.tensors[0].data.data())[0], 1.0f);
  auto options = SafetyOptions(dir.path());
  options.replace_existing = true;
  ASSERT_OK_AND_ASSIGN(auto ck, Checkpointer::Open(options));
  ASSERT_OK(SaveFloats(*ck, 5, 2.0f));
  ASSERT_OK_AND_ASSIGN(auto second, LoadCheckpoint(dir / "step-5"));
  EXPECT_EQ(reinterpret_cast<const float*>(second.tensors[0].data.data())[0], 2.0f);
}

TEST(CheckpointSafety, FoldersWhoseNameOrManifestLieAreNotCheckpoints) {
  TempDir dir;
  {
    ASSERT_OK_AND_ASSIGN(auto ck, Checkpointer::Open(SafetyOptions(dir.path())));
    ASSERT_OK(SaveFloats(*ck, 5));
  }
  fs::copy(dir / "step-5", dir / "step-9", fs::copy_options::recursive);  // manifest says 5
  fs::copy(dir / "step-5", dir / "step--1", fs::copy_options::recursive);
  fs::copy(dir / "step-5", dir / "step-005", fs::copy_options::recursive);
  auto renamed = LoadCheckpoint(dir / "step-9");
  ASSERT_FALSE(renamed.ok());
  EXPECT_EQ(renamed.error().code(), StatusCode::kCorruption);
  EXPECT_NE(renamed.error().message().find("is named step 9 but its manifest says step 5"), std::string::npos)
      << renamed.error().message();
  for (const char* name : {"step--1", "step-005"}) {
    auto odd = LoadCheckpoint(dir / name);
    ASSERT_FALSE(odd.ok()) << name;
    EXPECT_NE(odd.error().message().find("not a checkpoint folder name"), std::string::npos) << odd.error().message();
  }
  ASSERT_OK_AND_ASSIGN(auto listed, ListCheckpoints(dir.path()));
  ASSERT_EQ(listed.size(), 2u);  // step-5 and step-9 (whose name parses; loading it says what is wrong)
  EXPECT_EQ(listed[0].step, 5);
  EXPECT_EQ(listed[1].step, 9);
  LoadOptions skip;
  skip.skip_corrupt = true;
  ASSERT_OK_AND_ASSIGN(auto latest, LoadLatestCheckpoint(dir.path(), skip));
  EXPECT_EQ(latest.step, 5);
  ASSERT_EQ(latest.skipped.size(), 1u);
}

TEST(CheckpointSafety, AStructureNamingAMissingTensorIsCorrupt) {
  TempDir dir;
  ASSERT_OK_AND_ASSIGN(auto ck, Checkpointer::Open(SafetyOptions(dir.path())));
  std::vector<float> data(4, 1);
  const TensorRef refs[] = {{"model.w", TensorDType::kFloat32, {4}, data.data()}};
  CheckpointExtras extras;
  extras.user_json = R"({"structure": {"d": [["model", {"d": [["w", {"t": "model.w"}], ["b", {"t": "model.b"}]]}]]}})";
  ASSERT_TRUE(ck->Save(3, refs, extras).ok());
  ASSERT_OK(ck->Wait());
  auto loaded = LoadCheckpoint(dir / "step-3");
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.error().code(), StatusCode::kCorruption);
  EXPECT_NE(loaded.error().message().find("names tensor 'model.b', which none of its files holds"), std::string::npos)
      << loaded.error().message();
}

TEST(CheckpointSafety, TheSecondsIntervalRunsOnTheClockSeam) {
  TempDir dir;
  testing::FakeClock clock;
  auto options = SafetyOptions(dir.path());
  options.interval_mode = IntervalMode::kSeconds;
  options.every_seconds = 600;
  ASSERT_OK_AND_ASSIGN(auto ck, checkpoint::OpenCheckpointer(options, {nullptr, &clock}));
  EXPECT_FALSE(ck->Due(1));
  clock.AdvanceSeconds(601);
  EXPECT_TRUE(ck->Due(2));
  ASSERT_OK(SaveFloats(*ck, 2));
  EXPECT_FALSE(ck->Due(3));
  clock.AdvanceSeconds(599);
  EXPECT_FALSE(ck->Due(4));
  clock.AdvanceSeconds(2);
  EXPECT_TRUE(ck->Due(5));
}

TEST(CheckpointSafety, BadOptionsAreRefused) {
  TempDir dir;
  auto o = SafetyOptions(dir.path());
  o.every_seconds = std::nan("");
  EXPECT_FALSE(Checkpointer::Open(o).ok());
  o = SafetyOptions(dir.path());
  o.copy_threads = 100000;
  EXPECT_FALSE(Checkpointer::Open(o).ok());
  WriteFile(dir / "a-file", "x");
  auto not_dir = Checkpointer::Open(SafetyOptions(dir / "a-file"));
  ASSERT_FALSE(not_dir.ok());
}

}  // namespace
}  // namespace stoker
