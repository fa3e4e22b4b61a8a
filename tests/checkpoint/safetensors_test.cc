#include "checkpoint/safetensors.h"

#include <cstring>

#include <gtest/gtest.h>

namespace stoker::safetensors {
namespace {

std::string Header(const std::string& json, std::size_t data_bytes) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
  return out + json + std::string(data_bytes, '\x01');
}

Result<ParsedFile> ParseString(const std::string& s) {
  return Parse(std::as_bytes(std::span(s)), "t.safetensors");
}

TEST(Safetensors, EncodeIsPaddedToEightWithSpacesAndParsesBack) {
  std::vector<TensorLayout> tensors = {{"w", TensorDType::kFloat32, {2, 3}, 0, 24},
                                       {"b", TensorDType::kBFloat16, {3}, 24, 30},
                                       {"f8", TensorDType::kFloat8E4M3, {2}, 30, 32},
                                       {"scalar", TensorDType::kInt64, {}, 32, 40}};
  auto header = EncodeHeader(tensors, {{"format", "pt"}, {"note", "caf\xc3\xa9"}});
  ASSERT_TRUE(header.ok()) << header.error().ToString();
  std::uint64_t n = 0;
  std::memcpy(&n, header->data(), 8);
  EXPECT_EQ(n + 8, header->size());
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ((*header)[8], '{');
  EXPECT_EQ(header->substr(8, 16), R"({"__metadata__":)");
  std::string file = *header + std::string(40, '\0');
  auto parsed = ParseString(file);
  ASSERT_TRUE(parsed.ok()) << parsed.error().ToString();
  ASSERT_EQ(parsed->tensors.size(), 4u);
  EXPECT_EQ(parsed->tensors[1].name, "b");
  EXPECT_EQ(parsed->tensors[1].dtype, TensorDType::kBFloat16);
  EXPECT_EQ(parsed->tensors[3].shape.size(), 0u);
  EXPECT_EQ(parsed->metadata.at("note"), "caf\xc3\xa9");
  EXPECT_EQ(parsed->data_offset, header->size());
}

TEST(Safetensors, EveryDTypeRoundTripsByName) {
  for (int i = 0; i <= static_cast<int>(TensorDType::kFloat8E8M0); ++i) {
    auto dtype = static_cast<TensorDType>(i);
    EXPECT_EQ(ParseTensorDType(TensorDTypeName(dtype)), dtype) << TensorDTypeName(dtype);
  }
  EXPECT_EQ(TensorDTypeSize(TensorDType::kComplex64), 8u);
  EXPECT_FALSE(ParseTensorDType("F4").has_value());
  EXPECT_FALSE(ParseTensorDType("f32").has_value());
}

TEST(Safetensors, RejectsEveryBrokenRule) {
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ASSERT_TRUE(ParseString(Header(ok, 8)).ok());
  struct Case {
    std::string file;
    std::string expected;
  };
  std::string huge(8, '\0');
  huge[3] = 0x10;  // N = 256 MiB > 100 MB
  const std::vector<Case> cases = {
      {"1234", "shorter than the 8-byte"},
      {huge + "{}", "exceeds the limit"},
      {Header(ok, 8).substr(0, 20), "runs past the end"},
      {Header(" " + ok, 8), "does not start with '{'"},
      {Header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", 8), "not valid JSON"},
      {Header(
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
           8),
       "duplicate key 'a'"},
      {Header(R"({"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", 8), "unsupported dtype 'F33'"},
      {Header(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), "not a non-negative integer"},
      {Header(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), "needs 12 bytes"},
      {Header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8), "run backwards"},
      {Header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12), "a hole"},
      {Header(
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
           12),
       "an overlap"},
      {Header(ok, 12), "cover 8 bytes of a 12-byte"},
      {Header(ok, 4), "past the data buffer"},
      {Header(R"({"__metadata__":{"k":1},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8), "not a string"},
      {Header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1}})", 8), "unknown field 'extra'"},
      {Header(R"({"a":{"dtype":"F32","shape":[4611686018427387904,8],"data_offsets":[0,8]}})", 8), "overflows"},
      {Header(R"([1,2])", 0), "does not start with '{'"},
  };
  for (const auto& c : cases) {
    auto r = ParseString(c.file);
    ASSERT_FALSE(r.ok()) << c.expected;
    EXPECT_EQ(r.error().code(), StatusCode::kCorruption);
    EXPECT_NE(r.error().message().find(c.expected), std::string::npos) << r.error().message();
    EXPECT_NE(r.error().message().find("t.safetensors"), std::string::npos);
  }
}

TEST(Safetensors, EncodeRefusesInvalidNames) {
  std::vector<TensorLayout> bad_utf8 = {{"\xff", TensorDType::kUInt8, {1}, 0, 1}};
  EXPECT_FALSE(EncodeHeader(bad_utf8, {}).ok());
  std::vector<TensorLayout> reserved = {{"__metadata__", TensorDType::kUInt8, {1}, 0, 1}};
  EXPECT_FALSE(EncodeHeader(reserved, {}).ok());
}

}  // namespace
}  // namespace stoker::safetensors
