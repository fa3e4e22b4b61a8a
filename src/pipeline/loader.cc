// The loader: a pool of native threads turns work items (a batch's read, or
// one sample's finish) into batches; the consumer takes batches strictly in
// order. The rules live in small parts: BatchScheduler (slots, queue,
// epochs), ReadAheadAnnouncer (the shard order a remote cache fetches
// ahead), SampleProducer (reads, checks, substitutes), SampleFinisher
// (what a batch buffer holds). This file is their glue: the lock, the
// threads, and the consumer's side.
#include "stoker/loader.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <thread>

#include <fmt/format.h>

#include "core/cancel.h"
#include "core/host_buffer.h"
#include "core/mutex.h"
#include "order/read_plan.h"
#include "order/sampler.h"
#include "pipeline/autotune.h"
#include "pipeline/batch_scheduler.h"
#include "pipeline/cpu_finisher.h"
#include "pipeline/loader_counters.h"
#include "pipeline/loader_internal.h"
#include "pipeline/loader_setup.h"
#include "pipeline/sample_producer.h"
#include "transform/transform.h"

namespace stoker {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

struct Loader::Impl {
  struct Slot {
    HostBuffer images;
    std::vector<std::int64_t> labels;
    std::vector<std::uint64_t> indices;
    std::uint32_t size = 0;
    std::uint64_t epoch = 0;
    std::uint64_t batch_index = 0;
    std::shared_ptr<const std::vector<std::uint64_t>> order;  // the batch's epoch order
    std::vector<std::uint64_t> positions;                     // in that order, one per sample
    pipeline::BatchInput input;                               // filled by the read item, then read by the sample items
    std::uint32_t pending = 0;                                // guarded by mu: items not yet finished
    std::uint32_t skipped = 0;                                // guarded by mu: places whose sample was replaced
    Status error;                                             // guarded by mu: the first failure in this batch
  };

  std::shared_ptr<const Dataset> dataset;
  LoaderOptions options;
  order::OrderSpec order_spec;
  pipeline::OrderChoice order_choice;  // as chosen at creation (kAuto resolved, the prediction)
  order::BatchPlan plan;
  std::vector<order::ShardSpan> shard_spans;
  std::shared_ptr<pipeline::SampleFinisher> finisher;
  std::unique_ptr<pipeline::SampleProducer> producer;
  std::uint32_t rank_capacity = 0;  // samples each slot holds
  pid_t owner_pid = 0;
  pipeline::LoaderCounters counters;

  Mutex consumer_mu;  // Next() calls take turns
  Mutex mu;
  CondVar work_cv, done_cv;
  std::vector<Slot> slots;  // buffers are fixed; metadata guarded by mu
  pipeline::BatchScheduler scheduler GUARDED_BY(mu);
  std::unique_ptr<order::ReadAheadAnnouncer> announcer GUARDED_BY(mu);
  // The order of the epoch being scheduled.
  std::shared_ptr<const std::vector<std::uint64_t>> schedule_order GUARDED_BY(mu);
  bool stop GUARDED_BY(mu) = false;
  // Set with `stop`, read without the lock by what the workers wait on below
  // (a remote read waiting for its shard gives up instead of finishing).
  std::atomic<bool> cancelled{false};
  std::vector<std::jthread> workers;
  // Workers with an index at or above this wait (autotune moves it).
  std::uint32_t active_threads GUARDED_BY(mu) = 0;
  std::uint32_t prefetch GUARDED_BY(mu) = 0;
  // LoaderOptions::autotune: the tuner and where its last window ended.
  std::unique_ptr<pipeline::Autotuner> tuner GUARDED_BY(mu);
  Clock::time_point tune_last GUARDED_BY(mu);
  std::uint64_t tune_wait_ns GUARDED_BY(mu) = 0, tune_busy_ns GUARDED_BY(mu) = 0;
  mutable Mutex method_mu;
  std::string read_method GUARDED_BY(method_mu);

  Impl(std::uint32_t pool, std::uint32_t prefetch_depth, std::uint64_t batches)
      : scheduler(pool, prefetch_depth, batches) {}

  std::uint64_t BusyNs() const {
    return counters.read_ns.load(std::memory_order_relaxed) + counters.decode_ns.load(std::memory_order_relaxed) +
           counters.transform_ns.load(std::memory_order_relaxed);
  }

