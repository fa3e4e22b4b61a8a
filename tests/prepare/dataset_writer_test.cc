// DatasetWriter: samples written from a program make the dataset pack
// makes; bad keys, fields and images are refused before anything is
// written (bad images kept on request, as pack keeps them); an unfinished
// writer leaves nothing behind.
#include "stoker/dataset_writer.h"

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include <gtest/gtest.h>

#include "fault_file_system.h"
#include "stoker/dataset.h"
#include "test_util.h"

namespace stoker {
namespace {

using testing::Bytes;
using testing::FakeImage;
using testing::FaultFileSystem;
using testing::ReadFile;
using testing::TempDir;

std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> names;
  if (!std::filesystem::exists(dir)) return names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Writes n samples: an image-named payload, a label, a caption and JSON.
Status WriteSamples(DatasetWriter& writer, int n) {
  for (int i = 0; i < n; ++i) {
    const std::string image = FakeImage("jpg", 3000 + 100 * i, i);
    const std::string label = std::to_string(i % 3), caption = "caption " + std::to_string(i),
                      json = "{\"boxes\": [[1, 2, 3, " + std::to_string(i) + "]]}";
    // Deliberately not sorted by name: the writer sorts.
    const SampleField fields[] = {{"txt", Bytes(caption), FieldKind::kText},
                                  {"jpg", Bytes(image), FieldKind::kImage},
                                  {"json", Bytes(json), FieldKind::kJson},
                                  {"cls", Bytes(label), FieldKind::kInt}};
    STOKER_RETURN_IF_ERROR(writer.Add("train/" + std::to_string(1000 + i), fields));
  }
  return Status::Ok();
}

TEST(DatasetWriter, WritesADatasetTheReaderOpensWithKindsLabelsAndBytes) {
  TempDir dir;
  DatasetWriterOptions options;
  options.target_shard_bytes = 8192;
  options.class_names = {"cat", "dog", "eel"};
  ASSERT_OK_AND_ASSIGN(auto writer, DatasetWriter::Create(dir / "out", options));
  ASSERT_OK(WriteSamples(*writer, 7));
  EXPECT_EQ(writer->samples(), 7u);
  EXPECT_FALSE(std::filesystem::exists(dir / "out/index.stoker"));  // not before Finish
  ASSERT_OK_AND_ASSIGN(PackSummary summary, writer->Finish());
  EXPECT_EQ(summary.samples, 7u);
  EXPECT_GE(summary.shards, 3u);  // ~3.5 KiB samples in 8 KiB shards

  ASSERT_OK_AND_ASSIGN(auto dataset, Dataset::Open(dir / "out"));
  ASSERT_EQ(dataset->num_samples(), 7u);
  EXPECT_EQ(dataset->field_names(), (std::vector<std::string>{"cls", "jpg", "json", "txt"}));
  EXPECT_EQ(dataset->recorded_field(*dataset->FieldIndex("jpg")).kind, FieldKind::kImage);
  EXPECT_EQ(dataset->recorded_field(*dataset->FieldIndex("json")).kind, FieldKind::kJson);
  EXPECT_EQ(dataset->recorded_field(*dataset->FieldIndex("txt")).kind, FieldKind::kText);
  EXPECT_EQ(dataset->class_names(), options.class_names);
  for (std::uint64_t i = 0; i < 7; ++i) {
    ASSERT_OK_AND_ASSIGN(SampleInfo info, dataset->Sample(i));
    EXPECT_EQ(info.key, "train/" + std::to_string(1000 + i));
    EXPECT_EQ(info.label, static_cast<std::int64_t>(i % 3));
    ASSERT_OK_AND_ASSIGN(auto image, dataset->ReadField(i, *dataset->FieldIndex("jpg")));
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(image.data()), image.size()),
              FakeImage("jpg", 3000 + 100 * i, static_cast<unsigned>(i)));
  }
  ASSERT_OK_AND_ASSIGN(auto report, Verify(*dataset));
  EXPECT_TRUE(report.ok());
}

