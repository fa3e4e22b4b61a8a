// Checkpointer: snapshot into reusable host buffers (snapshot.h), persist in
// a background thread (persist.h), publish by renaming the folder, then
// apply retention. This file owns the hand-over between the two threads.
#include "stoker/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "checkpoint/checkpointer_internal.h"
#include "checkpoint/interval.h"
#include "checkpoint/manifest.h"
#include "checkpoint/persist.h"
#include "checkpoint/sharded_manifest.h"
#include "checkpoint/sharded_persist.h"
#include "checkpoint/snapshot.h"
#include "core/host_buffer.h"
#include "core/mutex.h"

namespace stoker {

using checkpoint::kTempPrefix;

struct Checkpointer::Impl {
  CheckpointOptions options;
  FileSystem* fs = nullptr;
  Clock* clock = nullptr;
  std::unique_ptr<FileLock> lock;
  Clock::TimePoint created;
  std::unique_ptr<checkpoint::SnapshotCopier> copier;  // used by the thread calling Save

  // The arena is written by Save() and read by the persist thread; the
  // in_flight flag hands it over, so it needs no lock of its own.
  HostBuffer arena;

  mutable Mutex mu;
  CondVar changed;
  bool in_flight GUARDED_BY(mu) = false;
  bool stopping GUARDED_BY(mu) = false;
  std::optional<checkpoint::PersistJob> job GUARDED_BY(mu);
  // The last persisted job, handed back so that the next Save() reuses its
  // plan's storage (tens of thousands of names and shapes).
  checkpoint::PersistJob recycled GUARDED_BY(mu);
  Status pending_error GUARDED_BY(mu);
  CheckpointStats stats GUARDED_BY(mu);
  IntervalPolicy policy GUARDED_BY(mu);
  std::uint64_t temp_counter GUARDED_BY(mu) = 0;
  std::vector<SnapshotTensor> last_snapshot GUARDED_BY(mu);  // describe_snapshots
  std::thread worker;

  explicit Impl(CheckpointOptions o)
      : options(std::move(o)),
        policy(options.interval_mode, options.every_steps, options.every_seconds, options.mtbf_seconds, 0) {}

