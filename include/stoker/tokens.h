// stoker/tokens.h: token streams for language models. Megatron-LM's indexed
// datasets (PREFIX.idx + PREFIX.bin) read and written bit-compatibly, and a
// loader that packs their documents into rows of seq_len tokens, shuffled
// by stoker's own PRNG, every token of every document exactly once an
// epoch, resumable under another world size with the same global batch.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/file_system.h"
#include "stoker/remote.h"
#include "stoker/status.h"

namespace stoker {

// Where a token dataset lives, when not on a local file system.
struct TokenDatasetOptions {
  // http(s):// and s3:// prefixes: PREFIX.idx is fetched whole into the
  // cache folder; PREFIX.bin is read through the shard cache in chunks of
  // `chunk_bytes`, fetched by HTTP range as the loader will need them (see
  // TokenDataset::PlanReads) and evicted needed-furthest-first.
  RemoteOptions remote;
  std::uint64_t chunk_bytes = std::uint64_t{64} << 20;
};

// A run of a document's tokens.
struct TokenRange {
  std::uint64_t document = 0, offset = 0, length = 0;
};

// A Megatron indexed dataset, mapped (nothing read up front but the index's
// arrays, which opening checks: O(documents)), or read through the remote
// cache. Thread-safe to read.
class TokenDataset {
 public:
  // `prefix` names PREFIX.idx and PREFIX.bin on `file_system`, which must
  // outlive the dataset. NotFound names a missing file; Corruption names
  // the file and byte offset of what is wrong (a bad header, an unknown
  // token type, a sequence outside the .bin, boundaries that do not add up,
  // a .bin whose size is not the tokens' size).
  // On a remote file system (read_planner() set) the .bin is read in chunks
  // of `chunk_bytes` through its cache.
  [[nodiscard]] static Result<std::unique_ptr<TokenDataset>> Open(
      const std::string& prefix, FileSystem* file_system = FileSystem::Default(),
      std::uint64_t chunk_bytes = TokenDatasetOptions{}.chunk_bytes);
  // A local prefix, or an http(s):// or s3:// one (through the cache; its
  // errors name the URL). The .bin of a remote dataset is not fetched at
  // open: its size is checked as each chunk arrives.
  [[nodiscard]] static Result<std::unique_ptr<TokenDataset>> Open(const std::string& location,
                                                                  const TokenDatasetOptions& options);
  ~TokenDataset();
  TokenDataset(const TokenDataset&) = delete;
  TokenDataset& operator=(const TokenDataset&) = delete;

  [[nodiscard]] const std::string& prefix() const;
  [[nodiscard]] std::uint64_t num_documents() const;
  [[nodiscard]] std::uint64_t num_tokens() const;
  [[nodiscard]] std::string_view token_type() const;  // NumPy's name: "uint16", "int32", ...
  [[nodiscard]] std::uint64_t bin_bytes() const;      // the .bin's size: tokens x their size
  // Tokens of each document, in the dataset's order.
  [[nodiscard]] std::span<const std::uint64_t> document_tokens() const;
  // Tokens [offset, offset + out.size()) of document `document`, as int64.
  // InvalidArgument outside the document; Corruption naming the document
  // and position for a float token that is not a whole number (NaN, 3.5).
  [[nodiscard]] Status ReadTokens(std::uint64_t document, std::uint64_t offset, std::span<std::int64_t> out) const;

  // Read-ahead, for remote datasets (local ones have nothing to do): the
  // ranges a reader will read next, in order, appended to the cache's plan;
  // returns the plan's position at the first of them. AdvanceReads says
  // reading has reached a position; ResetReads forgets the plan (a jump).
  [[nodiscard]] bool remote() const;
  std::uint64_t PlanReads(std::span<const TokenRange> ranges) const;
  void AdvanceReads(std::uint64_t position) const;
  void ResetReads() const;
  // The remote cache's figures (zero for a local dataset).
  [[nodiscard]] RemoteStats remote_stats() const;
  // How the .bin will be read, for the kernel's read-ahead (its mapping's
  // MappedFile::AdviseAccess; a remote dataset's cached chunks). A hint:
  // what is read does not change. TokenLoaderOptions::kernel_readahead.
  void AdviseAccess(AccessPattern pattern) const;

