// Loader::Impl: the state the loader's files share (the lock, the slots,
// the scheduler, the announcer, the threads' loop). loader.cc makes the
// loader and serves batches; loader_position.cc moves its position (epochs,
// state, restore, reshard).
#pragma once

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "core/cancel.h"
#include "core/host_buffer.h"
#include "core/mutex.h"
#include "core/owner_process.h"
#include "io/read_access.h"
#include "order/read_plan.h"
#include "order/sampler.h"
#include "pipeline/autotune.h"
#include "pipeline/batch_scheduler.h"
#include "pipeline/buffer_warmth.h"
#include "pipeline/cpu_finisher.h"
#include "pipeline/loader_counters.h"
#include "pipeline/loader_setup.h"
#include "pipeline/order_ahead.h"
#include "pipeline/sample_producer.h"
#include "transform/transform.h"

namespace stoker {

struct Loader::Impl {
  using Clock = std::chrono::steady_clock;

  struct Slot {
    HostBuffer images;
    std::vector<std::int64_t> labels;
    std::vector<std::uint64_t> indices;
    std::uint32_t size = 0;
    std::uint64_t epoch = 0;
    std::uint64_t batch_index = 0;
    std::shared_ptr<const order::Permutation> order;  // the batch's epoch order
    std::vector<std::uint64_t> positions;             // in that order, one per sample
    pipeline::BatchInput input;                       // filled by the read item, then read by the sample items
    pipeline::FieldColumns fields;                    // typed fields: [spec][place], each place one worker's
    std::uint32_t pending = 0;                        // guarded by mu: items not yet finished
    std::uint32_t skipped = 0;                        // guarded by mu: places whose sample was replaced
    Status error;                                     // guarded by mu: the first failure in this batch
  };

  std::shared_ptr<const Dataset> dataset;
  LoaderOptions options;
  order::OrderSpec order_spec;
  pipeline::OrderChoice order_choice;  // as chosen at creation (kAuto resolved, the prediction)
  std::string corrupt_note;            // LoaderStats::corrupt_note
  io::ReadAccessChoice read_access;    // as chosen at creation
  order::BatchPlan plan;
  std::vector<order::ShardSpan> shard_spans;
  std::shared_ptr<pipeline::SampleFinisher> finisher;
  std::unique_ptr<pipeline::SampleProducer> producer;
  std::uint32_t rank_capacity = 0;  // samples each slot holds
  OwnerProcess owner;               // a forked child's copy fails at once (core/owner_process.h)
  pipeline::LoaderCounters counters;

  Mutex consumer_mu;  // Next() calls take turns
  Mutex mu;
  CondVar work_cv, done_cv;
  // Buffers move between slots and are allocated under mu, never while a
  // batch decodes into them or is held; metadata guarded by mu.
  std::vector<Slot> slots;
  std::size_t buffer_bytes = 0;  // each batch buffer's
  // Page-locked buffers are committed when allocated: a pinned pool
  // allocates each the first time a batch is decoded into it (two at
  // creation), so that buffers a loop never uses are never pinned.
  bool pinned_pool = false;
  // The read bytes of a batch are needed only from its read until its last
  // sample is finished: slots lend theirs back here in between, so a batch
  // held by the consumer or waiting for it holds no copy of what it was
  // decoded from (64 samples of a depth map or a multi-band chip: 50-100 MB).
  std::vector<std::vector<std::byte>> spare_arenas GUARDED_BY(mu);
  pipeline::BatchScheduler scheduler GUARDED_BY(mu);
  // Which buffers are warm, and the read batches waiting for one.
  pipeline::BufferWarmth warmth GUARDED_BY(mu);
  // The slot Next() is waiting for, if it is.
  std::optional<std::uint32_t> consumer_waits_for GUARDED_BY(mu);
  std::unique_ptr<order::ReadAheadAnnouncer> announcer GUARDED_BY(mu);
  // The order of the epoch being scheduled, and the next one's, made ahead.
  std::shared_ptr<const order::Permutation> schedule_order GUARDED_BY(mu);
  std::unique_ptr<pipeline::OrderAhead> orders GUARDED_BY(mu);
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

