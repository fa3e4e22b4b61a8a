// TokenLoader: rows of a token dataset's packed stream, batch by batch, one
// thread preparing batches ahead; exactly once an epoch over any world size.
#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <deque>
#include <thread>

#include <fmt/format.h>

#include "core/hash.h"
#include "core/mutex.h"
#include "core/owner_process.h"
#include "io/page_cache_room.h"
#include "io/read_access.h"
#include "order/token_plan.h"
#include "stoker/tokens.h"

namespace stoker {
namespace {

struct Position {
  std::uint64_t epoch = 0;
  std::uint64_t batch = 0;  // global batches of the epoch handed out (or produced)
  bool operator==(const Position&) const = default;
};

// A batch whose reads the remote cache was told of: the plan position of
// its first read in each dataset.
struct PlannedBatch {
  Position at;
  std::vector<std::uint64_t> starts;
};

struct Item {
  Position at;
  Result<std::optional<TokenBatch>> batch = std::optional<TokenBatch>();
  std::uint64_t tokens = 0;  // input tokens, not padding
};

}  // namespace

struct TokenLoader::Impl {
  std::vector<std::shared_ptr<const TokenDataset>> datasets;
  TokenLoaderOptions options;
  io::ReadAccessChoice read_access;  // as chosen at creation
  std::optional<order::BlendPlan> blend;
  std::uint64_t rows_per_epoch = 0;
  std::uint64_t num_tokens = 0, num_documents = 0, blend_hash = 0;
  // The producer thread's plans: each dataset's last two epochs (a batch may straddle one's end).
  std::vector<std::vector<std::shared_ptr<const order::TokenEpochPlan>>> plans;

  const order::TokenEpochPlan& PlanFor(std::uint32_t d, std::uint64_t epoch) {
    auto& cached = plans[d];
    for (const auto& p : cached)
      if (p->epoch() == epoch) return *p;
    if (cached.size() == 2) cached.erase(cached.begin());
    cached.push_back(std::make_shared<order::TokenEpochPlan>(datasets[d]->document_tokens(), options.seq_len,
                                                             options.seed, epoch, options.shuffle));
    return *cached.back();
  }

  mutable Mutex mu;
  CondVar changed;
  std::deque<Item> queue GUARDED_BY(mu);
  Position consumed GUARDED_BY(mu);  // where the consumer is
  Position produced GUARDED_BY(mu);  // where the producer goes next
  std::uint32_t rank GUARDED_BY(mu) = 0, world_size GUARDED_BY(mu) = 1;
  std::uint64_t generation GUARDED_BY(mu) = 0;  // bumped by every jump; older work is dropped
  bool stop GUARDED_BY(mu) = false;
  TokenLoaderStats stats GUARDED_BY(mu);
  OwnerProcess owner;  // a forked child's copy fails at once
  std::jthread producer;

  // Read-ahead for remote datasets (the producer thread's): the batches
  // planned ahead of the one being built, and the next to plan.
  bool any_remote = false;
  std::deque<PlannedBatch> planned;
  Position plan_next;
  std::uint64_t plan_generation = 0;
  std::vector<std::vector<TokenRange>> ranges;  // scratch, per dataset

  std::uint64_t NumBatches() const {
    const std::uint64_t b = options.global_batch_size;
    return (rows_per_epoch + b - 1) / b;
  }

  // The position produced after `p`: the epoch's end marker is a position too.
  Position After(Position p) const {
    return p.batch >= NumBatches() ? Position{p.epoch + 1, 0} : Position{p.epoch, p.batch + 1};
  }

  // This rank's rows of batch `at`: [first, first + count).
  std::pair<std::uint64_t, std::uint64_t> RowsOf(Position at, std::uint32_t share_rank, std::uint32_t world) const {
    const std::uint64_t global = options.global_batch_size;
    const std::uint64_t first_row = at.batch * global;
    const std::uint64_t rows_in_batch = std::min<std::uint64_t>(global, rows_per_epoch - first_row);
    const std::uint64_t lo = share_rank * rows_in_batch / world, hi = (share_rank + 1) * rows_in_batch / world;
    return {first_row + lo, hi - lo};
  }

