// Pack's image header check (prepare/image_check.h): an image field that the
// loader could not even start to decode stops the pack, named; with
// keep_bad_images it is stored as it is, counted and named.
#include "prepare/image_check.h"

#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "dataset/pack_test_util.h"
#include "pipeline/loader_test_util.h"
#include "stoker/dataset.h"
#include "stoker/dataset_writer.h"
#include "stoker/loader.h"
#include "stoker/pack.h"
#include "test_util.h"

namespace stoker::prepare {
namespace {

using testing::TempDir;
using testing::Text;
using testing::WriteFile;

// Three good images of the folder's formats, and one more file per call.
void GoodFolder(const TempDir& dir) {
  WriteFile(dir / "src/a/good.jpg", MakeJpeg(24, 16, 1));
  WriteFile(dir / "src/a/grey.pgm", "P5\n4 2\n255\n" + std::string(8, '\x7f'));
  WriteFile(dir / "src/b/header_only.png", testing::FakeImage("png", 60, 2));  // the check reads headers only
}

struct Bad {
  std::string file;  // under src/
  std::string bytes;
  StatusCode code;
  std::string says;
};

TEST(ImageCheck, AnImageTheLoaderCouldNotStartToDecodeStopsThePackNamingItsSampleAndFile) {
  const std::string jpeg = MakeJpeg(24, 16, 3);
  const std::vector<Bad> cases = {
      {"a/empty.jpg", "", StatusCode::kCorruption, "0 bytes, not an image"},
      {"a/page.jpg", "<html><body>404 Not Found</body></html>", StatusCode::kCorruption,
       "not an image: neither JPEG, PNG, WebP, TIFF, PGM, PPM nor BMP by its first bytes"},
      {"a/anim.jpeg", "GIF89a\x01\x00\x01\x00", StatusCode::kUnimplemented, "a GIF image"},
      {"b/cut.jpg", jpeg.substr(0, 40), StatusCode::kCorruption, "not a decodable JPEG"},
      {"b/cut.png", std::string("\x89PNG\r\n\x1a\n\0\0\0\x0dIH", 14), StatusCode::kCorruption, "PNG"},
  };
  for (const Bad& bad : cases) {
    TempDir dir;
    GoodFolder(dir);
    WriteFile(dir / ("src/" + bad.file), bad.bytes);
    auto packed = Pack(dir / "src", dir / "out");
    ASSERT_FALSE(packed.ok()) << bad.file;
    EXPECT_EQ(packed.error().code(), bad.code) << packed.error().ToString();
    const std::string& m = packed.error().message();
    const std::string key = bad.file.substr(0, bad.file.rfind('.'));
    EXPECT_NE(m.find("sample '" + key + "'"), std::string::npos) << m;
    EXPECT_NE(m.find(dir / ("src/" + bad.file)), std::string::npos) << m;
    EXPECT_NE(m.find(bad.says), std::string::npos) << m;
    EXPECT_NE(m.find("--keep-bad-images"), std::string::npos) << m;
    EXPECT_FALSE(std::filesystem::exists(dir / "out/index.stoker")) << bad.file;
  }
  TempDir good;
  GoodFolder(good);
  ASSERT_OK_AND_ASSIGN(PackSummary summary, Pack(good / "src", good / "out"));
  EXPECT_EQ(summary.samples, 3u);
  EXPECT_EQ(summary.bad_images_kept, 0u);
  EXPECT_EQ(summary.note.find("bad_images"), std::string::npos) << summary.note;
}

TEST(ImageCheck, KeptBadImagesAreStoredAsTheyAreCountedAndTheSmallestKeysNamed) {
  TempDir dir;
  GoodFolder(dir);
  // Seven bad images: the five smallest keys are named, whatever the threads.
  for (const char* name : {"c/6", "c/0", "c/4", "c/2", "c/5", "c/1", "c/3"})
    WriteFile(dir / ("src/" + std::string(name) + ".jpg"), std::string("bad ") + name);
  std::string first_note;
  for (unsigned threads : {1u, 8u}) {
    PackOptions keep;
    keep.keep_bad_images = true;
    keep.threads = threads;
    keep.overwrite = true;
    keep.shuffle = true;  // the bad images arrive out of key order
    keep.shuffle_seed = 3;
    ASSERT_OK_AND_ASSIGN(PackSummary summary, Pack(dir / "src", dir / "out", keep));
    EXPECT_EQ(summary.samples, 10u);
    EXPECT_EQ(summary.bad_images_kept, 7u);
    ASSERT_EQ(summary.bad_images_named.size(), 7u) << "the summary lists every one (up to 1,000)";
    for (std::size_t i = 0; i < 7; ++i)
      EXPECT_EQ(summary.bad_images_named[i].rfind("c/" + std::to_string(i) + ", field 'jpg': not an image", 0), 0u)
          << summary.bad_images_named[i];
    if (first_note.empty()) first_note = summary.note;
    EXPECT_EQ(summary.note, first_note) << "the note does not depend on the threads";
  }
  ASSERT_OK_AND_ASSIGN(auto dataset, Dataset::Open(dir / "out"));
  const auto note = nlohmann::json::parse(dataset->pack_note());
  EXPECT_EQ(note["bad_images"]["kept"], 7);
  std::vector<std::string> noted;
  for (const auto& [name, why] : note["bad_images"]["named"].items()) noted.push_back(name);
  EXPECT_EQ(noted, (std::vector<std::string>{"c/0, field 'jpg'", "c/1, field 'jpg'", "c/2, field 'jpg'",
                                             "c/3, field 'jpg'", "c/4, field 'jpg'"}))
      << "the note keeps the five smallest keys: " << note.dump();
  EXPECT_TRUE(note.contains("classes")) << note.dump();
  const auto jpg = dataset->FieldIndex("jpg");
  ASSERT_TRUE(jpg.has_value());
  for (std::uint64_t i = 0; i < dataset->num_samples(); ++i) {
    ASSERT_OK_AND_ASSIGN(SampleInfo info, dataset->Sample(i));
    if (!info.key.starts_with("c/")) continue;
    ASSERT_OK_AND_ASSIGN(auto bytes, dataset->ReadField(i, *jpg));
    EXPECT_EQ(Text(bytes), "bad " + std::string(info.key));
  }
}

// A loader that would stop at a kept bad image says so when it is made.
TEST(ImageCheck, ALoaderOverKeptBadImagesWarnsWhenMadeUnlessItSkipsThem) {
  TempDir dir;
  GoodFolder(dir);
  WriteFile(dir / "src/b/zero.jpg", "");
  PackOptions keep;
  keep.keep_bad_images = true;
  ASSERT_OK(Pack(dir / "src", dir / "out", keep).status());
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<const Dataset> dataset, Dataset::Open(dir / "out"));
  EXPECT_EQ(dataset->bad_images_kept(), 1u);
  EXPECT_EQ(dataset->first_bad_image(), "b/zero, field 'jpg'");
  LoaderOptions options = SmallOptions();
  ASSERT_OK_AND_ASSIGN(auto stopping, Loader::Create(dataset, options));
  const std::string note = stopping->stats().corrupt_note;
  EXPECT_NE(note.find("holds 1 image that the loader cannot decode"), std::string::npos) << note;
  EXPECT_NE(note.find("kept as it was when written (keep_bad_images, --keep-bad-images; b/zero, field 'jpg')"),
            std::string::npos)
      << note;
  EXPECT_NE(note.find("on_corrupt=\"skip\""), std::string::npos) << note;
  options.on_corrupt = CorruptPolicy::kSkip;
  ASSERT_OK_AND_ASSIGN(auto skipping, Loader::Create(dataset, options));
  EXPECT_EQ(skipping->stats().corrupt_note, "");
  TempDir clean;
  GoodFolder(clean);
  ASSERT_OK(Pack(clean / "src", clean / "out").status());
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<const Dataset> good, Dataset::Open(clean / "out"));
  EXPECT_EQ(good->bad_images_kept(), 0u);
  ASSERT_OK_AND_ASSIGN(auto quiet, Loader::Create(good, SmallOptions()));
  EXPECT_EQ(quiet->stats().corrupt_note, "");
}

