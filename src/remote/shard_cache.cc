#include "remote/shard_cache.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "core/cancel.h"
#include "core/mutex.h"
#include "remote/eviction.h"
#include "remote/shard_download.h"
#include "stoker/byte_size.h"
#include "stoker/text.h"

namespace stoker::remote {

struct ShardCache::Impl {
  enum class State : std::uint8_t { kAbsent, kDownloading, kPresent };
  struct Entry {
    State state = State::kAbsent;
    std::unique_ptr<ReadableFile> file;  // opened at first read
    std::uint32_t pins = 0;
    std::uint32_t waiters = 0;  // readers waiting for it: not to be evicted before they pin it
    std::uint64_t last_use = 0;
    bool demanded = false;           // queued for a reader
    bool read_ahead_failed = false;  // do not fetch ahead again; a reader will retry
    std::uint64_t failures = 0;
    Status failure;
    // A reader's download failed: readers get `failure` at once until the
    // plan is reset (generation changes) or this time passes.
    std::optional<Clock::TimePoint> failed_until;
    std::uint64_t failed_in_plan = 0;
  };

  ShardCacheOptions options;
  std::vector<ShardDesc> shards;
  std::vector<std::uint64_t> shard_sizes;
  HttpTransport* transport = nullptr;
  FileSystem* fs = nullptr;
  Clock* clock = nullptr;
  std::unique_ptr<CacheFolder> folder;
  std::atomic<bool> stopping{false};

  mutable Mutex mu;
  CondVar changed;
  std::vector<Entry> entries GUARDED_BY(mu);
  AccessPattern access GUARDED_BY(mu) = AccessPattern::kNormal;  // ShardCache::AdviseAccess
  std::deque<std::uint32_t> demand GUARDED_BY(mu);
  std::vector<std::uint32_t> plan GUARDED_BY(mu);
  std::uint64_t plan_base GUARDED_BY(mu) = 0;  // global position of plan[0]
  std::uint64_t position GUARDED_BY(mu) = 0;
  std::uint64_t plan_resets GUARDED_BY(mu) = 0;
  std::uint64_t used GUARDED_BY(mu) = 0;
  std::uint64_t in_flight GUARDED_BY(mu) = 0;
  // What other live processes are downloading into the folder: counted
  // against the shared cap like our own downloads.
  std::uint64_t others_in_flight GUARDED_BY(mu) = 0;
  std::uint64_t ticks GUARDED_BY(mu) = 0;
  std::uint64_t generation GUARDED_BY(mu) = 0;  // bumps whenever new work may exist
  std::optional<Clock::TimePoint> last_refresh GUARDED_BY(mu);
  bool stop GUARDED_BY(mu) = false;
  // Read-ahead stopped for want of an evictable entry: an unpin may help.
  bool waiting_for_room GUARDED_BY(mu) = false;
  RemoteStats st GUARDED_BY(mu);
  std::vector<std::jthread> workers;

  void Bump() REQUIRES(mu) {
    ++generation;
    changed.NotifyAll();
  }

  Horizon CurrentHorizon() const REQUIRES(mu) {
    return ComputeHorizon(plan, plan_base, position, shard_sizes, options.cache.capacity_bytes);
  }

  std::optional<std::uint32_t> Victim(const Horizon& h, std::uint64_t after) const REQUIRES(mu) {
    std::vector<EntryState> view(entries.size());
    for (std::size_t s = 0; s < entries.size(); ++s) {
      const Entry& e = entries[s];
      view[s] = {e.state == State::kPresent, e.state == State::kPresent && e.pins == 0 && e.waiters == 0, e.last_use};
    }
    return ChooseVictim(view, h, after);
  }

  void Evict(std::uint32_t s) REQUIRES(mu) {
    Entry& e = entries[s];
    e.file.reset();
    (void)fs->Remove(folder->EntryPath(s));  // already gone is fine (another process evicted it)
    e.state = State::kAbsent;
    used -= shards[s].size;
    ++st.evictions;
  }

  // Brings this process's view of the folder up to date (at most every 200
  // ms): entries other processes added or evicted, and their downloads.
  void RefreshFromDisk() REQUIRES(mu) {
    const auto now = clock->Now();
    if (last_refresh && now - *last_refresh < std::chrono::milliseconds(200)) return;
    last_refresh = now;
    auto listing = folder->List(shards);
    if (!listing.ok()) return;  // keep the last view; the next refresh tries again
    others_in_flight = listing->others_in_flight;
    for (std::uint32_t s = 0; s < entries.size(); ++s) {
      Entry& e = entries[s];
      if (e.state == State::kDownloading || e.pins > 0) continue;
      const bool on_disk = listing->on_disk[s];
      if (e.state == State::kPresent && !on_disk) {
        e.file.reset();  // another process evicted it
        e.state = State::kAbsent;
        used -= shards[s].size;
      } else if (e.state == State::kAbsent && on_disk) {
        // Another process fetched it (entries appear whole, by rename); opened at first read.
        auto info = fs->LinkStat(folder->EntryPath(s));
        if (!info.ok() || info->size != shards[s].size) continue;
        e.state = State::kPresent;
        e.last_use = 0;
        used += shards[s].size;
      }
    }
  }

