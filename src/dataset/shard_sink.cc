#include "dataset/shard_sink.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dataset/index_file.h"
#include "format/tar.h"
#include "stoker/dataset.h"
#include "stoker/text.h"

namespace stoker::pack_internal {
namespace {

std::span<const std::byte> AsBytes(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

// A shard name this sink writes: shard-NNNNNN.tar; its number.
std::optional<std::uint64_t> ShardNumber(std::string_view name) {
  if (name.size() != ShardName(0).size() || !name.starts_with("shard-") || !name.ends_with(".tar")) return std::nullopt;
  const std::string_view digits = name.substr(6, 6);
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  return std::stoull(std::string(digits));
}

// A temporary an earlier stoker run left: "<shard or index>.tmp-<pid>-<n>"
// whose process is gone.
bool IsDeadTemporary(std::string_view name) {
  const auto at = name.find(".tmp-");
  if (at == std::string_view::npos) return false;
  const std::string_view base = name.substr(0, at);
  if (!ShardNumber(base) && base != kIndexFileName) return false;
  const std::string_view rest = name.substr(at + 5);
  const auto dash = rest.find('-');
  if (dash == std::string_view::npos || dash == 0 || dash + 1 == rest.size()) return false;
  const std::string_view pid = rest.substr(0, dash), counter = rest.substr(dash + 1);
  auto digits = [](std::string_view t) {
    return std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (!digits(pid) || !digits(counter) || pid.size() > 9) return false;
  const long p = std::stol(std::string(pid));
  return p > 0 && ::kill(static_cast<pid_t>(p), 0) != 0 && errno == ESRCH;
}

Status PrepareOutput(FileSystem& fs, const std::string& out_dir, bool overwrite, std::string_view force_hint) {
  STOKER_RETURN_IF_ERROR(fs.CreateDirectories(out_dir));
  STOKER_ASSIGN_OR_RETURN(FileInfo info, fs.Stat(out_dir));
  if (info.type != FileType::kDirectory)
    return Status::InvalidArgument(fmt::format("output '{}' is not a folder", out_dir));
  STOKER_ASSIGN_OR_RETURN(auto entries, fs.ListDirectory(out_dir));
  std::vector<std::string> in_the_way;
  bool has_index = false;
  for (const auto& e : entries) {
    if (e.name == kIndexFileName) has_index = true;
    if (ShardNumber(e.name)) in_the_way.push_back(e.name);
  }
  std::sort(in_the_way.begin(), in_the_way.end());
  if (!overwrite) {
    if (has_index)
      return Status::AlreadyExists(fmt::format("'{}' already holds a dataset ({} exists); {} to replace it", out_dir,
                                               kIndexFileName, force_hint));
    if (!in_the_way.empty())
      return Status::AlreadyExists(fmt::format(
          "'{}' holds {} this pack would overwrite or leave mixed with its own ({}{}); {} "
          "to replace them, or pack into an empty folder",
          out_dir, Counted(in_the_way.size(), "shard file", "shard files"),
          fmt::join(in_the_way.begin(), in_the_way.begin() + std::min<std::size_t>(3, in_the_way.size()), ", "),
          in_the_way.size() > 3 ? ", ..." : "", force_hint));
  }
  if (has_index) {
    STOKER_RETURN_IF_ERROR(fs.Remove(out_dir + "/" + std::string(kIndexFileName)));
    STOKER_RETURN_IF_ERROR(fs.SyncDirectory(out_dir));
  }
  for (const auto& e : entries)
    if (!e.is_link && e.type == FileType::kRegular && IsDeadTemporary(e.name))
      STOKER_RETURN_IF_ERROR(fs.Remove(out_dir + "/" + e.name));
  return Status::Ok();
}

// After a replace: removes shard files numbered past the new last shard.
Status RemoveStaleShards(FileSystem& fs, const std::string& out_dir, std::uint64_t shard_count) {
  STOKER_ASSIGN_OR_RETURN(auto entries, fs.ListDirectory(out_dir));
  for (const auto& e : entries) {
    const auto number = ShardNumber(e.name);
    if (number && *number >= shard_count) STOKER_RETURN_IF_ERROR(fs.Remove(out_dir + "/" + e.name));
  }
  return Status::Ok();
}

}  // namespace

std::string ShardName(std::uint64_t i) {
  return fmt::format("shard-{:06}.tar", i);
}

Status ValidateKey(std::string_view key, std::string_view origin) {
  auto bad = [&](std::string_view why) {
    return Status::InvalidArgument(
        fmt::format("{}: sample key '{}' {}; tar members named after it could be written outside the folder they "
                    "are unpacked into (rename the file, or give a clean key)",
                    Printable(origin), Printable(key), why));
  };
  if (key.empty()) return bad("is empty");
  if (key.starts_with('/')) return bad("is an absolute path");
  if (std::any_of(key.begin(), key.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }))
    return bad("holds control characters (a newline, tab or NUL)");
  if (key.find('\\') != std::string_view::npos) return bad("holds a backslash");
  std::size_t start = 0;
  while (start <= key.size()) {
    const auto slash = key.find('/', start);
    const std::string_view part =
        key.substr(start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    if (part == "..") return bad("has a '..' component");
    if (part == "." || part.empty()) return bad("has an empty or '.' path component");
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return Status::Ok();
}

Status ShardSink::CheckTargetShardBytes(std::uint64_t target_shard_bytes) {
  if (target_shard_bytes >= 4096) return Status::Ok();
  return Status::InvalidArgument(
      fmt::format("target shard size {} bytes is too small (minimum 4096)", target_shard_bytes));
}

ShardSink::ShardSink(FileSystem& fs, std::string out_dir, std::uint64_t target_shard_bytes, bool overwrite)
    : fs_(&fs), out_dir_(std::move(out_dir)), target_shard_bytes_(target_shard_bytes), overwrite_(overwrite) {}

Result<std::unique_ptr<ShardSink>> ShardSink::Create(FileSystem& fs, std::string out_dir,
                                                     std::uint64_t target_shard_bytes, bool overwrite,
                                                     std::string_view force_hint) {
  STOKER_RETURN_IF_ERROR(CheckTargetShardBytes(target_shard_bytes));
  STOKER_RETURN_IF_ERROR(PrepareOutput(fs, out_dir, overwrite, force_hint));
  auto sink = std::unique_ptr<ShardSink>(new ShardSink(fs, out_dir, target_shard_bytes, overwrite));
  sink->builder_.SetStores(BuilderStoresFor(fs, out_dir));
  return sink;
}

ShardSink::~ShardSink() {
  if (finished_ || !owner_.IsCurrent()) return;
  file_.reset();  // removes the temporary
  for (std::uint64_t i = 0; i < shards_published_; ++i) (void)fs_->Remove(out_dir_ + "/" + ShardName(i));
}

Status ShardSink::CheckOwner() const {
  if (owner_.IsCurrent()) return Status::Ok();
  return Status::FailedPrecondition(fmt::format(
      "the dataset writer of '{}' was created in another process; this forked child (process {}) cannot write to "
      "it (its shards are that process's): create a writer of its own, into another folder",
      out_dir_, ::getpid()));
}

Status ShardSink::FinishShard() {
  static constexpr std::byte kZeros[tar::kEndOfArchiveSize] = {};
  STOKER_RETURN_IF_ERROR(file_->Append(kZeros));
  hash_.Update(kZeros);
  offset_ += sizeof kZeros;
  Status s = file_->Commit(/*sync_folder=*/false);
  file_.reset();
  STOKER_RETURN_IF_ERROR(s);
  builder_.SetShardContents(shard_id_, offset_, hash_.Digest());
  shard_bytes_ += offset_;
  ++shards_published_;
  return Status::Ok();
}

Status ShardSink::Add(std::string_view key, std::int64_t label, std::span<const Field> unsorted) {
  if (finished_) return Status::FailedPrecondition("this dataset is finished; no samples can be added");
  STOKER_RETURN_IF_ERROR(CheckOwner());
  if (!broken_.ok())
    return Status::FailedPrecondition(
        fmt::format("an earlier error left this dataset unfinished ({}); start it again", broken_.message()));
  STOKER_ASSIGN_OR_RETURN(const std::optional<std::uint64_t> taken,
                          taken_keys_.Find(key, [this](std::uint64_t sample) { return builder_.Key(sample); }));
  if (taken)
    return Status::InvalidArgument(
        fmt::format("sample key '{}' given twice (samples {} and {}); each sample needs a key of its own",
                    Printable(key), *taken, builder_.num_samples()));
  std::vector<Field> fields(unsorted.begin(), unsorted.end());
  std::sort(fields.begin(), fields.end(), [](const Field& a, const Field& b) { return a.name < b.name; });
  for (std::size_t f = 1; f < fields.size(); ++f)
    if (fields[f].name == fields[f - 1].name)
      return Status::InvalidArgument(fmt::format("sample '{}' has field '{}' twice", Printable(key), fields[f].name));
  // Lay the sample out as tar members: header, data, padding for each field.
  std::vector<std::string> headers(fields.size());
  std::uint64_t sample_bytes = 0;
  for (std::size_t f = 0; f < fields.size(); ++f) {
    STOKER_RETURN_IF_ERROR(
        tar::AppendFileHeader(headers[f], fmt::format("{}.{}", key, fields[f].name), fields[f].bytes.size()));
    sample_bytes += headers[f].size() + fields[f].bytes.size() + tar::PaddingAfter(fields[f].bytes.size());
  }
  // From here on a failure leaves a shard half-written: the sink is broken.
  Status s = Write(key, label, fields, headers, sample_bytes);
  if (!s.ok()) {
    broken_ = s;
    return s;
  }
  taken_keys_.Add(key, builder_.num_samples() - 1);
  return Status::Ok();
}

Status ShardSink::Write(std::string_view key, std::int64_t label, std::span<const Field> fields,
                        std::span<const std::string> headers, std::uint64_t sample_bytes) {
  if (file_ && offset_ + sample_bytes + tar::kEndOfArchiveSize > target_shard_bytes_)
    STOKER_RETURN_IF_ERROR(FinishShard());
  if (!file_) {
    STOKER_ASSIGN_OR_RETURN(auto file, AtomicFile::Create(*fs_, out_dir_ + "/" + ShardName(shards_published_)));
    file_.emplace(std::move(file));
    offset_ = 0;
    hash_ = Xxh3Stream();
    shard_id_ = builder_.AddShard(ShardName(shards_published_));
  }
  auto append = [&](std::span<const std::byte> bytes) -> Status {
    STOKER_RETURN_IF_ERROR(file_->Append(bytes));
    hash_.Update(bytes);
    offset_ += bytes.size();
    return Status::Ok();
  };
  std::vector<index_format::IndexBuilder::Field> entries;
  entries.reserve(fields.size());
  Xxh3Stream checksum;
  static constexpr std::byte kPadding[tar::kBlockSize] = {};
  for (std::size_t f = 0; f < fields.size(); ++f) {
    const Field& field = fields[f];
    STOKER_RETURN_IF_ERROR(append(AsBytes(headers[f])));
    // Every payload goes along: a seekable JPEG's region record checks the sample's other fields too.
    index_format::IndexBuilder::Field entry{field.name, offset_, field.bytes.size(),
                                            index_format::KindCode(field.content)};
    entry.payload = field.bytes;
    if (field.restarts != nullptr) {
      entry.restarts = field.restarts->offsets;
      entry.geometry = field.restarts->geometry;
    }
    entries.push_back(entry);
    STOKER_RETURN_IF_ERROR(append(field.bytes));
    STOKER_RETURN_IF_ERROR(append(std::span(kPadding).first(tar::PaddingAfter(field.bytes.size()))));
    checksum.Update(field.bytes);
    payload_bytes_ += field.bytes.size();
  }
  return builder_.AddSample(shard_id_, key, label, checksum.Digest(), entries);
}

Result<PackSummary> ShardSink::Finish(std::string note) {
  if (finished_) return Status::FailedPrecondition("this dataset is finished already");
  STOKER_RETURN_IF_ERROR(CheckOwner());
  if (!broken_.ok())
    return Status::FailedPrecondition(
        fmt::format("an earlier error left this dataset unfinished ({}); start it again", broken_.message()));
  if (builder_.num_samples() == 0)
    return Status::InvalidArgument(
        fmt::format("no samples were written to '{}'; a dataset needs at least one", out_dir_));
  if (Status s = FinishShard(); !s.ok()) {
    broken_ = s;
    return s;
  }
  STOKER_RETURN_IF_ERROR(fs_->SyncDirectory(out_dir_));
  builder_.SetNote(std::move(note));
  // The index goes last: only a complete dataset has one.
  PackSummary summary;
  summary.index_path = out_dir_ + "/" + std::string(kIndexFileName);
  STOKER_RETURN_IF_ERROR(
      WriteIndexFile(*fs_, summary.index_path, [&](index_format::ByteSink& out) { return builder_.FinishTo(out); }));
  finished_ = true;
  if (overwrite_) STOKER_RETURN_IF_ERROR(RemoveStaleShards(*fs_, out_dir_, shards_published_));
  summary.samples = builder_.num_samples();
  summary.shards = shards_published_;
  summary.shard_bytes = shard_bytes_;
  summary.payload_bytes = payload_bytes_;
  return summary;
}

}  // namespace stoker::pack_internal
