// stoker pack and stoker index.
#include "stoker/pack.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <optional>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/hash.h"
#include "core/mutex.h"
#include "core/rng.h"
#include "dataset/index_shards.h"
#include "dataset/pack_rewrite.h"
#include "dataset/source.h"
#include "format/index_format.h"
#include "format/index_note.h"
#include "format/tar.h"
#include "format/webdataset.h"
#include "stoker/dataset.h"
#include "stoker/text.h"

namespace stoker {
namespace {

using pack_internal::FieldRewriter;
using pack_internal::FieldSource;
using pack_internal::SourceListing;
using pack_internal::SourceSample;

namespace fs_std = std::filesystem;

std::string ShardName(std::uint64_t i) {
  return fmt::format("shard-{:06}.tar", i);
}

std::span<const std::byte> AsBytes(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  if (s.size() < suffix.size()) return false;
  return std::equal(suffix.begin(), suffix.end(), s.end() - static_cast<std::ptrdiff_t>(suffix.size()),
                    [](char a, char b) { return std::tolower(static_cast<unsigned char>(a)) == b; });
}

// One sample's field payloads, in the sample's field order, and the
// restart tables a rewriter gave them (empty for none).
struct LoadedSample {
  std::vector<std::vector<std::byte>> payloads;
  std::vector<SeekableTable> restarts;
};

Result<LoadedSample> LoadSample(FileSystem& fs, const SourceSample& sample) {
  LoadedSample loaded;
  auto& out = loaded.payloads;
  out.reserve(sample.fields.size());
  for (const auto& f : sample.fields) {
    switch (f.kind) {
      case FieldSource::Kind::kInline: {
        auto bytes = AsBytes(f.text);
        out.emplace_back(bytes.begin(), bytes.end());
        break;
      }
      case FieldSource::Kind::kFile: {
        auto bytes = ReadWholeFile(fs, f.path);
        if (!bytes.ok()) return bytes.error().WithContext(fmt::format("sample '{}'", sample.key));
        out.push_back(std::move(bytes).value());
        break;
      }
      case FieldSource::Kind::kRange: {
        auto file = fs.OpenForRead(f.path);
        if (!file.ok()) return file.error().WithContext(fmt::format("sample '{}'", sample.key));
        std::vector<std::byte> bytes(f.size);
        Status s = (*file)->ReadExactAt(f.offset, bytes);
        if (!s.ok()) return s.WithContext(fmt::format("sample '{}' at {}:{}", sample.key, f.path, f.offset));
        out.push_back(std::move(bytes));
        break;
      }
    }
  }
  loaded.restarts.resize(out.size());
  return loaded;
}

// Reads samples on `threads` threads, at most `window` ahead of the consumer,
// and hands them over strictly in order, so output does not depend on timing.
class OrderedParallelReader {
 public:
  OrderedParallelReader(FileSystem& fs, const std::vector<SourceSample>& samples, unsigned threads,
                        const FieldRewriter* rewriter)
      : fs_(fs),
        samples_(samples),
        rewriter_(rewriter),
        window_(std::max<std::size_t>(16, std::size_t{4} * threads)),
        slots_(window_) {
    for (unsigned t = 0; t < threads; ++t) workers_.emplace_back([this] { Work(); });
  }
  ~OrderedParallelReader() {
    {
      MutexLock lock(mu_);
      stop_ = true;
    }
    space_.NotifyAll();
    workers_.clear();  // joins
  }

  // The next sample in order.
  Result<LoadedSample> Next() {
    MutexLock lock(mu_);
    const std::size_t i = consumed_;
    filled_.Wait(mu_, [&]() REQUIRES(mu_) { return slots_[i % window_].has_value(); });
    Result<LoadedSample> out = std::move(*slots_[i % window_]);
    slots_[i % window_].reset();
    ++consumed_;
    space_.NotifyAll();
    return out;
  }

