// How an epoch of a token dataset becomes rows: its documents, in an order
// shuffled by (seed, epoch) with stoker's own PRNG, make one stream of
// tokens, cut into rows of seq_len tokens (a document that does not fit is
// split across rows: the standard pretraining packing); the rows are then
// shuffled too, so that a batch does not hold neighbouring pieces of one
// stream. Every token of every document is in exactly one row of an epoch.
// Memory: 8 bytes per document and per row. Pure arithmetic.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace stoker::order {

// A run of one document's tokens.
struct TokenPiece {
  std::uint64_t document = 0;  // in the dataset's order
  std::uint64_t offset = 0;    // of its first token within the document
  std::uint64_t length = 0;
  friend bool operator==(const TokenPiece&, const TokenPiece&) = default;
};

class TokenEpochPlan {
 public:
  // `document_tokens[d]`: document d's token count. seq_len >= 1.
  TokenEpochPlan(std::span<const std::uint64_t> document_tokens, std::uint64_t seq_len, std::uint64_t seed,
                 std::uint64_t epoch, bool shuffle);

  [[nodiscard]] std::uint64_t num_rows() const { return rows_; }
  [[nodiscard]] std::uint64_t total_tokens() const { return stream_end_.empty() ? 0 : stream_end_.back(); }
  [[nodiscard]] std::uint64_t seq_len() const { return seq_len_; }
  [[nodiscard]] std::uint64_t epoch() const { return epoch_; }
  // Row `r` of the epoch (0 <= r < num_rows()) as the pieces of the stream
  // it holds, plus `extra` tokens after it (labels: the next token of the
  // stream); the pieces cover seq_len + extra tokens, fewer at the stream's
  // end. Appends to `out`.
  void Row(std::uint64_t r, std::uint64_t extra, std::vector<TokenPiece>& out) const;
  // The stream row behind epoch row `r` (its position before the rows were shuffled).
  [[nodiscard]] std::uint64_t StreamRow(std::uint64_t r) const { return row_order_.empty() ? r : row_order_[r]; }

 private:
  std::uint64_t seq_len_;
  std::uint64_t epoch_;
  std::uint64_t rows_ = 0;
  std::vector<std::uint64_t> document_order_;  // stream position -> document
  std::vector<std::uint64_t> stream_end_;      // stream position -> tokens up to and including that document
  std::vector<std::uint64_t> row_order_;       // epoch row -> stream row (empty: not shuffled)
};

// How several token datasets blend by weight. One blend epoch is
// sum(rows) rows; the dataset of each is chosen by error diffusion (the
// dataset furthest behind weight x rows-so-far, as Megatron's blending
// does), so over any run of consecutive rows each dataset's count is within
// two rows of its weight's share. The choice restarts identically each
// blend epoch, so a dataset takes `per_epoch(d)` rows every blend epoch;
// its k-th row overall is row k % rows(d) of its own epoch k / rows(d): a
// dataset that runs out starts its next epoch (a new shuffle), and every
// token of a dataset is taken once per its own epoch. Weights
// proportional to the datasets' rows (the default) take each dataset
// exactly once a blend epoch. Memory: 9 bytes per row of a blend epoch.
class BlendPlan {
 public:
  // `rows[d]` rows an epoch of dataset d; `weights[d]` >= 0, not all zero.
  BlendPlan(std::span<const std::uint64_t> rows, std::span<const double> weights);

  struct Source {
    std::uint32_t dataset = 0;
    std::uint64_t epoch = 0;  // the dataset's own
    std::uint64_t row = 0;    // in that epoch
  };
  [[nodiscard]] std::uint64_t rows_per_epoch() const { return choice_.size(); }
  [[nodiscard]] std::uint64_t per_epoch(std::uint32_t dataset) const { return per_epoch_[dataset]; }
  // Row `r` of blend epoch `epoch`.
  [[nodiscard]] Source At(std::uint64_t epoch, std::uint64_t r) const;

 private:
  std::vector<std::uint64_t> dataset_rows_;
  std::vector<std::uint64_t> per_epoch_;
  std::vector<std::uint8_t> choice_;   // blend row -> dataset (at most 256 datasets)
  std::vector<std::uint64_t> within_;  // blend row -> its index among its dataset's rows this blend epoch
};

}  // namespace stoker::order