// Past 1,000 kept, the summary lists the 1,000 smallest keys, whatever
// order they arrive in.
TEST(ImageCheck, TheSummaryListsAThousandBadImagesAtMost) {
  TempDir dir;
  for (int i = 0; i < 1003; ++i) WriteFile(dir / fmt::format("src/d/{:04d}.jpg", i), "");
  PackOptions keep;
  keep.keep_bad_images = true;
  keep.shuffle = true;
  ASSERT_OK_AND_ASSIGN(PackSummary summary, Pack(dir / "src", dir / "out", keep));
  EXPECT_EQ(summary.bad_images_kept, 1003u);
  ASSERT_EQ(summary.bad_images_named.size(), kBadImagesListed);
  EXPECT_EQ(summary.bad_images_named.front().rfind("d/0000, field 'jpg'", 0), 0u) << summary.bad_images_named.front();
  EXPECT_EQ(summary.bad_images_named.back().rfind("d/0999, field 'jpg'", 0), 0u) << summary.bad_images_named.back();
}

// With max_side and seekable_jpeg a kept bad image passes both untouched;
// a JPEG whose header reads but whose scan is cut is found by the
// re-encoder, which decodes it, and refused or kept the same way.
TEST(ImageCheck, RewritersAfterTheCheckLeaveKeptImagesAloneAndReportTheirOwnFindsTheSameWay) {
  TempDir dir;
  WriteFile(dir / "src/a/big.jpg", MakeJpeg(64, 48, 1));
  WriteFile(dir / "src/a/zero.jpg", "");
  const std::string whole = MakeJpeg(64, 48, 2);
  WriteFile(dir / "src/a/scan_cut.jpg", whole.substr(0, whole.size() / 2));
  PackOptions options;
  options.max_side = 32;
  options.seekable_jpeg = true;
  options.keep_bad_images = true;
  ASSERT_OK_AND_ASSIGN(PackSummary summary, Pack(dir / "src", dir / "out", options));
  EXPECT_EQ(summary.bad_images_kept, 2u);
  ASSERT_EQ(summary.bad_images_named.size(), 2u);
  EXPECT_NE(summary.bad_images_named[0].find("a/scan_cut, field 'jpg': cannot re-encode the image"), std::string::npos)
      << summary.bad_images_named[0];
  EXPECT_NE(summary.bad_images_named[1].find("a/zero, field 'jpg': 0 bytes"), std::string::npos)
      << summary.bad_images_named[1];
  EXPECT_EQ(summary.images_reencoded, 1u);
  EXPECT_EQ(summary.seekable_jpegs, 1u);
  EXPECT_EQ(summary.seekable_kept, 0u) << "kept bad images never reach the seekable writer";
  ASSERT_OK_AND_ASSIGN(auto dataset, Dataset::Open(dir / "out"));
  const auto note = nlohmann::json::parse(dataset->pack_note());
  EXPECT_EQ(note["bad_images"]["kept"], 2);
  EXPECT_EQ(note["images_reencoded"], 1);
  EXPECT_EQ(note["seekable_jpeg"]["images_rewritten"], 1);
  const auto jpg = *dataset->FieldIndex("jpg");
  ASSERT_OK_AND_ASSIGN(auto cut, dataset->ReadField(1, jpg));  // a/scan_cut, stored as it was
  EXPECT_EQ(Text(cut), whole.substr(0, whole.size() / 2));

  options.keep_bad_images = false;
  options.overwrite = true;
  std::filesystem::remove(dir / "src/a/zero.jpg");
  auto refused = Pack(dir / "src", dir / "out", options);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message().find("sample 'a/scan_cut'"), std::string::npos) << refused.error().ToString();
  EXPECT_NE(refused.error().message().find("--keep-bad-images"), std::string::npos) << refused.error().ToString();
}

