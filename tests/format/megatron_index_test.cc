#include "format/megatron_index.h"

#include <gtest/gtest.h>

#include <cstring>

#include "test_util.h"

namespace stoker::megatron {
namespace {

template <typename T>
void Put(std::vector<std::byte>& out, T v) {
  const std::size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

// The layout Megatron-core's _IndexWriter writes, spelled out: documents of 3, 0 and 2 uint16 tokens.
std::vector<std::byte> ByHand() {
  std::vector<std::byte> out;
  for (char c : std::string("MMIDIDX\0\0", 9)) out.push_back(static_cast<std::byte>(c));
  Put<std::uint64_t>(out, 1);
  Put<std::uint8_t>(out, 8);
  Put<std::uint64_t>(out, 3);
  Put<std::uint64_t>(out, 4);
  for (std::int32_t length : {3, 0, 2}) Put(out, length);
  for (std::int64_t pointer : {0, 6, 6}) Put(out, pointer);
  for (std::int64_t boundary : {0, 1, 2, 3}) Put(out, boundary);
  return out;
}

TEST(MegatronIndex, BuilderWritesMegatronsLayoutAndTheReaderReadsIt) {
  IndexBuilder builder(TokenType::kUInt16);
  for (std::uint64_t tokens : {3, 0, 2}) ASSERT_OK(builder.AddDocument(tokens));
  const auto bytes = builder.Finish();
  EXPECT_EQ(bytes, ByHand());
  ASSERT_OK_AND_ASSIGN(IndexView view, IndexView::Open(bytes, "c.idx", 10));
  EXPECT_EQ(view.token_type(), TokenType::kUInt16);
  EXPECT_EQ(view.num_sequences(), 3u);
  EXPECT_EQ(view.num_documents(), 3u);
  EXPECT_EQ(view.total_tokens(), 5u);
  EXPECT_EQ(view.length(2), 2);
  EXPECT_EQ(view.pointer(2), 6);
  EXPECT_EQ(view.boundary(3), 3);
  EXPECT_FALSE(view.has_modes());
  // Multimodal indexes carry one mode byte per sequence after the boundaries.
  auto with_modes = bytes;
  with_modes.insert(with_modes.end(), 3, std::byte{0});
  ASSERT_OK_AND_ASSIGN(IndexView modal, IndexView::Open(with_modes, "c.idx", 10));
  EXPECT_TRUE(modal.has_modes());
  EXPECT_EQ(TokenTypeForVocabulary(50257), TokenType::kUInt16);
  EXPECT_EQ(TokenTypeForVocabulary(128256), TokenType::kInt32);
}

TEST(MegatronIndex, BadIndexesAreNamedWithTheirOffset) {
  const auto good = ByHand();
  struct Case {
    std::size_t at;
    std::vector<std::byte> value;
    std::string says;
  };
  auto bytes_of = [](auto v) {
    std::vector<std::byte> out;
    Put(out, v);
    return out;
  };
  const std::vector<Case> cases = {
      {0, {std::byte{'X'}}, "bad magic"},
      {17, bytes_of(std::uint8_t{9}), "unknown token type code 9 (Megatron's are 1-8) (at byte 17)"},
      {18, bytes_of(std::uint64_t{1} << 40), "do not fit"},
      {34, bytes_of(std::int32_t{-1}), "sequence 0 has length -1 (at byte 34)"},
      {34 + 12 + 16, bytes_of(std::int64_t{9}), "sequence 2 (2 tokens at byte 9) lies outside the .bin (10 bytes)"},
      {34 + 36, bytes_of(std::int64_t{1}), "the first document boundary is 1, not 0"},
      {34 + 36 + 16, bytes_of(std::int64_t{0}), "document boundary 2 is 0: outside [1, 3] (at byte 86)"},
      {34 + 36 + 24, bytes_of(std::int64_t{2}), "the last document boundary is 2, not the sequence count 3"},
  };
  for (const auto& c : cases) {
    auto bad = good;
    ASSERT_LE(c.at + c.value.size(), bad.size());
    std::memcpy(bad.data() + c.at, c.value.data(), c.value.size());
    auto view = IndexView::Open(bad, "c.idx", 10);
    ASSERT_FALSE(view.ok()) << c.says;
    EXPECT_NE(view.error().message().find(c.says), std::string::npos) << view.error().message();
    EXPECT_TRUE(view.error().message().starts_with("c.idx: ")) << view.error().message();
  }
  auto version = good;
  version[9] = std::byte{2};
  EXPECT_EQ(IndexView::Open(version, "c.idx", 10).error().code(), StatusCode::kUnimplemented);
  EXPECT_FALSE(IndexView::Open(std::span(good).first(20), "c.idx", 10).ok());
  auto extra = good;
  extra.push_back(std::byte{0});
  auto trailing = IndexView::Open(extra, "c.idx", 10);
  ASSERT_FALSE(trailing.ok());
  EXPECT_NE(trailing.error().message().find("1 bytes follow the document boundaries"), std::string::npos);
  EXPECT_FALSE(IndexView::Open(good, "c.idx", 9).ok()) << "a .bin too short for the last sequence";
  IndexBuilder huge(TokenType::kInt32);
  EXPECT_FALSE(huge.AddDocument(std::uint64_t{1} << 31).ok());
}

}  // namespace
}  // namespace stoker::megatron