TEST(DatasetWriter, TheSameSamplesGiveByteIdenticalFiles) {
  TempDir dir;
  for (const char* out : {"a", "b"}) {
    DatasetWriterOptions options;
    options.target_shard_bytes = 8192;
    ASSERT_OK_AND_ASSIGN(auto writer, DatasetWriter::Create(dir / out, options));
    ASSERT_OK(WriteSamples(*writer, 5));
    ASSERT_OK(writer->Finish().status());
  }
  ASSERT_EQ(Entries(dir / "a"), Entries(dir / "b"));
  for (const auto& name : Entries(dir / "a"))
    EXPECT_EQ(ReadFile(dir / "a/" + name), ReadFile(dir / "b/" + name)) << name;
}

TEST(DatasetWriter, RefusesKeysAndFieldsThatWouldNotReadBackAndStaysUsable) {
  TempDir dir;
  ASSERT_OK_AND_ASSIGN(auto writer, DatasetWriter::Create(dir / "out"));
  const std::string payload = "x";
  auto add = [&](std::string_view key, std::string_view field) {
    const SampleField fields[] = {{field, Bytes(payload), FieldKind::kBytes}};
    return writer->Add(key, fields);
  };
  struct Case {
    std::string key, field, says;
  };
  const Case cases[] = {
      {"photo.v2", "jpg", "'.' in its last part 'photo.v2'"},
      {"__meta__/a", "jpg", "__*__"},
      {"../up", "jpg", "'..'"},
      {"", "jpg", "is empty"},
      {"/abs", "jpg", "absolute"},
      {"a\nb", "jpg", "control"},
      {"ok", "JPG", "upper-case"},
      {"ok", "mask/png", "'/'"},
      {"ok", "", "field name '' is empty"},
      {"ok", "cls", "decimal integer, not 'x'"},
  };
  for (const Case& c : cases) {
    Status s = add(c.key, c.field);
    ASSERT_FALSE(s.ok()) << c.key << "." << c.field;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
    EXPECT_NE(s.message().find(c.says), std::string::npos) << s.message();
  }
  EXPECT_FALSE(writer->Add("empty", {}).ok());
  const SampleField twice[] = {{"jpg", Bytes(payload)}, {"jpg", Bytes(payload)}};
  Status s = writer->Add("twice", twice);
  EXPECT_NE(s.message().find("field 'jpg' twice"), std::string::npos) << s.message();

  ASSERT_OK(add("first", "jpg"));
  s = add("first", "png");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'first' given twice (samples 0 and 1)"), std::string::npos) << s.message();
  // A field name with dots is WebDataset's way of naming a second file.
  const SampleField two[] = {{"jpg", Bytes(payload)}, {"mask.png", Bytes(payload)}};
  ASSERT_OK(writer->Add("second", two));
  ASSERT_OK_AND_ASSIGN(PackSummary summary, writer->Finish());
  EXPECT_EQ(summary.samples, 2u);
  ASSERT_OK_AND_ASSIGN(auto dataset, Dataset::Open(dir / "out"));
  EXPECT_EQ(dataset->field_names(), (std::vector<std::string>{"jpg", "mask.png"}));
  EXPECT_EQ(writer->Add("late", two).code(), StatusCode::kFailedPrecondition);
}

