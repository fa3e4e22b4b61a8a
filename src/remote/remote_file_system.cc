#include "remote/remote_file_system.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "core/hash.h"
#include "format/index_format.h"
#include "format/megatron_index.h"
#include "remote/url.h"
#include "stoker/byte_size.h"
#include "stoker/dataset.h"
#include "stoker/text.h"

namespace stoker::remote {
namespace {

Status ReadOnly(const std::string& path) {
  return Status::Unimplemented(fmt::format("{}: remote datasets are read-only", RedactUrl(path)));
}

// A shard read through the cache.
class CachedShardFile final : public ReadableFile {
 public:
  CachedShardFile(ShardCache* cache, std::uint32_t shard)
      : cache_(cache), shard_(shard), display_(RedactUrl(cache->shards()[shard].url)) {}
  Result<std::size_t> ReadAt(std::uint64_t offset, std::span<std::byte> out) override {
    const std::uint64_t size = cache_->shards()[shard_].size;
    if (offset >= size) return std::size_t{0};
    out = out.subspan(0, static_cast<std::size_t>(std::min<std::uint64_t>(out.size(), size - offset)));
    STOKER_RETURN_IF_ERROR(cache_->ReadAt(shard_, offset, out));
    return out.size();
  }
  Result<std::uint64_t> Size() override { return cache_->shards()[shard_].size; }
  const std::string& path() const override { return display_; }
  // The advice is the cache's, for every local copy it reads: a dataset
  // advises each of its shards the same way.
  Status AdviseAccess(AccessPattern pattern) override {
    cache_->AdviseAccess(pattern);
    return Status::Ok();
  }

 private:
  ShardCache* cache_;
  std::uint32_t shard_;
  std::string display_;
};

// A large file read through the cache in chunks (AttachChunkedFile).
class ChunkedFile final : public ReadableFile {
 public:
  ChunkedFile(ShardCache* cache, std::uint32_t first_chunk, std::uint64_t chunk_bytes, std::uint64_t size,
              std::string display)
      : cache_(cache),
        first_chunk_(first_chunk),
        chunk_bytes_(chunk_bytes),
        size_(size),
        display_(std::move(display)) {}
  Result<std::size_t> ReadAt(std::uint64_t offset, std::span<std::byte> out) override {
    if (offset >= size_) return std::size_t{0};
    out = out.subspan(0, static_cast<std::size_t>(std::min<std::uint64_t>(out.size(), size_ - offset)));
    std::size_t done = 0;
    while (done < out.size()) {
      const std::uint64_t at = offset + done;
      const auto chunk = first_chunk_ + static_cast<std::uint32_t>(at / chunk_bytes_);
      const std::uint64_t within = at - std::uint64_t{chunk - first_chunk_} * chunk_bytes_;
      const std::size_t n =
          static_cast<std::size_t>(std::min<std::uint64_t>(out.size() - done, cache_->shards()[chunk].size - within));
      STOKER_RETURN_IF_ERROR(cache_->ReadAt(chunk, within, out.subspan(done, n)));
      done += n;
    }
    return done;
  }
  Result<std::uint64_t> Size() override { return size_; }
  const std::string& path() const override { return display_; }
  // As CachedShardFile: the cache's advice, for every local copy it reads.
  Status AdviseAccess(AccessPattern pattern) override {
    cache_->AdviseAccess(pattern);
    return Status::Ok();
  }

