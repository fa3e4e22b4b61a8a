// Loading N tensors costs O(N): counted in operations, not seconds. Every
// JSON text of a checkpoint (the manifest with the state's structure, each
// safetensors header, the index) is parsed exactly once, and each tensor
// costs a fixed number of name look-ups, at 1,000 tensors as at 16,000.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "checkpoint/load_counted.h"
#include "checkpoint/manifest.h"
#include "stoker/checkpoint.h"
#include "test_util.h"

namespace stoker {
namespace {

using testing::TempDir;

struct Saved {
  std::string step_directory;
  std::uint64_t json_bytes_on_disk = 0;  // manifest, safetensors headers, index
};

std::uint64_t HeaderBytes(const std::filesystem::path& safetensors_file) {
  std::ifstream in(safetensors_file, std::ios::binary);
  unsigned char n[8] = {};
  in.read(reinterpret_cast<char*>(n), 8);
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | n[i];
  return v;
}

// An optimizer-shaped state of `tensors` tensors (three per parameter) with
// the structure JSON the Python package writes, saved in files of at most
// `max_file_bytes`.
Saved SaveState(const std::string& directory, std::size_t tensors, std::uint64_t max_file_bytes) {
  std::vector<float> data(tensors * 4, 1.0f);
  std::vector<TensorRef> refs;
  std::string structure = R"({"structure":{"d":[["optimizer",{"d":[["state",{"d":[)";
  const char* kinds[] = {"exp_avg", "exp_avg_sq", "step"};
  for (std::size_t i = 0; i < tensors; ++i) {
    const std::string param = std::to_string(i / 3);
    const std::string name = "optimizer.state." + param + "." + kinds[i % 3];
    refs.push_back({name, TensorDType::kFloat32, {4}, data.data() + 4 * i});
    if (i % 3 == 0) structure += std::string(i ? "," : "") + "[" + param + R"(,{"d":[)";
    structure += std::string(i % 3 ? "," : "") + "[\"" + kinds[i % 3] + "\",{\"t\":\"" + name + "\"}]";
    if (i % 3 == 2 || i + 1 == tensors) structure += R"(],"o":false}])";
  }
  structure += R"(],"o":false}]],"o":false}]],"o":false}})";

  CheckpointOptions options;
  options.directory = directory;
  options.max_file_bytes = max_file_bytes;
  auto ck = Checkpointer::Open(options);
  EXPECT_TRUE(ck.ok()) << ck.error().ToString();
  CheckpointExtras extras;
  extras.user_json = structure;
  EXPECT_TRUE((*ck)->Save(1, refs, extras).ok());
  EXPECT_TRUE((*ck)->Wait().ok());

  Saved saved;
  saved.step_directory = directory + "/step-1";
  for (const auto& entry : std::filesystem::directory_iterator(saved.step_directory)) {
    const auto name = entry.path().filename().string();
    if (name.ends_with(".safetensors"))
      saved.json_bytes_on_disk += HeaderBytes(entry.path());
    else
      saved.json_bytes_on_disk += std::filesystem::file_size(entry.path());  // manifest.json, the index
  }
  return saved;
}

struct Work {
  safetensors::ParseWork counted;
  std::uint64_t json_bytes_on_disk = 0;
};

Work LoadCounting(std::size_t tensors, std::uint64_t max_file_bytes) {
  TempDir dir;
  const Saved saved = SaveState(dir.path(), tensors, max_file_bytes);
  Work work;
  work.json_bytes_on_disk = saved.json_bytes_on_disk;
  auto loaded = checkpoint::LoadCheckpointCounted(saved.step_directory, {}, &work.counted);
  EXPECT_TRUE(loaded.ok()) << loaded.error().ToString();
  if (loaded.ok()) {
    EXPECT_EQ(loaded->tensors.size(), tensors);
  }
  return work;
}

TEST(LoadWork, EveryJsonTextIsParsedOnceAndLookupsAreLinear) {
  for (const std::uint64_t max_file_bytes : {std::uint64_t{4} << 30, std::uint64_t{8} << 10}) {
    SCOPED_TRACE(max_file_bytes == 8 << 10 ? "split into files with an index" : "one file");
    double lookups_per_tensor = 0;
    for (const std::size_t tensors : {1'000, 4'000, 16'000}) {
      SCOPED_TRACE(tensors);
      const Work w = LoadCounting(tensors, max_file_bytes);
      // Each byte of JSON once: the manifest (its user document cut out and
      // read apart, "null" standing in for it in the rest), every header and
      // the index. A re-parse or a copy of a header per tensor would show.
      EXPECT_GE(w.counted.json_bytes, w.json_bytes_on_disk);
      EXPECT_LE(w.counted.json_bytes, w.json_bytes_on_disk + 4);
      // A fixed number of look-ups per tensor: its header key, the name
      // index, the structure's reference (and the index's entry when split).
      const double per_tensor = static_cast<double>(w.counted.name_lookups) / tensors;
      EXPECT_LE(per_tensor, 4.01);
      if (lookups_per_tensor > 0) {
        EXPECT_NEAR(per_tensor, lookups_per_tensor, 0.01);
      }
      lookups_per_tensor = per_tensor;
    }
  }
}

// Integers written as floats out of every integer's range (checkpoint_manifest_fuzzer
// found 1e126 as the version) are refused as malformed, never converted.
TEST(ManifestUserDocument, IntegersOutOfRangeAsFloatsAreRefused) {
  for (const std::string& bad : {std::string(R"("version":1e126,"step":7)"), std::string(R"("version":1,"step":1e300)"),
                                 std::string(R"("version":1,"step":-2.5e40)")}) {
    const std::string text = R"({"format":"stoker-checkpoint",)" + bad +
                             R"(,"tensor_count":0,"tensor_bytes":0,"files":[],"loader_state":null,"rng_states":{},)"
                             R"("metadata":{},"metric":null,"user":null})";
    auto decoded = checkpoint::DecodeManifest(text, "m.json");
    ASSERT_FALSE(decoded.ok()) << bad;
    EXPECT_NE(decoded.error().ToString().find("m.json"), std::string::npos) << decoded.error().ToString();
  }
}

// The manifest's user document is cut out of the text, not parsed: it comes
// back byte for byte, whatever its strings hold; a "user" key spelled with
// escapes is still found (by the tree parse), and a malformed document is
// reported when the checkpoint is loaded.
TEST(ManifestUserDocument, ComesBackVerbatim) {
  const std::string user =
      R"({"structure":{"d":[["a}]\"{[",{"t":"a}]\"{["}],["s",{"v":"\u00e9"}]],"o":true}, "extra" : [1,  2]})";
  const std::string head =
      R"({"format":"stoker-checkpoint","version":1,"step":7,"tensor_count":0,"tensor_bytes":0,"files":[],)"
      R"("loader_state":null,"rng_states":{},"metadata":{},"metric":null,)";
  auto decoded = checkpoint::DecodeManifest(head + R"("user":)" + user + "}", "m.json");
  ASSERT_TRUE(decoded.ok()) << decoded.error().ToString();
  EXPECT_EQ(decoded->extras.user_json, user);
  auto encoded = checkpoint::EncodeManifest(*decoded);
  ASSERT_TRUE(encoded.ok()) << encoded.error().ToString();
  auto again = checkpoint::DecodeManifest(*encoded, "again.json");
  ASSERT_TRUE(again.ok()) << again.error().ToString();
  EXPECT_EQ(again->extras.user_json, user);

  auto escaped = checkpoint::DecodeManifest(head + R"("us\u0065r":{"k":[1]}})", "escaped.json");
  ASSERT_TRUE(escaped.ok()) << escaped.error().ToString();
  EXPECT_EQ(escaped->extras.user_json, R"({"k":[1]})");

  auto none = checkpoint::DecodeManifest(head + R"("user":null})", "none.json");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->extras.user_json, "");
  // Not parsed when decoded (listing needs only the rest), never written back.
  auto bad = checkpoint::DecodeManifest(head + R"("user":{"a":[1}]})", "bad.json");
  ASSERT_TRUE(bad.ok()) << bad.error().ToString();
  EXPECT_FALSE(checkpoint::EncodeManifest(*bad).ok());
}

TEST(ManifestUserDocument, MalformedIsCorruptionOnLoad) {
  TempDir dir;
  const Saved saved = SaveState(dir.path(), 3, std::uint64_t{4} << 30);
  const std::string manifest_path = saved.step_directory + "/manifest.json";
  std::ifstream in(manifest_path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto at = text.find("\"structure\":{");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 13, "\"structure\":[");  // an object opened as an array: brackets no longer match
  std::ofstream(manifest_path, std::ios::trunc) << text;
  auto loaded = LoadCheckpoint(saved.step_directory);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.error().code(), StatusCode::kCorruption);
  EXPECT_NE(loaded.error().message().find("not valid JSON"), std::string::npos) << loaded.error().ToString();
  EXPECT_NE(loaded.error().message().find(saved.step_directory), std::string::npos) << loaded.error().ToString();
}

}  // namespace
}  // namespace stoker
