// Checkpointer: snapshot into reusable host buffers, persist in a background
// thread, publish by renaming the folder, then apply retention.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/interval.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "core/hash.h"
#include "core/host_buffer.h"
#include "core/mutex.h"
#include "device/runtime.h"
#include "stoker/checkpoint.h"

namespace stoker {
namespace {

using Clock = std::chrono::steady_clock;
using checkpoint::kTempPrefix;

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// One output file: the tensors it holds, laid out in its data buffer, and
// where that buffer lies in the snapshot arena.
struct FilePlan {
  std::string name;
  std::vector<safetensors::TensorLayout> tensors;
  std::uint64_t arena_offset = 0;
  std::uint64_t bytes = 0;
};

struct PersistJob {
  std::int64_t step = 0;
  std::vector<FilePlan> files;
  std::uint64_t tensor_bytes = 0;
  CheckpointExtras extras;
  double stall_seconds = 0;
  Clock::time_point snapshot_done;
};

// Copies [src, src+len) segments into the arena with several threads; a
// single core cannot saturate memory bandwidth.
struct CopySegment {
  std::byte* dst;
  const std::byte* src;
  std::uint64_t bytes;
};

void ParallelCopy(const std::vector<CopySegment>& segments, std::uint64_t total, std::uint32_t threads) {
  constexpr std::uint64_t kMinPerThread = std::uint64_t{32} << 20;
  threads = static_cast<std::uint32_t>(std::clamp<std::uint64_t>(total / kMinPerThread, 1, threads));
  auto copy_range = [&](std::uint64_t from, std::uint64_t to) {
    std::uint64_t pos = 0;
    for (const auto& s : segments) {
      const std::uint64_t begin = std::max(from, pos), end = std::min(to, pos + s.bytes);
      if (begin < end) std::memcpy(s.dst + (begin - pos), s.src + (begin - pos), end - begin);
      pos += s.bytes;
      if (pos >= to) break;
    }
  };
  if (threads == 1) {
    copy_range(0, total);
    return;
  }
  std::vector<std::thread> workers;
  const std::uint64_t share = (total + threads - 1) / threads;
  for (std::uint32_t i = 1; i < threads; ++i)
    workers.emplace_back(copy_range, i * share, std::min(total, (i + 1) * share));
  copy_range(0, std::min(total, share));
  for (auto& w : workers) w.join();
}

std::string FileName(std::size_t index, std::size_t count) {
  if (count == 1) return "model.safetensors";
  return fmt::format("model-{:05d}-of-{:05d}.safetensors", index + 1, count);
}

}  // namespace

struct Checkpointer::Impl {
  CheckpointOptions options;
  FileSystem* fs = nullptr;
  std::unique_ptr<FileLock> lock;
  std::uint32_t copy_threads = 1;
  Clock::time_point created = Clock::now();

  // The arena is written by Save() and read by the persist thread; the
  // in_flight flag hands it over, so it needs no lock of its own.
  HostBuffer arena;

  mutable Mutex mu;
  CondVar changed;
  bool in_flight GUARDED_BY(mu) = false;
  bool stopping GUARDED_BY(mu) = false;
  std::optional<PersistJob> job GUARDED_BY(mu);
  Status pending_error GUARDED_BY(mu);
  CheckpointStats stats GUARDED_BY(mu);
  IntervalPolicy policy GUARDED_BY(mu);
  std::uint64_t temp_counter GUARDED_BY(mu) = 0;
  std::uint64_t persist_bytes = 0;  // of the persist in progress; worker thread only

  // Device tensors: the runtime, and one copy stream per device (made on
  // first use; touched only by the thread calling Save).
  device::DeviceRuntime* device_runtime = nullptr;
  std::string device_unavailable;
  std::map<int, device::Stream> device_streams;

  device::DeviceRuntime* DeviceRuntimeFor(const TensorRef&) {
    if (device_runtime == nullptr) {
      device_runtime = options.device_runtime ? options.device_runtime : device::CudaDeviceRuntime(&device_unavailable);
    }
    return device_runtime;
  }
  std::thread worker;

