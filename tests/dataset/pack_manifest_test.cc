// Pack from CSV and JSON Lines manifests: labels, keys, extra columns, file
// columns and the kinds the index records for them.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "stoker/dataset.h"
#include "stoker/pack.h"
#include "test_util.h"

namespace stoker {
namespace {

using testing::TempDir;
using testing::Text;
using testing::WriteFile;

TEST(Pack, FromCsvAndJsonlManifests) {
  TempDir dir;
  WriteFile(dir / "m/img/a.jpg", testing::FakeImage("jpg", 40, 1));
  WriteFile(dir / "m/img/b.png", testing::FakeImage("png", 40, 2));
  WriteFile(dir / "m/list.csv", "path,label,caption\nimg/a.jpg,zebra,\"striped, black\"\nimg/b.png,ant,tiny\n");
  ASSERT_OK_AND_ASSIGN(auto summary, Pack(dir / "m/list.csv", dir / "out"));
  EXPECT_EQ(summary.class_names, (std::vector<std::string>{"ant", "zebra"}));
  ASSERT_OK_AND_ASSIGN(auto dataset, Dataset::Open(dir / "out/index.stoker"));
  EXPECT_EQ(dataset->field_names(), (std::vector<std::string>{"caption", "cls", "jpg", "png"}));
  ASSERT_OK_AND_ASSIGN(auto s0, dataset->Sample(0));
  EXPECT_EQ(s0.key, "img/a");
  EXPECT_EQ(s0.label, 1);
  EXPECT_EQ(Text(*dataset->ReadField(0, 0)), "striped, black");

  WriteFile(dir / "m/list.jsonl",
            "{\"path\": \"img/a.jpg\", \"label\": 5, \"key\": \"first\"}\n{\"path\": \"img/b.png\"}\n");
  ASSERT_OK(Pack(dir / "m/list.jsonl", dir / "out2").status());
  ASSERT_OK_AND_ASSIGN(auto d2, Dataset::Open(dir / "out2"));
  EXPECT_EQ(d2->Sample(0)->key, "first");
  EXPECT_EQ(d2->Sample(0)->label, 5);
  EXPECT_EQ(d2->Sample(1)->label, kNoLabel);

  WriteFile(dir / "m/missing.csv", "path,label\nimg/a.jpg,1\nimg/gone.jpg,2\n");
  auto r = Pack(dir / "m/missing.csv", dir / "out3");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), StatusCode::kNotFound);
  EXPECT_NE(r.error().message().find("img/gone.jpg"), std::string::npos) << r.error().message();
  EXPECT_FALSE(std::filesystem::exists(dir / "out3/index.stoker"));
}

