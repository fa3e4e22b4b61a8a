// SummarizeTokens, TokenDatasetPrefix and CheckTokens (`stoker inspect` and
// `stoker verify` of a Megatron token dataset), and float tokens that are
// not token ids named where the loader reads them.
#include "stoker/token_check.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "test_util.h"
#include "token_test_util.h"

namespace stoker {
namespace {

using testing::ReadFile;
using testing::TempDir;
using testing::WriteFile;
using testing::WriteTokenCorpus;

TEST(TokenCheck, SummaryCountsDocumentsTokensAndLengths) {
  TempDir dir;
  std::vector<std::vector<std::int64_t>> docs;
  for (int n : {5, 0, 1, 9, 3, 0, 7, 2, 4, 100}) docs.emplace_back(n, 1);
  const auto dataset = WriteTokenCorpus(dir, docs, "uint16");
  const TokenDatasetSummary s = SummarizeTokens(*dataset);
  EXPECT_EQ(s.documents, 10u);
  EXPECT_EQ(s.empty_documents, 2u);
  EXPECT_EQ(s.tokens, 131u);
  EXPECT_EQ(s.bin_bytes, 262u);
  EXPECT_EQ(s.token_type, "uint16");
  // Sorted: 0 0 1 2 3 4 5 7 9 100.
  EXPECT_EQ(s.min_tokens, 0u);
  EXPECT_EQ(s.median_tokens, 3u);
  EXPECT_EQ(s.p99_tokens, 9u);
  EXPECT_EQ(s.max_tokens, 100u);
  EXPECT_DOUBLE_EQ(s.mean_tokens, 13.1);
  const auto none = WriteTokenCorpus(dir, {}, "uint16", /*overwrite=*/true);
  EXPECT_EQ(SummarizeTokens(*none).documents, 0u);
  EXPECT_EQ(SummarizeTokens(*none).max_tokens, 0u);
}

TEST(TokenCheck, APrefixIsToldByItsIndexsMagic) {
  TempDir dir;
  WriteTokenCorpus(dir, {{1, 2, 3}}, "int32");
  const std::string prefix = dir / "corpus";
  EXPECT_EQ(TokenDatasetPrefix(prefix), prefix);
  EXPECT_EQ(TokenDatasetPrefix(prefix + ".idx"), prefix);
  EXPECT_EQ(TokenDatasetPrefix(prefix + ".bin"), prefix);
  EXPECT_EQ(TokenDatasetPrefix(dir / "missing"), std::nullopt);
  WriteFile(dir / "other.idx", "not megatron");
  EXPECT_EQ(TokenDatasetPrefix(dir / "other"), std::nullopt);  // a stoker index, or anything else
  EXPECT_EQ(TokenDatasetPrefix(dir.path()), std::nullopt);     // a folder
  EXPECT_EQ(TokenDatasetPrefix("https://host/lm/corpus.idx"), "https://host/lm/corpus");
  EXPECT_EQ(TokenDatasetPrefix("https://host/lm/corpus"), std::nullopt);  // told by trying to open it
}

TEST(TokenCheck, EveryTokenIsReadAndBadIdsAreNamed) {
  TempDir dir;
  const auto dataset = WriteTokenCorpus(dir, {{5, 0, 17}, {}, {3, -2, 99, 100}}, "int16");
  ASSERT_OK_AND_ASSIGN(auto any, CheckTokens(*dataset));
  EXPECT_EQ(any.documents_checked, 3u);
  EXPECT_EQ(any.tokens_checked, 7u);
  EXPECT_EQ(any.min_token, -2);
  EXPECT_EQ(any.max_token, 100);
  ASSERT_EQ(any.problems_total, 1u);  // a negative id, whatever the vocabulary
  EXPECT_EQ(any.problems[0].document, 2u);
  EXPECT_EQ(any.problems[0].position, 1u);
  EXPECT_EQ(any.problems[0].message, "document 2 holds token -2 at position 1: a negative id");

  TokenCheckOptions options;
  options.vocab_size = 99;
  options.max_problems = 2;
  std::uint64_t progress_documents = 0;
  options.on_progress = [&](std::uint64_t documents, std::uint64_t) { progress_documents = documents; };
  ASSERT_OK_AND_ASSIGN(auto vocab, CheckTokens(*dataset, options));
  EXPECT_EQ(vocab.problems_total, 3u);   // -2, 99, 100
  ASSERT_EQ(vocab.problems.size(), 2u);  // the first two listed
  EXPECT_EQ(vocab.problems[1].message,
            "document 2 holds token 99 at position 2, outside the vocabulary (vocab_size 99)");
  EXPECT_FALSE(vocab.ok());
  EXPECT_EQ(progress_documents, 3u);
}

// A corpus tokenized without its end-of-document token trains a model that
// never learns where a text ends: --eos names each document that does not
// end with it (and each empty one), reading across chunk boundaries.
TEST(TokenCheck, DocumentsThatDoNotEndWithTheEndOfDocumentTokenAreNamed) {
  TempDir dir;
  std::vector<std::int64_t> long_document(3'000'000, 7);  // three chunks of the check's reads
  long_document.back() = 2;
  const auto dataset = WriteTokenCorpus(dir, {{5, 9, 2}, long_document, {}, {3, 2, 3}}, "int32");
  TokenCheckOptions options;
  options.eos = 2;
  ASSERT_OK_AND_ASSIGN(auto report, CheckTokens(*dataset, options));
  ASSERT_EQ(report.problems_total, 2u);
  EXPECT_EQ(report.problems[0].message, "document 2 is empty: it has no end-of-document token 2");
  EXPECT_EQ(report.problems[1].message, "document 3 ends with token 3, not the end-of-document token 2");
  EXPECT_EQ(report.problems[1].position, 2u);
  ASSERT_OK_AND_ASSIGN(auto unchecked, CheckTokens(*dataset));
  EXPECT_TRUE(unchecked.ok());  // without eos, no document's ending is a problem
}

// A float .bin holding NaN or 2.5 where a token id belongs: converting it to
// int64 was undefined (NaN) or silently truncated; now the read and the check
// name the document and position.
TEST(TokenCheck, FloatTokensThatAreNotIdsAreNamed) {
  TempDir dir;
  WriteTokenCorpus(dir, {{1, 2, 3}, {4, 5}}, "float32");
  std::string bin = ReadFile(dir / "corpus.bin");
  const float nan = std::numeric_limits<float>::quiet_NaN(), half = 2.5f;
  std::memcpy(bin.data() + 4 * 1, &nan, 4);   // document 0, position 1
  std::memcpy(bin.data() + 4 * 4, &half, 4);  // document 1, position 1
  WriteFile(dir / "corpus.bin", bin);
  ASSERT_OK_AND_ASSIGN(auto dataset, TokenDataset::Open(dir / "corpus"));
  std::vector<std::int64_t> out(3);
  const Status read = dataset->ReadTokens(0, 0, out);
  EXPECT_EQ(read.code(), StatusCode::kCorruption);
  EXPECT_NE(read.message().find("document 0 holds nan at position 1 (byte 4)"), std::string::npos) << read.message();
  std::vector<std::int64_t> first(1);
  ASSERT_OK(dataset->ReadTokens(0, 0, first));  // the tokens before it read
  EXPECT_EQ(first[0], 1);
  ASSERT_OK_AND_ASSIGN(auto report, CheckTokens(*dataset));
  ASSERT_EQ(report.problems_total, 2u);
  EXPECT_NE(report.problems[1].message.find("document 1 holds 2.5 at position 1"), std::string::npos)
      << report.problems[1].message;
}

}  // namespace
}  // namespace stoker