  explicit Impl(CheckpointOptions o)
      : options(std::move(o)),
        policy(options.interval_mode, options.every_steps, options.every_seconds, options.mtbf_seconds, 0) {}

  double Now() const { return Seconds(Clock::now() - created); }

  void Run();
  Status Persist(const PersistJob& work, const std::string& temp);
  Status ApplyRetention();
  std::string Path(std::string_view name) const { return options.directory + "/" + std::string(name); }
};

Result<std::unique_ptr<Checkpointer>> Checkpointer::Open(CheckpointOptions options) {
  if (options.directory.empty()) return Status::InvalidArgument("checkpoint directory is empty");
  while (options.directory.size() > 1 && options.directory.back() == '/') options.directory.pop_back();
  if (options.max_file_bytes == 0) return Status::InvalidArgument("max_file_bytes must be positive");
  if (options.interval_mode == IntervalMode::kSteps && options.every_steps == 0)
    return Status::InvalidArgument("every_steps must be positive");
  if (!(options.every_seconds > 0)) return Status::InvalidArgument("every_seconds must be positive");
  if (!(options.mtbf_seconds > 0)) return Status::InvalidArgument("mtbf_seconds must be positive");

  auto impl = std::make_unique<Impl>(std::move(options));
  impl->fs = impl->options.file_system ? impl->options.file_system : FileSystem::Default();
  FileSystem& fs = *impl->fs;
  const std::string& dir = impl->options.directory;
  STOKER_RETURN_IF_ERROR(fs.CreateDirectories(dir).WithContext("checkpoint directory"));
  auto lock = fs.TryLock(impl->Path(checkpoint::kLockName));
  if (!lock.ok()) {
    if (lock.error().code() == StatusCode::kUnavailable)
      return Status::Unavailable(
          fmt::format("another process is writing checkpoints to '{}' (it holds '{}'); one Checkpointer per directory",
                      dir, impl->Path(checkpoint::kLockName)));
    return lock.error();
  }
  impl->lock = std::move(*lock);

  // We hold the lock, so every temporary here is a crashed writer's leftover.
  STOKER_ASSIGN_OR_RETURN(auto entries, fs.ListDirectory(dir));
  for (const auto& e : entries) {
    if (e.name.starts_with(kTempPrefix) || e.name == std::string(checkpoint::kLatestName) + ".tmp")
      STOKER_RETURN_IF_ERROR(RemoveTree(fs, impl->Path(e.name)).WithContext("removing a leftover temporary"));
  }

  const std::uint32_t cores = std::max(1u, std::thread::hardware_concurrency());
  impl->copy_threads = impl->options.copy_threads ? impl->options.copy_threads : std::min(4u, cores);
  Impl* raw = impl.get();
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
  const auto start = Clock::now();
  Impl& m = *impl_;
  if (step < 0) return Status::InvalidArgument(fmt::format("step {} is negative", step));
  if (extras.metric && !std::isfinite(*extras.metric))
    return Status::InvalidArgument(fmt::format("metric {} is not finite", *extras.metric));
  if (!extras.user_json.empty() && !nlohmann::json::accept(extras.user_json))
    return Status::InvalidArgument("user_json is not valid JSON");

  // Validate and order: by element size (largest first) then name, so every
  // tensor is aligned to its element size in the file.
  std::vector<std::uint64_t> bytes(tensors.size());
  std::vector<std::size_t> order(tensors.size());
  std::set<std::string_view> names;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorRef& t = tensors[i];
    if (t.name.empty()) return Status::InvalidArgument(fmt::format("tensor {} has an empty name", i));
    if (t.name == "__metadata__") return Status::InvalidArgument("a tensor may not be named '__metadata__'");
    if (!names.insert(t.name).second) return Status::InvalidArgument(fmt::format("duplicate tensor name '{}'", t.name));
    if (t.device >= 0 && m.DeviceRuntimeFor(t) == nullptr)
      return Status::Unavailable(fmt::format("tensor '{}' is on cuda:{} but CUDA is not usable here: {}", t.name,
                                             t.device, m.device_unavailable));
    auto b = safetensors::TensorBytes(t.dtype, t.shape);
    if (!b.ok()) return b.error().WithContext(fmt::format("tensor '{}'", t.name));
    if (*b > 0 && t.data == nullptr) return Status::InvalidArgument(fmt::format("tensor '{}' has no data", t.name));
    bytes[i] = *b;
    order[i] = i;
  }
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const auto sa = TensorDTypeSize(tensors[a].dtype), sb = TensorDTypeSize(tensors[b].dtype);
    return sa != sb ? sa > sb : tensors[a].name < tensors[b].name;
  });

  {
    MutexLock l(m.mu);
    if (!m.pending_error.ok()) return std::exchange(m.pending_error, Status::Ok());
    if (m.in_flight) {
      if (m.options.when_busy == WhenBusy::kSkip) {
        ++m.stats.skipped_busy;
        return SaveOutcome::kSkippedBusy;
      }
      ++m.stats.waited_busy;
      const auto wait_start = Clock::now();
      m.changed.Wait(m.mu, [&]() REQUIRES(m.mu) { return !m.in_flight; });
      m.stats.busy_wait_seconds += Seconds(Clock::now() - wait_start);
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

  // Plan the files: fill each up to max_file_bytes in the chosen order.
  PersistJob job;
  job.step = step;
  job.extras = extras;
  std::vector<std::vector<std::size_t>> groups;
  std::uint64_t in_group = 0;
  for (std::size_t i : order) {
    if (groups.empty() || (in_group > 0 && in_group + bytes[i] > m.options.max_file_bytes)) {
      groups.emplace_back();
      in_group = 0;
    }
    groups.back().push_back(i);
    in_group += bytes[i];
  }
  if (groups.empty()) groups.emplace_back();  // an empty state still makes one (empty) file
  std::vector<CopySegment> segments;
  std::uint64_t total = 0;
  for (const auto& group : groups) {
    std::uint64_t size = 0;
    for (std::size_t i : group) size += bytes[i];
    total += size;
  }
  job.tensor_bytes = total;
  if (m.arena.size() < total) {
    m.arena = HostBuffer();  // free first: two large buffers may not fit
    auto arena = HostBuffer::Allocate(total);
    if (!arena.ok())
      return fail(arena.error().WithContext(fmt::format("allocating the snapshot buffer for step {}", step)));
    m.arena = std::move(*arena);
  }
  std::uint64_t arena_pos = 0;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    FilePlan file;
    file.name = FileName(g, groups.size());
    file.arena_offset = arena_pos;
    for (std::size_t i : groups[g]) {
      const TensorRef& t = tensors[i];
      file.tensors.push_back({t.name, t.dtype, t.shape, file.bytes, file.bytes + bytes[i]});
      if (bytes[i] > 0 && t.device < 0)
        segments.push_back({m.arena.data() + arena_pos + file.bytes, static_cast<const std::byte*>(t.data), bytes[i]});
      file.bytes += bytes[i];
    }
    arena_pos += file.bytes;
    job.files.push_back(std::move(file));
  }

  const auto copy_start = Clock::now();
  // Device tensors: asynchronous copies on one stream per device, enqueued
  // first so that they run while the host tensors are copied. The caller's
  // current device is put back afterwards.
  std::set<int> devices_used;
  std::optional<int> caller_device;
  for (std::size_t g = 0, arena_at = 0; g < groups.size(); ++g) {
    std::uint64_t in_file = 0;
    for (std::size_t i : groups[g]) {
      const TensorRef& t = tensors[i];
      if (t.device >= 0 && bytes[i] > 0) {
        device::DeviceRuntime& rt = *m.device_runtime;
        if (!caller_device) {
          auto current = rt.CurrentDevice();
          if (!current.ok()) return fail(current.error());
          caller_device = *current;
        }
        if (Status s = rt.SetDevice(t.device); !s.ok()) return fail(s.WithContext(fmt::format("tensor '{}'", t.name)));
        auto stream = m.device_streams.find(t.device);
        if (stream == m.device_streams.end()) {
          auto made = device::MakeStream(rt);
          if (!made.ok()) return fail(made.error());
          stream = m.device_streams.emplace(t.device, std::move(*made)).first;
        }
        if (Status s = rt.CopyToHostAsync(m.arena.data() + arena_at + in_file, t.data, bytes[i], stream->second.get());
            !s.ok())
          return fail(s.WithContext(fmt::format("snapshot of tensor '{}' on cuda:{}", t.name, t.device)));
        devices_used.insert(t.device);
      }
      in_file += bytes[i];
    }
    arena_at += in_file;
  }
  std::uint64_t host_total = 0;
  for (const auto& segment : segments) host_total += segment.bytes;
  ParallelCopy(segments, host_total, m.copy_threads);
  for (int d : devices_used) {
    if (Status s = m.device_runtime->SynchronizeStream(m.device_streams.at(d).get()); !s.ok())
      return fail(s.WithContext(fmt::format("snapshot from cuda:{}", d)));
  }
  if (caller_device) {
    if (Status s = m.device_runtime->SetDevice(*caller_device); !s.ok()) return fail(s);
  }
  job.snapshot_done = Clock::now();
  job.stall_seconds = Seconds(job.snapshot_done - start);
  {
    MutexLock l(m.mu);
    m.stats.last_snapshot_seconds = Seconds(job.snapshot_done - copy_start);
    m.stats.last_stall_seconds = job.stall_seconds;
    m.stats.last_bytes = total;
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
    PersistJob current;
    std::string temp;
    {
      MutexLock l(mu);
      changed.Wait(mu, [&]() REQUIRES(mu) { return job.has_value() || stopping; });
      if (!job) return;
      current = std::move(*job);
      job.reset();
      temp = Path(fmt::format("{}step-{}-{}-{}", kTempPrefix, current.step, ::getpid(), temp_counter++));
    }
    Status s = Persist(current, temp);
    if (!s.ok()) (void)RemoveTree(*fs, temp);  // best effort; the next Open removes it otherwise
    const double persist_seconds = Seconds(Clock::now() - current.snapshot_done);
    Status retention = s.ok() ? ApplyRetention() : Status::Ok();
    {
      MutexLock l(mu);
      in_flight = false;
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
    }
    changed.NotifyAll();
  }
}