 private:
  ShardCache* cache_;
  std::uint32_t first_chunk_;
  std::uint64_t chunk_bytes_, size_;
  std::string display_;
};

}  // namespace

RemoteFileSystem::RemoteFileSystem(RemoteOptions options, std::unique_ptr<HttpTransport> transport, FileSystem* local)
    : options_(std::move(options)), local_(local), transport_(std::move(transport)) {
  if (options_.cache.dir.empty()) options_.cache.dir = DefaultCacheDir();
}

RemoteFileSystem::~RemoteFileSystem() = default;

Status RemoteFileSystem::AttachShards(std::span<const ShardFile> shards) {
  if (cache_) return Status::Internal("the remote file system already serves a dataset");
  std::vector<ShardDesc> descs;
  for (std::uint32_t i = 0; i < shards.size(); ++i) {
    STOKER_ASSIGN_OR_RETURN(HttpRequest request, RequestFor(shards[i].path, options_));
    descs.push_back({request.url, shards[i].name, shards[i].size, shards[i].checksum});
    by_path_[shards[i].path] = i;
  }
  return CreateCache(std::move(descs), shards.empty() ? std::string() : shards[0].path);
}

Status RemoteFileSystem::AttachChunkedFiles(std::span<const ChunkedFileSpec> files, std::uint64_t chunk_bytes) {
  if (cache_) return Status::Internal("the remote file system already serves a dataset");
  if (chunk_bytes == 0) return Status::InvalidArgument("the chunk size must be above zero");
  std::vector<ShardDesc> descs;
  for (const ChunkedFileSpec& file : files) {
    if (file.size / chunk_bytes >= (std::uint64_t{1} << 31) - descs.size())
      return Status::InvalidArgument(fmt::format("{}: {} bytes in chunks of {} are too many chunks",
                                                 RedactUrl(file.path), file.size, chunk_bytes));
    STOKER_ASSIGN_OR_RETURN(HttpRequest request, RequestFor(file.path, options_));
    const std::string name = file.path.substr(file.path.rfind('/') + 1);
    chunked_[file.path] = {static_cast<std::uint32_t>(descs.size()), file.size};
    for (std::uint64_t at = 0; at < file.size; at += chunk_bytes) {
      ShardDesc d{request.url, name, std::min(chunk_bytes, file.size - at), file.version};
      d.chunk = true;
      d.offset = at;
      descs.push_back(std::move(d));
    }
  }
  chunk_bytes_ = chunk_bytes;
  return CreateCache(std::move(descs), files.empty() ? std::string() : files[0].path);
}

Status RemoteFileSystem::CreateCache(std::vector<ShardDesc> descs, const std::string& any_path) {
  ShardCacheOptions o;
  // Every object of a dataset shares the scheme, so the signing and
  // timeouts of any one are the cache's request template.
  if (!any_path.empty()) {
    STOKER_ASSIGN_OR_RETURN(o.request, RequestFor(any_path, options_));
  }
  o.request.url.clear();
  o.cache = options_.cache;
  o.connections = options_.connections;
  o.max_bytes_in_flight = options_.max_bytes_in_flight;
  o.retry = RetryFor(options_);
  STOKER_ASSIGN_OR_RETURN(cache_, ShardCache::Create(std::move(o), std::move(descs), transport_.get(), local_));
  return Status::Ok();
}

Result<std::unique_ptr<ReadableFile>> RemoteFileSystem::OpenForRead(const std::string& path) {
  if (auto c = chunked_.find(path); cache_ && c != chunked_.end())
    return std::unique_ptr<ReadableFile>(std::make_unique<ChunkedFile>(cache_.get(), c->second.first_chunk,
                                                                       chunk_bytes_, c->second.size, RedactUrl(path)));
  auto it = by_path_.find(path);
  if (it != by_path_.end() && cache_)
    return std::unique_ptr<ReadableFile>(std::make_unique<CachedShardFile>(cache_.get(), it->second));
  if (by_path_.empty()) {
    // Not a dataset's shard: a small object (an index, a checkpoint's manifests), fetched whole.
    STOKER_ASSIGN_OR_RETURN(std::string local, FetchIndex(path));
    return local_->OpenForRead(local);
  }
  return Status::NotFound(fmt::format("{}: not a shard of this dataset", RedactUrl(path)));
}

Result<std::unique_ptr<MappedFile>> RemoteFileSystem::Map(const std::string& path, MapAccess access) {
  if (chunked_.contains(path))
    return Status::Unimplemented(fmt::format("{}: read in chunks through the cache, not mapped", RedactUrl(path)));
  if (auto it = by_path_.find(path); it != by_path_.end() && cache_) {
    // A shard: through the cache (the mapping outlives an eviction).
    STOKER_RETURN_IF_ERROR(cache_->Ensure(it->second));
    auto mapped = local_->Map(cache_->EntryPath(it->second), access);
    if (mapped.ok() || mapped.error().code() != StatusCode::kNotFound) return mapped;
    STOKER_RETURN_IF_ERROR(cache_->Ensure(it->second));  // evicted in between: once more
    return local_->Map(cache_->EntryPath(it->second), access);
  }
  STOKER_ASSIGN_OR_RETURN(std::string local, FetchIndex(path));
  return local_->Map(local, access);
}

Result<FileInfo> RemoteFileSystem::Stat(const std::string& path) {
  if (auto c = chunked_.find(path); cache_ && c != chunked_.end()) return FileInfo{FileType::kRegular, c->second.size};
  if (auto it = by_path_.find(path); it != by_path_.end() && cache_)
    return FileInfo{FileType::kRegular, cache_->shards()[it->second].size};
  STOKER_ASSIGN_OR_RETURN(std::string local, FetchIndex(path));
  return local_->Stat(local);
}

Result<std::string> RemoteFileSystem::FetchIndex(const std::string& path) {
  if (auto it = fetched_.find(path); it != fetched_.end()) return it->second;
  const std::string shown = RedactUrl(path);
  STOKER_ASSIGN_OR_RETURN(auto request, RequestFor(path, options_));
  request.url = request.url.empty() ? path : request.url;
  STOKER_RETURN_IF_ERROR(local_->CreateDirectories(options_.cache.dir));
  const std::string local = fmt::format("{}/index-{:016x}.stoker", options_.cache.dir,
                                        Xxh3(std::as_bytes(std::span(path.data(), path.size()))));
  // The most the index may take: the cache's own limits.
  std::uint64_t limit = options_.cache.capacity_bytes;
  if (auto free = local_->FreeBytes(options_.cache.dir); free.ok())
    limit = std::min(limit, *free > options_.cache.min_free_bytes ? *free - options_.cache.min_free_bytes : 0);
  STOKER_ASSIGN_OR_RETURN(AtomicFile out, AtomicFile::Create(*local_, local));
  // A stoker index or a Megatron .idx is checked by its magic as it arrives;
  // other objects (a checkpoint's JSON manifests) are bounded by the cache alone.
  const bool is_index = path.ends_with(kIndexFileName) || path.ends_with(".idx");
  std::vector<std::byte> head;  // the first bytes, until the header tells the size
  std::uint64_t declared = 0, received = 0;
  const auto sink = [&](std::span<const std::byte> data) -> Status {
    received += data.size();
    if (is_index && declared == 0 && head.size() < index_format::kHeaderSize) {
      const std::size_t take = std::min(data.size(), index_format::kHeaderSize - head.size());
      head.insert(head.end(), data.begin(), data.begin() + static_cast<std::ptrdiff_t>(take));
      if (head.size() == index_format::kHeaderSize) {
        // A Megatron .idx (whose reader checks it) states no size: the cache's limits bound it.
        const bool is_megatron = std::memcmp(head.data(), megatron::kMagic, sizeof(megatron::kMagic)) == 0;
        if (!is_megatron && std::memcmp(head.data(), index_format::kMagic, sizeof(index_format::kMagic)) != 0)
          return Status::Corruption(fmt::format("{}: neither a stoker index nor a Megatron .idx (bad magic)", shown));
        if (!is_megatron)
          declared = index_format::Load<std::uint64_t>(head.data() + index_format::header::kFileSizeOff);
        if (declared > limit)
          return Status::ResourceExhausted(
              fmt::format("{}: the index says it is {}, more than the cache may hold ({}; --cache-size, free space)",
                          shown, FormatBytes(declared), FormatBytes(limit)));
      }
    }
    if (received > limit || (declared > 0 && received > declared))
      return Status::ResourceExhausted(
          fmt::format("{}: the index is larger than {} (what its header says, or what the cache may hold)", shown,
                      FormatBytes(declared > 0 ? std::min(declared, limit) : limit)));
    return out.Append(data);
  };
  const auto restart = [&]() -> Status {
    head.clear();
    declared = received = 0;
    return out.Restart();
  };
  Status s = FetchObject(*transport_, request, std::nullopt, sink, restart, RetryFor(options_));
  if (s.ok()) s = out.Commit();
  if (!s.ok()) {
    if (s.code() == StatusCode::kNotFound && is_index)
      return Status::NotFound(fmt::format("{} (not a packed dataset: no {} there)", s.message(), kIndexFileName));
    return s;
  }
  fetched_[path] = local;
  return local;
}

Result<std::unique_ptr<WritableFile>> RemoteFileSystem::CreateForWrite(const std::string& path, CreateMode) {
  return ReadOnly(path);
}
Status RemoteFileSystem::Rename(const std::string& from, const std::string&) {
  return ReadOnly(from);
}
Status RemoteFileSystem::Remove(const std::string& path) {
  return ReadOnly(path);
}
Status RemoteFileSystem::RemoveDirectory(const std::string& path) {
  return ReadOnly(path);
}
Status RemoteFileSystem::CreateDirectories(const std::string& path) {
  return ReadOnly(path);
}
Status RemoteFileSystem::SyncDirectory(const std::string& path) {
  return ReadOnly(path);
}
Result<std::vector<DirEntry>> RemoteFileSystem::ListDirectory(const std::string& path) {
  return Status::Unimplemented(fmt::format("{}: remote locations cannot be listed", RedactUrl(path)));
}
Result<std::unique_ptr<FileLock>> RemoteFileSystem::TryLock(const std::string& path) {
  return ReadOnly(path);
}
Result<std::uint64_t> RemoteFileSystem::FreeBytes(const std::string& path) {
  return Status::Unimplemented(fmt::format("{}: a remote location has no free space to tell", RedactUrl(path)));
}
std::string RemoteFileSystem::Sibling(const std::string& path, std::string_view name) const {
  return SiblingUrl(path, name);
}
std::string RemoteFileSystem::DisplayName(const std::string& path) const {
  return RedactUrl(path);
}

std::uint64_t RemoteFileSystem::AppendPlan(std::span<const std::uint32_t> shards) {
  return cache_ ? cache_->AppendPlan(shards) : 0;
}
void RemoteFileSystem::AdvancePlan(std::uint64_t position) {
  if (cache_) cache_->AdvancePlan(position);
}
void RemoteFileSystem::ResetPlan() {
  if (cache_) cache_->ResetPlan();
}
std::uint64_t RemoteFileSystem::working_set_bytes() const {
  return cache_ ? cache_->capacity_bytes() : 0;
}
std::uint64_t RemoteFileSystem::largest_shard_bytes() const {
  return cache_ ? cache_->largest_shard_bytes() : 0;
}

RemoteStats RemoteFileSystem::stats() const {
  return cache_ ? cache_->stats() : RemoteStats{};
}

Result<WarmReport> RemoteFileSystem::Warm(const std::function<void(std::uint64_t, std::uint64_t)>& progress) {
  if (!cache_) return Status::Internal("the remote file system serves no dataset yet");
  ShardCache& cache = *cache_;
  WarmReport report;
  report.shards = cache.shards().size();
  // Announce the shards that fit, in dataset order: the read-ahead downloads
  // them in parallel.
  std::vector<std::uint32_t> all;
  std::uint64_t bytes = 0;
  for (std::uint32_t i = 0; i < cache.shards().size(); ++i) {
    if (bytes + cache.shards()[i].size > cache.capacity_bytes()) continue;
    bytes += cache.shards()[i].size;
    all.push_back(i);
  }
  report.not_fitting = report.shards - all.size();
  cache.ResetPlan();
  const std::uint64_t base = cache.AppendPlan(all);
  cache.AdvancePlan(base);
  for (std::size_t k = 0; k < all.size(); ++k) {
    STOKER_RETURN_IF_ERROR(cache.Ensure(all[k]));
    if (progress) progress(k + 1, all.size());
  }
  for (std::uint32_t i = 0; i < cache.shards().size(); ++i) {
    if (!cache.IsLocal(i)) continue;
    ++report.cached;
    report.bytes += cache.shards()[i].size;
  }
  return report;
}

Result<RemoteLocation> OpenRemoteLocation(const std::string& location, const RemoteOptions& options) {
  if (!IsRemoteUrl(location))
    return Status::InvalidArgument(fmt::format("not a remote location: {}", RedactUrl(location)));
  if (options.cache.capacity_bytes == 0) return Status::InvalidArgument("the cache size must be above zero");
  if (options.connections == 0 || options.connections > 256)
    return Status::InvalidArgument(fmt::format("connections must be between 1 and 256, not {}", options.connections));
  if (options.max_attempts == 0) return Status::InvalidArgument("max_attempts must be at least 1");
  for (const auto& [name, value] : {std::pair{"connect timeout", options.connect_timeout_seconds},
                                    std::pair{"stall timeout", options.stall_timeout_seconds},
                                    std::pair{"fetch deadline", options.fetch_deadline_seconds}})
    if (!(value > 0) || value > 1e7)
      return Status::InvalidArgument(fmt::format("the {} must be a positive number of seconds, not {}", name, value));
  std::string why;
  auto transport = MakeCurlTransport(&why);
  if (!transport) return Status::Unavailable(fmt::format("{}: {}", RedactUrl(location), why));
  RemoteLocation out;
  out.file_system = std::make_shared<RemoteFileSystem>(options, std::move(transport), FileSystem::Default());
  out.index_url = IndexUrl(location);
  return out;
}

}  // namespace stoker::remote