 private:
  void Work() {
    while (true) {
      std::size_t i = 0;
      {
        MutexLock lock(mu_);
        space_.Wait(mu_,
                    [&]() REQUIRES(mu_) { return stop_ || next_ >= samples_.size() || next_ < consumed_ + window_; });
        if (stop_ || next_ >= samples_.size()) return;
        i = next_++;
      }
      Result<LoadedSample> loaded = LoadSample(fs_, samples_[i]);
      if (loaded.ok() && rewriter_ != nullptr) {
        const SourceSample& sample = samples_[i];
        for (std::size_t f = 0; f < sample.fields.size(); ++f) {
          Result<bool> rewritten = rewriter_->Rewrite(sample.fields[f].name, loaded->payloads[f], loaded->restarts[f]);
          if (!rewritten.ok()) {
            loaded = Result<LoadedSample>(rewritten.error().WithContext(
                fmt::format("sample '{}' ({}), field '{}'", sample.key, sample.origin, sample.fields[f].name)));
            break;
          }
        }
      }
      {
        MutexLock lock(mu_);
        slots_[i % window_] = std::move(loaded);
      }
      filled_.NotifyAll();
    }
  }

  FileSystem& fs_;
  const std::vector<SourceSample>& samples_;
  const FieldRewriter* rewriter_;
  const std::size_t window_;
  Mutex mu_;
  CondVar filled_, space_;
  std::vector<std::optional<Result<LoadedSample>>> slots_ GUARDED_BY(mu_);
  std::size_t next_ GUARDED_BY(mu_) = 0;
  std::size_t consumed_ GUARDED_BY(mu_) = 0;
  bool stop_ GUARDED_BY(mu_) = false;
  std::vector<std::jthread> workers_;
};

// Writes shard files under temporary names (created exclusively, never
// through a link) and publishes each by rename.
class ShardWriter {
 public:
  ShardWriter(FileSystem& fs, std::string dir) : fs_(fs), dir_(std::move(dir)) {}

  [[nodiscard]] bool open() const { return file_.has_value(); }
  [[nodiscard]] std::uint64_t offset() const { return offset_; }

  Status Open(std::uint64_t shard) {
    STOKER_ASSIGN_OR_RETURN(auto file, AtomicFile::Create(fs_, dir_ + "/" + ShardName(shard)));
    file_.emplace(std::move(file));
    offset_ = 0;
    hash_ = Xxh3Stream();
    return Status::Ok();
  }

  Status Append(std::span<const std::byte> bytes) {
    STOKER_RETURN_IF_ERROR(file_->Append(bytes));
    hash_.Update(bytes);
    offset_ += bytes.size();
    return Status::Ok();
  }

  // Ends the archive, syncs and renames (the folder is synced once at the
  // end). Returns (size, checksum). Abandoned on error, the temporary goes.
  Result<std::pair<std::uint64_t, std::uint64_t>> Finish() {
    static constexpr std::byte kZeros[tar::kEndOfArchiveSize] = {};
    STOKER_RETURN_IF_ERROR(Append(kZeros));
    Status s = file_->Commit(/*sync_folder=*/false);
    file_.reset();
    STOKER_RETURN_IF_ERROR(s);
    return std::pair{offset_, hash_.Digest()};
  }

