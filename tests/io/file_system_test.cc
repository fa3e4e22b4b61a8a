// The POSIX file system's safety rules: deletes never follow links, writes
// never go through them, temporaries are created exclusively, non-regular
// files are refused before any read, and failures say what they are.
#include "stoker/file_system.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <future>

#include <gtest/gtest.h>

#include "test_util.h"

namespace stoker {
namespace {

using testing::ReadFile;
using testing::TempDir;
using testing::WriteFile;
namespace fs = std::filesystem;

FileSystem& Posix() {
  return *FileSystem::Default();
}

TEST(RemoveTree, NeverFollowsLinks) {
  TempDir dir;
  WriteFile(dir / "precious/keep.txt", "keep");
  // A link to an outside folder, where a folder is deleted; one nested deeper;
  // and a link loop.
  fs::create_directories(dir / "doomed/sub");
  fs::create_directory_symlink(dir / "precious", dir / "doomed/link");
  fs::create_directory_symlink(dir / "precious", dir / "doomed/sub/nested");
  fs::create_symlink(dir / "doomed/loop2", dir / "doomed/loop1");
  fs::create_symlink(dir / "doomed/loop1", dir / "doomed/loop2");
  WriteFile(dir / "doomed/sub/file", "x");
  ASSERT_OK(RemoveTree(Posix(), dir / "doomed"));
  EXPECT_FALSE(fs::exists(fs::symlink_status(dir / "doomed")));
  EXPECT_EQ(ReadFile(dir / "precious/keep.txt"), "keep");
  // The path itself a link to a folder: the link goes, the folder stays.
  fs::create_directory_symlink(dir / "precious", dir / "alias");
  ASSERT_OK(RemoveTree(Posix(), dir / "alias"));
  EXPECT_FALSE(fs::exists(fs::symlink_status(dir / "alias")));
  EXPECT_EQ(ReadFile(dir / "precious/keep.txt"), "keep");
  ASSERT_OK(RemoveTree(Posix(), dir / "never-was"));
}

TEST(CreateForWrite, NeverWritesThroughALink) {
  TempDir dir;
  WriteFile(dir / "outside", "original");
  fs::create_symlink(dir / "outside", dir / "planted");
  for (auto mode : {CreateMode::kTruncate, CreateMode::kExclusive}) {
    auto file = Posix().CreateForWrite(dir / "planted", mode);
    ASSERT_FALSE(file.ok());
    EXPECT_NE(file.error().message().find("planted"), std::string::npos) << file.error().message();
  }
  EXPECT_EQ(ReadFile(dir / "outside"), "original");
  WriteFile(dir / "exists", "x");
  auto again = Posix().CreateForWrite(dir / "exists", CreateMode::kExclusive);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code(), StatusCode::kAlreadyExists);
}

TEST(AtomicFile, APlantedLinkAtTheTemporaryIsRemovedNeverFollowed) {
  TempDir dir;
  WriteFile(dir / "outside", "original");
  fs::create_symlink(dir / "outside", dir / "latest.tmp");
  {
    ASSERT_OK_AND_ASSIGN(auto file, AtomicFile::Create(Posix(), dir / "latest", dir / "latest.tmp"));
    ASSERT_OK(file.Append(testing::Bytes("step-5\n")));
    ASSERT_OK(file.Commit());
  }
  EXPECT_EQ(ReadFile(dir / "outside"), "original");
  EXPECT_EQ(ReadFile(dir / "latest"), "step-5\n");
  EXPECT_FALSE(fs::is_symlink(dir / "latest"));
  EXPECT_FALSE(fs::exists(fs::symlink_status(dir / "latest.tmp")));
}

TEST(AtomicFile, AnUncommittedFileLeavesNothingAndTheOldOneStays) {
  TempDir dir;
  WriteFile(dir / "data", "old");
  std::string temp;
  {
    ASSERT_OK_AND_ASSIGN(auto file, AtomicFile::Create(Posix(), dir / "data"));
    temp = file.temp_path();
    ASSERT_OK(file.Append(testing::Bytes("new, half written")));
    EXPECT_TRUE(fs::exists(temp));
  }
  EXPECT_FALSE(fs::exists(temp));
  EXPECT_EQ(ReadFile(dir / "data"), "old");
  ASSERT_OK(WriteWholeFileAtomically(Posix(), dir / "data", testing::Bytes("new")));
  EXPECT_EQ(ReadFile(dir / "data"), "new");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
}

TEST(OpenForRead, AFifoIsRefusedAtOnceNotWaitedOn) {
  TempDir dir;
  ASSERT_EQ(::mkfifo((dir / "pipe").c_str(), 0600), 0);
  auto opening = std::async(std::launch::async, [&] { return Posix().OpenForRead(dir / "pipe"); });
  ASSERT_EQ(opening.wait_for(std::chrono::seconds(5)), std::future_status::ready) << "open waited for a writer";
  auto file = opening.get();
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(file.error().message().find("a FIFO (named pipe), not a regular file"), std::string::npos)
      << file.error().message();
  EXPECT_FALSE(Posix().Map(dir / "pipe").ok());
}

TEST(Stat, DanglingLinksAndLoopsAreToldApart) {
  TempDir dir;
  fs::create_symlink(dir / "gone", dir / "dangling");
  fs::create_symlink(dir / "b", dir / "a");
  fs::create_symlink(dir / "a", dir / "b");
  auto dangling = Posix().Stat(dir / "dangling");
  ASSERT_FALSE(dangling.ok());
  EXPECT_NE(dangling.error().message().find("dangling symbolic link"), std::string::npos);
  auto loop = Posix().Stat(dir / "a");
  ASSERT_FALSE(loop.ok());
  EXPECT_NE(loop.error().message().find("loop of symbolic links"), std::string::npos) << loop.error().message();
  ASSERT_OK_AND_ASSIGN(auto link, Posix().LinkStat(dir / "a"));
  EXPECT_EQ(link.type, FileType::kSymlink);
  ASSERT_OK_AND_ASSIGN(auto listing, Posix().ListDirectory(dir.path()));
  for (const auto& e : listing) {
    EXPECT_TRUE(e.is_link) << e.name;
    EXPECT_EQ(e.type, FileType::kSymlink) << e.name;  // leads nowhere
  }
}

TEST(FileSystem, FreeBytesAndSiblings) {
  TempDir dir;
  ASSERT_OK_AND_ASSIGN(auto free, Posix().FreeBytes(dir.path()));
  EXPECT_GT(free, 0u);
  EXPECT_EQ(Posix().Sibling("/d/index.stoker", "shard-0.tar"), "/d/shard-0.tar");
  EXPECT_EQ(Posix().Sibling("/d/index.stoker", "/abs/s.tar"), "/abs/s.tar");
  EXPECT_EQ(Posix().Sibling("index.stoker", "s.tar"), "s.tar");
}

// A scratch file has no name: nothing appears in its folder, nothing is left
// after it, and it reads back what was appended.
TEST(ScratchFile, ReadsBackWhatWasAppendedAndLeavesNoName) {
  TempDir dir;
  {
    ASSERT_OK_AND_ASSIGN(auto scratch, Posix().CreateScratch(dir.path()));
    const std::string a = testing::RandomBytes(5000, 1), b = testing::RandomBytes(70000, 2);
    ASSERT_TRUE(scratch->Append(testing::Bytes(a)).ok());
    ASSERT_TRUE(scratch->Append(testing::Bytes(b)).ok());
    std::string back(100, '\0');
    ASSERT_TRUE(scratch->ReadExactAt(4950, std::as_writable_bytes(std::span(back))).ok());
    EXPECT_EQ(back, a.substr(4950) + b.substr(0, 50));
    EXPECT_TRUE(fs::is_empty(dir.path())) << "a scratch file has no name";
    // Past what was appended: an error, not a short read.
    EXPECT_EQ(scratch->ReadExactAt(74950, std::as_writable_bytes(std::span(back))).code(), StatusCode::kInternal);
  }
  EXPECT_TRUE(fs::is_empty(dir.path()));
  auto missing = Posix().CreateScratch(dir / "missing");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message().find("missing"), std::string::npos) << missing.error().message();
}

}  // namespace
}  // namespace stoker