  struct Impl;

 private:
  explicit TokenDataset(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Writes a Megatron indexed dataset one document at a time: tokens to
// PREFIX.bin as they come, PREFIX.idx at Finish(). Both are written under
// temporary names and renamed, the index last, so an interrupted write never
// leaves a dataset that opens. The output is byte-identical to Megatron-core's
// IndexedDatasetBuilder's (add_document per document) for the same tokens.
class TokenDatasetWriter {
 public:
  // `token_type`: "uint8", "int8", "int16", "uint16", "int32", "int64",
  // "float32" or "float64" (Megatron picks uint16 for vocabularies under
  // 65500 tokens, else int32). AlreadyExists when PREFIX.idx or .bin exists
  // and `overwrite` is false.
  [[nodiscard]] static Result<std::unique_ptr<TokenDatasetWriter>> Create(
      const std::string& prefix, std::string_view token_type, bool overwrite = false,
      FileSystem* file_system = FileSystem::Default());
  ~TokenDatasetWriter();  // abandons an unfinished write: its temporaries go
  // InvalidArgument for a token the type cannot hold (naming the document and position).
  [[nodiscard]] Status AddDocument(std::span<const std::int64_t> tokens);
  [[nodiscard]] std::uint64_t num_documents() const;
  [[nodiscard]] Status Finish();

  struct Impl;

 private:
  explicit TokenDatasetWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct TokenLoaderOptions {
  std::uint64_t seq_len = 2048;
  // Rows per global batch (every rank's together) and this rank's place; a
  // rank takes the contiguous share [r*B/W, (r+1)*B/W) of each global batch.
  std::uint32_t global_batch_size = 8;
  std::uint32_t rank = 0, world_size = 1;
  std::uint64_t seed = 0;
  bool shuffle = true;
  std::int64_t pad_id = 0;           // input_ids past the epoch's last token
  std::int64_t ignore_index = -100;  // labels without a next token
  // False: the label of each document's last token (the next document's
  // first token, which nothing in the document predicts) is ignore_index,
  // as Megatron's eod_mask_loss and Hugging Face's DataCollatorWithFlattening
  // leave it out of the loss.
  bool labels_across_documents = true;
  // Tokens at or above it are Corruption naming the document (0: unchecked).
  std::uint64_t vocab_size = 0;
  // Batches prepared ahead on the loader's thread.
  std::uint32_t prefetch = 2;
  // Remote datasets: the batches whose reads the cache is told ahead of
  // time (it downloads their chunks in that order and evicts the chunks
  // needed furthest ahead).
  std::uint32_t read_ahead_batches = 16;
  // Fill TokenBatch::pieces.
  bool with_documents = false;
  // The kernel's read-ahead on the .bin files. kAuto switches it off
  // (madvise MADV_RANDOM: a page fault reads only its page, not the pages
  // around it) for a shuffled order over .bin files larger than the page
  // cache can hold (measured at creation: MemAvailable, and each memory
  // cgroup's limit less its anonymous memory), where what the kernel reads around a
  // row is evicted before use; TokenLoader::readahead_note() says why.
  KernelReadahead kernel_readahead = KernelReadahead::kAuto;
};

struct TokenBatch {
  std::uint64_t epoch = 0;
  std::uint64_t batch_index = 0;  // global batch of the epoch
  std::uint32_t rows = 0;         // this rank's share
  // The epoch's row (in the epoch's order, every rank's together) of this
  // share's first: rows [first_row, first_row + rows) of global batch
  // batch_index. Ids for exactly-once checks, whatever the world size.
  std::uint64_t first_row = 0;
  std::uint64_t seq_len = 0;
  // [rows, seq_len] each, row-major.
  std::vector<std::int64_t> input_ids;
  // The next token of the stream; ignore_index past the end (and before
  // each document start without labels_across_documents).
  std::vector<std::int64_t> labels;
  std::vector<std::int64_t> position_ids;  // each token's position in its document
  // Segment boundaries over the flattened rows (int32, as flash-attention's
  // varlen kernels take them): each row's pieces, then its padding, in
  // order; from 0 to rows * seq_len.
  std::vector<std::int32_t> cu_seqlens;
  // With TokenLoaderOptions::with_documents: each row's pieces.
  struct Piece {
    std::uint32_t dataset = 0;  // in TokenLoader::Create's list
    std::uint64_t document = 0, offset = 0, length = 0;
  };
  std::vector<std::vector<Piece>> pieces;
};

// What a TokenLoader has done since creation (TokenLoader::Stats()).
struct TokenLoaderStats {
  std::uint64_t batches = 0;  // handed out by Next() (this rank's shares)
  std::uint64_t rows = 0;
  std::uint64_t tokens = 0;  // input tokens, not padding
  // Next() waited for a batch not ready yet: the training loop's data wait.
  double wait_seconds = 0;
  // The producer thread reading and packing batches (page faults on the
  // .bin files and remote datasets' downloads included); its share of the
  // wall time says whether the one thread keeps up.
  double build_seconds = 0;
  std::uint64_t batches_built = 0;
};

// Where a TokenLoader is: enough to resume exactly, under another world
// size too (same global batch, seed, seq_len and dataset).
struct TokenLoaderState {
  std::uint64_t seed = 0, epoch = 0, global_batch_size = 0, seq_len = 0;
  std::uint64_t batches_consumed = 0;               // global batches of this epoch handed out
  std::uint64_t num_tokens = 0, num_documents = 0;  // of the datasets together, to catch a mismatched restore
  std::uint64_t blend = 0;                          // xxh3 of each dataset's counts and weight: the same blend
};

class TokenLoader {
 public:
  [[nodiscard]] static Result<std::unique_ptr<TokenLoader>> Create(std::shared_ptr<const TokenDataset> dataset,
                                                                   const TokenLoaderOptions& options);
  // Several datasets blended by `weights` (one per dataset, >= 0, not all
  // zero; empty: proportional to each dataset's rows, so that each is read
  // exactly once a blend epoch). A blend epoch is the rows of the datasets
  // of weight above zero; each row's dataset is chosen by error diffusion
  // (the dataset furthest behind its weight's share, as Megatron blends),
  // so over any 1,000 consecutive rows each dataset's share is within 0.2%
  // of its weight; a dataset that runs out starts its own next epoch (a new
  // shuffle). At most 256 datasets.
  [[nodiscard]] static Result<std::unique_ptr<TokenLoader>> Create(
      std::vector<std::shared_ptr<const TokenDataset>> datasets, std::vector<double> weights,
      const TokenLoaderOptions& options);
  ~TokenLoader();
  // This rank's share of the next global batch, or nullopt at the end of
  // the epoch (the next call starts the next one). In a child forked from
  // the process that made the loader, this and every call that returns a
  // Status are FailedPrecondition (the producer thread did not survive the fork).
  [[nodiscard]] Result<std::optional<TokenBatch>> Next();
  // The same, waiting at most `timeout`: DeadlineExceeded when no batch is ready by then.
  [[nodiscard]] Result<std::optional<TokenBatch>> Next(std::chrono::nanoseconds timeout);
  [[nodiscard]] std::uint64_t epoch() const;
  [[nodiscard]] std::uint64_t num_batches() const;  // global batches an epoch
  [[nodiscard]] std::uint64_t num_rows() const;     // rows an epoch
  [[nodiscard]] Status SetEpoch(std::uint64_t epoch);
  [[nodiscard]] TokenLoaderState State() const;
  [[nodiscard]] Status Restore(const TokenLoaderState& state);
  [[nodiscard]] Status Reshard(std::uint32_t rank, std::uint32_t world_size);
  [[nodiscard]] TokenLoaderStats Stats() const;
  // TokenLoaderOptions::kernel_readahead as decided at creation, and why.
  [[nodiscard]] bool kernel_readahead() const;
  [[nodiscard]] const std::string& readahead_note() const;

  struct Impl;

 private:
  explicit TokenLoader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace stoker
