// stoker pack and stoker index.
#include "stoker/pack.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/mutex.h"
#include "core/rng.h"
#include "dataset/index_shards.h"
#include "dataset/pack_rewrite.h"
#include "dataset/shard_sink.h"
#include "dataset/source.h"
#include "format/index_note.h"
#include "stoker/dataset.h"

namespace stoker {
namespace {

using pack_internal::FieldRewriter;
using pack_internal::FieldSource;
using pack_internal::ShardSink;
using pack_internal::SourceListing;
using pack_internal::SourceSample;
using pack_internal::ValidateKey;

namespace fs_std = std::filesystem;

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
          const pack_internal::PackedField field{sample.key, sample.fields[f].name, sample.fields[f].content};
          Result<pack_internal::Rewritten> rewritten =
              rewriter_->Rewrite(field, loaded->payloads[f], loaded->restarts[f]);
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

// Repacking a stoker dataset (a folder of its shards and index, e.g. to
// shuffle it): what its index records beyond the tar members goes on, the
// labels' names and each field's kind (a manifest's text column stays text,
// not the bytes WebDataset's naming would make of it). An index that does
// not open (stale, damaged) is named in a warning and left.
void KeepWhatTheIndexRecords(FileSystem& fs, const std::string& folder, SourceListing& listing) {
  const std::string index = folder + "/" + std::string(kIndexFileName);
  if (!fs.Stat(index).ok()) return;
  auto dataset = Dataset::Open(folder, &fs);
  if (!dataset.ok()) {
    listing.warnings.push_back(fmt::format("{} does not open ({}); its class names and field kinds are not kept", index,
                                           dataset.error().message()));
    return;
  }
  listing.class_names = (*dataset)->class_names();
  std::unordered_map<std::string_view, FieldKind> kinds;
  const auto& names = (*dataset)->field_names();
  for (std::size_t i = 0; i < names.size(); ++i)
    if (auto kind = (*dataset)->recorded_field(i).kind) kinds.emplace(names[i], *kind);
  for (auto& sample : listing.samples)
    for (auto& field : sample.fields)
      if (auto it = kinds.find(field.name); it != kinds.end()) field.content = it->second;
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
      if (!tars.empty()) {
        STOKER_ASSIGN_OR_RETURN(SourceListing listing, pack_internal::ListTarFiles(fs, tars));
        KeepWhatTheIndexRecords(fs, source, listing);
        return listing;
      }
    }
    return pack_internal::ListImageFolder(fs, source);
  }
  if (EndsWith(source, ".csv") || EndsWith(source, ".jsonl") || EndsWith(source, ".json")) {
    if (!info.ok() && info.error().code() == StatusCode::kNotFound)
      return Status::NotFound(fmt::format("no manifest at '{}': no file by that name", source));
    if (!info.ok()) return info.error();
    return pack_internal::ListManifest(fs, source, options.file_columns);
  }
  if (!options.file_columns.empty())
    return Status::InvalidArgument(
        fmt::format("file columns ({}) name columns of a manifest, and '{}' is not one (.csv or .jsonl)",
                    fmt::join(options.file_columns, ", "), source));
  if (EndsWith(source, ".tar")) return pack_internal::ListTarShards(fs, source);
  if (!info.ok() && info.error().code() == StatusCode::kNotFound)
    return Status::NotFound(fmt::format(
        "nothing to pack at '{}': no file or folder by that name (an ImageFolder directory, a .csv or .jsonl "
        "manifest, .tar shards, or Parquet files)",
        source));
  if (!info.ok()) return info.error();
  return Status::InvalidArgument(fmt::format(
      "cannot tell what '{}' is: expected an ImageFolder directory, a .csv or .jsonl manifest, or .tar shards",
      source));
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
  STOKER_RETURN_IF_ERROR(ShardSink::CheckTargetShardBytes(options.target_shard_bytes));
  STOKER_ASSIGN_OR_RETURN(SourceListing listing, ListSource(fs, source, out_dir, options));
  if (listing.samples.empty()) return Status::InvalidArgument(fmt::format("'{}' holds no samples to pack", source));
  for (const auto& sample : listing.samples) STOKER_RETURN_IF_ERROR(ValidateKey(sample.key, sample.origin));
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
  STOKER_ASSIGN_OR_RETURN(auto sink, ShardSink::Create(fs, out_dir, options.target_shard_bytes, options.overwrite,
                                                       "pass --force (Python: overwrite=True)"));

  OrderedParallelReader reader(fs, listing.samples, options.threads ? options.threads : DefaultThreads(), rewriter);
  PackProgress progress;
  progress.samples_total = listing.samples.size();
  std::vector<ShardSink::Field> fields;
  for (const SourceSample& sample : listing.samples) {
    STOKER_ASSIGN_OR_RETURN(LoadedSample next, reader.Next());
    fields.clear();
    for (std::size_t f = 0; f < sample.fields.size(); ++f) {
      fields.push_back({sample.fields[f].name, next.payloads[f], sample.fields[f].content,
                        next.restarts[f].offsets.empty() ? nullptr : &next.restarts[f]});
      progress.bytes_done += next.payloads[f].size();
    }
    STOKER_RETURN_IF_ERROR(sink->Add(sample.key, sample.label, fields));
    progress.samples_done++;
    if (options.on_progress) options.on_progress(progress);
  }
  // What a rewriter did, and labels that came from names (ImageFolder's
  // classes, a manifest's class-name labels), go into the index's note.
  const std::string note =
      index_format::NoteWithClassNames(rewriter != nullptr ? rewriter->Note() : "", listing.class_names);
  STOKER_ASSIGN_OR_RETURN(PackSummary summary, sink->Finish(note));
  if (rewriter != nullptr) rewriter->Report(summary);
  summary.class_names = listing.class_names;
  summary.warnings = listing.warnings;
  summary.note = note;
  return summary;
}

}  // namespace stoker
