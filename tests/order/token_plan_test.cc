#include "order/token_plan.h"

#include <gtest/gtest.h>

#include <map>
#include <numeric>

namespace stoker::order {
namespace {

// Each document's tokens, by the rows that hold them: every token exactly once.
void ExpectEveryTokenOnce(const TokenEpochPlan& plan, const std::vector<std::uint64_t>& docs) {
  std::map<std::uint64_t, std::vector<int>> seen;
  for (std::size_t d = 0; d < docs.size(); ++d) seen[d].assign(docs[d], 0);
  std::vector<TokenPiece> pieces;
  for (std::uint64_t r = 0; r < plan.num_rows(); ++r) {
    pieces.clear();
    plan.Row(r, 0, pieces);
    std::uint64_t length = 0;
    for (const auto& p : pieces) {
      ASSERT_GT(p.length, 0u);
      ASSERT_LE(p.offset + p.length, docs[p.document]);
      for (std::uint64_t t = p.offset; t < p.offset + p.length; ++t) seen[p.document][t]++;
      length += p.length;
    }
    if (plan.StreamRow(r) + 1 < plan.num_rows()) {
      EXPECT_EQ(length, plan.seq_len()) << "row " << r;
    }
  }
  for (const auto& [d, counts] : seen)
    for (std::size_t t = 0; t < counts.size(); ++t) ASSERT_EQ(counts[t], 1) << "document " << d << " token " << t;
}

TEST(TokenPlan, EveryTokenOnceWhateverTheShapes) {
  const std::vector<std::uint64_t> docs = {5, 0, 17, 1, 64, 3, 0, 9, 31};
  for (std::uint64_t seq : {1, 4, 16, 64, 200}) {
    for (bool shuffle : {false, true}) {
      TokenEpochPlan plan(docs, seq, 7, 2, shuffle);
      EXPECT_EQ(plan.total_tokens(), 130u);
      EXPECT_EQ(plan.num_rows(), (130 + seq - 1) / seq);
      ExpectEveryTokenOnce(plan, docs);
    }
  }
}

TEST(TokenPlan, UnshuffledIsTheDocumentsInOrderAndExtraTokensAreTheNextOnes) {
  const std::vector<std::uint64_t> docs = {3, 0, 4, 2};
  TokenEpochPlan plan(docs, 4, 0, 0, false);
  std::vector<TokenPiece> row;
  plan.Row(0, 1, row);
  EXPECT_EQ(row, (std::vector<TokenPiece>{{0, 0, 3}, {2, 0, 2}}));  // 4 tokens + 1 for the labels
  row.clear();
  plan.Row(1, 1, row);
  EXPECT_EQ(row, (std::vector<TokenPiece>{{2, 1, 3}, {3, 0, 2}}));
  row.clear();
  plan.Row(2, 1, row);
  EXPECT_EQ(row, (std::vector<TokenPiece>{{3, 1, 1}})) << "the stream's end: no token after it";
}

TEST(TokenPlan, ShufflesAreDeterministicPerSeedAndEpoch) {
  std::vector<std::uint64_t> docs(200);
  std::iota(docs.begin(), docs.end(), 1);
  auto rows = [&](std::uint64_t seed, std::uint64_t epoch) {
    TokenEpochPlan plan(docs, 32, seed, epoch, true);
    std::vector<std::vector<TokenPiece>> out(plan.num_rows());
    for (std::uint64_t r = 0; r < plan.num_rows(); ++r) plan.Row(r, 0, out[r]);
    return out;
  };
  EXPECT_EQ(rows(1, 0), rows(1, 0));
  EXPECT_NE(rows(1, 0), rows(1, 1));
  EXPECT_NE(rows(1, 0), rows(2, 0));
}

TEST(BlendPlan, WeightsHoldOverEveryWindowAndEachDatasetRowsOncePerItsEpoch) {
  const std::vector<std::uint64_t> rows = {5000, 800, 2200};
  const std::vector<double> weights = {0.5, 0.3, 0.2};
  BlendPlan plan(rows, weights);
  ASSERT_EQ(plan.rows_per_epoch(), 8000u);
  std::vector<std::vector<int>> counts(3);
  for (std::size_t d = 0; d < 3; ++d) counts[d].assign(2 * plan.per_epoch(d), 0);  // two blend epochs' worth
  std::vector<int> window(3, 0);
  std::vector<std::uint32_t> chosen;
  for (std::uint64_t epoch = 0; epoch < 2; ++epoch)
    for (std::uint64_t r = 0; r < plan.rows_per_epoch(); ++r) {
      const auto s = plan.At(epoch, r);
      ASSERT_LT(s.row, rows[s.dataset]);
      ASSERT_LT(s.epoch * rows[s.dataset] + s.row, counts[s.dataset].size());
      counts[s.dataset][s.epoch * rows[s.dataset] + s.row]++;
      chosen.push_back(s.dataset);
    }
  // Over every window of 1,000 consecutive rows, each dataset within 2 rows (0.2%) of its weight's share.
  for (std::size_t i = 0; i < chosen.size(); ++i) {
    window[chosen[i]]++;
    if (i >= 1000) window[chosen[i - 1000]]--;
    if (i >= 999) {
      for (std::size_t d = 0; d < 3; ++d) ASSERT_NEAR(window[d], 1000 * weights[d], 2.0) << "at " << i;
    }
  }
  // Each dataset's rows in order: its k-th row overall is row k % rows of its own epoch k / rows, once.
  for (std::size_t d = 0; d < 3; ++d) {
    for (std::uint64_t k = 0; k < counts[d].size(); ++k) ASSERT_EQ(counts[d][k], 1) << d << " " << k;
  }
  EXPECT_GT(plan.per_epoch(1), rows[1]) << "the small dataset ran out and started its next epoch";
}

TEST(BlendPlan, WeightsProportionalToRowsReadEachDatasetOnceAnEpochAndZeroWeightsNone) {
  const std::vector<std::uint64_t> rows = {7, 0, 13, 4};
  BlendPlan proportional(rows, std::vector<double>{7, 0, 13, 4});
  EXPECT_EQ(proportional.rows_per_epoch(), 24u);
  for (std::uint32_t d = 0; d < 4; ++d) EXPECT_EQ(proportional.per_epoch(d), rows[d]);
  BlendPlan skip(rows, std::vector<double>{1, 0, 0, 1});
  EXPECT_EQ(skip.rows_per_epoch(), 11u);
  for (std::uint64_t r = 0; r < skip.rows_per_epoch(); ++r) EXPECT_NE(skip.At(0, r).dataset, 2u);
}

}  // namespace
}  // namespace stoker::order
