#include "remote/shard_cache.h"

#include <signal.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <optional>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "core/byte_size.h"
#include "core/cancel.h"
#include "core/hash.h"
#include "core/mutex.h"

namespace stoker::remote {
namespace {

constexpr std::string_view kEntrySuffix = ".shard";
constexpr std::string_view kPartialMarker = ".part-";
constexpr std::uint64_t kBeyond = UINT64_MAX;  // not needed within the plan's horizon

using Clock = std::chrono::steady_clock;

std::string SafeName(std::string_view name) {
  std::string out;
  const auto slash = name.rfind('/');
  if (slash != std::string_view::npos) name = name.substr(slash + 1);
  for (char c : name.substr(0, 64))
    out += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.') ? c : '_';
  return out;
}

Result<std::uint64_t> StatvfsFreeBytes(const std::string& dir) {
  struct statvfs v {};
  if (::statvfs(dir.c_str(), &v) != 0) return Status::FromErrno(errno, fmt::format("statvfs {}", dir));
  return static_cast<std::uint64_t>(v.f_bavail) * v.f_frsize;
}

bool ProcessAlive(long pid) {
  return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
}

// The process writing a partial file `<entry>.part-<pid>-<n>`; 0 for other names.
long PartialFileWriter(const std::string& name) {
  const auto at = name.find(kPartialMarker);
  return at == std::string::npos ? 0 : std::strtol(name.c_str() + at + kPartialMarker.size(), nullptr, 10);
}

}  // namespace

bool IsCacheEntryName(std::string_view name) {
  return name.ends_with(kEntrySuffix) && name.find(kPartialMarker) == std::string_view::npos;
}
bool IsCachePartialName(std::string_view name) {
  return name.find(kPartialMarker) != std::string_view::npos;
}

std::string DefaultCacheDir() {
  if (const char* d = std::getenv("STOKER_CACHE_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/stoker";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/stoker";
  return "/tmp/stoker-cache";
}

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
  };
  struct Horizon {
    std::vector<std::uint64_t> next_use;  // per shard; kBeyond when not within the lookahead
    std::vector<std::uint32_t> order;     // shards by next use
    // The first `wanted` of `order` fill the cache: what it should hold.
    std::size_t wanted = 0;
    std::uint64_t last_wanted_use = 0;
  };

  ShardCacheOptions options;
  std::vector<ShardDesc> shards;
  HttpTransport* transport = nullptr;
  FileSystem* fs = nullptr;
  std::atomic<bool> stopping{false};
  std::atomic<std::uint64_t> partial_counter{0};

  mutable Mutex mu;
  CondVar changed;
  std::vector<Entry> entries GUARDED_BY(mu);
  std::deque<std::uint32_t> demand GUARDED_BY(mu);
  std::vector<std::uint32_t> plan GUARDED_BY(mu);
  std::uint64_t plan_base GUARDED_BY(mu) = 0;  // global position of plan[0]
  std::uint64_t position GUARDED_BY(mu) = 0;
  std::uint64_t used GUARDED_BY(mu) = 0;
  std::uint64_t in_flight GUARDED_BY(mu) = 0;
  // What other live processes are downloading into the folder: counted
  // against the shared cap like our own downloads.
  std::uint64_t others_in_flight GUARDED_BY(mu) = 0;
  std::uint64_t ticks GUARDED_BY(mu) = 0;
  std::uint64_t generation GUARDED_BY(mu) = 0;  // bumps whenever new work may exist
  std::optional<Clock::time_point> last_refresh GUARDED_BY(mu);
  bool stop GUARDED_BY(mu) = false;
  // Read-ahead stopped for want of an evictable entry: an unpin may help.
  bool waiting_for_room GUARDED_BY(mu) = false;
  RemoteStats st GUARDED_BY(mu);
  std::vector<std::jthread> workers;

  std::vector<std::string> entry_paths;                           // per shard, fixed at Create
  std::unordered_map<std::string, std::uint32_t> shard_of_entry;  // entry file name -> shard

  const std::string& EntryPath(std::uint32_t s) const { return entry_paths[s]; }

  void Bump() REQUIRES(mu) {
    ++generation;
    changed.NotifyAll();
  }

  // Next uses over a lookahead of twice the cache, and the wanted set.
  Horizon ComputeHorizon() const REQUIRES(mu) {
    Horizon h;
    h.next_use.assign(shards.size(), kBeyond);
    std::uint64_t bytes = 0;
    const std::uint64_t capacity = options.cache.capacity_bytes;
    for (std::uint64_t i = position > plan_base ? position - plan_base : 0; i < plan.size(); ++i) {
      const std::uint32_t s = plan[i];
      if (h.next_use[s] != kBeyond) continue;
      bytes += shards[s].size;
      if (bytes > 2 * capacity && !h.order.empty()) break;
      h.next_use[s] = plan_base + i;
      h.order.push_back(s);
      if (bytes <= capacity || h.wanted == 0) {
        h.wanted = h.order.size();
        h.last_wanted_use = plan_base + i;
      }
    }
    return h;
  }

  // The unpinned local entry needed furthest ahead (least recently used
  // among those beyond the horizon) of those needed later than `after`.
  std::optional<std::uint32_t> Victim(const Horizon& h, std::uint64_t after) const REQUIRES(mu) {
    std::optional<std::uint32_t> best;
    for (std::uint32_t s = 0; s < entries.size(); ++s) {
      const Entry& e = entries[s];
      if (e.state != State::kPresent || e.pins > 0 || e.waiters > 0) continue;
      if (h.next_use[s] <= after && h.next_use[s] != kBeyond) continue;
      if (!best) {
        best = s;
        continue;
      }
      const std::uint64_t a = h.next_use[s], b = h.next_use[*best];
      if (a > b || (a == b && e.last_use < entries[*best].last_use)) best = s;
    }
    return best;
  }

  void Evict(std::uint32_t s) REQUIRES(mu) {
    Entry& e = entries[s];
    e.file.reset();
    (void)fs->Remove(EntryPath(s));  // already gone is fine (another process evicted it)
    e.state = State::kAbsent;
    used -= shards[s].size;
    ++st.evictions;
  }

  // Brings this process's view of the folder up to date (at most every 200
  // ms): entries other processes added or evicted, and the downloads they
  // have in flight. One listing of the folder, whose size is the cache's,
  // not the dataset's.
  void RefreshFromDisk() REQUIRES(mu) {
    const auto now = Clock::now();
    if (last_refresh && now - *last_refresh < std::chrono::milliseconds(200)) return;
    last_refresh = now;
    auto listing = fs->ListDirectory(options.cache.dir);
    if (!listing.ok()) return;  // keep the last view; the next refresh tries again
    std::vector<bool> on_disk(entries.size(), false);
    std::uint64_t others = 0;
    const long self = ::getpid();
    for (const DirEntry& d : *listing) {
      const auto at = d.name.find(kPartialMarker);
      const auto it = shard_of_entry.find(at == std::string::npos ? d.name : d.name.substr(0, at));
      if (it == shard_of_entry.end()) continue;
      if (at == std::string::npos) {
        on_disk[it->second] = true;
        continue;
      }
      const long pid = PartialFileWriter(d.name);
      if (pid != self && ProcessAlive(pid)) others += shards[it->second].size;
    }
    others_in_flight = others;
    for (std::uint32_t s = 0; s < entries.size(); ++s) {
      Entry& e = entries[s];
      if (e.state == State::kDownloading || e.pins > 0) continue;
      if (e.state == State::kPresent && !on_disk[s]) {
        e.file.reset();  // another process evicted it
        e.state = State::kAbsent;
        used -= shards[s].size;
      } else if (e.state == State::kAbsent && on_disk[s]) {
        // Another process fetched it (entries appear whole, by rename); opened at first read.
        auto info = fs->Stat(EntryPath(s));
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
      const Horizon h = ComputeHorizon();
      if (!MakeRoom(shards[s].size, h, 0)) ++st.over_capacity;  // a reader needs it now
      return s;
    }
    if (in_flight >= options.max_bytes_in_flight || plan.empty()) return std::nullopt;
    const Horizon h = ComputeHorizon();
    for (std::size_t k = 0; k < h.wanted; ++k) {
      const std::uint32_t s = h.order[k];
      Entry& e = entries[s];
      if (e.state != State::kAbsent || e.read_ahead_failed) continue;
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

  void WorkerLoop() {
    MutexLock lock(mu);
    std::uint64_t seen = generation;
    while (!stop) {
      auto job = NextJob();
      if (!job) {
        // Timed: other processes' downloads finishing or entries going are
        // only seen by looking at the folder again.
        (void)changed.WaitFor(mu, std::chrono::seconds(1), [&]() REQUIRES(mu) { return stop || generation != seen; });
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
        e.last_use = ++ticks;
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
        if (!e.demanded) e.read_ahead_failed = true;
      }
      Bump();
    }
  }

  Status CheckFreeSpace(std::uint32_t s) {
    const auto& probe = options.free_bytes ? options.free_bytes : StatvfsFreeBytes;
    for (;;) {
      STOKER_ASSIGN_OR_RETURN(std::uint64_t free, probe(options.cache.dir));
      if (free >= shards[s].size + options.cache.min_free_bytes) return Status::Ok();
      MutexLock lock(mu);
      Horizon h;
      h.next_use.assign(shards.size(), kBeyond);  // any unpinned entry may go
      auto victim = Victim(h, 0);
      if (!victim) {
        return Status::ResourceExhausted(fmt::format(
            "cache folder {} has {} free; downloading {} ({}) would leave less than the {} floor (free space, or "
            "lower the cache size)",
            options.cache.dir, FormatBytes(free), shards[s].url, FormatBytes(shards[s].size),
            FormatBytes(options.cache.min_free_bytes)));
      }
      Evict(*victim);
    }
  }

  struct DownloadCounts {
    std::uint32_t retries = 0;
    std::uint32_t connections = 0;
    bool adopted = false;  // another process had downloaded it
  };

  Result<std::unique_ptr<ReadableFile>> Download(std::uint32_t s, DownloadCounts* counts) {
    const ShardDesc& d = shards[s];
    const std::string path = EntryPath(s);
    // One download per shard across processes: wait for the entry's lock.
    std::unique_ptr<FileLock> lock;
    for (;;) {
      auto l = fs->TryLock(path + ".lock");
      if (l.ok()) {
        lock = std::move(l).value();
        break;
      }
      if (l.error().code() != StatusCode::kUnavailable) return l.error();
      if (stopping.load()) return Status::Cancelled("the cache is closing");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (auto info = fs->Stat(path); info.ok() && info->size == d.size) {
      auto file = fs->OpenForRead(path);
      if (file.ok()) {
        counts->adopted = true;
        return file;
      }
    }
    STOKER_RETURN_IF_ERROR(CheckFreeSpace(s));
    const std::string partial =
        fmt::format("{}{}{}-{}", path, kPartialMarker, ::getpid(), partial_counter.fetch_add(1));
    Status status;
    for (int whole_attempt = 0; whole_attempt < 2; ++whole_attempt) {
      std::unique_ptr<WritableFile> out;
      Xxh3Stream hash;
      auto open = [&]() -> Status {
        out.reset();
        hash = Xxh3Stream();
        STOKER_ASSIGN_OR_RETURN(out, fs->CreateForWrite(partial));
        return Status::Ok();
      };
      status = open();
      if (!status.ok()) break;
      const auto sink = [&](std::span<const std::byte> data) -> Status {
        if (stopping.load()) return Status::Cancelled("the cache is closing");
        hash.Update(data);
        return out->Append(data);
      };
      HttpRequest request = options.request;
      request.url = d.url;
      request.cancel = &stopping;
      FetchStats fetch;
      status = FetchObject(*transport, request, d.size, sink, open, options.retry, &fetch);
      counts->retries += fetch.retries;
      counts->connections += fetch.connections;
      if (status.ok() && hash.Digest() != d.checksum) {
        // A body of the right size but other bytes: corrupted on the way, or
        // the object was replaced since packing. Once more, then give up.
        status = Status::Corruption(fmt::format(
            "{}: downloaded {} bytes whose xxh3 {:016x} differs from the index's {:016x} (the object changed since "
            "it was packed, or was corrupted on the way)",
            d.url, d.size, hash.Digest(), d.checksum));
        ++counts->retries;
        continue;
      }
      if (status.ok()) status = out->Sync();
      if (status.ok()) status = out->Close();
      if (status.ok()) status = fs->Rename(partial, path);
      break;
    }
    if (!status.ok()) {
      (void)fs->Remove(partial);
      return status;
    }
    return fs->OpenForRead(path);
  }

  // Waits until `s` is local and pins it, or returns the download's error.
  Status AcquirePinned(std::uint32_t s, ReadableFile** file) REQUIRES(mu) {
    const auto t0 = Clock::now();
    bool waited = false;
    for (;;) {
      Entry& e = entries[s];
      if (e.state == State::kPresent) {
        if (!e.file) {
          auto opened = fs->OpenForRead(EntryPath(s));
          if (!opened.ok()) {
            // Removed under us (another process evicted it): fetch it again.
            e.state = State::kAbsent;
            used -= shards[s].size;
            continue;
          }
          e.file = std::move(opened).value();
        }
        ++e.pins;
        e.last_use = ++ticks;
        *file = e.file.get();
        if (waited) {
          ++st.misses;
          st.wait_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
        } else {
          ++st.hits;
        }
        return Status::Ok();
      }
      if (stop) return Status::Cancelled("the cache is closing");
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
      while (!changed.WaitFor(mu, std::chrono::milliseconds(100), [&]() REQUIRES(mu) {
        const Entry& w = entries[s];
        // Absent and no longer queued: evicted or never fetched; ask again.
        return stop || w.state == State::kPresent || w.failures != failures ||
               (w.state == State::kAbsent && !w.demanded);
      })) {
        if (CancelScope::Requested()) {
          --entries[s].waiters;
          return Status::Cancelled(fmt::format("{}: the reader stopped waiting for the download", shards[s].url));
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
  STOKER_RETURN_IF_ERROR(fs->CreateDirectories(options.cache.dir));
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  impl->shards = std::move(shards);
  impl->transport = transport;
  impl->fs = fs;
  for (const ShardDesc& d : impl->shards) {
    std::string name = fmt::format("{:016x}-{:016x}-{}{}", Xxh3(std::as_bytes(std::span(d.url.data(), d.url.size()))),
                                   d.checksum, SafeName(d.name), kEntrySuffix);
    impl->entry_paths.push_back(impl->options.cache.dir + "/" + name);
    impl->shard_of_entry.emplace(std::move(name), static_cast<std::uint32_t>(impl->entry_paths.size() - 1));
  }
  // Leftovers of dead processes' downloads go; live ones' stay.
  STOKER_ASSIGN_OR_RETURN(auto listing, fs->ListDirectory(impl->options.cache.dir));
  for (const auto& entry : listing)
    if (IsCachePartialName(entry.name) && !ProcessAlive(PartialFileWriter(entry.name)))
      (void)fs->Remove(impl->options.cache.dir + "/" + entry.name);
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
  std::uint64_t largest = 0;
  for (const auto& d : impl_->shards) largest = std::max(largest, d.size);
  return largest;
}

const std::vector<ShardDesc>& ShardCache::shards() const {
  return impl_->shards;
}
std::string ShardCache::EntryPath(std::uint32_t shard) const {
  return impl_->EntryPath(shard);
}
bool ShardCache::IsLocal(std::uint32_t shard) const {
  MutexLock lock(impl_->mu);
  return shard < impl_->entries.size() && impl_->entries[shard].state == Impl::State::kPresent;
}

}  // namespace stoker::remote