  // Evicts until `bytes` more fit under the cap; false when only entries
  // needed no later than `after` (or pinned ones) are left.
  bool MakeRoom(std::uint64_t bytes, const Horizon& h, std::uint64_t after) REQUIRES(mu) {
    RefreshFromDisk();
    while (used + in_flight + others_in_flight + bytes > options.cache.capacity_bytes) {
      auto victim = Victim(h, after);
      if (!victim) return false;
      Evict(*victim);
    }
    return true;
  }

  std::optional<std::uint32_t> NextJob() REQUIRES(mu) {
    while (!demand.empty()) {
      const std::uint32_t s = demand.front();
      demand.pop_front();
      Entry& e = entries[s];
      e.demanded = false;
      if (e.state != State::kAbsent) continue;
      if (!MakeRoom(shards[s].size, CurrentHorizon(), 0)) ++st.over_capacity;  // a reader needs it now
      return s;
    }
    if (in_flight >= options.max_bytes_in_flight || plan.empty()) return std::nullopt;
    const Horizon h = CurrentHorizon();
    for (std::size_t k = 0; k < h.wanted; ++k) {
      const std::uint32_t s = h.order[k];
      Entry& e = entries[s];
      if (e.state != State::kAbsent || e.read_ahead_failed || Failed(e)) continue;
      if (in_flight > 0 && in_flight + shards[s].size > options.max_bytes_in_flight) return std::nullopt;
      // Fetching ahead only displaces entries outside the wanted set (needed
      // after all of it, or not at all): evicting one inside would cost a
      // second download of it.
      if (!MakeRoom(shards[s].size, h, h.last_wanted_use)) {
        waiting_for_room = true;
        return std::nullopt;
      }
      return s;
    }
    return std::nullopt;
  }

  // Whether `e` failed for readers recently (same plan, within the memory).
  bool Failed(const Entry& e) const REQUIRES(mu) {
    return e.failed_until && e.failed_in_plan == plan_resets && clock->Now() < *e.failed_until;
  }

  void WorkerLoop() {
    MutexLock lock(mu);
    std::uint64_t seen = generation;
    while (!stop) {
      auto job = NextJob();
      if (!job) {
        // Timed: other processes' downloads finishing or entries going are
        // only seen by looking at the folder again.
        (void)clock->WaitFor(changed, mu, std::chrono::seconds(1),
                             [&]() REQUIRES(mu) { return stop || generation != seen; });
        seen = generation;
        continue;
      }
      const std::uint32_t s = *job;
      entries[s].state = State::kDownloading;
      in_flight += shards[s].size;
      mu.Unlock();
      DownloadCounts counts;
      auto file = Download(s, &counts);
      mu.Lock();
      in_flight -= shards[s].size;
      Entry& e = entries[s];
      st.retries += counts.retries;
      st.connections += counts.connections;
      if (file.ok()) {
        e.state = State::kPresent;
        e.file = std::move(file).value();
        if (access != AccessPattern::kNormal) (void)e.file->AdviseAccess(access);  // a hint, as in AcquirePinned
        e.last_use = ++ticks;
        e.failed_until.reset();
        used += shards[s].size;
        if (counts.adopted) {
          ++st.adopted;
        } else {
          ++st.downloads;
          st.bytes_downloaded += shards[s].size;
        }
      } else {
        e.state = State::kAbsent;
        e.failure = file.error();
        ++e.failures;
        // A whole fetch cycle failed (every attempt, or the deadline):
        // readers of this epoch get this failure at once rather than start
        // another cycle each; read-ahead does not try it again either.
        e.read_ahead_failed = true;
        e.failed_until = clock->Now() + Clock::Seconds(options.failure_memory_seconds);
        e.failed_in_plan = plan_resets;
      }
      Bump();
    }
  }

