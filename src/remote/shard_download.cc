#include "remote/shard_download.h"

#include <fmt/format.h>

#include "core/hash.h"
#include "stoker/text.h"

namespace stoker::remote {

Result<std::unique_ptr<ReadableFile>> DownloadShard(const DownloadContext& c, std::uint32_t shard, const ShardDesc& d,
                                                    DownloadCounts* counts) {
  FileSystem& fs = *c.fs;
  const std::string& path = c.folder->EntryPath(shard);
  // One download per shard across processes: wait for the entry's lock.
  std::unique_ptr<FileLock> lock;
  for (;;) {
    auto l = fs.TryLock(path + ".lock");
    if (l.ok()) {
      lock = std::move(l).value();
      break;
    }
    if (l.error().code() != StatusCode::kUnavailable) return l.error();
    if (c.stopping->load()) return Status::Cancelled("the cache is closing");
    c.clock->SleepFor(std::chrono::milliseconds(20));
  }
  if (auto info = fs.LinkStat(path); info.ok() && info->type == FileType::kRegular && info->size == d.size) {
    auto file = fs.OpenForRead(path);
    if (file.ok()) {
      counts->adopted = true;
      return file;
    }
  }
  STOKER_RETURN_IF_ERROR(c.ensure_free_space(d.size));
  const std::string url = RedactUrl(d.url);
  STOKER_ASSIGN_OR_RETURN(AtomicFile out, AtomicFile::Create(fs, path, c.folder->NewPartialPath(shard)));
  Status status;
  for (int whole_attempt = 0; whole_attempt < 2; ++whole_attempt) {
    Xxh3Stream hash;
    auto restart = [&]() -> Status {
      hash = Xxh3Stream();
      return out.Restart();
    };
    if (whole_attempt > 0) {
      status = restart();
      if (!status.ok()) break;
    }
    const auto sink = [&](std::span<const std::byte> data) -> Status {
      if (c.stopping->load()) return Status::Cancelled("the cache is closing");
      if (!d.chunk) hash.Update(data);  // chunks carry no checksum to compare with
      return out.Append(data);
    };
    HttpRequest request = *c.request_template;
    request.url = d.url;
    request.cancel = c.stopping;
    if (d.chunk) {
      request.range_start = d.offset;
      request.range_end = d.offset + d.size - 1;
    }
    FetchStats fetch;
    status = FetchObject(*c.transport, request, d.size, sink, restart, *c.retry, &fetch);
    counts->retries += fetch.retries;
    counts->connections += fetch.connections;
    if (status.ok() && !d.chunk && hash.Digest() != d.checksum) {
      // A body of the right size but other bytes: corrupted on the way, or
      // the object was replaced since packing. Once more, then give up.
      status = Status::Corruption(fmt::format(
          "{}: downloaded {} bytes whose xxh3 {:016x} differs from the index's {:016x} (the object changed since "
          "it was packed, or was corrupted on the way)",
          url, d.size, hash.Digest(), d.checksum));
      ++counts->retries;
      continue;
    }
    break;
  }
  STOKER_RETURN_IF_ERROR(status);  // `out` removes the partial file
  STOKER_RETURN_IF_ERROR(out.Commit());
  return fs.OpenForRead(path);
}

}  // namespace stoker::remote