// What is checked is the kind the index will record, not the name: a
// repacked dataset whose writer declared "jpg" as bytes keeps any bytes
// there, and fields of other kinds are never read as images; a manifest's
// second file (a mask) is an image field like the first.
TEST(ImageCheck, FieldsAreCheckedByTheirRecordedKind) {
  TempDir dir;
  {
    ASSERT_OK_AND_ASSIGN(auto writer, DatasetWriter::Create(dir / "opaque"));
    const std::vector<SampleField> fields = {{"jpg", testing::Bytes("opaque bytes, declared so"), FieldKind::kBytes},
                                             {"txt", testing::Bytes("not an image"), FieldKind::kText}};
    ASSERT_OK(writer->Add("s0", fields));
    ASSERT_OK(writer->Finish().status());
  }
  ASSERT_OK_AND_ASSIGN(PackSummary repacked, Pack(dir / "opaque", dir / "out"));
  EXPECT_EQ(repacked.samples, 1u);
  EXPECT_EQ(repacked.bad_images_kept, 0u);

  WriteFile(dir / "m/a.jpg", MakeJpeg(24, 16, 1));
  WriteFile(dir / "m/a_mask.png", "a mask that is not one");
  WriteFile(dir / "m/list.csv", "path,mask\na.jpg,a_mask.png\n");
  PackOptions options;
  options.file_columns = {"mask"};
  auto refused = Pack(dir / "m/list.csv", dir / "out2", options);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message().find("sample 'a'"), std::string::npos) << refused.error().ToString();
  EXPECT_NE(refused.error().message().find("field 'mask.png'"), std::string::npos) << refused.error().ToString();
}