  Impl(std::uint32_t pool, std::uint32_t prefetch_depth, std::uint64_t batches, bool warm_buffers_only)
      : scheduler(pool, prefetch_depth, batches), warmth(pool, warm_buffers_only) {}

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

  // Restarts delivery and scheduling at batch `consumed` of `epoch`; the
  // caller has drained in-flight work.
  void StartEpoch(std::uint64_t epoch, std::uint64_t consumed) REQUIRES(mu) {
    scheduler.StartEpoch(epoch, consumed);
    schedule_order = orders->Take(epoch);
    announcer->Restart(epoch, consumed, *schedule_order);
    // A remote cache is told the next epoch's reads once they are made.
    if (announcer->active()) orders->Start(epoch + 1);
  }

  // The next epoch's shard visits, once made ahead, go to the remote cache.
  void AnnounceMadeAhead() REQUIRES(mu) {
    if (!announcer->active()) return;
    if (const auto ready = orders->Ready(); ready.visits != nullptr)
      announcer->AnnounceAhead(ready.epoch, *ready.visits);
  }

  // Schedules batches into free slots up to prefetch. Right after Next()
  // hands over a batch (`just_delivered`) the pool's reserve slot
  // (BatchScheduler) is left alone: the loop still holds its last batch for
  // a moment, and its release schedules the next into that one's buffer.
  void Schedule(bool just_delivered = false) REQUIRES(mu) {
    AnnounceMadeAhead();
    std::vector<std::uint64_t> positions;
    while (auto batch = scheduler.ScheduleNext(/*may_use_reserve=*/!just_delivered)) {
      if (batch->starts_epoch) {
        std::optional<order::EpochVisits> visits;
        schedule_order = orders->Take(batch->epoch, &visits);
        announcer->EpochScheduled(batch->epoch, *schedule_order, visits ? &*visits : nullptr);
      }
      // Nine tenths of the epoch scheduled (a remote dataset: from its
      // start, for its cache): the next one's order is made ahead, off this
      // lock (pipeline/order_ahead.h).
      if (const std::uint64_t batches = plan.NumBatches();
          announcer->active() || batch->batch + 1 >= batches - batches / 10)
        orders->Start(batch->epoch + 1);
      plan.RankPositions(batch->batch, positions);
      Slot& slot = slots[batch->slot];
      warmth.Scheduled(batch->slot);
      slot.size = static_cast<std::uint32_t>(positions.size());
      slot.epoch = batch->epoch;
      slot.batch_index = batch->batch;
      slot.order = schedule_order;
      slot.positions.assign(positions.begin(), positions.end());
      slot.input.seed = options.seed;
      slot.input.epoch = batch->epoch;
      slot.input.samples.clear();
      for (std::uint64_t p : positions) slot.input.samples.push_back((*schedule_order)[p]);
      slot.pending = slot.size;
      slot.skipped = 0;
      slot.error = Status::Ok();
      finisher->BeginBatch(batch->slot);
      // An empty share (the epoch's short last batch under a balanced split)
      // is ready at once: a read item for it could still be running when
      // the consumer takes and recycles the slot.
      if (slot.size == 0) {
        warmth.NeedsNoBuffer(batch->slot);
        continue;
      }
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

  // Queues the samples of a read batch that may decode (BufferWarmth),
  // first moving a warm buffer into its slot if it takes one.
  void StartSamples(const pipeline::BufferWarmth::Start& start) REQUIRES(mu) {
    Slot& slot = slots[start.slot];
    // Neither slot's buffer is in use: one is free, the other not started.
    if (start.take_buffer_of) std::swap(slot.images, slots[*start.take_buffer_of].images);
    if (slot.images.data() == nullptr && slot.size > 0) {
      // A pinned pool's buffer used for the first time. Allocation falls back
      // to pageable memory when pinning fails; failing that, the batch fails.
      auto images = HostBuffer::Allocate(buffer_bytes);
      if (!images.ok()) {
        slot.error = Status::ResourceExhausted(
            fmt::format("cannot allocate a batch buffer of {} bytes: {}", buffer_bytes, images.error().message()));
        slot.pending -= slot.size;
        if (slot.pending == 0) done_cv.NotifyAll();
        return;
      }
      slot.images = std::move(*images);
    }
    scheduler.QueueSamples(start.slot, slot.size);
    work_cv.NotifyAll();
  }
  // Starts the read batches waiting for a buffer that may decode now:
  // after a release, or when the consumer waits for `consumer_waits`.
  void StartWaitingBatches() REQUIRES(mu) {
    for (const auto& start : warmth.StartWaiting(scheduler.in_flight(), scheduler.free_list(), consumer_waits_for))
      StartSamples(start);
  }

  // Throws away queued work (SetEpoch, Restore), waits for started items,
  // and recycles the slots.
  void Drain() REQUIRES(mu) {
    for (const auto& item : scheduler.DropQueued())
      slots[item.slot].pending -= item.kind == pipeline::ItemKind::kReadBatch ? slots[item.slot].size : 1;
    // Read batches waiting for a buffer have no items queued; one being read
    // now may come to wait too (its read done, no buffer free): dropped then.
    const auto drop_waiting = [&]() REQUIRES(mu) {
      for (std::uint32_t s : warmth.DropWaiting()) slots[s].pending -= slots[s].size;
    };
    drop_waiting();
    done_cv.Wait(mu, [&]() REQUIRES(mu) {
      const auto& in_flight = scheduler.in_flight();
      return std::all_of(in_flight.begin(), in_flight.end(),
                         [&](std::uint32_t s) REQUIRES(mu) { return slots[s].pending == 0 || warmth.Waiting(s); });
    });
    drop_waiting();
    for (Slot& slot : slots) LendArena(slot);
    scheduler.ReclaimInFlight();
  }

  // A slot whose samples are all finished gives its read bytes back.
  void LendArena(Slot& slot) REQUIRES(mu) {
    if (slot.input.encoded.capacity() == 0) return;
    // Not cleared: a read resizes its arena, and zeroes only what it grows by.
    spare_arenas.push_back(std::move(slot.input.encoded));
    slot.input.encoded = {};
  }
  // A slot about to read takes the spare with the most room, if any.
  void BorrowArena(Slot& slot) REQUIRES(mu) {
    if (slot.input.encoded.capacity() != 0 || spare_arenas.empty()) return;
    auto largest = std::max_element(spare_arenas.begin(), spare_arenas.end(),
                                    [](const auto& a, const auto& b) { return a.capacity() < b.capacity(); });
    slot.input.encoded = std::move(*largest);
    spare_arenas.erase(largest);
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
        BorrowArena(slot);
        mu.Unlock();
        producer->ReadBatch(slot.input);
        if (!method_known) {
          method_known = true;
          MutexLock lock(method_mu);
          read_method = producer->ReadMethod();
        }
        mu.Lock();
        // Its samples go behind reads already queued for later batches, so
        // reads run ahead of decoding; unless it waits for a buffer.
        for (const auto& start :
             warmth.ReadDone(item.slot, scheduler.in_flight(), scheduler.free_list(), consumer_waits_for))
          StartSamples(start);
        if (warmth.Waiting(item.slot)) done_cv.NotifyAll();  // a drain waiting for this batch drops it now
        continue;
      }
      const pipeline::SampleContext context{options.seed, slot.epoch, 0, item.slot, item.index};
      mu.Unlock();
      auto produced = producer->Produce(slot.input, item.index, *slot.order, slot.positions[item.index], context,
                                        slot.images.data(), slot.fields, scratch);
      mu.Lock();
      if (produced.ok()) {
        slot.labels[item.index] = produced->label;
        slot.indices[item.index] = produced->sample;
        slot.skipped += produced->substituted ? 1 : 0;
      } else if (slot.error.ok()) {
        slot.error = produced.error();
      }
      if (--slot.pending == 0) {
        LendArena(slot);
        done_cv.NotifyAll();
      }
    }
    mu.Unlock();
  }

  Status CheckOwner() const { return owner.Check("this loader"); }
};

}  // namespace stoker
