// `stoker cache stat|clear|warm`: the local cache of remote datasets.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "stoker/byte_size.h"
#include "stoker/progress.h"
#include "stoker/remote.h"
#include "stoker/text.h"

namespace stoker_cli {
namespace {

void PrintCacheStat(const stoker::CacheStat& st, bool json) {
  if (json) {
    nlohmann::json j = {{"dir", st.dir},
                        {"entries", st.entries},
                        {"bytes", st.bytes},
                        {"partial_files", st.partial_files},
                        {"partial_bytes", st.partial_bytes},
                        {"free_bytes", st.free_bytes}};
    fmt::print("{}\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    return;
  }
  fmt::print("cache {}: {}, {}; {} ({}); {} free on its file system\n", stoker::Printable(st.dir),
             stoker::Counted(st.entries, "shard", "shards"), stoker::FormatBytes(st.bytes),
             stoker::Counted(st.partial_files, "partial download", "partial downloads"),
             stoker::FormatBytes(st.partial_bytes), stoker::FormatBytes(st.free_bytes));
}

}  // namespace

int RunCacheStatOrClear(bool clear, const RemoteArgs& remote, bool json) {
  auto options = OpenOptionsFrom(remote);
  if (!options.ok()) return Fail(options.error());
  auto st = clear ? stoker::ClearCache(options->remote.cache) : stoker::StatCache(options->remote.cache);
  if (!st.ok()) return Fail(st.error());
  PrintCacheStat(*st, json);
  return kExitOk;
}

int RunCacheWarm(const std::string& location, const RemoteArgs& remote, bool json) {
  if (!stoker::IsRemoteLocation(location))
    return Fail(stoker::Status::InvalidArgument(
        fmt::format("{}: not a remote location (http://, https:// or s3://)", stoker::Printable(location))));
  auto dataset = Open(location, remote);
  if (!dataset.ok()) return Fail(dataset.error());
  stoker::ProgressBar progress("warm", "shards", (*dataset)->shards().size());
  auto report = stoker::WarmCache(**dataset, [&](std::uint64_t done, std::uint64_t) { progress.Update(done, 0); });
  progress.Finish();
  if (!report.ok()) return Fail(report.error());
  if (report->not_fitting > 0) {
    std::uint64_t smallest = UINT64_MAX;
    for (const auto& s : (*dataset)->shards()) smallest = std::min(smallest, s.size);
    Warn(fmt::format("{} of {} {} not fit in the cache ({}; the smallest shard is {}): raise --cache-size",
                     report->not_fitting, stoker::Counted(report->shards, "shard", "shards"),
                     report->not_fitting == 1 ? "does" : "do", remote.cache_size, stoker::FormatBytes(smallest)));
  }
  auto options = OpenOptionsFrom(remote);
  if (!options.ok()) return Fail(options.error());
  auto st = stoker::StatCache(options->remote.cache);
  if (!st.ok()) return Fail(st.error());
  PrintCacheStat(*st, json);
  return report->cached == 0 && report->shards > 0 ? kExitError : kExitOk;
}

}  // namespace stoker_cli
