// Remote locations: URL handling, the read-only remote file system the
// Dataset reads through, and the cache administration behind `stoker cache`.
#include "stoker/remote.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <cstdlib>
#include <map>

#include <fmt/format.h>

#include "core/hash.h"
#include "dataset/dataset_impl.h"
#include "remote/http.h"
#include "remote/shard_cache.h"

namespace stoker {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// Percent-encodes an S3 key, keeping '/' (RFC 3986 unreserved characters pass).
std::string EncodeKey(std::string_view key) {
  std::string out;
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || c == '/') {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  return out;
}

// Turns a location into a request template: http(s) as is, s3:// signed.
Result<remote::HttpRequest> RequestFor(const std::string& location, const RemoteOptions& options) {
  remote::HttpRequest r;
  r.connect_timeout_s = options.connect_timeout_s;
  r.stall_timeout_s = options.stall_timeout_s;
  if (location.starts_with("http://") || location.starts_with("https://")) {
    r.url = location;
    return r;
  }
  if (!location.starts_with("s3://"))
    return Status::InvalidArgument(fmt::format("not a remote location: {}", location));
  const std::string_view rest = std::string_view(location).substr(5);
  const auto slash = rest.find('/');
  const std::string bucket(rest.substr(0, slash));
  const std::string key = slash == std::string_view::npos ? "" : std::string(rest.substr(slash + 1));
  if (bucket.empty()) return Status::InvalidArgument(fmt::format("{}: no bucket name", location));
  std::string region = Env("AWS_REGION");
  if (region.empty()) region = Env("AWS_DEFAULT_REGION");
  if (region.empty()) region = "us-east-1";
  std::string endpoint = Env("AWS_ENDPOINT_URL_S3");
  if (endpoint.empty()) endpoint = Env("AWS_ENDPOINT_URL");
  if (endpoint.empty()) endpoint = fmt::format("https://s3.{}.amazonaws.com", region);
  while (endpoint.ends_with('/')) endpoint.pop_back();
  const std::string id = Env("AWS_ACCESS_KEY_ID"), secret = Env("AWS_SECRET_ACCESS_KEY");
  if (id.empty() || secret.empty())
    return Status::InvalidArgument(fmt::format(
        "{}: s3:// locations need AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment", location));
  r.url = fmt::format("{}/{}/{}", endpoint, bucket, EncodeKey(key));
  r.aws_sigv4 = fmt::format("aws:amz:{}:s3", region);
  r.aws_credentials = id + ":" + secret;
  r.aws_session_token = Env("AWS_SESSION_TOKEN");
  return r;
}

remote::RetryPolicy RetryFor(const RemoteOptions& options) {
  remote::RetryPolicy p;
  p.max_attempts = options.max_attempts;
  p.backoff_initial_s = options.backoff_initial_s;
  p.backoff_max_s = options.backoff_max_s;
  p.jitter_seed = static_cast<std::uint64_t>(::getpid());
  return p;
}

class CachedShardFile final : public ReadableFile {
 public:
  CachedShardFile(remote::ShardCache* cache, std::uint32_t shard) : cache_(cache), shard_(shard) {}
  Result<std::size_t> ReadAt(std::uint64_t offset, std::span<std::byte> out) override {
    const std::uint64_t size = cache_->shards()[shard_].size;
    if (offset >= size) return std::size_t{0};
    out = out.subspan(0, static_cast<std::size_t>(std::min<std::uint64_t>(out.size(), size - offset)));
    STOKER_RETURN_IF_ERROR(cache_->ReadAt(shard_, offset, out));
    return out.size();
  }
  Result<std::uint64_t> Size() override { return cache_->shards()[shard_].size; }
  const std::string& path() const override { return cache_->shards()[shard_].url; }

 private:
  remote::ShardCache* cache_;
  std::uint32_t shard_;
};

// Read-only: the index is fetched into the cache folder and mapped; shard
// files read through the ShardCache.
class RemoteFileSystem final : public FileSystem, public ShardReadPlanner {
 public:
  RemoteFileSystem(RemoteOptions options, std::unique_ptr<remote::HttpTransport> transport)
      : options_(std::move(options)), transport_(std::move(transport)) {
    if (options_.cache.dir.empty()) options_.cache.dir = remote::DefaultCacheDir();
  }

  Status Attach(const std::vector<ShardInfo>& shards) {
    remote::ShardCacheOptions o;
    std::vector<remote::ShardDesc> descs;
    for (std::uint32_t i = 0; i < shards.size(); ++i) {
      // Every shard of a dataset shares the scheme, so the signing and
      // timeouts of any one are the cache's request template.
      STOKER_ASSIGN_OR_RETURN(o.request, RequestFor(shards[i].full_path, options_));
      descs.push_back({o.request.url, shards[i].path, shards[i].size, shards[i].checksum});
      by_path_[shards[i].full_path] = i;
    }
    o.request.url.clear();
    o.cache = options_.cache;
    o.connections = options_.connections;
    o.max_bytes_in_flight = options_.max_bytes_in_flight;
    o.retry = RetryFor(options_);
    STOKER_ASSIGN_OR_RETURN(cache_,
                            remote::ShardCache::Create(std::move(o), std::move(descs), transport_.get(), local_));
    return Status::Ok();
  }
  remote::ShardCache* cache() { return cache_.get(); }

