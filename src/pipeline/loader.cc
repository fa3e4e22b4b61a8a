// The loader: a pool of native threads turns work items (a batch's read, or
// one sample's finish) into batches; the consumer takes batches strictly in
// order. The rules live in small parts: BatchScheduler (slots, queue,
// epochs), ReadAheadAnnouncer (the shard order a remote cache fetches
// ahead), SampleProducer (reads, checks, substitutes), SampleFinisher
// (what a batch buffer holds). This file is their glue: making the loader,
// its threads, and the consumer's side; the shared state is
// loader_impl.h, moving the position loader_position.cc.
#include "stoker/loader.h"

#include <algorithm>
#include <thread>

#include <fmt/format.h>

#include "pipeline/cpu_finisher.h"
#include "pipeline/loader_impl.h"
#include "pipeline/loader_internal.h"
#include "stoker/text.h"

namespace stoker {

using Clock = Loader::Impl::Clock;

// --- Batch ---

namespace {
// Gives a field column's memory back (its values' capacity too).
void FreeColumn(std::vector<FieldValue>& column) {
  for (FieldValue& v : column) {
    std::vector<std::byte>().swap(v.tensor.data);
    std::string().swap(v.bytes);
    v.present = false;
  }
}
}  // namespace

Batch::Batch(Batch&& o) noexcept : loader_(std::exchange(o.loader_, nullptr)), slot_(o.slot_) {}
Batch& Batch::operator=(Batch&& o) noexcept {
  if (this != &o) {
    if (loader_) loader_->Release(slot_);
    loader_ = std::exchange(o.loader_, nullptr);
    slot_ = o.slot_;
  }
  return *this;
}
Batch::~Batch() {
  if (loader_) loader_->Release(slot_);
}
void* Batch::images() const {
  // An empty batch (a rank's share of a short last batch) may have a pinned
  // pool's buffer not allocated yet: a valid pointer all the same.
  alignas(64) static std::byte no_images[64];
  void* images = loader_->impl_->slots[slot_].images.data();
  return images != nullptr ? images : no_images;
}
const std::int64_t* Batch::labels() const {
  return loader_->impl_->slots[slot_].labels.data();
}
const std::uint64_t* Batch::indices() const {
  return loader_->impl_->slots[slot_].indices.data();
}
std::uint32_t Batch::size() const {
  return loader_->impl_->slots[slot_].size;
}
DType Batch::dtype() const {
  return loader_->impl_->options.transform.dtype;
}
std::uint64_t Batch::epoch() const {
  return loader_->impl_->slots[slot_].epoch;
}
std::uint64_t Batch::batch_index() const {
  return loader_->impl_->slots[slot_].batch_index;
}
std::size_t Batch::num_fields() const {
  return loader_->impl_->slots[slot_].fields.size();
}
std::span<const FieldValue> Batch::field(std::size_t i) const {
  return std::span<const FieldValue>(loader_->impl_->slots[slot_].fields[i]).first(size());
}
void Batch::ReleaseField(std::size_t i) {
  FreeColumn(loader_->impl_->slots[slot_].fields[i]);
}
const std::vector<FieldSpec>& Batch::field_specs() const {
  return loader_->impl_->producer->field_specs();
}
bool Batch::has_images() const {
  return loader_->impl_->producer->has_image();
}
std::size_t Batch::image_bytes() const {
  return loader_->impl_->finisher->UsedBytes(slot_, size());
}
std::array<std::int64_t, 4> Batch::shape() const {
  const auto& t = loader_->impl_->options.transform;
  if (t.layout == Layout::kNCHW) return {size(), 3, t.height, t.width};
  return {size(), t.height, t.width, 3};
}

// --- Loader ---

Loader::Loader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Loader::~Loader() {
  if (!impl_->CheckOwner().ok()) {
    // A forked child's copy: its threads do not exist here, and its locks
    // may be held forever. Leave it alone (the memory is the child's copy).
    (void)impl_.release();
    return;
  }
  {
    MutexLock lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->cancelled.store(true, std::memory_order_release);
  impl_->work_cv.NotifyAll();
  impl_->workers.clear();  // joins
}

Result<std::unique_ptr<Loader>> Loader::Create(std::shared_ptr<const Dataset> dataset, const LoaderOptions& options) {
  return pipeline::CreateLoader(std::move(dataset), options,
                                std::make_shared<pipeline::CpuFinisher>(options.transform));
}

Result<std::unique_ptr<Loader>> pipeline::CreateLoader(std::shared_ptr<const Dataset> dataset,
                                                       const LoaderOptions& options,
                                                       std::shared_ptr<SampleFinisher> finisher) {
  if (!dataset) return Status::InvalidArgument("Loader needs a dataset");
  if (!finisher) return Status::InvalidArgument("Loader needs a sample finisher");
  STOKER_ASSIGN_OR_RETURN(const LoaderSetup setup, ResolveLoaderSetup(*dataset, options));
  const order::BatchPlan& plan = setup.plan;
  const std::uint32_t threads = setup.max_threads;
  std::uint32_t prefetch = setup.prefetch;
  std::uint32_t pool = BatchPoolSize(prefetch);
  std::uint32_t max_prefetch = prefetch;
  if (options.autotune) {
    // The memory budget decides how deep prefetch may go: as many buffers as fit, all made now.
    STOKER_RETURN_IF_ERROR(finisher->Prepare(1, setup.rank_capacity));
    const std::uint64_t bytes = std::max<std::uint64_t>(finisher->BatchBufferBytes(), 1);
    const std::uint64_t fit = setup.autotune_memory_bytes / bytes;
    if (fit < BatchPoolSize(1))
      return Status::InvalidArgument(
          fmt::format("autotune_memory_bytes {} holds {} batch buffer(s) of {} bytes; the loader needs at least {}",
                      setup.autotune_memory_bytes, fit, bytes, BatchPoolSize(1)));
    max_prefetch =
        static_cast<std::uint32_t>(std::min<std::uint64_t>({fit - 2, kMaxPrefetch, setup.order.max_prefetch}));
    prefetch = std::min(prefetch, max_prefetch);
    pool = BatchPoolSize(max_prefetch);
  }
  // An automatic depth decodes ahead only into buffers the loop has touched
  // (BufferWarmth) where each thread has a batch's 16 samples or more: a
  // batch read ahead then starts the moment the loop lets go of its last,
  // and the threads idle only through the last samples of a batch (about
  // half a sample each). Page-locked buffers are allocated as they are first
  // used, to the same effect.
  const bool warm_only =
      options.prefetch == 0 && !options.autotune && setup.rank_capacity >= kWarmBuffersSamplesPerThread * setup.threads;
  auto impl = std::make_unique<Loader::Impl>(pool, prefetch, plan.NumBatches(), warm_only);
  impl->dataset = dataset;
  impl->options = options;
  impl->plan = plan;
  impl->rank_capacity = setup.rank_capacity;
  impl->finisher = std::move(finisher);
  STOKER_ASSIGN_OR_RETURN(impl->producer,
                          SampleProducer::Create(dataset, options, impl->finisher.get(), &impl->counters));

  impl->order_spec = setup.order_spec;
  impl->order_choice = setup.order;
  if (options.on_corrupt == CorruptPolicy::kError && dataset->bad_images_kept() > 0) {
    const bool one = dataset->bad_images_kept() == 1;
    impl->corrupt_note = fmt::format(
        "the dataset holds {} that the loader cannot decode, kept as {} when written (keep_bad_images, "
        "--keep-bad-images; {}{}): reading stops at {} unless on_corrupt=\"skip\" skips {}",
        Counted(dataset->bad_images_kept(), "image", "images"), one ? "it was" : "they were",
        one ? "" : "the first: ", Printable(dataset->first_bad_image()), one ? "it" : "the first one it meets",
        one ? "it" : "them");
  }
  ShardReadPlanner* planner = dataset->file_system() ? dataset->file_system()->read_planner() : nullptr;
  for (const auto& s : dataset->shards()) impl->shard_spans.push_back({s.first_sample, s.num_samples});

  STOKER_RETURN_IF_ERROR(impl->finisher->Prepare(pool, setup.rank_capacity));
  {
    // The kernel's read-ahead on the shard files (local, or a remote cache's
    // copies), against the page cache's room less the batch buffers this
    // loader is about to allocate.
    const bool shard_files = !dataset->loose_files();
    std::uint64_t shard_bytes = 0;
    for (const auto& shard : dataset->shards()) shard_bytes += shard.size;
    const bool measure = shard_files && options.kernel_readahead == KernelReadahead::kAuto;
    impl->read_access = io::ChooseReadAccess(
        options.kernel_readahead, setup.order.order == Order::kShuffle, "this order reads them shard by shard",
        shard_files, "shards", shard_bytes, measure ? io::ReadPageCacheRoom(*FileSystem::Default()) : std::nullopt,
        std::uint64_t{pool} * (impl->producer->has_image() ? impl->finisher->BatchBufferBytes() : 0));
    if (!impl->read_access.note.empty()) dataset->AdviseShardAccess(impl->read_access.pattern);
  }
  impl->slots.resize(pool);
  // Typed fields without a transformed image leave images() unused.
  impl->buffer_bytes = impl->producer->has_image() ? impl->finisher->BatchBufferBytes() : 1;
  for (std::uint32_t i = 0; i < pool; ++i) {
    auto& slot = impl->slots[i];
    // A pinned pool allocates the buffers past the first two when first used
    // (Impl::StartSamples); a pageable one's pages are touched only when used.
    if (i < pipeline::BufferWarmth::kWorkingSet || !impl->pinned_pool) {
      auto images = HostBuffer::Allocate(impl->buffer_bytes);
      if (!images.ok())
        return Status::ResourceExhausted(fmt::format("cannot allocate batch buffer {} of {} ({} bytes each): {}", i,
                                                     pool, impl->buffer_bytes, images.error().message()));
      slot.images = std::move(*images);
      if (i == 0) impl->pinned_pool = slot.images.pinned();
    }
    slot.labels.resize(setup.rank_capacity);
    slot.indices.resize(setup.rank_capacity);
    slot.fields.assign(impl->producer->field_specs().size(), std::vector<FieldValue>(setup.rank_capacity));
  }
  Loader::Impl* raw = impl.get();
  {
    MutexLock lock(raw->mu);
    raw->active_threads = setup.threads;
    raw->prefetch = prefetch;
    if (options.autotune) {
      pipeline::AutotuneLimits limits;
      limits.max_threads = setup.max_threads;
      limits.max_prefetch = max_prefetch;
      raw->tuner = std::make_unique<pipeline::Autotuner>(limits, setup.threads, prefetch);
      raw->tune_last = Clock::now();
    }
    raw->announcer = std::make_unique<order::ReadAheadAnnouncer>(planner, raw->plan, raw->shard_spans);
    raw->orders = std::make_unique<pipeline::OrderAhead>(raw->order_spec, raw->shard_spans,
                                                         planner ? std::optional(raw->plan) : std::nullopt);
    raw->StartEpoch(0, 0);
  }
  try {
    for (std::uint32_t i = 0; i < threads; ++i) raw->workers.emplace_back([raw, i] { raw->WorkerLoop(i); });
  } catch (const std::system_error& e) {
    // The system refused a thread: stop the ones started, and say so.
    {
      MutexLock lock(raw->mu);
      raw->stop = true;
    }
    raw->work_cv.NotifyAll();
    raw->workers.clear();
    return Status::ResourceExhausted(fmt::format("could not start loader thread {} of {}: {} (ask for fewer threads)",
                                                 raw->workers.size() + 1, threads, e.what()));
  }
  {
    // Start preparing the first batches now, while the caller builds its model.
    MutexLock lock(raw->mu);
    raw->Schedule();
  }
  return std::unique_ptr<Loader>(new Loader(std::move(impl)));
}

Result<std::optional<Batch>> Loader::Next() {
  return Next(std::chrono::nanoseconds::max());
}

Result<std::optional<Batch>> Loader::Next(std::chrono::nanoseconds timeout) {
  Impl& m = *impl_;
  STOKER_RETURN_IF_ERROR(m.CheckOwner());
  MutexLock turn(m.consumer_mu);
  MutexLock lock(m.mu);
  if (m.scheduler.EpochDelivered()) {
    // End of epoch: the next call delivers the following one, whose first
    // batches are already scheduled.
    m.scheduler.NextEpoch();
    m.Schedule();
    return std::optional<Batch>();
  }
  m.Schedule();
  const auto next = m.scheduler.NextInFlight();
  if (!next) {
    // Every buffer is held by the consumer: waiting would never end.
    return Status::ResourceExhausted(fmt::format(
        "all {} batch buffers are still held by the consumer; release batches (or raise prefetch) before asking "
        "for more",
        m.slots.size()));
  }
  const std::uint32_t s = *next;
  // A read batch waiting for a buffer takes one now: the consumer needs it.
  m.consumer_waits_for = s;
  m.StartWaitingBatches();
  std::uint64_t ready = 0;
  for (std::uint32_t i : m.scheduler.in_flight()) ready += m.slots[i].pending == 0;
  const auto start = Clock::now();
  const auto done = [&]() REQUIRES(m.mu) { return m.slots[s].pending == 0; };
  if (timeout == std::chrono::nanoseconds::max()) {
    m.done_cv.Wait(m.mu, done);
  } else if (!m.done_cv.WaitFor(m.mu, timeout, done)) {
    m.consumer_waits_for.reset();
    pipeline::LoaderCounters::Add(m.counters.wait_ns, Clock::now() - start);
    return Status::DeadlineExceeded("the next batch is not ready yet");
  }
  m.consumer_waits_for.reset();
  pipeline::LoaderCounters::Add(m.counters.wait_ns, Clock::now() - start);
  m.counters.ready_sum.fetch_add(ready, std::memory_order_relaxed);
  m.counters.next_calls.fetch_add(1, std::memory_order_relaxed);
  m.scheduler.Delivered();
  m.announcer->Advance(m.scheduler.epoch(), m.scheduler.next_to_deliver() - 1);
  if (!m.slots[s].error.ok()) {
    Status error = m.slots[s].error;
    m.scheduler.Release(s);
    m.StartWaitingBatches();
    m.Schedule();
    return error;
  }
  m.counters.batches.fetch_add(1, std::memory_order_relaxed);
  m.counters.samples.fetch_add(m.slots[s].size, std::memory_order_relaxed);
  m.counters.corrupt_skipped.fetch_add(m.slots[s].skipped, std::memory_order_relaxed);
  if (m.tuner) m.Tune();
  m.Schedule(/*just_delivered=*/true);
  return std::optional<Batch>(Batch(this, s));
}

void Loader::Release(std::uint32_t slot) {
  if (!impl_->CheckOwner().ok()) return;
  // The batch's decoded fields (masks, arrays, text) go now, not when the
  // slot is next decoded into: a slot waiting for its next batch would
  // otherwise hold a whole batch of them that nobody uses. The consumer
  // still owns the slot here, so no lock.
  for (auto& column : impl_->slots[slot].fields) FreeColumn(column);
  MutexLock lock(impl_->mu);
  impl_->scheduler.Release(slot);
  impl_->StartWaitingBatches();
  impl_->Schedule();
}

LoaderStats Loader::stats() const {
  Impl& m = *impl_;
  LoaderStats s = pipeline::StatsFromCounters(m.counters);
  {
    MutexLock lock(m.mu);
    s.threads = m.active_threads;
    s.prefetch = m.prefetch;
    if (m.tuner) {
      s.autotune = true;
      s.autotune_changes = static_cast<std::uint32_t>(m.tuner->changes());
      s.autotune_last_change_batch = m.tuner->last_change_batch();
    }
  }
  s.shard_window = m.order_spec.shard_window;
  s.order = m.order_choice.order;
  s.predicted_epoch_download_bytes = m.order_choice.predicted_epoch_download_bytes;
  s.order_note = m.order_choice.note;
  s.order_warning = m.order_choice.warning;
  s.corrupt_note = m.corrupt_note;
  s.kernel_readahead = m.read_access.pattern == AccessPattern::kNormal;
  s.readahead_note = m.read_access.note;
  s.pinned_memory = m.pinned_pool;
  {
    MutexLock lock(m.mu);
    s.batch_buffers_touched = m.warmth.touched();
  }
  MutexLock lock(m.method_mu);
  s.read_method = m.read_method;
  return s;
}

std::vector<std::string> Loader::AutotuneLog() const {
  MutexLock lock(impl_->mu);
  return impl_->tuner ? impl_->tuner->log() : std::vector<std::string>{};
}

std::size_t Loader::batch_buffer_bytes() const {
  return impl_->finisher->BatchBufferBytes();
}
std::uint32_t Loader::batch_capacity() const {
  return impl_->rank_capacity;
}
const LoaderOptions& Loader::options() const {
  return impl_->options;
}
std::uint32_t Loader::rank() const {
  MutexLock lock(impl_->mu);
  return impl_->plan.rank;
}
std::uint32_t Loader::world_size() const {
  MutexLock lock(impl_->mu);
  return impl_->plan.world_size;
}

}  // namespace stoker
