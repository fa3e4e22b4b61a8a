// TokenDataset, TokenDatasetWriter and TokenLoader on files in a temporary
// folder: batches against the stream rebuilt by hand, exactly once over world
// sizes, resume under another world size, and bad input named.
#include "stoker/tokens.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <map>
#include <random>

#include "fault_file_system.h"
#include "test_util.h"
#include "token_test_util.h"

namespace stoker {
namespace {

using testing::ReadFile;
using testing::TempDir;
using testing::WriteFile;
using testing::WriteTokenCorpus;

std::vector<std::vector<std::int64_t>> Documents(int n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<std::int64_t>> docs(n);
  for (int d = 0; d < n; ++d) {
    docs[d].resize(rng() % 40);
    for (auto& t : docs[d]) t = static_cast<std::int64_t>(rng() % 1000);
  }
  return docs;
}

std::unique_ptr<TokenLoader> Make(std::shared_ptr<const TokenDataset> d, TokenLoaderOptions o) {
  auto made = TokenLoader::Create(std::move(d), o);
  EXPECT_TRUE(made.ok()) << made.error().ToString();
  return std::move(made).value();
}

TEST(TokenDataset, WritesAndReadsEveryTokenType) {
  TempDir dir;
  for (const char* type : {"uint16", "int32", "int64", "uint8", "int8", "int16", "float32", "float64"}) {
    auto docs = Documents(30, 1);
    for (auto& doc : docs)
      for (auto& t : doc) t = std::string(type) == "int8" ? t % 128 : std::string(type) == "uint8" ? t % 256 : t;
    auto dataset = WriteTokenCorpus(dir, docs, type);
    ASSERT_EQ(dataset->num_documents(), 30u);
    EXPECT_EQ(dataset->token_type(), type);
    for (std::size_t d = 0; d < docs.size(); ++d) {
      std::vector<std::int64_t> out(docs[d].size());
      ASSERT_OK(dataset->ReadTokens(d, 0, out));
      EXPECT_EQ(out, docs[d]);
    }
    std::filesystem::remove(dir / "corpus.idx");
    std::filesystem::remove(dir / "corpus.bin");
  }
  auto bad = TokenDatasetWriter::Create(dir / "x", "uint8");
  ASSERT_OK(bad.status());
  std::vector<std::int64_t> too_big = {1, 300};
  auto refused = (*bad)->AddDocument(too_big);
  EXPECT_NE(refused.message().find("token 300 at position 1 does not fit in uint8"), std::string::npos);
  EXPECT_FALSE(TokenDatasetWriter::Create(dir / "x", "bfloat16").ok());
}

TEST(TokenDataset, DamagedFilesAreNamed) {
  TempDir dir;
  WriteTokenCorpus(dir, Documents(10, 2));
  EXPECT_EQ(TokenDataset::Open(dir / "missing").error().code(), StatusCode::kNotFound);
  auto bin = ReadFile(dir / "corpus.bin");
  WriteFile(dir / "corpus.bin", bin.substr(0, bin.size() - 2));
  auto truncated = TokenDataset::Open(dir / "corpus");
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.error().message().find("corpus.idx"), std::string::npos) << truncated.error().message();
  WriteFile(dir / "corpus.bin", bin + "xx");
  auto longer = TokenDataset::Open(dir / "corpus");
  ASSERT_FALSE(longer.ok());
  EXPECT_NE(longer.error().message().find("the lengths do not add up to the .bin"), std::string::npos)
      << longer.error().message();
  EXPECT_EQ(TokenDatasetWriter::Create(dir / "corpus", "uint16").error().code(), StatusCode::kAlreadyExists);
}

TEST(TokenLoader, BatchesAreTheStreamsRowsWithLabelsPositionsAndSegments) {
  TempDir dir;
  const std::vector<std::vector<std::int64_t>> docs = {{1, 2, 3}, {}, {4, 5, 6, 7}, {8, 9}};
  auto dataset = WriteTokenCorpus(dir, docs);
  TokenLoaderOptions o;
  o.seq_len = 4;
  o.global_batch_size = 2;
  o.shuffle = false;
  o.with_documents = true;
  auto loader = Make(dataset, o);
  EXPECT_EQ(loader->num_rows(), 3u);
  ASSERT_OK_AND_ASSIGN(auto first, loader->Next());
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->rows, 2u);
  EXPECT_EQ(first->input_ids, (std::vector<std::int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(first->labels, (std::vector<std::int64_t>{2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(first->position_ids, (std::vector<std::int64_t>{0, 1, 2, 0, 1, 2, 3, 0}));
  EXPECT_EQ(first->cu_seqlens, (std::vector<std::int32_t>{0, 3, 4, 7, 8}));
  ASSERT_EQ(first->pieces.size(), 2u);
  EXPECT_EQ(first->pieces[1].size(), 2u);
  ASSERT_OK_AND_ASSIGN(auto last, loader->Next());
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->rows, 1u);
  EXPECT_EQ(last->input_ids, (std::vector<std::int64_t>{9, 0, 0, 0}));  // padded with pad_id
  EXPECT_EQ(last->labels, (std::vector<std::int64_t>{-100, -100, -100, -100}));
  EXPECT_EQ(last->position_ids, (std::vector<std::int64_t>{1, 0, 0, 0}));
  EXPECT_EQ(last->cu_seqlens, (std::vector<std::int32_t>{0, 1, 4}));
  ASSERT_OK_AND_ASSIGN(auto end, loader->Next());
  EXPECT_FALSE(end.has_value());
  EXPECT_EQ(loader->epoch(), 1u);
  const TokenLoaderStats stats = loader->Stats();
  EXPECT_EQ(stats.batches, 2u);  // the epoch's end is not a batch
  EXPECT_EQ(stats.rows, 3u);
  EXPECT_EQ(stats.tokens, 9u);  // the padding of the last row is not counted
  EXPECT_GE(stats.batches_built, 2u);
  EXPECT_GT(stats.build_seconds, 0.0);
}

TEST(TokenLoader, WithoutLabelsAcrossDocumentsADocumentsLastTokenHasNoLabel) {
  TempDir dir;
  auto dataset = WriteTokenCorpus(dir, {{1, 2, 3}, {}, {4, 5, 6, 7}, {8, 9}});
  TokenLoaderOptions o;
  o.seq_len = 4;
  o.global_batch_size = 2;
  o.shuffle = false;
  o.labels_across_documents = false;
  auto loader = Make(dataset, o);
  ASSERT_OK_AND_ASSIGN(auto first, loader->Next());
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->input_ids, (std::vector<std::int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  // 4 and 8 start documents: nothing before them predicts them. A document
  // going on in the next row keeps its label (5 follows 4).
  EXPECT_EQ(first->labels, (std::vector<std::int64_t>{2, 3, -100, 5, 6, 7, -100, 9}));
  // A document starting the next row: the row's last label goes too.
  o.seq_len = 3;
  loader = Make(dataset, o);
  ASSERT_OK_AND_ASSIGN(auto rows_of_three, loader->Next());
  ASSERT_TRUE(rows_of_three.has_value());
  EXPECT_EQ(rows_of_three->input_ids, (std::vector<std::int64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(rows_of_three->labels, (std::vector<std::int64_t>{2, 3, -100, 5, 6, 7}));
}

// Each (document, token) once per epoch over the ranks of any world size, and
// resumed under another world size from a rank's state.
TEST(TokenLoader, ExactlyOnceOverWorldSizesAndAcrossAResume) {
  TempDir dir;
  const auto docs = Documents(60, 3);
  auto dataset = WriteTokenCorpus(dir, docs);
  std::uint64_t total = 0;
  for (const auto& d : docs) total += d.size();
  auto collect = [&](TokenLoader& l, std::map<std::pair<std::uint64_t, std::uint64_t>, int>& seen,
                     std::uint64_t batches) {
    for (std::uint64_t b = 0; b < batches; ++b) {
      auto next = l.Next();
      ASSERT_TRUE(next.ok()) << next.error().ToString();
      if (!next->has_value()) return;
      for (const auto& row : (*next)->pieces)
        for (const auto& p : row)
          for (std::uint64_t t = p.offset; t < p.offset + p.length; ++t) seen[{p.document, t}]++;
    }
  };
  TokenLoaderOptions o;
  o.seq_len = 16;
  o.global_batch_size = 5;
  o.seed = 9;
  o.with_documents = true;
  for (std::uint32_t world : {1u, 2u, 3u, 7u}) {
    std::map<std::pair<std::uint64_t, std::uint64_t>, int> seen;
    for (std::uint32_t rank = 0; rank < world; ++rank) {
      o.rank = rank;
      o.world_size = world;
      auto loader = Make(dataset, o);
      collect(*loader, seen, 1000);
    }
    EXPECT_EQ(seen.size(), total) << "world " << world;
    for (const auto& [token, count] : seen) ASSERT_EQ(count, 1);
  }

  // Two ranks take 3 batches, then three ranks resume from rank 0's state.
  std::map<std::pair<std::uint64_t, std::uint64_t>, int> seen;
  TokenLoaderState state;
  for (std::uint32_t rank = 0; rank < 2; ++rank) {
    o.rank = rank;
    o.world_size = 2;
    auto loader = Make(dataset, o);
    collect(*loader, seen, 3);
    if (rank == 0) state = loader->State();
  }
  EXPECT_EQ(state.batches_consumed, 3u);
  for (std::uint32_t rank = 0; rank < 3; ++rank) {
    o.rank = rank;
    o.world_size = 3;
    auto loader = Make(dataset, o);
    ASSERT_OK(loader->Restore(state));
    collect(*loader, seen, 1000);
  }
  EXPECT_EQ(seen.size(), total);
  for (const auto& [token, count] : seen) ASSERT_EQ(count, 1);

  // Reshard in place: the same rows from the same position.
  o.rank = 0;
  o.world_size = 1;
  auto alone = Make(dataset, o);
  ASSERT_OK(alone->Restore(state));
  std::map<std::pair<std::uint64_t, std::uint64_t>, int> rest;
  collect(*alone, rest, 1000);
  auto resharded = Make(dataset, o);
  ASSERT_OK(resharded->Reshard(1, 2));
  ASSERT_OK(resharded->Reshard(0, 1));
  ASSERT_OK(resharded->Restore(state));
  std::map<std::pair<std::uint64_t, std::uint64_t>, int> again;
  collect(*resharded, again, 1000);
  EXPECT_EQ(rest, again);
}

// A forked child (DataLoader workers, multiprocessing's "fork") copies the
// loader but not its producer thread: its calls fail at once, naming why,
// where they used to wait forever.
TEST(TokenLoader, AForkedChildIsToldItCannotUseItsParentsLoader) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer does not support forking a process with threads; runs in the other builds";
#endif
  TempDir dir;
  TokenLoaderOptions o;
  o.seq_len = 8;
  o.global_batch_size = 2;
  auto loader = Make(WriteTokenCorpus(dir, Documents(40, 5)), o);
  const pid_t child = ::fork();
  if (child == 0) {
    auto next = loader->Next();
    const bool refused = !next.ok() && next.error().code() == StatusCode::kFailedPrecondition &&
                         next.error().message().find("forked child") != std::string::npos;
    const bool set_epoch_refused = loader->SetEpoch(1).code() == StatusCode::kFailedPrecondition;
    loader.reset();  // the destructor must not wait for a thread the child does not have
    ::_exit(refused && set_epoch_refused ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child hung or crashed";
  EXPECT_EQ(WEXITSTATUS(status), 0);
  ASSERT_OK_AND_ASSIGN(auto batch, loader->Next());  // the parent's loader is unaffected
  EXPECT_TRUE(batch.has_value());
}

TEST(TokenLoader, BadOptionsStatesAndTokensAreRefused) {
  TempDir dir;
  auto dataset = WriteTokenCorpus(dir, Documents(20, 4));
  TokenLoaderOptions o;
  o.seq_len = 0;
  EXPECT_EQ(TokenLoader::Create(dataset, o).error().code(), StatusCode::kInvalidArgument);
  o.seq_len = 8;
  o.rank = 2;
  o.world_size = 2;
  EXPECT_FALSE(TokenLoader::Create(dataset, o).ok());
  o.rank = 0;
  auto loader = Make(dataset, o);
  TokenLoaderState other = loader->State();
  other.seed = 5;
  auto refused = loader->Restore(other);
  EXPECT_NE(refused.message().find("seed 5, this one has 0"), std::string::npos) << refused.message();
  other = loader->State();
  other.num_tokens += 1;
  EXPECT_FALSE(loader->Restore(other).ok());
  EXPECT_FALSE(loader->Reshard(3, 3).ok());

  o.vocab_size = 500;  // the documents' tokens go up to 999
  auto strict = Make(dataset, o);
  auto next = strict->Next();
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.error().code(), StatusCode::kCorruption);
  EXPECT_NE(next.error().message().find("outside the vocabulary (vocab_size 500)"), std::string::npos)
      << next.error().message();
}

TEST(TokenLoader, BlendsDatasetsByWeightEachTokenOncePerItsEpoch) {
  TempDir a_dir, b_dir;
  const auto a_docs = Documents(80, 11), b_docs = Documents(20, 12);
  auto a = WriteTokenCorpus(a_dir, a_docs);
  auto b = WriteTokenCorpus(b_dir, b_docs);
  TokenLoaderOptions o;
  o.seq_len = 8;
  o.global_batch_size = 4;
  o.seed = 3;
  o.with_documents = true;
  // Default weights (proportional to size): each dataset's every token exactly once a blend epoch.
  auto made = TokenLoader::Create({a, b}, {}, o);
  ASSERT_OK(made.status());
  std::map<std::tuple<std::uint32_t, std::uint64_t, std::uint64_t>, int> seen;
  for (;;) {
    ASSERT_OK_AND_ASSIGN(auto next, (*made)->Next());
    if (!next) break;
    for (const auto& row : next->pieces)
      for (const auto& p : row)
        for (std::uint64_t t = p.offset; t < p.offset + p.length; ++t) seen[{p.dataset, p.document, t}]++;
  }
  std::uint64_t total = 0;
  for (const auto& d : a_docs) total += d.size();
  for (const auto& d : b_docs) total += d.size();
  EXPECT_EQ(seen.size(), total);
  for (const auto& [token, count] : seen) ASSERT_EQ(count, 1);

  // 1:3 by weight: the small dataset gives three rows in four, and runs through its epochs.
  auto weighted = TokenLoader::Create({a, b}, {1, 3}, o);
  ASSERT_OK(weighted.status());
  std::uint64_t from_b = 0, rows = 0;
  for (int i = 0; i < 50; ++i) {
    ASSERT_OK_AND_ASSIGN(auto next, (*weighted)->Next());
    if (!next) continue;
    for (const auto& row : next->pieces) {
      ++rows;
      from_b += !row.empty() && row.front().dataset == 1;
    }
  }
  EXPECT_NEAR(static_cast<double>(from_b) / static_cast<double>(rows), 0.75, 0.02);
  TokenLoaderState state = (*weighted)->State();
  auto other = TokenLoader::Create({a, b}, {1, 2}, o);
  ASSERT_OK(other.status());
  auto refused = (*other)->Restore(state);
  EXPECT_NE(refused.message().find("another blend"), std::string::npos) << refused.message();

  EXPECT_FALSE(TokenLoader::Create({a, b}, {1}, o).ok());
  EXPECT_FALSE(TokenLoader::Create({a, b}, {0, 0}, o).ok());
  auto negative = TokenLoader::Create({a, b}, {1, -1}, o);
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.error().message().find("weight of dataset 1"), std::string::npos);
}

// kernel_readahead: the choice reaches the .bin's mapping (madvise), and
// says why; an unshuffled order and a corpus that fits keep the default.
TEST(TokenLoader, TheReadAheadChoiceReachesTheBinsMapping) {
  TempDir dir;
  WriteTokenCorpus(dir, Documents(50, 3));
  testing::FaultFileSystem fs;
  fs.record_advice = true;
  auto opened = TokenDataset::Open(dir / "corpus", &fs);
  ASSERT_TRUE(opened.ok()) << opened.error().ToString();
  std::shared_ptr<const TokenDataset> dataset = std::move(opened).value();
  EXPECT_EQ(dataset->bin_bytes(), dataset->num_tokens() * 2);  // uint16
  TokenLoaderOptions o;
  o.seq_len = 8;
  o.global_batch_size = 2;
  o.kernel_readahead = KernelReadahead::kOff;
  auto off = Make(dataset, o);
  EXPECT_FALSE(off->kernel_readahead());
  EXPECT_EQ(off->readahead_note(), "kernel read-ahead off for the token files (kernel_readahead=off)");
  EXPECT_EQ(fs.Advised().at(dir / "corpus.bin"), AccessPattern::kRandom);
  ASSERT_OK_AND_ASSIGN(auto batch, off->Next());
  ASSERT_TRUE(batch.has_value());  // reads go on as before
  off.reset();

  o.kernel_readahead = KernelReadahead::kAuto;  // a corpus this small fits any page cache
  auto fits = Make(dataset, o);
  EXPECT_TRUE(fits->kernel_readahead());
  EXPECT_NE(fits->readahead_note().find("fit the page cache"), std::string::npos) << fits->readahead_note();
  EXPECT_EQ(fs.Advised().at(dir / "corpus.bin"), AccessPattern::kNormal);
  fits.reset();
  o.shuffle = false;
  auto in_order = Make(dataset, o);
  EXPECT_EQ(in_order->readahead_note(),
            "kernel read-ahead on for the token files: an unshuffled order reads them front to back");
}

}  // namespace
}  // namespace stoker
