#include "stoker/dataset.h"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/hash.h"
#include "dataset/dataset_impl.h"
#include "dataset/index_shards.h"
#include "dataset/sample_check.h"
#include "dataset/source.h"
#include "format/index_note.h"
#include "stoker/text.h"

namespace stoker {

Dataset::Dataset(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Dataset::~Dataset() = default;

Result<std::unique_ptr<Dataset>> Dataset::Open(const std::string& path, std::shared_ptr<FileSystem> fs) {
  if (!fs) return Status::InvalidArgument("Dataset::Open needs a file system");
  FileSystem* raw = fs.get();
  STOKER_ASSIGN_OR_RETURN(auto dataset, Open(path, raw));
  dataset->impl_->owned_fs = std::move(fs);
  return dataset;
}

Result<std::unique_ptr<Dataset>> Dataset::Open(const std::string& path, FileSystem* fs) {
  auto impl = std::make_unique<Impl>();
  impl->fs = fs;
  STOKER_ASSIGN_OR_RETURN(FileInfo info, fs->Stat(path));
  const std::string index_path =
      info.type == FileType::kDirectory ? (std::filesystem::path(path) / kIndexFileName).string() : path;
  impl->index_path = fs->DisplayName(index_path);
  auto mapped = fs->Map(index_path);
  if (!mapped.ok()) {
    // Nothing at all named index.stoker: not a packed dataset. (A link that
    // dangles or loops keeps its own message.)
    if (mapped.error().code() == StatusCode::kNotFound && info.type == FileType::kDirectory &&
        !fs->LinkStat(index_path).ok()) {
      auto tars = index_internal::TarFilesIn(*fs, path);
      if (tars.ok() && !tars->empty()) {
        return Status::NotFound(
            fmt::format("'{}' has no {}, but holds {} .tar file(s): WebDataset shards written elsewhere are read "
                        "through an index, which `stoker index {}` writes beside them (the shards stay as they are); "
                        "if a `stoker pack` into it did not finish, pack again (its shards hold part of the source)",
                        fs->DisplayName(path), kIndexFileName, tars->size(), fs->DisplayName(path)));
      }
      return Status::NotFound(fmt::format("'{}' has no {} (not a packed dataset, or packing did not finish)",
                                          fs->DisplayName(path), kIndexFileName));
    }
    return mapped.error();
  }
  impl->mapped = std::move(mapped).value();
  STOKER_ASSIGN_OR_RETURN(impl->view, index_format::IndexView::Open(impl->mapped->data(), impl->index_path));
  impl->class_names = index_format::ClassNamesInNote(impl->view.note());
  {
    auto bad = index_format::BadImagesInNote(impl->view.note());
    impl->bad_images_kept = bad.kept;
    impl->first_bad_image = std::move(bad.first);
  }
  impl->shards.reserve(impl->view.shards().size());
  std::vector<ShardFile> files;
  files.reserve(impl->view.shards().size());
  for (const auto& entry : impl->view.shards()) {
    ShardInfo shard;
    shard.path = entry.path;
    shard.full_path = fs->Sibling(index_path, entry.path);
    shard.size = entry.size;
    shard.checksum = entry.checksum;
    shard.first_sample = entry.first_sample;
    shard.num_samples = entry.num_samples;
    files.push_back({shard.full_path, shard.path, shard.size, shard.checksum});
    impl->shards.push_back(std::move(shard));
  }
  impl->cls_field = impl->FieldIndex("cls");
  STOKER_RETURN_IF_ERROR(fs->AttachShards(files));
  {
    MutexLock lock(impl->mu);
    impl->open_shards.resize(impl->shards.size());
  }
  return std::unique_ptr<Dataset>(new Dataset(std::move(impl)));
}

Result<std::unique_ptr<Dataset>> Dataset::OpenImageFolder(const std::string& root, FileSystem* fs) {
  STOKER_ASSIGN_OR_RETURN(auto listing, pack_internal::ListImageFolder(*fs, root));
  index_format::IndexBuilder builder;
  for (const auto& sample : listing.samples) {
    for (const auto& field : sample.fields) {
      if (field.kind != pack_internal::FieldSource::Kind::kFile) continue;  // the label lives in the record
      STOKER_ASSIGN_OR_RETURN(FileInfo info, fs->Stat(field.path));
      const std::uint32_t shard = builder.AddShard(field.path);
      builder.SetShardContents(shard, info.size, /*checksum=*/0);  // not hashed: nothing to verify against
      const index_format::IndexBuilder::Field location{field.name, 0, info.size, index_format::KindCode(field.content)};
      STOKER_RETURN_IF_ERROR(builder.AddSample(shard, sample.key, sample.label, 0, std::span(&location, 1)));
    }
  }
  auto impl = std::make_unique<Impl>();
  impl->fs = fs;
  impl->loose = true;
  impl->index_path = root;
  impl->class_names = listing.class_names;
  STOKER_ASSIGN_OR_RETURN(impl->in_memory_index, builder.Finish());
  STOKER_ASSIGN_OR_RETURN(impl->view, index_format::IndexView::Open(impl->in_memory_index, root));
  for (const auto& entry : impl->view.shards()) {
    ShardInfo shard;
    shard.path = shard.full_path = entry.path;
    shard.size = entry.size;
    shard.first_sample = entry.first_sample;
    shard.num_samples = entry.num_samples;
    impl->shards.push_back(std::move(shard));
  }
  return std::unique_ptr<Dataset>(new Dataset(std::move(impl)));
}

bool Dataset::loose_files() const {
  return impl_->loose;
}

std::uint64_t Dataset::num_samples() const {
  return impl_->view.num_samples();
}
std::uint64_t Dataset::seekable_payloads() const {
  return impl_->view.num_restart_tables();
}
Status Dataset::CheckRegionRecord(const SampleInfo& info, std::size_t field, std::span<const std::byte> payload) const {
  std::vector<std::uint32_t> table;
  RegionRecord region;
  if (!RestartTable(info.index, field, table, &region) || region.rows() == 0) return Status::Ok();
  std::vector<FieldRead> reads;
  for (std::size_t f = 0; f < info.fields.size(); ++f) {
    if (f == field || !info.fields[f]) continue;
    FieldRead read;
    read.sample = &info;
    read.field = f;
    reads.push_back(read);
  }
  std::vector<std::byte> arena;
  ReadFieldsOptions options;
  options.verify = false;
  (void)ReadFields(reads, arena, options);
  std::vector<std::span<const std::byte>> others;
  for (const auto& read : reads) {
    STOKER_RETURN_IF_ERROR(read.status);
    others.push_back(read.bytes);
  }
  if (table[0] > payload.size() ||
      !index_format::RegionPiecesAgree(region, table, payload.size(), others, payload.first(table[0]), 0,
                                       payload.subspan(table[0])))
    return Status::Corruption(
        "the index's region record (a check of each MCU row and of the rest of the sample) disagrees with the "
        "sample's bytes; the loader reads this JPEG whole");
  return Status::Ok();
}

bool Dataset::has_region_records() const {
  return impl_->view.has_region_records();
}

bool Dataset::RestartTable(std::uint64_t sample, std::size_t field, std::vector<std::uint32_t>& table,
                           RegionRecord* region) const {
  table.clear();
  if (region != nullptr) *region = {};
  if (field > UINT32_MAX) return false;
  return impl_->view.restart_table(sample, static_cast<std::uint32_t>(field), table, region);
}

const std::vector<std::string>& Dataset::field_names() const {
  return impl_->view.field_names();
}
const std::vector<ShardInfo>& Dataset::shards() const {
  return impl_->shards;
}
std::uint64_t Dataset::skipped_members() const {
  return impl_->view.skipped_members();
}
std::string_view Dataset::pack_note() const {
  return impl_->view.note();
}
std::uint64_t Dataset::bad_images_kept() const {
  return impl_->bad_images_kept;
}
const std::string& Dataset::first_bad_image() const {
  return impl_->first_bad_image;
}
const std::vector<std::string>& Dataset::class_names() const {
  return impl_->class_names;
}
const std::string& Dataset::index_path() const {
  return impl_->index_path;
}

Dataset::RecordedField Dataset::recorded_field(std::size_t field) const {
  RecordedField out;
  const auto& entry = impl_->view.fields().at(field);
  if (entry.kind != index_format::kKindNotRecorded) out.kind = static_cast<FieldKind>(entry.kind - 1);
  if (entry.has_stats) {
    out.samples = entry.samples;
    out.bytes = entry.bytes;
  }
  return out;
}

std::optional<std::size_t> Dataset::FieldIndex(std::string_view name) const {
  return impl_->FieldIndex(name);
}

Result<SampleInfo> Dataset::Sample(std::uint64_t i) const {
  STOKER_ASSIGN_OR_RETURN(auto rec, impl_->view.record(i));
  SampleInfo info;
  info.index = i;
  info.key = rec.key;
  info.shard = rec.shard;
  info.label = rec.label;
  info.checksum = rec.checksum;
  info.fields.resize(field_names().size());
  for (std::size_t f = 0; f < info.fields.size(); ++f) {
    auto range = rec.field(f);
    if (range.present()) info.fields[f] = FieldLocation{range.offset, range.size};
  }
  return info;
}

Result<ReadableFile*> Dataset::Impl::ShardForRead(std::uint32_t shard, std::unique_ptr<ReadableFile>& owner) const {
  if (!loose) return Shard(shard);
  STOKER_ASSIGN_OR_RETURN(owner, fs->OpenForRead(shards[shard].full_path));
  return owner.get();
}

Result<ReadableFile*> Dataset::Impl::Shard(std::uint32_t shard) const {
  MutexLock lock(mu);
  auto& slot = open_shards[shard];
  if (!slot) {
    STOKER_ASSIGN_OR_RETURN(slot, fs->OpenForRead(shards[shard].full_path));
    // Advice is a hint: a file system that refuses it reads the same bytes.
    if (shard_access != AccessPattern::kNormal) (void)slot->AdviseAccess(shard_access);
  }
  return slot.get();
}

void Dataset::AdviseShardAccess(AccessPattern pattern) const {
  MutexLock lock(impl_->mu);
  if (impl_->shard_access == pattern) return;
  impl_->shard_access = pattern;
  for (auto& file : impl_->open_shards)
    if (file) (void)file->AdviseAccess(pattern);  // a hint; see Impl::Shard
}

Status Dataset::ReadFieldInto(const SampleInfo& info, std::size_t field, std::vector<std::byte>& out,
                              bool verify) const {
  if (field >= info.fields.size())
    return Status::InvalidArgument(fmt::format("field {} is out of range ({} fields)", field, info.fields.size()));
  FieldRead read;
  read.sample = &info;
  read.field = field;
  ReadFieldsOptions options;
  options.verify = verify;
  std::vector<std::byte> arena;
  (void)ReadFields(std::span(&read, 1), arena, options);
  STOKER_RETURN_IF_ERROR(read.status);
  out.assign(read.bytes.begin(), read.bytes.end());
  return Status::Ok();
}

std::string Dataset::Impl::Where(const SampleInfo& info, std::size_t field) const {
  return fmt::format("field '{}' of sample '{}' at {}:{}", view.field_names()[field], Printable(info.key),
                     shards[info.shard].path, info.fields[field] ? info.fields[field]->offset : 0);
}

namespace {

// A read's part, when it fits the field: the byte ranges of its head and rows.
struct PartRanges {
  std::uint64_t head = 0, rows_begin = 0, rows_end = 0;
};
std::optional<PartRanges> RangesOf(const Dataset::FieldRead::Part& part, std::uint64_t size) {
  if (part.table == nullptr || part.region == nullptr) return std::nullopt;
  const auto& table = *part.table;
  const RegionRecord& region = *part.region;
  if (region.rows() == 0 || table.size() < 2 || (table.size() - 1) % region.rows() != 0 ||
      part.first_row >= part.end_row || part.end_row > region.rows())
    return std::nullopt;
  PartRanges r{table[0], region.RowStart(table, part.first_row, size), region.RowStart(table, part.end_row, size)};
  if (!(r.head <= r.rows_begin && r.rows_begin < r.rows_end && r.rows_end <= size)) return std::nullopt;
  return r;
}

}  // namespace

std::size_t Dataset::ReadFields(std::span<FieldRead> reads, std::vector<std::byte>& arena,
                                const ReadFieldsOptions& options) const {
  // Loose files carry no checksums to check against.
  const bool verify = options.verify && !impl_->loose;
  const std::size_t num_fields = field_names().size();
  enum class Piece : std::uint8_t { kWhole, kHead, kRows };
  struct Wanted {
    std::size_t read;  // index into `reads`
    std::size_t field;
    std::uint32_t shard;
    FieldLocation loc;  // what to read: the field, or a piece of it
    Piece piece = Piece::kWhole;
    // Bytes of the field left unread right before / after this piece: no
    // request may span them.
    bool skips_before = false, skips_after = false;
  };
  std::vector<Wanted> wanted;
  wanted.reserve(reads.size() * (verify ? num_fields : 1));
  for (std::size_t i = 0; i < reads.size(); ++i) {
    FieldRead& r = reads[i];
    r.bytes = {};
    r.rows = {};
    r.pieces_disagree = false;
    r.status = Status::Ok();
    const SampleInfo& info = *r.sample;
    if (r.field >= info.fields.size() || !info.fields[r.field]) {
      r.status = Status::NotFound(fmt::format("sample '{}' has no field {}", Printable(info.key),
                                              r.field < num_fields ? field_names()[r.field] : "?"));
      continue;
    }
    const FieldLocation loc = *info.fields[r.field];
    std::optional<PartRanges> ranges;
    if (r.part) ranges = RangesOf(*r.part, loc.size);
    if (!ranges) {
      r.part.reset();  // read whole instead
      wanted.push_back({i, r.field, info.shard, loc});
    } else {
      const bool gap = ranges->rows_begin > ranges->head;
      wanted.push_back({i, r.field, info.shard, {loc.offset, ranges->head}, Piece::kHead, false, gap});
      wanted.push_back({i,
                        r.field,
                        info.shard,
                        {loc.offset + ranges->rows_begin, ranges->rows_end - ranges->rows_begin},
                        Piece::kRows,
                        gap,
                        ranges->rows_end < loc.size});
    }
    if (!verify || !r.check) continue;
    for (std::size_t f = 0; f < info.fields.size(); ++f)
      if (info.fields[f] && f != r.field) wanted.push_back({i, f, info.shard, *info.fields[f]});
  }
  std::sort(wanted.begin(), wanted.end(), [](const Wanted& a, const Wanted& b) {
    return a.shard != b.shard ? a.shard < b.shard : a.loc.offset < b.loc.offset;
  });

  // Merge neighbours into requests, laid out one after another in the arena.
  struct Request {
    std::uint32_t shard;
    std::uint64_t offset, end, arena_offset;
    std::size_t first, last;  // range in `wanted`
    bool skips_after;         // the bytes after `end` are a field's, left unread
  };
  std::vector<Request> requests;
  std::uint64_t arena_size = 0;
  for (std::size_t w = 0; w < wanted.size(); ++w) {
    const auto& x = wanted[w];
    const std::uint64_t end = x.loc.offset + x.loc.size;
    if (!requests.empty()) {
      Request& last = requests.back();
      const bool touching = x.loc.offset <= last.end;
      if (last.shard == x.shard && x.loc.offset <= last.end + options.max_gap &&
          std::max(end, last.end) - last.offset <= options.max_request &&
          (touching || (!last.skips_after && !x.skips_before))) {
        arena_size += std::max(end, last.end) - last.end;
        if (end > last.end) last.skips_after = x.skips_after;
        last.end = std::max(end, last.end);
        last.last = w;
        continue;
      }
    }
    requests.push_back({x.shard, x.loc.offset, end, arena_size, w, w, x.skips_after});
    arena_size += x.loc.size;
  }
  arena.resize(arena_size);

  std::vector<ReadRequest> batch;
  std::vector<std::size_t> batch_request;  // batch entry -> requests index
  batch.reserve(requests.size());
  std::vector<Status> request_status(requests.size());
  std::vector<std::unique_ptr<ReadableFile>> owners(impl_->loose ? requests.size() : 0);
  for (std::size_t q = 0; q < requests.size(); ++q) {
    const Request& r = requests[q];
    std::unique_ptr<ReadableFile> unused;
    auto file = impl_->ShardForRead(r.shard, impl_->loose ? owners[q] : unused);
    if (!file.ok()) {
      request_status[q] = file.error();
      continue;
    }
    batch.push_back({*file, r.offset, std::span(arena).subspan(r.arena_offset, r.end - r.offset), Status::Ok()});
    batch_request.push_back(q);
  }
  impl_->fs->ReadBatch(batch);
  for (std::size_t b = 0; b < batch.size(); ++b) request_status[batch_request[b]] = batch[b].status;

  // Each field's bytes (or failure), per read and field.
  std::vector<std::span<const std::byte>> field_bytes(verify ? reads.size() * num_fields : 0);
  for (std::size_t q = 0; q < requests.size(); ++q) {
    const Request& r = requests[q];
    for (std::size_t w = r.first; w <= r.last; ++w) {
      const Wanted& x = wanted[w];
      FieldRead& out = reads[x.read];
      const auto place = std::span(arena).subspan(r.arena_offset + (x.loc.offset - r.offset), x.loc.size);
      Status status = request_status[q];
      if (!status.ok() && r.first != r.last) {
        // A merged request failed (say, the shard ends early): read this
        // field alone, so that only the fields really affected fail.
        std::unique_ptr<ReadableFile> owner;
        auto file = impl_->ShardForRead(r.shard, owner);
        status = file.ok() ? (*file)->ReadExactAt(x.loc.offset, place) : file.error();
      }
      if (!status.ok()) {
        if (out.status.ok()) out.status = status.WithContext("reading " + impl_->Where(*out.sample, x.field));
        continue;
      }
      if (x.piece == Piece::kRows) {
        out.rows = place;
        continue;
      }
      if (x.field == out.field) out.bytes = place;
      if (verify && x.piece == Piece::kWhole) field_bytes[x.read * num_fields + x.field] = place;
    }
  }
  if (verify) {
    for (std::size_t i = 0; i < reads.size(); ++i) {
      FieldRead& r = reads[i];
      if (!r.status.ok() || !r.check) continue;
      const auto fields = std::span(field_bytes).subspan(i * num_fields, num_fields);
      Status s = r.part ? dataset_internal::CheckSamplePieces(*r.sample, fields, impl_->cls_field, r.field, *r.part,
                                                              r.bytes, r.rows, &r.pieces_disagree)
                        : dataset_internal::CheckSample(*r.sample, fields, impl_->cls_field);
      if (!s.ok()) {
        r.status = s.WithContext(fmt::format("sample '{}' at {}:{}", Printable(r.sample->key),
                                             impl_->shards[r.sample->shard].path, r.sample->fields[r.field]->offset));
        r.bytes = {};
        r.rows = {};
      }
    }
  }
  return batch.size();
}

Result<std::vector<std::byte>> Dataset::ReadField(std::uint64_t sample, std::size_t field, bool verify) const {
  STOKER_ASSIGN_OR_RETURN(SampleInfo info, Sample(sample));
  std::vector<std::byte> out;
  STOKER_RETURN_IF_ERROR(ReadFieldInto(info, field, out, verify));
  return out;
}

}  // namespace stoker

namespace stoker {

Status Dataset::VerifyIndexChecksum() const {
  if (Xxh3(impl_->view.data_section()) != impl_->view.data_checksum()) {
    return Status::Corruption(
        fmt::format("{}: index records checksum mismatch: the index file is corrupt", impl_->index_path));
  }
  return Status::Ok();
}

Status Dataset::CheckShardFiles(bool sizes) const {
  const Impl& m = *impl_;
  if (m.loose || m.fs != FileSystem::Default()) return Status::Ok();
  std::vector<std::string> missing, resized;
  for (const ShardInfo& shard : m.shards) {
    auto info = m.fs->Stat(shard.full_path);
    if (!info.ok()) {
      missing.push_back(fmt::format("'{}' ({})", shard.path, info.error().message()));
    } else if (sizes && info->size != shard.size) {
      resized.push_back(fmt::format("'{}' is {} bytes, the index says {}", shard.path, info->size, shard.size));
    }
  }
  auto named = [](const std::vector<std::string>& list) {
    const std::size_t shown = std::min<std::size_t>(list.size(), 3);
    std::string out =
        fmt::format("{}", fmt::join(list.begin(), list.begin() + static_cast<std::ptrdiff_t>(shown), "; "));
    if (list.size() > shown) out += fmt::format("; and {} more", list.size() - shown);
    return out;
  };
  if (!missing.empty())
    return Status::NotFound(fmt::format("{} of the {} that index '{}' names cannot be opened: {}", missing.size(),
                                        Counted(m.shards.size(), "shard", "shards"), m.index_path, named(missing)));
  if (!resized.empty())
    return Status::Corruption(
        fmt::format("{} of the {} that index '{}' names changed size after indexing: {} (`stoker verify` lists what "
                    "differs; index the shards again if they were rewritten on purpose)",
                    resized.size(), Counted(m.shards.size(), "shard", "shards"), m.index_path, named(resized)));
  return Status::Ok();
}

FileSystem* Dataset::file_system() const {
  return impl_->fs;
}

}  // namespace stoker
