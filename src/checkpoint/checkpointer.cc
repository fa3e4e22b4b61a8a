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
  std::thread worker;

  explicit Impl(CheckpointOptions o)
      : options(std::move(o)),
        policy(options.interval_mode, options.every_steps, options.every_seconds, options.mtbf_seconds, 0) {}

  double Now() const { return SecondsBetween(created, clock->Now()); }
  std::string Path(std::string_view name) const { return options.directory + "/" + std::string(name); }
  void Run();
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
  auto lock = fs.TryLock(impl->Path(checkpoint::kLockName));
  if (!lock.ok()) {
    if (lock.error().code() == StatusCode::kUnavailable)
      return Status::Unavailable(
          fmt::format("another process is writing checkpoints to '{}' (it holds '{}'); one Checkpointer per directory",
                      dir, impl->Path(checkpoint::kLockName)));
    return lock.error();
  }
  impl->lock = std::move(*lock);

  // We hold the lock, so every temporary here is a crashed writer's
  // leftover. RemoveTree never follows links: a link named like a
  // temporary goes itself, never what it points to.
  STOKER_ASSIGN_OR_RETURN(auto entries, fs.ListDirectory(dir));
  const std::string latest_temp = std::string(checkpoint::kLatestName) + ".tmp";
  for (const auto& e : entries) {
    if (e.name.starts_with(kTempPrefix) || e.name.starts_with(latest_temp))
      STOKER_RETURN_IF_ERROR(RemoveTree(fs, impl->Path(e.name)).WithContext("removing a leftover temporary"));
  }

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
                                       const CheckpointExtras& extras) {
  Impl& m = *impl_;
  const auto start = m.clock->Now();
  if (step < 0) return Status::InvalidArgument(fmt::format("step {} is negative", step));
  if (extras.metric && !std::isfinite(*extras.metric))
    return Status::InvalidArgument(fmt::format("metric {} is not finite", *extras.metric));
  checkpoint::PersistJob job;
  {
    MutexLock l(m.mu);
    job = std::move(m.recycled);
  }
  STOKER_ASSIGN_OR_RETURN(checkpoint::SnapshotPlan plan,
                          checkpoint::PlanSnapshot(tensors, m.options.max_file_bytes, std::move(job.plan)));
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
  }
  m.changed.NotifyAll();
  return SaveOutcome::kStarted;
}

Status Checkpointer::Wait() {
  MutexLock l(impl_->mu);
  impl_->changed.Wait(impl_->mu, [&]() REQUIRES(impl_->mu) { return !impl_->in_flight; });
  return std::exchange(impl_->pending_error, Status::Ok());
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
      temp = Path(fmt::format("{}step-{}-{}-{}", kTempPrefix, current.step, ::getpid(), temp_counter++));
    }
    std::uint64_t written = 0;
    Status s =
        checkpoint::PersistCheckpoint(*fs, options.directory, current, arena, temp, options.replace_existing, &written);
    if (!s.ok()) (void)RemoveTree(*fs, temp);  // best effort; the next Open removes it otherwise
    const double persist_seconds = SecondsBetween(current.snapshot_done, clock->Now());
    Status retention = s.ok() ? checkpoint::ApplyRetention(*fs, options) : Status::Ok();
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