  // After a delivery: feeds the tuner, and applies what it decides.
  void Tune() REQUIRES(mu) {
    const auto now = Clock::now();
    const std::uint64_t wait = counters.wait_ns.load(std::memory_order_relaxed), busy = BusyNs();
    const auto change = tuner->Observe(std::chrono::duration<double>(now - tune_last).count(),
                                       static_cast<double>(wait - tune_wait_ns) * 1e-9,
                                       static_cast<double>(busy - tune_busy_ns) * 1e-9);
    tune_last = now;
    tune_wait_ns = wait;
    tune_busy_ns = busy;
    if (!change) return;
    active_threads = change->threads;
    prefetch = change->prefetch;
    scheduler.SetPrefetch(change->prefetch);
    work_cv.NotifyAll();
  }

  std::shared_ptr<const std::vector<std::uint64_t>> OrderOf(std::uint64_t epoch) const {
    return std::make_shared<const std::vector<std::uint64_t>>(order::EpochOrder(order_spec, epoch, shard_spans));
  }

  // Restarts delivery and scheduling at batch `consumed` of `epoch`; the
  // caller has drained in-flight work.
  void StartEpoch(std::uint64_t epoch, std::uint64_t consumed) REQUIRES(mu) {
    scheduler.StartEpoch(epoch, consumed);
    schedule_order = OrderOf(epoch);
    announcer->Restart(epoch, consumed, *schedule_order);
  }

  void Schedule() REQUIRES(mu) {
    std::vector<std::uint64_t> positions;
    while (auto batch = scheduler.ScheduleNext()) {
      if (batch->starts_epoch) {
        schedule_order = OrderOf(batch->epoch);
        announcer->EpochScheduled(batch->epoch, *schedule_order);
      }
      plan.RankPositions(batch->batch, positions);
      Slot& slot = slots[batch->slot];
      slot.size = static_cast<std::uint32_t>(positions.size());
      slot.epoch = batch->epoch;
      slot.batch_index = batch->batch;
      slot.order = schedule_order;
      slot.positions.assign(positions.begin(), positions.end());
      slot.input.samples.clear();
      for (std::uint64_t p : positions) slot.input.samples.push_back((*schedule_order)[p]);
      slot.pending = slot.size;
      slot.skipped = 0;
      slot.error = Status::Ok();
      finisher->BeginBatch(batch->slot);
      // An empty share (the epoch's short last batch under a balanced split)
      // is ready at once: a read item for it could still be running when
      // the consumer takes and recycles the slot.
      if (slot.size == 0) continue;
      scheduler.QueueRead(batch->slot);
      // One read each: waking every worker per read only has them fight for
      // the lock the consumer needs. With idle workers parked by autotune, a
      // single wake-up could reach a parked one, so all are woken.
      if (active_threads < workers.size()) {
        work_cv.NotifyAll();
      } else {
        work_cv.NotifyOne();
      }
    }
  }

  // Throws away queued work (SetEpoch, Restore), waits for started items,
  // and recycles the slots.
  void Drain() REQUIRES(mu) {
    for (const auto& item : scheduler.DropQueued())
      slots[item.slot].pending -= item.kind == pipeline::ItemKind::kReadBatch ? slots[item.slot].size : 1;
    done_cv.Wait(mu, [&]() REQUIRES(mu) {
      const auto& in_flight = scheduler.in_flight();
      return std::all_of(in_flight.begin(), in_flight.end(), [&](std::uint32_t s) { return slots[s].pending == 0; });
    });
    scheduler.ReclaimInFlight();
  }

  void WorkerLoop(std::uint32_t index) EXCLUDES(mu) {
    const CancelScope cancel_scope(&cancelled);
    pipeline::ProducerScratch scratch;
    bool method_known = false;
    mu.Lock();
    while (true) {
      work_cv.Wait(mu, [&]() REQUIRES(mu) { return stop || (index < active_threads && scheduler.HasWork()); });
      if (stop) break;
      const pipeline::WorkItem item = *scheduler.PopWork();
      Slot& slot = slots[item.slot];
      if (item.kind == pipeline::ItemKind::kReadBatch) {
        mu.Unlock();
        producer->ReadBatch(slot.input);
        if (!method_known) {
          method_known = true;
          MutexLock lock(method_mu);
          read_method = producer->ReadMethod();
        }
        mu.Lock();
        // Its samples go behind reads already queued for later batches, so
        // reads run ahead of decoding.
        scheduler.QueueSamples(item.slot, slot.size);
        work_cv.NotifyAll();
        continue;
      }
      const pipeline::SampleContext context{options.seed, slot.epoch, 0, item.slot, item.index};
      mu.Unlock();
      auto produced = producer->Produce(slot.input, item.index, *slot.order, slot.positions[item.index], context,
                                        slot.images.data(), scratch);
      mu.Lock();
      if (produced.ok()) {
        slot.labels[item.index] = produced->label;
        slot.indices[item.index] = produced->sample;
        slot.skipped += produced->substituted ? 1 : 0;
      } else if (slot.error.ok()) {
        slot.error = produced.error();
      }
      if (--slot.pending == 0) done_cv.NotifyAll();
    }
    mu.Unlock();
  }