// A manifest with a second file per sample (image + mask) and typed columns:
// the index records each field's kind and how many samples have it.
TEST(Pack, ManifestFileColumnsAndTypedColumnsAreRecorded) {
  TempDir dir;
  WriteFile(dir / "m/a.jpg", testing::FakeImage("jpg", 40, 1));
  WriteFile(dir / "m/a_mask.png", testing::FakeImage("png", 40, 3));
  WriteFile(dir / "m/b.jpg", testing::FakeImage("jpg", 40, 2));
  WriteFile(dir / "m/b.npy", "NN");
  WriteFile(dir / "m/list.jsonl",
            "{\"path\": \"a.jpg\", \"mask\": \"a_mask.png\", \"depth\": null, \"boxes\": [[1, 2, 3, 4]], "
            "\"n\": 3, \"score\": 0.5, \"caption\": \"a cat\"}\n"
            "{\"path\": \"b.jpg\", \"depth\": \"b.npy\", \"boxes\": [], \"n\": 4, \"score\": 2, \"caption\": \"7\"}\n");
  PackOptions options;
  options.file_columns = {"mask", "depth"};
  ASSERT_OK(Pack(dir / "m/list.jsonl", dir / "out", options).status());
  ASSERT_OK_AND_ASSIGN(auto dataset, Dataset::Open(dir / "out"));
  EXPECT_EQ(dataset->field_names(),
            (std::vector<std::string>{"boxes", "caption", "depth.npy", "jpg", "mask.png", "n", "score"}));
  std::map<std::string, std::pair<FieldKind, std::uint64_t>> recorded;
  for (std::size_t f = 0; f < dataset->field_names().size(); ++f) {
    const auto r = dataset->recorded_field(f);
    ASSERT_TRUE(r.kind.has_value() && r.samples.has_value()) << dataset->field_names()[f];
    recorded[dataset->field_names()[f]] = {*r.kind, *r.samples};
  }
  EXPECT_EQ(recorded["boxes"], std::pair(FieldKind::kJson, std::uint64_t{2}));
  EXPECT_EQ(recorded["caption"], std::pair(FieldKind::kText, std::uint64_t{2})) << "a JSON string stays text";
  EXPECT_EQ(recorded["depth.npy"], std::pair(FieldKind::kArray, std::uint64_t{1}));
  EXPECT_EQ(recorded["jpg"], std::pair(FieldKind::kImage, std::uint64_t{2}));
  EXPECT_EQ(recorded["mask.png"], std::pair(FieldKind::kImage, std::uint64_t{1}));
  EXPECT_EQ(recorded["n"], std::pair(FieldKind::kInt, std::uint64_t{2}));
  EXPECT_EQ(recorded["score"], std::pair(FieldKind::kFloat, std::uint64_t{2})) << "0.5 and 2 widen to float";
  ASSERT_OK_AND_ASSIGN(auto a, dataset->Sample(0));
  EXPECT_EQ(a.key, "a");
  EXPECT_EQ(Text(*dataset->ReadField(0, *dataset->FieldIndex("mask.png"))), testing::FakeImage("png", 40, 3));
  EXPECT_EQ(Text(*dataset->ReadField(0, *dataset->FieldIndex("boxes"))), "[[1,2,3,4]]");
  EXPECT_EQ(Text(*dataset->ReadField(1, *dataset->FieldIndex("depth.npy"))), "NN");
  ASSERT_OK_AND_ASSIGN(auto summary, Summarize(*dataset));
  EXPECT_TRUE(summary.fields[0].kind_recorded);
  EXPECT_EQ(summary.fields[4].samples, 1u);

  // A CSV's cells are typed by what they read as; without `path`, the first file column names the key.
  WriteFile(dir / "m/list.csv", "image,mask,n,x\na.jpg,a_mask.png,1,2\nb.jpg,,2,two\n");
  options.file_columns = {"image", "mask"};
  ASSERT_OK(Pack(dir / "m/list.csv", dir / "csv", options).status());
  ASSERT_OK_AND_ASSIGN(auto from_csv, Dataset::Open(dir / "csv"));
  EXPECT_EQ(from_csv->field_names(), (std::vector<std::string>{"image.jpg", "mask.png", "n", "x"}));
  EXPECT_EQ(from_csv->recorded_field(2).kind, FieldKind::kInt);
  EXPECT_EQ(from_csv->recorded_field(3).kind, FieldKind::kText) << "2 and 'two' widen to text";
  EXPECT_EQ(from_csv->Sample(1)->key, "b");

  // File columns name manifest columns; anything else is refused, naming them.
  auto not_manifest = Pack(dir / "out/shard-000000.tar", dir / "re", options);
  ASSERT_FALSE(not_manifest.ok());
  EXPECT_NE(not_manifest.error().message().find("file columns (image, mask)"), std::string::npos);
  options.file_columns = {"nope"};
  auto missing_column = Pack(dir / "m/list.csv", dir / "csv2", options);
  ASSERT_FALSE(missing_column.ok());
  EXPECT_NE(missing_column.error().message().find("file column 'nope' is not in the header"), std::string::npos);
}

}  // namespace
}  // namespace stoker