Status Checkpointer::Impl::Persist(const PersistJob& work, const std::string& temp) {
  STOKER_RETURN_IF_ERROR(RemoveTree(*fs, temp));
  STOKER_RETURN_IF_ERROR(fs->CreateDirectories(temp));
  checkpoint::Manifest manifest;
  manifest.step = work.step;
  manifest.extras = work.extras;
  manifest.tensor_bytes = work.tensor_bytes;
  manifest.created_unix_seconds =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::map<std::string, std::string> file_metadata = work.extras.metadata;
  file_metadata.try_emplace("format", "pt");  // what Hugging Face loaders look for

  auto write_file = [&](const std::string& name, std::span<const std::byte> head,
                        std::span<const std::byte> body) -> Status {
    const std::string path = temp + "/" + name;
    STOKER_ASSIGN_OR_RETURN(auto file, fs->CreateForWrite(path));
    Xxh3Stream hash;
    hash.Update(head);
    STOKER_RETURN_IF_ERROR(file->Append(head));
    constexpr std::size_t kChunk = std::size_t{16} << 20;  // hash while the chunk is hot in cache
    for (std::size_t pos = 0; pos < body.size(); pos += kChunk) {
      auto chunk = body.subspan(pos, std::min(kChunk, body.size() - pos));
      hash.Update(chunk);
      STOKER_RETURN_IF_ERROR(file->Append(chunk));
      STOKER_RETURN_IF_ERROR(file->StartWriteBack());  // the disk writes while we hash the next chunk
    }
    STOKER_RETURN_IF_ERROR(file->Sync());
    STOKER_RETURN_IF_ERROR(file->Close());
    manifest.files.push_back({name, head.size() + body.size(), hash.Digest()});
    persist_bytes += head.size() + body.size();
    return Status::Ok();
  };

  nlohmann::json weight_map = nlohmann::json::object();
  for (const auto& file : work.files) {
    STOKER_ASSIGN_OR_RETURN(std::string header, safetensors::EncodeHeader(file.tensors, file_metadata));
    STOKER_RETURN_IF_ERROR(write_file(file.name, std::as_bytes(std::span(header)),
                                      std::span<const std::byte>(arena.data() + file.arena_offset, file.bytes)));
    manifest.tensor_count += file.tensors.size();
    for (const auto& t : file.tensors) weight_map[t.name] = file.name;
  }
  if (work.files.size() > 1) {
    // The Hugging Face convention for a state split across files.
    nlohmann::json index = {{"metadata", {{"total_size", work.tensor_bytes}}}, {"weight_map", weight_map}};
    const std::string text = index.dump(2) + "\n";
    STOKER_RETURN_IF_ERROR(write_file(std::string(checkpoint::kIndexName), std::as_bytes(std::span(text)), {}));
  }
  STOKER_ASSIGN_OR_RETURN(std::string manifest_text, checkpoint::EncodeManifest(manifest));
  {
    const std::string path = temp + "/" + std::string(checkpoint::kManifestName);
    STOKER_ASSIGN_OR_RETURN(auto file, fs->CreateForWrite(path));
    STOKER_RETURN_IF_ERROR(file->Append(std::as_bytes(std::span(manifest_text))));
    STOKER_RETURN_IF_ERROR(file->Sync());
    STOKER_RETURN_IF_ERROR(file->Close());
  }
  STOKER_RETURN_IF_ERROR(fs->SyncDirectory(temp));

  // Publish: one rename makes the folder appear complete.
  const std::string name = checkpoint::StepDirectoryName(work.step);
  const std::string final_path = Path(name);
  std::string replaced;
  if (fs->Stat(final_path).ok()) {
    // Saving a step again (e.g. after resuming from an older one): move the
    // old folder aside under a temporary name, which a crash leaves for cleanup.
    replaced = Path(fmt::format("{}replaced-{}-{}", kTempPrefix, name, ::getpid()));
    STOKER_RETURN_IF_ERROR(fs->Rename(final_path, replaced));
  }
  STOKER_RETURN_IF_ERROR(fs->Rename(temp, final_path));
  STOKER_RETURN_IF_ERROR(fs->SyncDirectory(options.directory));
  const std::string latest = name + "\n";
  STOKER_RETURN_IF_ERROR(
      WriteWholeFileAtomically(*fs, Path(checkpoint::kLatestName), std::as_bytes(std::span(latest))));
  if (!replaced.empty()) STOKER_RETURN_IF_ERROR(RemoveTree(*fs, replaced));
  {
    MutexLock l(mu);
    stats.bytes_written += persist_bytes;
  }
  persist_bytes = 0;
  return Status::Ok();
}