  Status CheckOwner() const {
    if (::getpid() == owner_pid) return Status::Ok();
    return Status::FailedPrecondition(fmt::format(
        "this loader was created in process {}; a forked child (process {}) cannot use it, since its threads did "
        "not survive the fork: create a new loader in the child",
        owner_pid, ::getpid()));
  }
};

// --- Batch ---

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
  return loader_->impl_->slots[slot_].images.data();
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
  // The consumer may hold two batches (e.g. one in use, one being copied).
  std::uint32_t pool = prefetch + 2;
  std::uint32_t max_prefetch = prefetch;
  if (options.autotune) {
    // The memory budget decides how deep prefetch may go: as many buffers as fit, all made now.
    STOKER_RETURN_IF_ERROR(finisher->Prepare(1, setup.rank_capacity));
    const std::uint64_t bytes = std::max<std::uint64_t>(finisher->BatchBufferBytes(), 1);
    const std::uint64_t fit = setup.autotune_memory_bytes / bytes;
    if (fit < 3)
      return Status::InvalidArgument(
          fmt::format("autotune_memory_bytes {} holds {} batch buffer(s) of {} bytes; the loader needs at least 3",
                      setup.autotune_memory_bytes, fit, bytes));
    max_prefetch =
        static_cast<std::uint32_t>(std::min<std::uint64_t>({fit - 2, kMaxPrefetch, setup.order.max_prefetch}));
    prefetch = std::min(prefetch, max_prefetch);
    pool = max_prefetch + 2;
  }
  auto impl = std::make_unique<Loader::Impl>(pool, prefetch, plan.NumBatches());
  impl->dataset = dataset;
  impl->options = options;
  impl->plan = plan;
  impl->rank_capacity = setup.rank_capacity;
  impl->owner_pid = ::getpid();
  impl->finisher = std::move(finisher);
  STOKER_ASSIGN_OR_RETURN(impl->producer,
                          SampleProducer::Create(dataset, options, impl->finisher.get(), &impl->counters));

  impl->order_spec = setup.order_spec;
  impl->order_choice = setup.order;
  ShardReadPlanner* planner = dataset->file_system() ? dataset->file_system()->read_planner() : nullptr;
  for (const auto& s : dataset->shards()) impl->shard_spans.push_back({s.first_sample, s.num_samples});

