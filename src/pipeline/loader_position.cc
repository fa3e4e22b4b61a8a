// The loader's position: the epoch, the state a checkpoint records, resuming
// at one, and elastic resharding. Each drains what is prefetched and starts
// scheduling again from the new position.
#include <fmt/format.h>

#include "pipeline/loader_impl.h"

namespace stoker {

void Loader::SetEpoch(std::uint64_t epoch) {
  if (!impl_->CheckOwner().ok()) return;
  MutexLock turn(impl_->consumer_mu);
  MutexLock lock(impl_->mu);
  if (impl_->scheduler.epoch() == epoch && impl_->scheduler.next_to_deliver() == 0)
    return;  // already at its start: keep the prefetch
  if (impl_->scheduler.epoch() + 1 == epoch && impl_->scheduler.EpochDelivered()) {
    // Every batch of the current epoch was handed out and the caller moves
    // to the next one without asking Next for the end of the epoch (a loop
    // that counts len(loader) batches): the work already running ahead into
    // that epoch is kept, as Next would keep it (was: dropped and decoded
    // again, 45% more CPU a sample with 4-batch epochs).
    impl_->scheduler.NextEpoch();
    impl_->Schedule();
    return;
  }
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

std::uint64_t Loader::samples_per_epoch() const {
  MutexLock lock(impl_->mu);  // Reshard changes the rank
  return impl_->plan.RankSamplesPerEpoch();
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
  m.announcer = std::make_unique<order::ReadAheadAnnouncer>(planner, m.plan, m.shard_spans);
  // Visits made ahead were listed for the old rank's batches.
  if (planner != nullptr) m.orders = std::make_unique<pipeline::OrderAhead>(m.order_spec, m.shard_spans, m.plan);
  m.StartEpoch(m.scheduler.epoch(), m.scheduler.next_to_deliver());
  m.Schedule();
  return Status::Ok();
}

}  // namespace stoker