 private:
  FileSystem& fs_;
  std::string dir_;
  std::optional<AtomicFile> file_;
  std::uint64_t offset_ = 0;
  Xxh3Stream hash_;
};

// A shard name this pack writes: shard-NNNNNN.tar; its number.
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

// A key goes into tar member names, so it must be a relative path that
// stays inside the archive's folder and prints on one line.
Status ValidateKey(const SourceSample& sample) {
  const std::string_view key = sample.key;
  auto bad = [&](std::string_view why) {
    return Status::InvalidArgument(
        fmt::format("{}: sample key '{}' {}; tar members named after it could be written outside the folder they "
                    "are unpacked into (rename the file, or give a clean key in the manifest)",
                    Printable(sample.origin), Printable(key), why));
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

Result<SourceListing> ListSource(FileSystem& fs, const std::string& source, const std::string& out_dir,
                                 const PackOptions& options) {
  auto info = fs.Stat(source);
  if (info.ok() && info->type == FileType::kDirectory) {
    std::error_code ec;
    auto src = fs_std::weakly_canonical(source, ec);
    auto out = fs_std::weakly_canonical(out_dir, ec);
    auto [a, b] = std::mismatch(src.begin(), src.end(), out.begin(), out.end());
    if (a == src.end()) {
      return Status::InvalidArgument(fmt::format(
          "output folder '{}' is inside the source folder '{}'; it would be packed as a class", out_dir, source));
    }
    // A folder of shards (.tar files and no sub-folders) is packed as its shards, in name order.
    STOKER_ASSIGN_OR_RETURN(auto entries, fs.ListDirectory(source));
    if (std::none_of(entries.begin(), entries.end(),
                     [](const DirEntry& e) { return e.type == FileType::kDirectory; })) {
      STOKER_ASSIGN_OR_RETURN(auto tars, index_internal::TarFilesIn(fs, source));
      if (!tars.empty()) return pack_internal::ListTarFiles(fs, tars);
    }
    return pack_internal::ListImageFolder(fs, source);
  }
  if (EndsWith(source, ".csv") || EndsWith(source, ".jsonl") || EndsWith(source, ".json")) {
    if (!info.ok()) return info.error();
    return pack_internal::ListManifest(fs, source, options.file_columns);
  }
  if (!options.file_columns.empty())
    return Status::InvalidArgument(
        fmt::format("file columns ({}) name columns of a manifest, and '{}' is not one (.csv or .jsonl)",
                    fmt::join(options.file_columns, ", "), source));
  if (EndsWith(source, ".tar")) return pack_internal::ListTarShards(fs, source);
  if (!info.ok()) return info.error();
  return Status::InvalidArgument(fmt::format(
      "cannot tell what '{}' is: expected an ImageFolder directory, a .csv or .jsonl manifest, or .tar shards",
      source));
}

// Makes `out_dir` ready: with `overwrite`, removes an old index first (so
// the folder stops looking complete). Without it, refuses a folder holding
// an index or shard files of our naming, which this pack would overwrite or
// leave mixed with its own; nothing is deleted that this run did not create,
// except the temporaries of stoker runs that died (their exact names, dead
// writer pid).
Status PrepareOutput(FileSystem& fs, const std::string& out_dir, bool overwrite) {
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
      return Status::AlreadyExists(
          fmt::format("'{}' already holds a dataset ({} exists); pass --force to replace it", out_dir, kIndexFileName));
    if (!in_the_way.empty())
      return Status::AlreadyExists(fmt::format(
          "'{}' holds {} shard file(s) this pack would overwrite or leave mixed with its own ({}{}); pass --force "
          "to replace them, or pack into an empty folder",
          out_dir, in_the_way.size(),
          fmt::join(in_the_way.begin(), in_the_way.begin() + std::min<std::size_t>(3, in_the_way.size()), ", "),
          in_the_way.size() > 3 ? ", ..." : ""));
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

// After a replace (--force): removes shard files numbered past the new last shard.
Status RemoveStaleShards(FileSystem& fs, const std::string& out_dir, std::uint64_t shard_count) {
  STOKER_ASSIGN_OR_RETURN(auto entries, fs.ListDirectory(out_dir));
  for (const auto& e : entries) {
    const auto number = ShardNumber(e.name);
    if (number && *number >= shard_count) STOKER_RETURN_IF_ERROR(fs.Remove(out_dir + "/" + e.name));
  }
  return Status::Ok();
}

unsigned DefaultThreads() {
  return std::clamp(2 * std::thread::hardware_concurrency(), 4u, 32u);
}

}  // namespace

Result<PackSummary> pack_internal::PackWith(const std::string& source, const std::string& out_dir,
                                            const PackOptions& options, const FieldRewriter* rewriter) {
  FileSystem& fs = *options.file_system;
  if (options.threads > 1024)
    return Status::InvalidArgument(
        fmt::format("{} reader threads is more than the limit 1024 (0 picks a default)", options.threads));
  if (options.target_shard_bytes < 4096)
    return Status::InvalidArgument(
        fmt::format("target shard size {} bytes is too small (minimum 4096)", options.target_shard_bytes));
  STOKER_ASSIGN_OR_RETURN(SourceListing listing, ListSource(fs, source, out_dir, options));
  if (listing.samples.empty()) return Status::InvalidArgument(fmt::format("'{}' holds no samples to pack", source));
  for (const auto& sample : listing.samples) STOKER_RETURN_IF_ERROR(ValidateKey(sample));
  {
    std::unordered_map<std::string_view, std::string_view> seen;
    for (const auto& s : listing.samples) {
      auto [it, inserted] = seen.emplace(s.key, s.origin);
      if (!inserted) {
        return Status::InvalidArgument(
            fmt::format("two samples would get the key '{}': {} and {} (keys are paths "
                        "without extension, with '.' in the file name turned into '_')",
                        s.key, it->second, s.origin));
      }
    }
  }
  if (options.shuffle) {
    Rng rng(options.shuffle_seed, 0x7061636b);  // "pack": a stream of its own
    Shuffle(listing.samples.data(), listing.samples.size(), rng);
  }
  STOKER_RETURN_IF_ERROR(PrepareOutput(fs, out_dir, options.overwrite));

  PackSummary summary;
  summary.class_names = listing.class_names;
  summary.warnings = listing.warnings;
  index_format::IndexBuilder builder;
  ShardWriter writer(fs, out_dir);
  std::uint32_t shard_id = 0;
  auto finish_shard = [&]() -> Status {
    STOKER_ASSIGN_OR_RETURN(auto done, writer.Finish());
    builder.SetShardContents(shard_id, done.first, done.second);
    summary.shard_bytes += done.first;
    summary.shards++;
    return Status::Ok();
  };

  OrderedParallelReader reader(fs, listing.samples, options.threads ? options.threads : DefaultThreads(), rewriter);
  PackProgress progress;
  progress.samples_total = listing.samples.size();
  std::string headers;
  std::vector<index_format::IndexBuilder::Field> fields;
  for (const SourceSample& sample : listing.samples) {
    STOKER_ASSIGN_OR_RETURN(LoadedSample next, reader.Next());
    const auto& loaded = next.payloads;
    // Lay the sample out as tar members: header, data, padding for each field.
    std::vector<std::string> member_headers(sample.fields.size());
    std::uint64_t sample_bytes = 0;
    for (std::size_t f = 0; f < sample.fields.size(); ++f) {
      const std::string name = fmt::format("{}.{}", sample.key, sample.fields[f].name);
      STOKER_RETURN_IF_ERROR(tar::AppendFileHeader(member_headers[f], name, loaded[f].size()));
      sample_bytes += member_headers[f].size() + loaded[f].size() + tar::PaddingAfter(loaded[f].size());
    }
    if (writer.open() && writer.offset() + sample_bytes + tar::kEndOfArchiveSize > options.target_shard_bytes) {
      STOKER_RETURN_IF_ERROR(finish_shard());
    }
    if (!writer.open()) {
      shard_id = builder.AddShard(ShardName(summary.shards));
      STOKER_RETURN_IF_ERROR(writer.Open(summary.shards));
    }
    fields.clear();
    Xxh3Stream checksum;
    static constexpr std::byte kPadding[tar::kBlockSize] = {};
    for (std::size_t f = 0; f < sample.fields.size(); ++f) {
      STOKER_RETURN_IF_ERROR(writer.Append(AsBytes(member_headers[f])));
      fields.push_back({sample.fields[f].name, writer.offset(), loaded[f].size(),
                        index_format::KindCode(sample.fields[f].content), next.restarts[f].offsets,
                        next.restarts[f].geometry, loaded[f]});
      STOKER_RETURN_IF_ERROR(writer.Append(loaded[f]));
      STOKER_RETURN_IF_ERROR(writer.Append(std::span(kPadding).first(tar::PaddingAfter(loaded[f].size()))));
      checksum.Update(loaded[f]);
      progress.bytes_done += loaded[f].size();
      summary.payload_bytes += loaded[f].size();
    }
    STOKER_RETURN_IF_ERROR(builder.AddSample(shard_id, sample.key, sample.label, checksum.Digest(), fields));
    progress.samples_done++;
    if (options.on_progress) options.on_progress(progress);
  }
  STOKER_RETURN_IF_ERROR(finish_shard());
  STOKER_RETURN_IF_ERROR(fs.SyncDirectory(out_dir));

  if (rewriter != nullptr) {
    rewriter->Report(summary);
    summary.note = rewriter->Note();
  }
  // Labels that came from names keep them (ImageFolder's classes, a manifest's class-name labels).
  summary.note = index_format::NoteWithClassNames(summary.note, listing.class_names);
  builder.SetNote(summary.note);
  // The index goes last: only a complete dataset has one.
  STOKER_ASSIGN_OR_RETURN(auto index_bytes, builder.Finish());
  summary.index_path = out_dir + "/" + std::string(kIndexFileName);
  STOKER_RETURN_IF_ERROR(WriteWholeFileAtomically(fs, summary.index_path, index_bytes));
  if (options.overwrite) STOKER_RETURN_IF_ERROR(RemoveStaleShards(fs, out_dir, summary.shards));
  summary.samples = listing.samples.size();
  return summary;
}

}  // namespace stoker
