#include "remote/cache_folder.h"

#include <signal.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdlib>

#include <fmt/format.h>

#include "core/hash.h"
#include "stoker/remote.h"

namespace stoker::remote {
namespace {

constexpr std::string_view kEntrySuffix = ".shard";
constexpr std::string_view kPartialMarker = ".part-";

std::string SafeName(std::string_view name) {
  std::string out;
  const auto slash = name.rfind('/');
  if (slash != std::string_view::npos) name = name.substr(slash + 1);
  for (char c : name.substr(0, 64))
    out += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.') ? c : '_';
  return out;
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

long PartialFileWriter(std::string_view name) {
  const auto at = name.find(kPartialMarker);
  if (at == std::string_view::npos) return 0;
  const std::string_view rest = name.substr(at + kPartialMarker.size());
  long pid = 0;
  const auto [end, error] = std::from_chars(rest.data(), rest.data() + rest.size(), pid);
  return error == std::errc() && end != rest.data() ? pid : 0;
}

bool ProcessAlive(long pid) {
  return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
}

CacheFolder::CacheFolder(FileSystem* fs, std::string dir, std::span<const ShardDesc> shards)
    : fs_(fs), dir_(std::move(dir)) {
  for (const ShardDesc& d : shards) {
    std::string name =
        fmt::format("{:016x}-{:016x}-{}{}{}", Xxh3(std::as_bytes(std::span(d.url.data(), d.url.size()))), d.checksum,
                    SafeName(d.name), d.chunk ? fmt::format("@{}", d.offset) : "", kEntrySuffix);
    entry_paths_.push_back(dir_ + "/" + name);
    shard_of_entry_.emplace(std::move(name), static_cast<std::uint32_t>(entry_paths_.size() - 1));
  }
}

std::string CacheFolder::NewPartialPath(std::uint32_t shard) const {
  return fmt::format("{}{}{}-{}", entry_paths_[shard], kPartialMarker, ::getpid(), partial_counter_.fetch_add(1));
}

Status CacheFolder::RemoveDeadPartials() const {
  STOKER_ASSIGN_OR_RETURN(auto listing, fs_->ListDirectory(dir_));
  for (const auto& entry : listing)
    if (IsCachePartialName(entry.name) && !ProcessAlive(PartialFileWriter(entry.name)))
      (void)fs_->Remove(dir_ + "/" + entry.name);  // another process may have removed it first
  return Status::Ok();
}

Result<CacheFolder::Listing> CacheFolder::List(std::span<const ShardDesc> shards) const {
  STOKER_ASSIGN_OR_RETURN(auto entries, fs_->ListDirectory(dir_));
  Listing listing;
  listing.on_disk.assign(entry_paths_.size(), false);
  const long self = ::getpid();
  for (const DirEntry& d : entries) {
    const auto at = d.name.find(kPartialMarker);
    const auto it = shard_of_entry_.find(at == std::string::npos ? d.name : d.name.substr(0, at));
    if (it == shard_of_entry_.end()) continue;
    if (at == std::string::npos) {
      listing.on_disk[it->second] = d.type == FileType::kRegular && !d.is_link;
      continue;
    }
    const long pid = PartialFileWriter(d.name);
    if (pid != self && ProcessAlive(pid)) listing.others_in_flight += shards[it->second].size;
  }
  return listing;
}

}  // namespace stoker::remote

namespace stoker {

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
    if (e.type != FileType::kRegular || e.is_link) continue;
    auto info = fs->Stat(st.dir + "/" + e.name);
    if (!info.ok()) continue;
    if (remote::IsCachePartialName(e.name)) {
      ++st.partial_files;
      st.partial_bytes += info->size;
    } else if (remote::IsCacheEntryName(e.name)) {
      ++st.entries;
      st.bytes += info->size;
    }
  }
  if (auto free = fs->FreeBytes(st.dir); free.ok()) st.free_bytes = *free;
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
    const bool partial = remote::IsCachePartialName(e.name);
    const bool index = e.name.starts_with("index-") && e.name.ends_with(".stoker");
    if (!entry && !index && !partial) continue;  // locks stay: a live process may hold one
    if (entry || partial) {
      // Skip what a live process is downloading right now (it holds the lock).
      const std::string base = partial ? path.substr(0, path.find(".part-")) : path;
      auto lock = fs->TryLock(base + ".lock");
      if (!lock.ok()) continue;
    }
    STOKER_RETURN_IF_ERROR(fs->Remove(path));
  }
  return StatCache(options);
}

}  // namespace stoker
