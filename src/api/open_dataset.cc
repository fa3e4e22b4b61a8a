// OpenDataset: the location decides the file system (a registry by URL
// scheme, with the remote file systems built in), then the dataset layer
// opens the index; a local folder without one may be an ImageFolder tree.
#include <algorithm>
#include <cctype>
#include <map>
#include <mutex>

#include <fmt/format.h>

#include "core/mutex.h"
#include "dataset/index_shards.h"
#include "remote/remote_file_system.h"
#include "stoker/open.h"
#include "stoker/text.h"

namespace stoker {
namespace {

class SchemeRegistry {
 public:
  static SchemeRegistry& Get() {
    static SchemeRegistry* registry = new SchemeRegistry();  // never destroyed: used until exit
    return *registry;
  }

  void Register(const std::string& scheme, FileSystemFactory factory) {
    MutexLock lock(mu_);
    factories_[scheme] = std::move(factory);
  }

  // The factory for `location`'s scheme, if one is registered.
  std::optional<FileSystemFactory> Find(std::string_view location) const {
    MutexLock lock(mu_);
    for (const auto& [scheme, factory] : factories_)
      if (location.starts_with(scheme)) return factory;
    return std::nullopt;
  }

 private:
  SchemeRegistry() {
    // The built-in remote file systems.
    const FileSystemFactory remote = [](const std::string& location,
                                        const OpenOptions& options) -> Result<SchemeFileSystem> {
      STOKER_ASSIGN_OR_RETURN(auto opened, remote::OpenRemoteLocation(location, options.remote));
      return SchemeFileSystem{std::move(opened.file_system), std::move(opened.index_url)};
    };
    for (const char* scheme : {"http://", "https://", "s3://"}) factories_[scheme] = remote;
  }
  mutable Mutex mu_;
  std::map<std::string, FileSystemFactory> factories_ GUARDED_BY(mu_);
};

bool LooksLikeScheme(std::string_view s) {
  const auto colon = s.find("://");
  if (colon == std::string_view::npos || colon == 0 || colon + 3 != s.size()) return false;
  return std::isalpha(static_cast<unsigned char>(s[0])) &&
         std::all_of(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(colon), [](char c) {
           return std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.';
         });
}

Result<std::unique_ptr<Dataset>> OpenLocal(const std::string& location, const OpenOptions& options) {
  FileSystem* fs = FileSystem::Default();
  if (auto there = fs->LinkStat(location); !there.ok() && there.error().code() == StatusCode::kNotFound)
    return Status::NotFound(fmt::format(
        "no dataset at '{}': nothing by that name (give a dataset folder or its {}, a URL such as s3://..., or an "
        "ImageFolder of loose images)",
        location, kIndexFileName));
  auto packed = Dataset::Open(location, fs);
  if (packed.ok() || !options.image_folder || packed.error().code() != StatusCode::kNotFound) return packed;
  // Only a folder with nothing at all named index.stoker is an ImageFolder
  // candidate: a dangling or broken index.stoker is reported as it is.
  auto info = fs->Stat(location);
  if (!info.ok() || info->type != FileType::kDirectory) return packed;
  const std::string index = location + "/" + std::string(kIndexFileName);
  if (fs->LinkStat(index).ok()) return packed;
  // WebDataset shards without an index: the packed error says how to index them.
  if (auto tars = index_internal::TarFilesIn(*fs, location); tars.ok() && !tars->empty()) return packed;
  auto loose = Dataset::OpenImageFolder(location, fs);
  if (loose.ok()) return loose;
  return loose.error().WithContext(
      fmt::format("'{}' has no {} (not a packed dataset) and cannot be read as an ImageFolder of loose images",
                  location, kIndexFileName));
}

}  // namespace

Status RegisterFileSystem(const std::string& scheme, FileSystemFactory factory) {
  if (!LooksLikeScheme(scheme))
    return Status::InvalidArgument(fmt::format("'{}' is not a URL scheme such as \"gs://\"", Printable(scheme)));
  if (!factory) return Status::InvalidArgument(fmt::format("no factory given for '{}'", scheme));
  SchemeRegistry::Get().Register(scheme, std::move(factory));
  return Status::Ok();
}

bool IsRemoteLocation(std::string_view location) {
  return SchemeRegistry::Get().Find(location).has_value();
}

Result<std::unique_ptr<Dataset>> OpenDataset(const std::string& location, const OpenOptions& options) {
  if (location.empty()) return Status::InvalidArgument("no dataset location given");
  if (location.find('\0') != std::string::npos)
    return Status::InvalidArgument(fmt::format("dataset location '{}' contains a NUL byte", Printable(location)));
  auto factory = SchemeRegistry::Get().Find(location);
  if (!factory) return OpenLocal(location, options);
  STOKER_ASSIGN_OR_RETURN(SchemeFileSystem fs, (*factory)(location, options));
  if (!fs.file_system)
    return Status::Internal(fmt::format("the file system registered for '{}' returned none", RedactUrl(location)));
  return Dataset::Open(fs.index_path, std::move(fs.file_system));
}

RemoteStats GetRemoteStats(const Dataset& dataset) {
  ShardCacheControl* cache = dataset.file_system() ? dataset.file_system()->shard_cache() : nullptr;
  return cache ? cache->stats() : RemoteStats{};
}

Result<WarmReport> WarmCache(const Dataset& dataset,
                             const std::function<void(std::uint64_t, std::uint64_t)>& progress) {
  ShardCacheControl* cache = dataset.file_system() ? dataset.file_system()->shard_cache() : nullptr;
  if (!cache) return Status::InvalidArgument(fmt::format("{} is not a remote dataset", dataset.index_path()));
  return cache->Warm(progress);
}

}  // namespace stoker