// Image fields pass the check pack makes, or the sample is refused naming
// it and nothing changes; kept on request, they are counted and named, in
// the summary and the index's note (which the loader reads), and only with
// a sample that is written.
TEST(DatasetWriter, ImageFieldsAreCheckedAsPackChecksThemAndKeptOnRequest) {
  TempDir dir;
  const std::string good = FakeImage("jpg", 200, 1), html = "<html>gone</html>", label = "1";
  for (const bool keep : {false, true}) {
    DatasetWriterOptions options;
    options.keep_bad_images = keep;
    const std::string out = dir / (keep ? "kept" : "refused");
    ASSERT_OK_AND_ASSIGN(auto writer, DatasetWriter::Create(out, options));
    const SampleField bad[] = {{"jpg", Bytes(good), FieldKind::kImage},
                               {"mask.png", Bytes(html), FieldKind::kImage},
                               {"cls", Bytes(label), FieldKind::kInt}};
    const SampleField gif[] = {{"jpg", Bytes("GIF89a\1\0\1\0"), FieldKind::kImage}};
    const SampleField empty[] = {{"png", {}, FieldKind::kImage}};
    // Declared as bytes, the same HTML is stored as bytes: the recorded kind decides.
    const SampleField opaque[] = {{"mask.png", Bytes(html), FieldKind::kBytes}};
    const SampleField bad_and_bad_key[] = {{"jpg", Bytes(html), FieldKind::kImage}};
    EXPECT_EQ(writer->Add("b.x", bad_and_bad_key).code(), StatusCode::kInvalidArgument);  // not counted
    const Status s1 = writer->Add("s1", bad), s2 = writer->Add("s2", gif), s3 = writer->Add("s3", empty);
    ASSERT_OK(writer->Add("s4", opaque));
    if (!keep) {
      for (const auto& [s, says] : {std::pair{s1, "sample 's1', field 'mask.png': not an image"},
                                    std::pair{s2, "sample 's2', field 'jpg': a GIF image"},
                                    std::pair{s3, "sample 's3', field 'png': 0 bytes, not an image"}}) {
        EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
        EXPECT_NE(s.message().find(says), std::string::npos) << s.message();
        EXPECT_NE(s.message().find("keep_bad_images keeps such images"), std::string::npos) << s.message();
      }
      ASSERT_OK(writer->Add("s1", std::span(bad).first(1)));  // the key was not taken
      ASSERT_OK_AND_ASSIGN(PackSummary summary, writer->Finish());
      EXPECT_EQ(summary.samples, 2u);
      EXPECT_EQ(summary.bad_images_kept, 0u);
      continue;
    }
    ASSERT_OK(s1);
    ASSERT_OK(s2);
    ASSERT_OK(s3);
    EXPECT_EQ(writer->Add("s1", bad).code(), StatusCode::kInvalidArgument);  // given twice: not written, not counted
    ASSERT_OK_AND_ASSIGN(PackSummary summary, writer->Finish());
    EXPECT_EQ(summary.samples, 4u);
    EXPECT_EQ(summary.bad_images_kept, 3u);
    ASSERT_EQ(summary.bad_images_named.size(), 3u);
    EXPECT_EQ(summary.bad_images_named[0].rfind("s1, field 'mask.png': not an image", 0), 0u)
        << summary.bad_images_named[0];
    EXPECT_EQ(summary.bad_images_named[2], "s3, field 'png': 0 bytes, not an image");
    ASSERT_OK_AND_ASSIGN(auto dataset, Dataset::Open(out));
    EXPECT_EQ(dataset->bad_images_kept(), 3u);
    EXPECT_NE(dataset->first_bad_image().find("s1, field 'mask.png'"), std::string::npos) << dataset->first_bad_image();
    ASSERT_OK_AND_ASSIGN(auto stored, dataset->ReadField(0, *dataset->FieldIndex("mask.png")));
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(stored.data()), stored.size()), html);  // as given
  }
}

TEST(DatasetWriter, DroppedUnfinishedLeavesNothingAndAnEmptyOneIsAnError) {
  TempDir dir;
  {
    DatasetWriterOptions options;
    options.target_shard_bytes = 8192;
    ASSERT_OK_AND_ASSIGN(auto writer, DatasetWriter::Create(dir / "out", options));
    ASSERT_OK(WriteSamples(*writer, 7));  // several shards published, one open
  }
  EXPECT_EQ(Entries(dir / "out"), std::vector<std::string>{});
  ASSERT_OK_AND_ASSIGN(auto writer, DatasetWriter::Create(dir / "out"));
  auto r = writer->Finish();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("no samples were written"), std::string::npos) << r.error().message();
}

