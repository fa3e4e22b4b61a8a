// Typed fields through the C++ loader (also run under ASan and TSan: worker
// threads write one batch's field columns side by side).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "pipeline/loader_test_util.h"

namespace stoker {
namespace {

std::shared_ptr<const Dataset> ManifestDataset(const TempDir& dir, int n) {
  std::string csv = "path,label,caption,score\n";
  for (int i = 0; i < n; ++i) {
    WriteFile(dir / ("m/img/" + std::to_string(i) + ".jpg"), MakeJpeg(40 + i, 32, 5 + i));
    csv += "img/" + std::to_string(i) + ".jpg," + std::to_string(i % 3) + ",caption " + std::to_string(i) + "," +
           std::to_string(i) + ".5\n";
  }
  WriteFile(dir / "m/list.csv", csv);
  auto packed = Pack(dir / "m/list.csv", dir / "out");
  EXPECT_TRUE(packed.ok()) << packed.error().ToString();
  return std::move(Dataset::Open(dir / "out")).value();
}

FieldSpec Spec(std::string name, FieldKind kind, std::string key) {
  FieldSpec s;
  s.name = std::move(name);
  s.kind = kind;
  s.keys = {std::move(key)};
  return s;
}

TEST(LoaderFields, EveryFieldArrivesDecodedBesideTheTransformedImage) {
  TempDir dir;
  constexpr int kSamples = 23;
  auto dataset = ManifestDataset(dir, kSamples);
  auto o = SmallOptions();
  o.threads = 3;
  o.batch_size = 5;
  o.shuffle = true;
  o.transform.dtype = DType::kUint8;
  o.transform.layout = Layout::kNHWC;
  FieldSpec image = Spec("image", FieldKind::kImage, "jpg");
  image.transformed = true;
  FieldSpec raw = Spec("raw", FieldKind::kImage, "jpg");
  raw.mode = "L";
  o.fields = {image, raw, Spec("caption", FieldKind::kText, "caption"), Spec("score", FieldKind::kFloat, "score"),
              Spec("label", FieldKind::kInt, "cls")};
  auto loader = Loader::Create(dataset, o);
  ASSERT_TRUE(loader.ok()) << loader.error().ToString();
  std::map<std::string, int> seen;
  for (;;) {
    auto next = (*loader)->Next();
    ASSERT_TRUE(next.ok()) << next.error().ToString();
    if (!next->has_value()) break;
    const Batch& b = **next;
    ASSERT_TRUE(b.has_images());
    ASSERT_EQ(b.num_fields(), 4u);
    EXPECT_EQ(b.field_specs()[0].name, "raw");
    for (std::uint32_t j = 0; j < b.size(); ++j) {
      const auto caption = b.field(1)[j];
      ASSERT_TRUE(caption.present);
      const int i = std::stoi(caption.bytes.substr(8));
      ++seen[caption.bytes];
      const FieldValue& gray = b.field(0)[j];
      ASSERT_TRUE(gray.present);
      EXPECT_EQ(gray.tensor.type, ElementType::kUInt8);
      EXPECT_EQ(gray.tensor.shape, (std::vector<std::int64_t>{32, 40 + i, 1}));
      double score = 0;
      std::memcpy(&score, b.field(2)[j].tensor.data.data(), 8);
      EXPECT_EQ(score, i + 0.5);
      std::int64_t label = 0;
      std::memcpy(&label, b.field(3)[j].tensor.data.data(), 8);
      EXPECT_EQ(label, i % 3);
      EXPECT_EQ(b.labels()[j], i % 3);
    }
  }
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(kSamples));
}

TEST(LoaderFields, FieldsWithoutAnImageNeedNoImageField) {
  TempDir dir;
  auto dataset = ManifestDataset(dir, 7);
  auto o = SmallOptions();
  o.batch_size = 7;
  o.fields = {Spec("caption", FieldKind::kBytes, "caption")};
  auto loader = Loader::Create(dataset, o);
  ASSERT_TRUE(loader.ok()) << loader.error().ToString();
  auto next = (*loader)->Next();
  ASSERT_TRUE(next.ok() && next->has_value());
  EXPECT_FALSE((*next)->has_images());
  EXPECT_EQ((*next)->field(0).size(), 7u);
}

TEST(LoaderFields, AReleasedFieldIsEmptyAndTheSlotFillsItAgain) {
  TempDir dir;
  auto dataset = ManifestDataset(dir, 18);
  auto o = SmallOptions();
  o.batch_size = 3;
  o.shuffle = false;
  o.fields = {Spec("raw", FieldKind::kImage, "jpg"), Spec("caption", FieldKind::kText, "caption")};
  auto loader = Loader::Create(dataset, o);
  ASSERT_TRUE(loader.ok()) << loader.error().ToString();
  for (int batch = 0; batch < 6; ++batch) {  // more batches than slots: released slots are filled again
    auto next = (*loader)->Next();
    ASSERT_TRUE(next.ok() && next->has_value());
    Batch& b = **next;
    for (const FieldValue& v : b.field(0)) ASSERT_TRUE(v.present && !v.tensor.data.empty());
    b.ReleaseField(0);
    for (const FieldValue& v : b.field(0)) EXPECT_TRUE(!v.present && v.tensor.data.capacity() == 0);
    for (const FieldValue& v : b.field(1)) EXPECT_TRUE(v.present && v.bytes.starts_with("caption "));
  }
}

TEST(LoaderFields, BadSpecsAreRefusedAtCreation) {
  TempDir dir;
  auto dataset = ManifestDataset(dir, 3);
  auto o = SmallOptions();
  o.fields = {Spec("x", FieldKind::kArray, "npy")};
  auto r = Loader::Create(dataset, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.error().message().find("names keys no sample"), std::string::npos) << r.error().message();
  o.fields = {Spec("x", FieldKind::kImage, "jpg")};
  o.fields[0].mode = "CMYK";
  EXPECT_EQ(Loader::Create(dataset, o).error().code(), StatusCode::kInvalidArgument);
  o.fields = {Spec("x", FieldKind::kText, "caption")};
  o.fields[0].transformed = true;
  EXPECT_EQ(Loader::Create(dataset, o).error().code(), StatusCode::kInvalidArgument);
}

// The index records each field's kind and count, so a spec that cannot work
// fails when the loader is made, not mid-epoch.
TEST(LoaderFields, SpecsAreCheckedAgainstTheIndexAtCreation) {
  TempDir dir;
  std::string csv = "path,caption,score\n";
  for (int i = 0; i < 6; ++i) {
    WriteFile(dir / ("m/" + std::to_string(i) + ".jpg"), MakeJpeg(40, 32, 5 + i));
    csv += std::to_string(i) + ".jpg," + (i % 3 == 1 ? "" : "c" + std::to_string(i)) + "," + std::to_string(i) + ".5\n";
  }
  WriteFile(dir / "m/list.csv", csv);
  ASSERT_OK(Pack(dir / "m/list.csv", dir / "out").status());
  std::shared_ptr<const Dataset> dataset = std::move(Dataset::Open(dir / "out")).value();
  auto o = SmallOptions();
  o.batch_size = 2;

  o.fields = {Spec("x", FieldKind::kArray, "jpg")};
  auto wrong_kind = Loader::Create(dataset, o);
  ASSERT_FALSE(wrong_kind.ok());
  EXPECT_NE(wrong_kind.error().message().find("reads key 'jpg', which dataset"), std::string::npos);
  EXPECT_NE(wrong_kind.error().message().find("records as image"), std::string::npos) << wrong_kind.error().message();
  o.fields = {Spec("x", FieldKind::kInt, "score")};
  EXPECT_FALSE(Loader::Create(dataset, o).ok()) << "a float's text is no integer";
  o.fields = {Spec("x", FieldKind::kText, "score")};
  EXPECT_TRUE(Loader::Create(dataset, o).ok()) << "numbers are text";

  o.fields = {Spec("c", FieldKind::kText, "caption")};
  auto lacking = Loader::Create(dataset, o);
  ASSERT_FALSE(lacking.ok());
  EXPECT_NE(lacking.error().message().find("2 of 6 samples"), std::string::npos) << lacking.error().message();
  EXPECT_NE(lacking.error().message().find("the first: sample '1' in shard-000000.tar"), std::string::npos)
      << lacking.error().message();
  o.fields[0].optional = true;
  EXPECT_TRUE(Loader::Create(dataset, o).ok());
  o.fields[0].optional = false;
  o.on_corrupt = CorruptPolicy::kSkip;
  EXPECT_TRUE(Loader::Create(dataset, o).ok()) << "skipped as they come, each counted";
}

TEST(LoaderFields, ExtensionsLoadOnceAndBadLibrariesAreRefused) {
  ASSERT_TRUE(LoadFieldExtension(STOKER_EXAMPLE_WAV_PCM16).ok());
  ASSERT_TRUE(LoadFieldExtension(STOKER_EXAMPLE_WAV_PCM16).ok());  // again: a no-op
  const auto names = FieldExtensionDecoders();
  EXPECT_NE(std::find(names.begin(), names.end(), "wav_pcm16"), names.end());
  EXPECT_EQ(LoadFieldExtension("/nonexistent/libx.so").code(), StatusCode::kNotFound);
  // A library without the entry point (libm is in every process).
  const Status no_entry = LoadFieldExtension("libm.so.6");
  EXPECT_EQ(no_entry.code(), StatusCode::kInvalidArgument) << no_entry.ToString();
  EXPECT_NE(no_entry.message().find("exports no stoker_field_decoders"), std::string::npos);
  // A custom field with a decoder nobody loaded is refused at creation.
  TempDir dir;
  auto dataset = ManifestDataset(dir, 2);
  auto o = SmallOptions();
  o.fields = {Spec("x", FieldKind::kCustom, "caption")};
  o.fields[0].decoder = "nope";
  auto r = Loader::Create(dataset, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("no field decoder 'nope' is loaded"), std::string::npos) << r.error().message();
  // The example decoder refuses text (not a WAV) as a corrupt sample.
  o.fields[0].decoder = "wav_pcm16";
  auto loader = Loader::Create(dataset, o);
  ASSERT_TRUE(loader.ok()) << loader.error().ToString();
  auto next = (*loader)->Next();
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.error().code(), StatusCode::kCorruption);
  EXPECT_NE(next.error().message().find("decoder 'wav_pcm16': not a RIFF/WAVE file"), std::string::npos)
      << next.error().message();
}

}  // namespace
}  // namespace stoker
