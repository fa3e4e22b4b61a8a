// One way to open a dataset: by location, through the file system
// registered for a URL scheme, or a local folder (packed, or an ImageFolder
// of loose files), and errors that say what was tried.
#include "stoker/open.h"

#include <filesystem>

#include <gtest/gtest.h>

#include "pipeline/loader_test_util.h"
#include "test_util.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;

TEST(OpenDataset, PackedFoldersIndexFilesAndImageFolders) {
  TempDir dir;
  auto packed = MakeDataset(dir);  // dir/src (ImageFolder) packed into dir/out
  ASSERT_OK_AND_ASSIGN(auto a, OpenDataset(dir / "out"));
  ASSERT_OK_AND_ASSIGN(auto b, OpenDataset(dir / "out/index.stoker"));
  ASSERT_OK_AND_ASSIGN(auto loose, OpenDataset(dir / "src"));
  EXPECT_FALSE(a->loose_files());
  EXPECT_TRUE(loose->loose_files());
  EXPECT_EQ(a->num_samples(), 30u);
  EXPECT_EQ(b->num_samples(), 30u);
  EXPECT_EQ(loose->num_samples(), 30u);
  OpenOptions strict;
  strict.image_folder = false;
  auto refused = OpenDataset(dir / "src", strict);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message().find("has no index.stoker"), std::string::npos);
}

TEST(OpenDataset, ShardsWithoutAnIndexAreNamedWithTheCommandThatIndexesThem) {
  TempDir dir;
  MakeDataset(dir);  // dir/out: shards and index.stoker
  fs::remove(dir / "out/index.stoker");
  auto shards = OpenDataset(dir / "out");
  ASSERT_FALSE(shards.ok());
  EXPECT_EQ(shards.error().code(), StatusCode::kNotFound);
  const std::string& why = shards.error().message();
  EXPECT_NE(why.find("has no index.stoker, but holds "), std::string::npos) << why;
  EXPECT_NE(why.find("`stoker index " + (dir / "out") + "`"), std::string::npos) << why;
  EXPECT_EQ(why.find("ImageFolder"), std::string::npos) << why;  // not taken for a tree of loose images
}

TEST(OpenDataset, TheRealCauseIsNamedNotHiddenBehindNoIndex) {
  TempDir dir;
  // A dangling index.stoker: reported as such, never read as an ImageFolder.
  fs::create_directories(dir / "a/class");
  WriteFile(dir / "a/class/x.jpg", MakeJpeg(16, 16, 1));
  fs::create_symlink(dir / "nowhere", dir / "a/index.stoker");
  auto dangling = OpenDataset(dir / "a");
  ASSERT_FALSE(dangling.ok());
  EXPECT_NE(dangling.error().message().find("dangling symbolic link"), std::string::npos) << dangling.error().message();
  // A folder that is neither: the ImageFolder's own complaint, named.
  WriteFile(dir / "b/class/README", "no extension");
  auto neither = OpenDataset(dir / "b");
  ASSERT_FALSE(neither.ok());
  EXPECT_NE(neither.error().message().find("cannot be read as an ImageFolder"), std::string::npos)
      << neither.error().message();
  EXPECT_NE(neither.error().message().find("README' has no file extension"), std::string::npos)
      << neither.error().message();
  // Links that point at each other are a loop, not "dangling".
  fs::create_directories(dir / "c/class");
  fs::create_symlink(dir / "c/class/q.jpg", dir / "c/class/p.jpg");
  fs::create_symlink(dir / "c/class/p.jpg", dir / "c/class/q.jpg");
  auto loop = OpenDataset(dir / "c");
  ASSERT_FALSE(loop.ok());
  EXPECT_NE(loop.error().message().find("loop of symbolic links"), std::string::npos) << loop.error().message();
  auto nul = OpenDataset(std::string("x\0y", 3));
  ASSERT_FALSE(nul.ok());
  EXPECT_NE(nul.error().message().find("NUL"), std::string::npos);
}

TEST(OpenDataset, RegisteredSchemesGoToTheirFileSystem) {
  TempDir dir;
  auto packed = MakeDataset(dir);
  const std::string folder = dir / "out";
  std::string asked;
  ASSERT_OK(
      RegisterFileSystem("testfs://", [&](const std::string& location, const OpenOptions&) -> Result<SchemeFileSystem> {
        asked = location;
        // A file system of our own: the local one, wrapped.
        std::shared_ptr<FileSystem> local(FileSystem::Default(), [](FileSystem*) {});
        return SchemeFileSystem{local, folder + "/index.stoker"};
      }));
  EXPECT_TRUE(IsRemoteLocation("testfs://bucket/data"));
  ASSERT_OK_AND_ASSIGN(auto d, OpenDataset("testfs://bucket/data"));
  EXPECT_EQ(asked, "testfs://bucket/data");
  EXPECT_EQ(d->num_samples(), 30u);
  EXPECT_FALSE(RegisterFileSystem("no-scheme", nullptr).ok());
  EXPECT_FALSE(RegisterFileSystem("x://", nullptr).ok());
  // Remote datasets are not local ones: no stats, no warming.
  EXPECT_EQ(GetRemoteStats(*d).downloads, 0u);
  EXPECT_FALSE(WarmCache(*d, nullptr).ok());
}

}  // namespace
}  // namespace stoker