  // Free space for `bytes` more on the cache's file system, evicting any
  // unpinned entry if needed.
  Status EnsureFreeSpace(std::uint32_t s, std::uint64_t bytes) {
    for (;;) {
      STOKER_ASSIGN_OR_RETURN(std::uint64_t free, fs->FreeBytes(options.cache.dir));
      if (free >= bytes + options.cache.min_free_bytes) return Status::Ok();
      MutexLock lock(mu);
      Horizon h;
      h.next_use.assign(shards.size(), kBeyond);  // any unpinned entry may go
      auto victim = Victim(h, 0);
      if (!victim) {
        return Status::ResourceExhausted(fmt::format(
            "cache folder {} has {} free; downloading {} ({}) would leave less than the {} floor (free space, or "
            "lower the cache size)",
            options.cache.dir, FormatBytes(free), RedactUrl(shards[s].url), FormatBytes(bytes),
            FormatBytes(options.cache.min_free_bytes)));
      }
      Evict(*victim);
    }
  }

  Result<std::unique_ptr<ReadableFile>> Download(std::uint32_t s, DownloadCounts* counts) {
    DownloadContext c;
    c.fs = fs;
    c.folder = folder.get();
    c.transport = transport;
    c.request_template = &options.request;
    c.retry = &options.retry;
    c.clock = clock;
    c.stopping = &stopping;
    c.ensure_free_space = [this, s](std::uint64_t bytes) { return EnsureFreeSpace(s, bytes); };
    return DownloadShard(c, s, shards[s], counts);
  }

  // Waits until `s` is local and pins it, or returns the download's error.
  Status AcquirePinned(std::uint32_t s, ReadableFile** file) REQUIRES(mu) {
    const auto t0 = clock->Now();
    bool waited = false;
    for (;;) {
      Entry& e = entries[s];
      if (e.state == State::kPresent) {
        if (!e.file) {
          auto opened = fs->OpenForRead(folder->EntryPath(s));
          if (!opened.ok()) {
            // Removed under us (another process evicted it): fetch it again.
            e.state = State::kAbsent;
            used -= shards[s].size;
            continue;
          }
          e.file = std::move(opened).value();
          // A hint (ShardCache::AdviseAccess): a file system that refuses it reads the same bytes.
          if (access != AccessPattern::kNormal) (void)e.file->AdviseAccess(access);
        }
        ++e.pins;
        e.last_use = ++ticks;
        *file = e.file.get();
        if (waited) {
          ++st.misses;
          st.wait_seconds += SecondsBetween(t0, clock->Now());
        } else {
          ++st.hits;
        }
        return Status::Ok();
      }
      if (stop) return Status::Cancelled("the cache is closing");
      // Failed for this epoch's readers: say so at once, no new fetch cycle.
      if (e.state == State::kAbsent && Failed(e)) return e.failure;
      const std::uint64_t failures = e.failures;
      if (e.state == State::kAbsent && !e.demanded) {
        e.demanded = true;
        e.read_ahead_failed = false;
        demand.push_back(s);
        Bump();
      }
      waited = true;
      ++entries[s].waiters;
      // Wakes now and then to see whether the reader's loader is stopping.
      while (!clock->WaitFor(changed, mu, std::chrono::milliseconds(100), [&]() REQUIRES(mu) {
        const Entry& w = entries[s];
        // Absent and no longer queued: evicted or never fetched; ask again.
        return stop || w.state == State::kPresent || w.failures != failures ||
               (w.state == State::kAbsent && !w.demanded);
      })) {
        if (CancelScope::Requested()) {
          --entries[s].waiters;
          return Status::Cancelled(
              fmt::format("{}: the reader stopped waiting for the download", RedactUrl(shards[s].url)));
        }
      }
      --entries[s].waiters;
      if (entries[s].state != State::kPresent && entries[s].failures != failures) return entries[s].failure;
    }
  }