  // Tells remote datasets' caches what the batches from `at` on will read,
  // `read_ahead_batches` of them, and that reading batch `at` begins.
  void ReadAhead(Position at, std::uint64_t gen, std::uint32_t share_rank, std::uint32_t world) {
    if (!any_remote) return;
    if (gen != plan_generation || (planned.empty() ? plan_next != at : planned.front().at != at)) {
      // A jump (restore, reshard, set_epoch) or the first batch: a new plan from `at`.
      for (const auto& d : datasets) d->ResetReads();
      planned.clear();
      plan_next = at;
      plan_generation = gen;
    }
    std::vector<order::TokenPiece> pieces;
    ranges.resize(datasets.size());
    while (planned.size() < std::max<std::uint32_t>(1, options.read_ahead_batches)) {
      for (auto& r : ranges) r.clear();
      if (plan_next.batch < NumBatches()) {
        const auto [first, count] = RowsOf(plan_next, share_rank, world);
        for (std::uint64_t row = first; row < first + count; ++row) {
          pieces.clear();
          const order::BlendPlan::Source source = blend->At(plan_next.epoch, row);
          PlanFor(source.dataset, source.epoch).Row(source.row, 1, pieces);
          for (const auto& p : pieces) ranges[source.dataset].push_back({p.document, p.offset, p.length});
        }
      }
      PlannedBatch batch{plan_next, std::vector<std::uint64_t>(datasets.size())};
      for (std::size_t d = 0; d < datasets.size(); ++d) batch.starts[d] = datasets[d]->PlanReads(ranges[d]);
      planned.push_back(std::move(batch));
      plan_next = After(plan_next);
    }
    for (std::size_t d = 0; d < datasets.size(); ++d) datasets[d]->AdvanceReads(planned.front().starts[d]);
    planned.pop_front();
  }

  // Restarts production at the consumer's position (mu held).
  void JumpTo(Position at) REQUIRES(mu) {
    ++generation;
    queue.clear();
    consumed = produced = at;
    changed.NotifyAll();
  }

  Result<TokenBatch> Build(Position at, std::uint32_t share_rank, std::uint32_t world, std::uint64_t& tokens_out) {
    const std::uint64_t seq = options.seq_len;
    const auto [first, count] = RowsOf(at, share_rank, world);
    TokenBatch out;
    out.epoch = at.epoch;
    out.batch_index = at.batch;
    out.rows = static_cast<std::uint32_t>(count);
    out.first_row = first;
    out.seq_len = seq;
    out.input_ids.assign(out.rows * seq, options.pad_id);
    out.labels.assign(out.rows * seq, options.ignore_index);
    out.position_ids.assign(out.rows * seq, 0);
    out.cu_seqlens.push_back(0);
    if (options.with_documents) out.pieces.resize(out.rows);
    std::vector<std::int64_t> tokens(seq + 1);
    std::vector<std::int64_t> positions(seq + 1);
    std::vector<order::TokenPiece> pieces;
    std::int32_t boundary = 0;
    for (std::uint64_t i = 0; i < out.rows; ++i) {
      pieces.clear();
      const order::BlendPlan::Source source = blend->At(at.epoch, first + i);
      PlanFor(source.dataset, source.epoch).Row(source.row, 1, pieces);
      const TokenDataset& dataset = *datasets[source.dataset];
      std::uint64_t n = 0;
      for (const auto& piece : pieces) {
        std::span<std::int64_t> into(tokens.data() + n, piece.length);
        STOKER_RETURN_IF_ERROR(dataset.ReadTokens(piece.document, piece.offset, into));
        for (std::uint64_t j = 0; j < piece.length; ++j) {
          if (options.vocab_size != 0 && (into[j] < 0 || static_cast<std::uint64_t>(into[j]) >= options.vocab_size))
            return Status::Corruption(
                fmt::format("{}: document {} holds token {} at position {}, outside the vocabulary (vocab_size {})",
                            dataset.prefix(), piece.document, into[j], piece.offset + j, options.vocab_size));
          positions[n + j] = static_cast<std::int64_t>(piece.offset + j);
        }
        n += piece.length;
      }
      const std::uint64_t inputs = std::min<std::uint64_t>(n, seq);
      tokens_out += inputs;
      std::int64_t* row_ids = out.input_ids.data() + i * seq;
      std::int64_t* row_labels = out.labels.data() + i * seq;
      std::int64_t* row_positions = out.position_ids.data() + i * seq;
      std::copy_n(tokens.data(), inputs, row_ids);
      std::copy_n(positions.data(), inputs, row_positions);
      if (n > 1) std::copy_n(tokens.data() + 1, std::min<std::uint64_t>(n - 1, seq), row_labels);
      if (!options.labels_across_documents)
        for (std::uint64_t j = 0; j + 1 < n && j < seq; ++j)
          if (positions[j + 1] == 0) row_labels[j] = options.ignore_index;  // the next token starts a document
      std::uint64_t covered = 0;
      for (const auto& piece : pieces) {
        const std::uint64_t length = std::min(piece.length, inputs - covered);
        if (length == 0) break;  // the label's extra token only
        covered += length;
        boundary += static_cast<std::int32_t>(length);
        out.cu_seqlens.push_back(boundary);
        if (options.with_documents) out.pieces[i].push_back({source.dataset, piece.document, piece.offset, length});
      }
      if (inputs < seq) {  // padding, a segment of its own
        boundary += static_cast<std::int32_t>(seq - inputs);
        out.cu_seqlens.push_back(boundary);
      }
    }
    return out;
  }