  Result<std::unique_ptr<ReadableFile>> OpenForRead(const std::string& path) override {
    auto it = by_path_.find(path);
    if (it == by_path_.end() || !cache_) return Status::NotFound(fmt::format("{}: not a shard of this dataset", path));
    return std::unique_ptr<ReadableFile>(std::make_unique<CachedShardFile>(cache_.get(), it->second));
  }
  Result<std::unique_ptr<MappedFile>> Map(const std::string& path, MapAccess access) override {
    if (auto it = by_path_.find(path); it != by_path_.end() && cache_) {
      // A shard: through the cache (the mapping outlives an eviction).
      STOKER_RETURN_IF_ERROR(cache_->Ensure(it->second));
      auto mapped = local_->Map(cache_->EntryPath(it->second), access);
      if (mapped.ok() || mapped.error().code() != StatusCode::kNotFound) return mapped;
      STOKER_RETURN_IF_ERROR(cache_->Ensure(it->second));  // evicted in between: once more
      return local_->Map(cache_->EntryPath(it->second), access);
    }
    STOKER_ASSIGN_OR_RETURN(auto request, RequestFor(path, options_));
    STOKER_RETURN_IF_ERROR(local_->CreateDirectories(options_.cache.dir));
    const std::string local = fmt::format("{}/index-{:016x}.stoker", options_.cache.dir,
                                          Xxh3(std::as_bytes(std::span(path.data(), path.size()))));
    const std::string partial = fmt::format("{}.part-{}", local, ::getpid());
    std::unique_ptr<WritableFile> out;
    auto open = [&]() -> Status {
      out.reset();
      STOKER_ASSIGN_OR_RETURN(out, local_->CreateForWrite(partial));
      return Status::Ok();
    };
    STOKER_RETURN_IF_ERROR(open());
    Status s = remote::FetchObject(
        *transport_, request, std::nullopt, [&](std::span<const std::byte> d) { return out->Append(d); }, open,
        RetryFor(options_));
    if (s.ok()) s = out->Close();
    if (s.ok()) s = local_->Rename(partial, local);
    if (!s.ok()) {
      (void)local_->Remove(partial);
      if (s.code() == StatusCode::kNotFound)
        return Status::NotFound(fmt::format("{} (not a packed dataset: no {} there)", s.message(), kIndexFileName));
      return s;
    }
    return local_->Map(local, access);
  }
  Result<FileInfo> Stat(const std::string& path) override {
    FileInfo info;
    info.type = path.ends_with(".stoker") ? FileType::kRegular : FileType::kDirectory;
    return info;
  }
  Result<std::unique_ptr<WritableFile>> CreateForWrite(const std::string& path) override { return ReadOnly(path); }
  Status Rename(const std::string& from, const std::string&) override { return ReadOnly(from); }
  Status Remove(const std::string& path) override { return ReadOnly(path); }
  Status RemoveDirectory(const std::string& path) override { return ReadOnly(path); }
  Status CreateDirectories(const std::string& path) override { return ReadOnly(path); }
  Status SyncDirectory(const std::string& path) override { return ReadOnly(path); }
  Result<std::vector<DirEntry>> ListDirectory(const std::string& path) override {
    return Status::Unimplemented(fmt::format("{}: remote locations cannot be listed", path));
  }
  Result<std::unique_ptr<FileLock>> TryLock(const std::string& path) override { return ReadOnly(path); }
  std::string ReadBatchMethod() override { return "remote cache (pread)"; }
  ShardReadPlanner* read_planner() override { return this; }

  std::uint64_t AppendPlan(std::span<const std::uint32_t> shards) override {
    return cache_ ? cache_->AppendPlan(shards) : 0;
  }
  void AdvancePlan(std::uint64_t position) override {
    if (cache_) cache_->AdvancePlan(position);
  }
  void ResetPlan() override {
    if (cache_) cache_->ResetPlan();
  }
  std::uint64_t working_set_bytes() const override { return cache_ ? cache_->capacity_bytes() : 0; }
  std::uint64_t largest_shard_bytes() const override { return cache_ ? cache_->largest_shard_bytes() : 0; }

 private:
  static Status ReadOnly(const std::string& path) {
    return Status::Unimplemented(fmt::format("{}: remote datasets are read-only", path));
  }
  RemoteOptions options_;
  FileSystem* local_ = FileSystem::Default();
  std::unique_ptr<remote::HttpTransport> transport_;
  std::map<std::string, std::uint32_t> by_path_;
  std::unique_ptr<remote::ShardCache> cache_;  // after transport_: destroyed first
};

}  // namespace

