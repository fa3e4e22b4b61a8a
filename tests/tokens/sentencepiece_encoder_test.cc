// SentencePieceEncoder on a model trained here (libsentencepiece_train): a
// batch on many threads gives each text's own encoding, in order; pieces the
// model lacks have no id; missing and malformed models are named.
#include "stoker/sentencepiece.h"

#include <gtest/gtest.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <string>
#include <vector>

#include "test_util.h"

namespace stoker {
namespace {

using stoker::testing::TempDir;
using stoker::testing::WriteFile;

// Text with a small vocabulary of made-up words, deterministic.
std::string Sentence(std::uint64_t seed) {
  static const char* kSyllables[] = {"ka", "lo", "mi", "tor", "ven", "sa", "pe", "ru", "zel", "dan", "o", "ix"};
  std::string out;
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  const int words = 3 + static_cast<int>(seed % 9);
  for (int w = 0; w < words; ++w) {
    if (w) out += ' ';
    for (int s = 0; s < 1 + static_cast<int>((x >> 7) % 3); ++s) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      out += kSyllables[x % 12];
    }
  }
  return out;
}

class SentencePieceEncoderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string corpus;
    for (std::uint64_t i = 0; i < 2000; ++i) corpus += Sentence(i) + "\n";
    WriteFile(dir_ / "corpus.txt", corpus);
    const auto status = sentencepiece::SentencePieceTrainer::Train(
        "--input=" + (dir_ / "corpus.txt") + " --model_prefix=" + (dir_ / "m") +
        " --vocab_size=120 --model_type=unigram --minloglevel=2 --num_threads=1");
    ASSERT_TRUE(status.ok()) << status.ToString();
    model_ = dir_ / "m.model";
  }
  TempDir dir_;
  std::string model_;
};

TEST_F(SentencePieceEncoderTest, BatchOnManyThreadsIsEachTextsOwnEncodingInOrder) {
  auto encoder = SentencePieceEncoder::Open(model_);
  ASSERT_TRUE(encoder.ok()) << encoder.error().ToString();
  sentencepiece::SentencePieceProcessor reference;
  ASSERT_TRUE(reference.Load(model_).ok());
  std::vector<std::string> texts;
  for (std::uint64_t i = 5000; i < 5600; ++i) texts.push_back(Sentence(i));
  texts.push_back("");                         // an empty document
  texts.push_back("unseen qqq \xE2\x82\xAC");  // characters the model never saw
  std::vector<std::string_view> views(texts.begin(), texts.end());
  for (unsigned threads : {1u, 3u, 8u, 0u}) {
    auto batch = (*encoder)->EncodeBatch(views, threads);
    ASSERT_TRUE(batch.ok()) << batch.error().ToString();
    ASSERT_EQ(batch->size(), texts.size());
    for (std::size_t i = 0; i < texts.size(); ++i) {
      std::vector<int> want;
      ASSERT_TRUE(reference.Encode(texts[i], &want).ok());
      ASSERT_EQ((*batch)[i], std::vector<std::int32_t>(want.begin(), want.end())) << "text " << i << ", " << threads;
    }
    EXPECT_TRUE((*batch)[texts.size() - 2].empty());
  }
  auto none = (*encoder)->EncodeBatch({}, 4);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST_F(SentencePieceEncoderTest, VocabularyPiecesAndEos) {
  auto encoder = SentencePieceEncoder::Open(model_);
  ASSERT_TRUE(encoder.ok()) << encoder.error().ToString();
  EXPECT_EQ((*encoder)->vocab_size(), 120u);
  // SentencePiece's defaults: <unk> 0, <s> 1, </s> 2.
  EXPECT_EQ((*encoder)->eos_id(), std::optional<std::int32_t>(2));
  EXPECT_EQ((*encoder)->PieceId("</s>"), std::optional<std::int32_t>(2));
  EXPECT_EQ((*encoder)->PieceId("<unk>"), std::optional<std::int32_t>(0));
  // Unknown pieces map to <unk> inside SentencePiece; here they have no id.
  EXPECT_EQ((*encoder)->PieceId("<|endoftext|>"), std::nullopt);
}

TEST_F(SentencePieceEncoderTest, MissingAndMalformedModelsAreNamed) {
  auto missing = SentencePieceEncoder::Open(dir_ / "nope.model");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.error().message().find("nope.model"), std::string::npos) << missing.error().ToString();
  WriteFile(dir_ / "bad.model", "this is not a protobuf at all \xff\xff\xff");
  auto bad = SentencePieceEncoder::Open(dir_ / "bad.model");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.error().message().find("bad.model"), std::string::npos) << bad.error().ToString();
}

}  // namespace
}  // namespace stoker