  double Now() const { return SecondsBetween(created, clock->Now()); }
  bool sharded() const { return options.world_size > 1; }
  std::string Path(std::string_view name) const { return options.directory + "/" + std::string(name); }
  void Run();
  // One rank's part of a sharded save, and on rank 0 the commit. A failed
  // save's files stay in its temporary folder for rank 0's next save to
  // remove: another rank may still be writing there.
  Status PersistSharded(const checkpoint::PersistJob& work, const std::string& temp, std::uint64_t* written) {
    const checkpoint::ShardedSaveInfo info{options.rank, options.world_size, work.save_id};
    const std::string temp_name = temp.substr(temp.rfind('/') + 1);
    if (options.rank == 0)
      STOKER_RETURN_IF_ERROR(checkpoint::RemoveStaleTemporaries(*fs, options.directory, temp_name));
    Status s = checkpoint::PersistRankPart(*fs, temp, work, arena, info, written);
    if (s.ok() && options.rank == 0)
      s = checkpoint::CommitShardedCheckpoint(*fs, options.directory, temp, work.step, info,
                                              options.commit_timeout_seconds, *clock, options.replace_existing);
    if (!s.ok()) {
      s = s.WithContext(fmt::format("rank {}", options.rank));
      // Tells rank 0 to stop waiting for this part, or (rank 0's) the other
      // ranks waiting for the publish that it will not come.
      checkpoint::RecordRankFailure(*fs, temp, options.rank, s);
    }
    return s;
  }
};

Result<std::unique_ptr<Checkpointer>> Checkpointer::Open(CheckpointOptions options) {
  return checkpoint::OpenCheckpointer(std::move(options), {});
}

Result<std::unique_ptr<Checkpointer>> checkpoint::OpenCheckpointer(CheckpointOptions options,
                                                                   const CheckpointerSeams& seams) {
  if (options.directory.empty()) return Status::InvalidArgument("checkpoint directory is empty");
  while (options.directory.size() > 1 && options.directory.back() == '/') options.directory.pop_back();
  if (options.max_file_bytes == 0) return Status::InvalidArgument("max_file_bytes must be positive");
  if (options.interval_mode == IntervalMode::kSteps && options.every_steps == 0)
    return Status::InvalidArgument("every_steps must be positive");
  if (!(options.every_seconds > 0) || !std::isfinite(options.every_seconds))
    return Status::InvalidArgument(fmt::format("every_seconds {} must be a positive number", options.every_seconds));
  if (!(options.mtbf_seconds > 0) || !std::isfinite(options.mtbf_seconds))
    return Status::InvalidArgument(fmt::format("mtbf_seconds {} must be a positive number", options.mtbf_seconds));
  if (options.world_size == 0 || options.rank >= options.world_size)
    return Status::InvalidArgument(
        fmt::format("rank {} is not in a world of size {}", options.rank, options.world_size));
  if (!(options.commit_timeout_seconds > 0) || !std::isfinite(options.commit_timeout_seconds))
    return Status::InvalidArgument(
        fmt::format("commit_timeout_seconds {} must be a positive number", options.commit_timeout_seconds));
  if (options.copy_threads > 64)
    return Status::InvalidArgument(fmt::format("copy_threads {} is more than the limit 64", options.copy_threads));

  auto impl = std::make_unique<Checkpointer::Impl>(std::move(options));
  impl->fs = impl->options.file_system ? impl->options.file_system : FileSystem::Default();
  impl->clock = seams.clock ? seams.clock : Clock::Real();
  impl->created = impl->clock->Now();
  FileSystem& fs = *impl->fs;
  const std::string& dir = impl->options.directory;
  STOKER_RETURN_IF_ERROR(fs.CreateDirectories(dir).WithContext("checkpoint directory"));
  if (auto info = fs.Stat(dir); info.ok() && info->type != FileType::kDirectory)
    return Status::InvalidArgument(fmt::format("checkpoint directory '{}' is not a directory", dir));
  // Sharded: one lock per rank (every rank writes here; two processes
  // claiming one rank are refused).
  const std::string lock_name =
      impl->sharded() ? fmt::format("{}.{}", checkpoint::kLockName, checkpoint::RankStem(impl->options.rank))
                      : std::string(checkpoint::kLockName);
  auto lock = fs.TryLock(impl->Path(lock_name));
  if (!lock.ok()) {
    if (lock.error().code() == StatusCode::kUnavailable)
      return Status::Unavailable(fmt::format(
          "another process is writing checkpoints to '{}' (it holds '{}'); one Checkpointer per directory{}", dir,
          impl->Path(lock_name), impl->sharded() ? " and rank" : ""));
    return lock.error();
  }
  impl->lock = std::move(*lock);

  // We hold the lock, so every temporary here is a crashed writer's
  // leftover (sharded: rank 0 cleans, before any rank saves). RemoveTree
  // never follows links: a link named like a temporary goes itself, never
  // what it points to.
  if (impl->options.rank == 0) STOKER_RETURN_IF_ERROR(checkpoint::RemoveStaleTemporaries(fs, dir, {}));

  const std::uint32_t cores = std::max(1u, std::thread::hardware_concurrency());
  const std::uint32_t copy_threads = impl->options.copy_threads ? impl->options.copy_threads : std::min(4u, cores);
  impl->copier = std::make_unique<checkpoint::SnapshotCopier>(seams.device_runtime, copy_threads);
  Checkpointer::Impl* raw = impl.get();
  impl->worker = std::thread([raw] { raw->Run(); });
  return std::unique_ptr<Checkpointer>(new Checkpointer(std::move(impl)));
}

Checkpointer::Checkpointer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Checkpointer::~Checkpointer() {
  {
    MutexLock l(impl_->mu);
    impl_->changed.Wait(impl_->mu, [&]() REQUIRES(impl_->mu) { return !impl_->in_flight; });
    impl_->stopping = true;
  }
  impl_->changed.NotifyAll();
  impl_->worker.join();
}

const CheckpointOptions& Checkpointer::options() const {
  return impl_->options;
}

Result<SaveOutcome> Checkpointer::Save(std::int64_t step, std::span<const TensorRef> tensors,
                                       const CheckpointExtras& extras, std::string_view save_id) {
  Impl& m = *impl_;
  const auto start = m.clock->Now();
  if (step < 0) return Status::InvalidArgument(fmt::format("step {} is negative", step));
  if (extras.metric && !std::isfinite(*extras.metric))
    return Status::InvalidArgument(fmt::format("metric {} is not finite", *extras.metric));
  if (m.sharded() && !checkpoint::ValidSaveId(save_id))
    return Status::InvalidArgument(fmt::format(
        "save id '{}' of a sharded save must be 1 to 64 letters, digits, '-' or '_', the same on every rank", save_id));
  checkpoint::PersistJob job;
  {
    MutexLock l(m.mu);
    job = std::move(m.recycled);
  }
  STOKER_ASSIGN_OR_RETURN(
      checkpoint::SnapshotPlan plan,
      checkpoint::PlanSnapshot(tensors, m.options.max_file_bytes, std::move(job.plan),
                               m.sharded() ? checkpoint::RankStem(m.options.rank) : std::string("model")));
  if (!m.sharded())
    for (const TensorRef& t : tensors)
      if (!t.global_shape.empty())
        return Status::InvalidArgument(fmt::format(
            "tensor '{}' is a shard of a larger tensor, but this Checkpointer is not sharded (world_size 1)", t.name));
  STOKER_RETURN_IF_ERROR(m.copier->CheckDevices(tensors));
  if (!m.options.replace_existing && m.fs->LinkStat(m.Path(checkpoint::StepDirectoryName(step))).ok())
    return Status::AlreadyExists(fmt::format(
        "'{}' exists already (a checkpoint of this step from an earlier run?): not replaced; set replace_existing "
        "to overwrite it, or save under another step",
        m.Path(checkpoint::StepDirectoryName(step))));

  {
    MutexLock l(m.mu);
    if (!m.pending_error.ok()) return std::exchange(m.pending_error, Status::Ok());
    if (m.in_flight) {
      if (m.options.when_busy == WhenBusy::kSkip) {
        ++m.stats.skipped_busy;
        return SaveOutcome::kSkippedBusy;
      }
      ++m.stats.waited_busy;
      const auto wait_start = m.clock->Now();
      m.changed.Wait(m.mu, [&]() REQUIRES(m.mu) { return !m.in_flight; });
      m.stats.busy_wait_seconds += SecondsBetween(wait_start, m.clock->Now());
      if (!m.pending_error.ok()) return std::exchange(m.pending_error, Status::Ok());
    }
    m.in_flight = true;  // the arena is ours until the persist finishes
    ++m.stats.saves_started;
  }
  auto fail = [&](Status s) {
    MutexLock l(m.mu);
    m.in_flight = false;
    ++m.stats.saves_failed;
    m.changed.NotifyAll();
    return s;
  };

  if (m.arena.size() < plan.tensor_bytes) {
    m.arena = HostBuffer();  // free first: two large buffers may not fit
    auto arena = HostBuffer::Allocate(plan.tensor_bytes);
    if (!arena.ok())
      return fail(arena.error().WithContext(fmt::format("allocating the snapshot buffer for step {}", step)));
    m.arena = std::move(*arena);
  }
  const auto copy_start = m.clock->Now();
  if (Status s = m.copier->Copy(plan, tensors, m.arena); !s.ok()) return fail(s);
  job.step = step;
  job.save_id.assign(save_id);
  job.pieces.clear();
  if (m.sharded()) {
    job.pieces.reserve(tensors.size());
    for (const TensorRef& t : tensors) {
      job.pieces.push_back(t);
      job.pieces.back().data = nullptr;
    }
  }
  std::vector<SnapshotTensor> described;
  if (m.options.describe_snapshots) {
    for (const checkpoint::FilePlan& file : plan.files)
      for (std::size_t i = 0; i < file.tensors.size(); ++i) {
        const safetensors::TensorLayout& t = file.tensors[i];
        described.push_back({file.sources[i], std::span<const std::byte>(m.arena.data() + file.arena_offset + t.begin,
                                                                         t.end - t.begin)});
      }
  }
  job.plan = std::move(plan);
  job.extras = extras;
  job.snapshot_done = m.clock->Now();
  job.stall_seconds = SecondsBetween(start, job.snapshot_done);
  {
    MutexLock l(m.mu);
    m.stats.last_snapshot_seconds = SecondsBetween(copy_start, job.snapshot_done);
    m.stats.last_stall_seconds = job.stall_seconds;
    m.stats.last_bytes = job.plan.tensor_bytes;
    m.stats.pinned_snapshot = m.arena.pinned();
    m.policy.OnSaveStarted(step, m.Now());
    m.job = std::move(job);
    if (m.options.describe_snapshots) m.last_snapshot = std::move(described);
  }
  m.changed.NotifyAll();
  return SaveOutcome::kStarted;
}

Status Checkpointer::Wait() {
  MutexLock l(impl_->mu);
  impl_->changed.Wait(impl_->mu, [&]() REQUIRES(impl_->mu) { return !impl_->in_flight; });
  return std::exchange(impl_->pending_error, Status::Ok());
}

bool Checkpointer::Busy() const {
  MutexLock l(impl_->mu);
  return impl_->in_flight;
}

std::vector<SnapshotTensor> Checkpointer::LastSnapshot() const {
  MutexLock l(impl_->mu);
  return impl_->last_snapshot;
}

bool Checkpointer::Failed() const {
  MutexLock l(impl_->mu);
  return !impl_->pending_error.ok();
}

bool Checkpointer::Due(std::int64_t step) const {
  MutexLock l(impl_->mu);
  return impl_->policy.Due(step, impl_->Now());
}

CheckpointStats Checkpointer::stats() const {
  MutexLock l(impl_->mu);
  CheckpointStats s = impl_->stats;
  s.interval_seconds = impl_->policy.interval_seconds();
  s.expected_overhead = impl_->policy.expected_overhead();
  return s;
}

void Checkpointer::Impl::Run() {
  for (;;) {
    checkpoint::PersistJob current;
    std::string temp;
    {
      MutexLock l(mu);
      changed.Wait(mu, [&]() REQUIRES(mu) { return job.has_value() || stopping; });
      if (!job) return;
      current = std::move(*job);
      job.reset();
      temp = sharded() ? Path(checkpoint::ShardedTempName(current.step, current.save_id))
                       : Path(fmt::format("{}step-{}-{}-{}", kTempPrefix, current.step, ::getpid(), temp_counter++));
    }
    std::uint64_t written = 0;
    Status s = sharded() ? PersistSharded(current, temp, &written)
                         : checkpoint::PersistCheckpoint(*fs, options.directory, current, arena, temp,
                                                         options.replace_existing, &written);
    if (!s.ok() && !sharded()) (void)RemoveTree(*fs, temp);  // best effort; the next Open removes it otherwise
    const double persist_seconds = SecondsBetween(current.snapshot_done, clock->Now());
    Status retention = s.ok() && options.rank == 0 ? checkpoint::ApplyRetention(*fs, options) : Status::Ok();
    {
      MutexLock l(mu);
      in_flight = false;
      stats.bytes_written += written;
      if (s.ok()) {
        ++stats.saves_published;
        stats.last_published_step = current.step;
        stats.last_persist_seconds = persist_seconds;
        policy.OnCostMeasured(current.stall_seconds, persist_seconds);
        // Retention is housekeeping: the new checkpoint is safe, so a failed
        // deletion is reported but does not fail the save.
        if (!retention.ok())
          pending_error =
              retention.WithContext(fmt::format("checkpoint step {} published, but retention failed", current.step));
      } else {
        ++stats.saves_failed;
        pending_error = s.WithContext(fmt::format("checkpoint step {} was not saved", current.step));
      }
      recycled = std::move(current);
    }
    changed.NotifyAll();
  }
}

}  // namespace stoker