// `stoker index` reads shards as they are: a bad image stops it named by
// shard:offset, or is indexed as it is, counted, named and noted.
TEST(ImageCheck, IndexingShardsChecksTheirImagesToo) {
  TempDir dir;
  {
    ASSERT_OK_AND_ASSIGN(auto writer, DatasetWriter::Create(dir / "w"));
    const std::string good = MakeJpeg(24, 16, 1);
    const std::vector<SampleField> first = {{"jpg", testing::Bytes(good), FieldKind::kImage}};
    const std::vector<SampleField> second = {{"jpg", testing::Bytes("<html>gone</html>"), FieldKind::kBytes}};
    ASSERT_OK(writer->Add("a", first));
    ASSERT_OK(writer->Add("b", second));
    ASSERT_OK(writer->Finish().status());
  }
  std::filesystem::remove(dir / "w/index.stoker");
  auto refused = IndexShards({dir / "w"}, {});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code(), StatusCode::kCorruption);
  const std::string& m = refused.error().message();
  EXPECT_NE(m.find("shard-000000.tar:"), std::string::npos) << m;
  EXPECT_NE(m.find("sample 'b', field 'jpg': not an image"), std::string::npos) << m;
  EXPECT_NE(m.find("--keep-bad-images"), std::string::npos) << m;
  EXPECT_FALSE(std::filesystem::exists(dir / "w/index.stoker"));

  IndexOptions keep;
  keep.keep_bad_images = true;
  ASSERT_OK_AND_ASSIGN(IndexSummary summary, IndexShards({dir / "w"}, keep));
  EXPECT_EQ(summary.samples, 2u);
  EXPECT_EQ(summary.bad_images_kept, 1u);
  ASSERT_EQ(summary.bad_images_named.size(), 1u);
  EXPECT_EQ(summary.bad_images_named[0].rfind("b, field 'jpg': not an image", 0), 0u) << summary.bad_images_named[0];
  ASSERT_OK_AND_ASSIGN(auto dataset, Dataset::Open(dir / "w"));
  const auto note = nlohmann::json::parse(dataset->pack_note());
  EXPECT_EQ(note["bad_images"]["kept"], 1) << note.dump();
}

}  // namespace
}  // namespace stoker::prepare