  STOKER_RETURN_IF_ERROR(impl->finisher->Prepare(pool, setup.rank_capacity));
  impl->slots.resize(pool);
  for (std::uint32_t i = 0; i < pool; ++i) {
    auto& slot = impl->slots[i];
    auto images = HostBuffer::Allocate(impl->finisher->BatchBufferBytes());
    if (!images.ok())
      return Status::ResourceExhausted(fmt::format("cannot allocate batch buffer {} of {} ({} bytes each): {}", i, pool,
                                                   impl->finisher->BatchBufferBytes(), images.error().message()));
    slot.images = std::move(*images);
    slot.labels.resize(setup.rank_capacity);
    slot.indices.resize(setup.rank_capacity);
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
    raw->announcer = std::make_unique<order::ReadAheadAnnouncer>(planner, raw->order_spec, raw->plan, raw->shard_spans);
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
  std::uint64_t ready = 0;
  for (std::uint32_t i : m.scheduler.in_flight()) ready += m.slots[i].pending == 0;
  const auto start = Clock::now();
  const auto done = [&]() REQUIRES(m.mu) { return m.slots[s].pending == 0; };
  if (timeout == std::chrono::nanoseconds::max()) {
    m.done_cv.Wait(m.mu, done);
  } else if (!m.done_cv.WaitFor(m.mu, timeout, done)) {
    pipeline::LoaderCounters::Add(m.counters.wait_ns, Clock::now() - start);
    return Status::DeadlineExceeded("the next batch is not ready yet");
  }
  pipeline::LoaderCounters::Add(m.counters.wait_ns, Clock::now() - start);
  m.counters.ready_sum.fetch_add(ready, std::memory_order_relaxed);
  m.counters.next_calls.fetch_add(1, std::memory_order_relaxed);
  m.scheduler.Delivered();
  m.announcer->Advance(m.scheduler.epoch(), m.scheduler.next_to_deliver() - 1);
  if (!m.slots[s].error.ok()) {
    Status error = m.slots[s].error;
    m.scheduler.Release(s);
    m.Schedule();
    return error;
  }
  m.counters.batches.fetch_add(1, std::memory_order_relaxed);
  m.counters.samples.fetch_add(m.slots[s].size, std::memory_order_relaxed);
  m.counters.corrupt_skipped.fetch_add(m.slots[s].skipped, std::memory_order_relaxed);
  if (m.tuner) m.Tune();
  m.Schedule();
  return std::optional<Batch>(Batch(this, s));
}

void Loader::Release(std::uint32_t slot) {
  if (!impl_->CheckOwner().ok()) return;
  MutexLock lock(impl_->mu);
  impl_->scheduler.Release(slot);
  impl_->Schedule();
}

void Loader::SetEpoch(std::uint64_t epoch) {
  if (!impl_->CheckOwner().ok()) return;
  MutexLock turn(impl_->consumer_mu);
  MutexLock lock(impl_->mu);
  if (impl_->scheduler.epoch() == epoch && impl_->scheduler.next_to_deliver() == 0)
    return;  // already at its start: keep the prefetch
  impl_->Drain();
  impl_->StartEpoch(epoch, 0);
  impl_->Schedule();
}

std::uint64_t Loader::epoch() const {
  MutexLock lock(impl_->mu);
  return impl_->scheduler.epoch();
}

std::uint64_t Loader::batches_per_epoch() const {
  return impl_->plan.NumBatches();
}

LoaderState Loader::state() const {
  MutexLock lock(impl_->mu);
  return {impl_->options.seed, impl_->scheduler.epoch(), impl_->plan.global_batch, impl_->scheduler.next_to_deliver(),
          impl_->plan.num_samples};
}

Status Loader::Restore(const LoaderState& state) {
  Impl& m = *impl_;
  STOKER_RETURN_IF_ERROR(m.CheckOwner());
  if (state.num_samples != m.plan.num_samples) {
    return Status::InvalidArgument(fmt::format("loader state is for a dataset of {} samples, this one has {}",
                                               state.num_samples, m.plan.num_samples));
  }
  if (state.global_batch_size != m.plan.global_batch) {
    return Status::InvalidArgument(fmt::format(
        "loader state has global batch {} but this loader's is {} (batch_size x world_size must stay the same)",
        state.global_batch_size, m.plan.global_batch));
  }
  if (state.seed != m.options.seed)
    return Status::InvalidArgument(fmt::format("loader state has seed {}, this loader {}", state.seed, m.options.seed));
  if (state.batches_consumed > m.plan.NumBatches())
    return Status::InvalidArgument(fmt::format("loader state is past the end of the epoch ({} of {} batches)",
                                               state.batches_consumed, m.plan.NumBatches()));
  MutexLock turn(m.consumer_mu);
  MutexLock lock(m.mu);
  m.Drain();
  m.StartEpoch(state.epoch, state.batches_consumed);
  m.Schedule();
  return Status::Ok();
}

Status Loader::Reshard(std::uint32_t rank, std::uint32_t world_size) {
  Impl& m = *impl_;
  STOKER_RETURN_IF_ERROR(m.CheckOwner());
  if (!m.plan.balanced)
    return Status::FailedPrecondition(
        "Reshard needs a loader made with global_batch_size (with batch_size per rank, the split is fixed)");
  if (world_size == 0 || rank >= world_size)
    return Status::InvalidArgument(fmt::format("rank {} is out of range for world size {}", rank, world_size));
  order::BatchPlan plan = m.plan;
  plan.rank = rank;
  plan.world_size = world_size;
  if (plan.MaxRankBatch() > m.rank_capacity)
    return Status::InvalidArgument(fmt::format(
        "world size {} gives a rank up to {} samples of the global batch {}, but the buffers hold {} (make the "
        "loader with min_world_size {} or less)",
        world_size, plan.MaxRankBatch(), plan.global_batch, m.rank_capacity, world_size));
  MutexLock turn(m.consumer_mu);
  MutexLock lock(m.mu);
  m.Drain();
  // Only these two fields change: readers of the others need no lock.
  m.plan.rank = rank;
  m.plan.world_size = world_size;
  ShardReadPlanner* planner = m.dataset->file_system() ? m.dataset->file_system()->read_planner() : nullptr;
  m.announcer = std::make_unique<order::ReadAheadAnnouncer>(planner, m.order_spec, m.plan, m.shard_spans);
  m.StartEpoch(m.scheduler.epoch(), m.scheduler.next_to_deliver());
  m.Schedule();
  return Status::Ok();
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
  s.pinned_memory = !m.slots.empty() && m.slots[0].images.pinned();
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