Status Checkpointer::Impl::ApplyRetention() {
  if (options.keep_last == 0) return Status::Ok();
  STOKER_ASSIGN_OR_RETURN(auto all, ListCheckpoints(options.directory, fs));
  if (all.empty()) return Status::Ok();
  std::set<std::int64_t> keep;
  keep.insert(all.back().step);  // the newest complete checkpoint, always
  for (std::size_t i = all.size() > options.keep_last ? all.size() - options.keep_last : 0; i < all.size(); ++i)
    keep.insert(all[i].step);
  if (options.keep_best > 0) {
    std::vector<const CheckpointInfo*> ranked;
    for (const auto& c : all)
      if (c.metric) ranked.push_back(&c);
    std::stable_sort(ranked.begin(), ranked.end(), [&](const CheckpointInfo* a, const CheckpointInfo* b) {
      return options.higher_metric_is_better ? *a->metric > *b->metric : *a->metric < *b->metric;
    });
    for (std::size_t i = 0; i < ranked.size() && i < options.keep_best; ++i) keep.insert(ranked[i]->step);
  }
  for (const auto& c : all) {
    if (keep.contains(c.step)) continue;
    // Rename first so that a crash mid-deletion leaves a temporary (cleaned
    // on the next Open), never a half-deleted step folder.
    const std::string doomed = Path(fmt::format("{}deleting-step-{}-{}", kTempPrefix, c.step, ::getpid()));
    STOKER_RETURN_IF_ERROR(fs->Rename(c.path, doomed));
    STOKER_RETURN_IF_ERROR(RemoveTree(*fs, doomed));
  }
  return Status::Ok();
}

}  // namespace stoker