bool IsRemoteLocation(std::string_view location) {
  return location.starts_with("http://") || location.starts_with("https://") || location.starts_with("s3://");
}

Result<std::unique_ptr<Dataset>> OpenDataset(const std::string& location, const RemoteOptions& options) {
  if (!IsRemoteLocation(location)) return Dataset::Open(location);
  if (options.cache.capacity_bytes == 0) return Status::InvalidArgument("the cache size must be above zero");
  std::string why;
  auto transport = remote::MakeCurlTransport(&why);
  if (!transport) return Status::Unavailable(fmt::format("{}: {}", location, why));
  auto fs = std::make_unique<RemoteFileSystem>(options, std::move(transport));
  std::string trimmed = location;
  while (trimmed.ends_with('/')) trimmed.pop_back();
  STOKER_ASSIGN_OR_RETURN(auto dataset, Dataset::Open(trimmed, fs.get()));
  STOKER_RETURN_IF_ERROR(fs->Attach(dataset->shards()));
  dataset->impl_->owned_fs = std::move(fs);
  return dataset;
}

RemoteStats GetRemoteStats(const Dataset& dataset) {
  auto* fs = dynamic_cast<RemoteFileSystem*>(dataset.file_system());
  return fs && fs->cache() ? fs->cache()->stats() : RemoteStats{};
}

Status WarmCache(const Dataset& dataset, const std::function<void(std::uint64_t, std::uint64_t)>& progress) {
  auto* fs = dynamic_cast<RemoteFileSystem*>(dataset.file_system());
  if (!fs || !fs->cache())
    return Status::InvalidArgument(fmt::format("{} is not a remote dataset", dataset.index_path()));
  remote::ShardCache& cache = *fs->cache();
  // Announce the shards that fit, in dataset order: the read-ahead downloads
  // them in parallel.
  std::vector<std::uint32_t> all;
  std::uint64_t bytes = 0;
  for (std::uint32_t i = 0; i < cache.shards().size(); ++i) {
    if (bytes + cache.shards()[i].size > cache.capacity_bytes()) break;
    bytes += cache.shards()[i].size;
    all.push_back(i);
  }
  cache.ResetPlan();
  const std::uint64_t base = cache.AppendPlan(all);
  cache.AdvancePlan(base);
  for (std::uint32_t i = 0; i < all.size(); ++i) {
    STOKER_RETURN_IF_ERROR(cache.Ensure(i));
    if (progress) progress(i + 1, all.size());
  }
  return Status::Ok();
}

Result<CacheStat> StatCache(const CacheOptions& options) {
  CacheStat st;
  st.dir = options.dir.empty() ? remote::DefaultCacheDir() : options.dir;
  FileSystem* fs = FileSystem::Default();
  auto listing = fs->ListDirectory(st.dir);
  if (!listing.ok()) {
    if (listing.error().code() == StatusCode::kNotFound) return st;
    return listing.error();
  }
  for (const auto& e : *listing) {
    auto info = fs->Stat(st.dir + "/" + e.name);
    if (!info.ok() || info->type != FileType::kRegular) continue;
    if (remote::IsCachePartialName(e.name)) {
      ++st.partial_files;
      st.partial_bytes += info->size;
    } else if (remote::IsCacheEntryName(e.name)) {
      ++st.entries;
      st.bytes += info->size;
    }
  }
  struct statvfs v {};
  if (::statvfs(st.dir.c_str(), &v) == 0) st.free_bytes = static_cast<std::uint64_t>(v.f_bavail) * v.f_frsize;
  return st;
}

Result<CacheStat> ClearCache(const CacheOptions& options) {
  const std::string dir = options.dir.empty() ? remote::DefaultCacheDir() : options.dir;
  FileSystem* fs = FileSystem::Default();
  auto listing = fs->ListDirectory(dir);
  if (!listing.ok()) {
    if (listing.error().code() == StatusCode::kNotFound) return StatCache(options);
    return listing.error();
  }
  for (const auto& e : *listing) {
    const std::string path = dir + "/" + e.name;
    const bool entry = remote::IsCacheEntryName(e.name);
    const bool index = e.name.starts_with("index-") && e.name.ends_with(".stoker");
    if (!entry && !index && !remote::IsCachePartialName(e.name) && !e.name.ends_with(".lock")) continue;
    if (entry || remote::IsCachePartialName(e.name)) {
      // Skip what a live process is downloading right now (it holds the lock).
      const std::string base = remote::IsCachePartialName(e.name) ? path.substr(0, path.find(".part-")) : path;
      auto lock = fs->TryLock(base + ".lock");
      if (!lock.ok()) continue;
      STOKER_RETURN_IF_ERROR(fs->Remove(path));
      continue;
    }
    if (e.name.ends_with(".lock")) continue;  // removed below, once nothing needs them
    STOKER_RETURN_IF_ERROR(fs->Remove(path));
  }
  return StatCache(options);
}

}  // namespace stoker