  void Produce() {
    for (;;) {
      Position at;
      std::uint64_t gen = 0;
      std::uint32_t share_rank = 0, world = 1;
      {
        MutexLock lock(mu);
        changed.Wait(mu, [&]() REQUIRES(mu) { return stop || queue.size() < options.prefetch; });
        if (stop) return;
        at = produced;
        gen = generation;
        share_rank = rank;
        world = world_size;
      }
      const auto started = std::chrono::steady_clock::now();
      ReadAhead(at, gen, share_rank, world);
      Item item;
      item.at = at;
      const Position next = After(at);
      if (at.batch < NumBatches()) {
        auto built = Build(at, share_rank, world, item.tokens);
        item.batch = built.ok() ? Result<std::optional<TokenBatch>>(std::optional<TokenBatch>(std::move(*built)))
                                : Result<std::optional<TokenBatch>>(built.error());
      }
      const std::chrono::duration<double> took = std::chrono::steady_clock::now() - started;
      MutexLock lock(mu);
      stats.build_seconds += took.count();
      stats.batches_built += at.batch < NumBatches() ? 1 : 0;
      if (gen != generation) continue;  // a jump happened meanwhile
      // Only a consumer finding the queue empty waits: wake it then, not on every batch.
      const bool was_empty = queue.empty();
      queue.push_back(std::move(item));
      produced = next;
      if (was_empty) changed.NotifyAll();
    }
  }
};

TokenLoader::TokenLoader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TokenLoader::~TokenLoader() {
  if (!impl_->owner.IsCurrent()) {
    // A forked child's copy: the producer thread does not exist here and the
    // lock may be held forever. Leave it alone (the memory is the child's copy).
    (void)impl_.release();
    return;
  }
  {
    MutexLock lock(impl_->mu);
    impl_->stop = true;
    impl_->changed.NotifyAll();
  }
  impl_->producer = std::jthread();  // joins
}

Result<std::unique_ptr<TokenLoader>> TokenLoader::Create(std::shared_ptr<const TokenDataset> dataset,
                                                         const TokenLoaderOptions& options) {
  std::vector<std::shared_ptr<const TokenDataset>> one;
  one.push_back(std::move(dataset));
  return Create(std::move(one), {}, options);
}

Result<std::unique_ptr<TokenLoader>> TokenLoader::Create(std::vector<std::shared_ptr<const TokenDataset>> datasets,
                                                         std::vector<double> weights,
                                                         const TokenLoaderOptions& options) {
  if (datasets.empty()) return Status::InvalidArgument("TokenLoader needs a dataset");
  if (datasets.size() > 256)
    return Status::InvalidArgument(fmt::format("{} datasets to blend is more than the limit 256", datasets.size()));
  for (const auto& d : datasets)
    if (!d) return Status::InvalidArgument("TokenLoader was given a null dataset");
  if (options.seq_len < 1 || options.seq_len > (std::uint64_t{1} << 24))
    return Status::InvalidArgument(fmt::format("seq_len {} is outside [1, 16777216]", options.seq_len));
  if (options.global_batch_size < 1)
    return Status::InvalidArgument("global_batch_size must be at least 1 (rows per step, every rank's together)");
  if (options.world_size < 1 || options.rank >= options.world_size)
    return Status::InvalidArgument(
        fmt::format("rank {} is out of range for world_size {}", options.rank, options.world_size));
  if (options.global_batch_size * options.seq_len > (std::uint64_t{1} << 31) - 1)
    return Status::InvalidArgument(
        fmt::format("a global batch of {} rows of {} tokens is over 2^31 tokens (cu_seqlens are int32)",
                    options.global_batch_size, options.seq_len));
  if (options.prefetch < 1 || options.prefetch > 64)
    return Status::InvalidArgument(fmt::format("prefetch {} is outside [1, 64]", options.prefetch));
  if (options.read_ahead_batches < 1 || options.read_ahead_batches > 65536)
    return Status::InvalidArgument(
        fmt::format("read_ahead_batches {} is outside [1, 65536]", options.read_ahead_batches));
  std::vector<std::uint64_t> rows;
  for (const auto& d : datasets) rows.push_back((d->num_tokens() + options.seq_len - 1) / options.seq_len);
  if (weights.empty()) {
    for (std::uint64_t r : rows) weights.push_back(static_cast<double>(r));
    if (std::all_of(rows.begin(), rows.end(), [](std::uint64_t r) { return r == 0; })) weights.assign(rows.size(), 1);
  }
  if (weights.size() != datasets.size())
    return Status::InvalidArgument(
        fmt::format("{} weights for {} datasets: give one weight per dataset", weights.size(), datasets.size()));
  bool any = false;
  for (std::size_t d = 0; d < weights.size(); ++d) {
    if (!std::isfinite(weights[d]) || weights[d] < 0)
      return Status::InvalidArgument(
          fmt::format("the weight of dataset {} ({}) is {}: weights are finite and not negative", d,
                      datasets[d]->prefix(), weights[d]));
    if (weights[d] > 0 && rows[d] == 0 && datasets.size() > 1)
      return Status::InvalidArgument(
          fmt::format("dataset {} ({}) has weight {} but no tokens to give", d, datasets[d]->prefix(), weights[d]));
    any = any || weights[d] > 0;
  }
  if (!any) return Status::InvalidArgument("every weight is zero: at least one dataset must be read");
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->blend.emplace(rows, weights);
  impl->rows_per_epoch = impl->blend->rows_per_epoch();
  impl->plans.resize(datasets.size());
  std::vector<std::uint64_t> fingerprint;  // each dataset's counts and weight
  for (std::size_t d = 0; d < datasets.size(); ++d) {
    impl->num_tokens += datasets[d]->num_tokens();
    impl->num_documents += datasets[d]->num_documents();
    fingerprint.insert(fingerprint.end(), {datasets[d]->num_tokens(), datasets[d]->num_documents(),
                                           std::bit_cast<std::uint64_t>(weights[d])});
  }
  impl->blend_hash = Xxh3(std::as_bytes(std::span(fingerprint)));
  impl->datasets = std::move(datasets);
  for (const auto& d : impl->datasets) impl->any_remote = impl->any_remote || d->remote();
  {
    // The kernel's read-ahead on the .bin files (io/read_access.h): a
    // shuffled order reads rows at random places.
    std::uint64_t bin_bytes = 0;
    for (const auto& d : impl->datasets) bin_bytes += d->bin_bytes();
    impl->read_access = io::ChooseReadAccess(
        options.kernel_readahead, options.shuffle, "an unshuffled order reads them front to back", true, "token files",
        bin_bytes,
        options.kernel_readahead == KernelReadahead::kAuto ? io::ReadPageCacheRoom(*FileSystem::Default())
                                                           : std::nullopt,
        0);
    for (const auto& d : impl->datasets) d->AdviseAccess(impl->read_access.pattern);
  }
  {
    MutexLock lock(impl->mu);
    impl->rank = options.rank;
    impl->world_size = options.world_size;
  }
  Impl* raw = impl.get();
  impl->producer = std::jthread([raw] { raw->Produce(); });
  return std::unique_ptr<TokenLoader>(new TokenLoader(std::move(impl)));
}

TokenLoaderStats TokenLoader::Stats() const {
  MutexLock lock(impl_->mu);
  return impl_->stats;
}

bool TokenLoader::kernel_readahead() const {
  return impl_->read_access.pattern == AccessPattern::kNormal;
}
const std::string& TokenLoader::readahead_note() const {
  return impl_->read_access.note;
}

Result<std::optional<TokenBatch>> TokenLoader::Next(std::chrono::nanoseconds timeout) {
  Impl& m = *impl_;
  STOKER_RETURN_IF_ERROR(m.owner.Check("this token loader"));
  MutexLock lock(m.mu);
  if (m.queue.empty()) {
    // The training loop's data wait (a Python caller comes back every 100 ms: each slice counts).
    const auto started = std::chrono::steady_clock::now();
    const bool ready = m.changed.WaitFor(m.mu, timeout, [&]() REQUIRES(m.mu) { return !m.queue.empty(); });
    m.stats.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (!ready) return Status::DeadlineExceeded("no batch yet");
  }
  Item item = std::move(m.queue.front());
  // The producer waits only on a full queue: wake it then, not on every batch.
  const bool was_full = m.queue.size() >= m.options.prefetch;
  m.queue.pop_front();
  if (was_full) m.changed.NotifyAll();
  if (item.batch.ok() && !item.batch->has_value()) {
    m.consumed = {item.at.epoch + 1, 0};
  } else {
    m.consumed = {item.at.epoch, item.at.batch + 1};
    if (item.batch.ok()) {
      m.stats.batches += 1;
      m.stats.rows += (*item.batch)->rows;
      m.stats.tokens += item.tokens;
    }
  }
  return std::move(item.batch);
}

Result<std::optional<TokenBatch>> TokenLoader::Next() {
  for (;;) {
    auto next = Next(std::chrono::hours(1));
    if (next.ok() || next.error().code() != StatusCode::kDeadlineExceeded) return next;
  }
}

std::uint64_t TokenLoader::epoch() const {
  MutexLock lock(impl_->mu);
  return impl_->consumed.epoch;
}
std::uint64_t TokenLoader::num_batches() const {
  return impl_->NumBatches();
}
std::uint64_t TokenLoader::num_rows() const {
  return impl_->rows_per_epoch;
}

Status TokenLoader::SetEpoch(std::uint64_t epoch) {
  STOKER_RETURN_IF_ERROR(impl_->owner.Check("this token loader"));
  MutexLock lock(impl_->mu);
  impl_->JumpTo({epoch, 0});
  return Status::Ok();
}

TokenLoaderState TokenLoader::State() const {
  const Impl& m = *impl_;
  TokenLoaderState s;
  s.seed = m.options.seed;
  s.global_batch_size = m.options.global_batch_size;
  s.seq_len = m.options.seq_len;
  s.num_tokens = m.num_tokens;
  s.num_documents = m.num_documents;
  s.blend = m.blend_hash;
  MutexLock lock(m.mu);
  s.epoch = m.consumed.epoch;
  s.batches_consumed = m.consumed.batch;
  return s;
}

Status TokenLoader::Restore(const TokenLoaderState& s) {
  Impl& m = *impl_;
  STOKER_RETURN_IF_ERROR(m.owner.Check("this token loader"));
  const TokenLoaderState mine = State();
  auto differs = [&](const char* what, std::uint64_t theirs, std::uint64_t ours) {
    return Status::InvalidArgument(fmt::format(
        "the state is of a token loader with {} {}, this one has {}: resuming would not give the same order", what,
        theirs, ours));
  };
  if (s.seed != mine.seed) return differs("seed", s.seed, mine.seed);
  if (s.global_batch_size != mine.global_batch_size)
    return differs("global_batch_size", s.global_batch_size, mine.global_batch_size);
  if (s.seq_len != mine.seq_len) return differs("seq_len", s.seq_len, mine.seq_len);
  if (s.num_tokens != mine.num_tokens || s.num_documents != mine.num_documents)
    return Status::InvalidArgument(fmt::format("the state is of datasets of {} tokens in {} documents; {} {} {} in {}",
                                               s.num_tokens, s.num_documents, m.datasets[0]->prefix(),
                                               m.datasets.size() > 1 ? "and the others have" : "has", mine.num_tokens,
                                               mine.num_documents));
  if (s.blend != mine.blend)
    return Status::InvalidArgument(
        "the state is of another blend (other datasets or weights): resuming would not give the same order");
  if (s.batches_consumed > m.NumBatches())
    return Status::InvalidArgument(
        fmt::format("the state is {} batches into an epoch of {}", s.batches_consumed, m.NumBatches()));
  MutexLock lock(m.mu);
  m.JumpTo({s.epoch, s.batches_consumed});
  return Status::Ok();
}

Status TokenLoader::Reshard(std::uint32_t rank, std::uint32_t world_size) {
  if (world_size < 1 || rank >= world_size)
    return Status::InvalidArgument(fmt::format("rank {} is out of range for world_size {}", rank, world_size));
  Impl& m = *impl_;
  STOKER_RETURN_IF_ERROR(m.owner.Check("this token loader"));
  MutexLock lock(m.mu);
  m.rank = rank;
  m.world_size = world_size;
  m.JumpTo(m.consumed);
  return Status::Ok();
}

}  // namespace stoker