TEST(DatasetWriter, ADiskFullWriteFailsEveryLaterCallAndLeavesNothing) {
  TempDir dir;
  FaultFileSystem fs;
  fs.disk_full_after = 20'000;
  DatasetWriterOptions options;
  options.target_shard_bytes = 8192;
  options.file_system = &fs;
  {
    ASSERT_OK_AND_ASSIGN(auto writer, DatasetWriter::Create(dir / "out", options));
    Status s = WriteSamples(*writer, 10);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.message();
    const std::string label = "1";
    const SampleField fields[] = {{"cls", Bytes(label), FieldKind::kInt}};
    Status later = writer->Add("later", fields);
    EXPECT_EQ(later.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(later.message().find("No space left on device"), std::string::npos) << later.message();
    EXPECT_EQ(writer->Finish().error().code(), StatusCode::kFailedPrecondition);
  }
  EXPECT_EQ(Entries(dir / "out"), std::vector<std::string>{});
}

TEST(DatasetWriter, AForkedChildsCopyWritesNothingAndRemovesNothing) {
  TempDir dir;
  DatasetWriterOptions options;
  options.target_shard_bytes = 8192;
  ASSERT_OK_AND_ASSIGN(auto writer, DatasetWriter::Create(dir / "out", options));
  ASSERT_OK(WriteSamples(*writer, 5));  // shards published, one open
  const auto before = Entries(dir / "out");
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // What a multiprocessing worker forked mid-write would do: use it, then drop it.
    const std::string label = "1";
    const SampleField fields[] = {{"cls", Bytes(label), FieldKind::kInt}};
    const Status s = writer->Add("from-child", fields);
    const bool refused = s.code() == StatusCode::kFailedPrecondition &&
                         s.message().find("forked child") != std::string::npos &&
                         writer->Finish().error().code() == StatusCode::kFailedPrecondition;
    writer.reset();
    ::_exit(refused ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's calls were not refused";
  EXPECT_EQ(Entries(dir / "out"), before);  // its copy removed nothing
  ASSERT_OK(WriteSamples(*writer, 0));
  ASSERT_OK_AND_ASSIGN(PackSummary summary, writer->Finish());
  EXPECT_EQ(summary.samples, 5u);
  ASSERT_OK_AND_ASSIGN(auto dataset, Dataset::Open(dir / "out"));
  ASSERT_OK_AND_ASSIGN(auto report, Verify(*dataset));
  EXPECT_TRUE(report.ok());
}

TEST(DatasetWriter, RefusesAFolderHoldingADatasetUnlessToldToReplaceIt) {
  TempDir dir;
  {
    ASSERT_OK_AND_ASSIGN(auto writer, DatasetWriter::Create(dir / "out"));
    ASSERT_OK(WriteSamples(*writer, 3));
    ASSERT_OK(writer->Finish().status());
  }
  auto again = DatasetWriter::Create(dir / "out");
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code(), StatusCode::kAlreadyExists);
  EXPECT_NE(again.error().message().find("overwrite=True"), std::string::npos) << again.error().message();
  DatasetWriterOptions replace;
  replace.overwrite = true;
  ASSERT_OK_AND_ASSIGN(auto writer, DatasetWriter::Create(dir / "out", replace));
  ASSERT_OK(WriteSamples(*writer, 1));
  ASSERT_OK(writer->Finish().status());
  ASSERT_OK_AND_ASSIGN(auto dataset, Dataset::Open(dir / "out"));
  EXPECT_EQ(dataset->num_samples(), 1u);
}

}  // namespace
}  // namespace stoker