  // Unpins wake the workers only when read-ahead waits for room: reads are
  // frequent, and each wake-up recomputes the horizon.
  void Unpin(std::uint32_t s) REQUIRES(mu) {
    if (--entries[s].pins == 0 && waiting_for_room) {
      waiting_for_room = false;
      Bump();
    }
  }
};

ShardCache::ShardCache(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ShardCache::~ShardCache() {
  {
    MutexLock lock(impl_->mu);
    impl_->stop = true;
    impl_->stopping = true;
    impl_->Bump();
  }
  impl_->workers.clear();  // joins
}

Result<std::unique_ptr<ShardCache>> ShardCache::Create(ShardCacheOptions options, std::vector<ShardDesc> shards,
                                                       HttpTransport* transport, FileSystem* fs) {
  if (options.cache.dir.empty()) options.cache.dir = DefaultCacheDir();
  if (options.connections == 0) return Status::InvalidArgument("the cache needs at least one connection");
  if (options.cache.capacity_bytes == 0) return Status::InvalidArgument("the cache size must be above zero");
  STOKER_RETURN_IF_ERROR(fs->CreateDirectories(options.cache.dir));
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  impl->shards = std::move(shards);
  for (const auto& d : impl->shards) impl->shard_sizes.push_back(d.size);
  impl->transport = transport;
  impl->fs = fs;
  impl->clock = impl->options.clock ? impl->options.clock : Clock::Real();
  if (!impl->options.retry.clock) impl->options.retry.clock = impl->clock;
  impl->folder = std::make_unique<CacheFolder>(fs, impl->options.cache.dir, impl->shards);
  // Leftovers of dead processes' downloads go; live ones' stay.
  STOKER_RETURN_IF_ERROR(impl->folder->RemoveDeadPartials());
  {
    MutexLock lock(impl->mu);
    impl->entries.resize(impl->shards.size());
    // Complete entries from earlier runs (or other processes) are used as they are.
    impl->RefreshFromDisk();
  }
  Impl* raw = impl.get();
  for (std::uint32_t i = 0; i < raw->options.connections; ++i) raw->workers.emplace_back([raw] { raw->WorkerLoop(); });
  return std::unique_ptr<ShardCache>(new ShardCache(std::move(impl)));
}

Status ShardCache::ReadAt(std::uint32_t shard, std::uint64_t offset, std::span<std::byte> out) {
  if (shard >= impl_->shards.size()) return Status::InvalidArgument(fmt::format("no shard {}", shard));
  ReadableFile* file = nullptr;
  {
    MutexLock lock(impl_->mu);
    STOKER_RETURN_IF_ERROR(impl_->AcquirePinned(shard, &file));
  }
  Status s = file->ReadExactAt(offset, out);
  MutexLock lock(impl_->mu);
  impl_->Unpin(shard);
  return s;
}

void ShardCache::AdviseAccess(AccessPattern pattern) {
  MutexLock lock(impl_->mu);
  if (impl_->access == pattern) return;
  impl_->access = pattern;
  for (auto& e : impl_->entries)
    if (e.file) (void)e.file->AdviseAccess(pattern);  // a hint; see AcquirePinned
}

Status ShardCache::Ensure(std::uint32_t shard) {
  if (shard >= impl_->shards.size()) return Status::InvalidArgument(fmt::format("no shard {}", shard));
  MutexLock lock(impl_->mu);
  ReadableFile* file = nullptr;
  STOKER_RETURN_IF_ERROR(impl_->AcquirePinned(shard, &file));
  impl_->Unpin(shard);
  return Status::Ok();
}

std::uint64_t ShardCache::AppendPlan(std::span<const std::uint32_t> shards) {
  MutexLock lock(impl_->mu);
  const std::uint64_t at = impl_->plan_base + impl_->plan.size();
  for (std::uint32_t s : shards)
    if (s < impl_->shards.size()) impl_->plan.push_back(s);
  impl_->Bump();
  return at;
}

void ShardCache::AdvancePlan(std::uint64_t position) {
  Impl& m = *impl_;
  MutexLock lock(m.mu);
  if (position <= m.position) return;
  m.position = position;
  // Forget the visited part once it dominates.
  const std::uint64_t done = std::min<std::uint64_t>(m.position - m.plan_base, m.plan.size());
  if (done > 4096 && done * 2 > m.plan.size()) {
    m.plan.erase(m.plan.begin(), m.plan.begin() + static_cast<std::ptrdiff_t>(done));
    m.plan_base += done;
  }
  m.Bump();
}

void ShardCache::ResetPlan() {
  Impl& m = *impl_;
  MutexLock lock(m.mu);
  m.plan_base += m.plan.size();
  m.plan.clear();
  m.position = m.plan_base;
  ++m.plan_resets;  // failures remembered for the last epoch's readers are forgotten
  m.Bump();
}

RemoteStats ShardCache::stats() const {
  MutexLock lock(impl_->mu);
  return impl_->st;
}

std::uint64_t ShardCache::capacity_bytes() const {
  return impl_->options.cache.capacity_bytes;
}
std::uint64_t ShardCache::largest_shard_bytes() const {
  return impl_->shard_sizes.empty() ? 0 : *std::max_element(impl_->shard_sizes.begin(), impl_->shard_sizes.end());
}

const std::vector<ShardDesc>& ShardCache::shards() const {
  return impl_->shards;
}
std::string ShardCache::EntryPath(std::uint32_t shard) const {
  return impl_->folder->EntryPath(shard);
}
bool ShardCache::IsLocal(std::uint32_t shard) const {
  MutexLock lock(impl_->mu);
  return shard < impl_->entries.size() && impl_->entries[shard].state == Impl::State::kPresent;
}

}  // namespace stoker::remote
