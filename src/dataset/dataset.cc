#include "stoker/dataset.h"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "core/hash.h"
#include "dataset/dataset_impl.h"
#include "dataset/source.h"

namespace stoker {

Dataset::Dataset(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Dataset::~Dataset() = default;

Result<std::unique_ptr<Dataset>> Dataset::Open(const std::string& path, FileSystem* fs) {
  auto impl = std::make_unique<Impl>();
  impl->fs = fs;
  STOKER_ASSIGN_OR_RETURN(FileInfo info, fs->Stat(path));
  impl->index_path = info.type == FileType::kDirectory ? (std::filesystem::path(path) / kIndexFileName).string() : path;
  auto mapped = fs->Map(impl->index_path);
  if (!mapped.ok()) {
    if (mapped.error().code() == StatusCode::kNotFound && info.type == FileType::kDirectory) {
      return Status::NotFound(
          fmt::format("'{}' has no {} (not a packed dataset, or packing did not finish)", path, kIndexFileName));
    }
    return mapped.error();
  }
  impl->mapped = std::move(mapped).value();
  STOKER_ASSIGN_OR_RETURN(impl->view, index_format::IndexView::Open(impl->mapped->data(), impl->index_path));
  const std::string dir = std::filesystem::path(impl->index_path).parent_path().string();
  impl->shards.reserve(impl->view.shards().size());
  for (const auto& entry : impl->view.shards()) {
    ShardInfo shard;
    shard.path = entry.path;
    // Plain concatenation: std::filesystem joins cost more than the rest of Open.
    shard.full_path = entry.path.starts_with('/') || dir.empty() ? entry.path : dir + "/" + entry.path;
    shard.size = entry.size;
    shard.checksum = entry.checksum;
    shard.first_sample = entry.first_sample;
    shard.num_samples = entry.num_samples;
    impl->shards.push_back(std::move(shard));
  }
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
      const index_format::IndexBuilder::Field location{field.name, 0, info.size};
      STOKER_RETURN_IF_ERROR(builder.AddSample(shard, sample.key, sample.label, 0, std::span(&location, 1)));
    }
  }
  auto impl = std::make_unique<Impl>();
  impl->fs = fs;
  impl->loose = true;
  impl->index_path = root;
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
const std::vector<std::string>& Dataset::field_names() const {
  return impl_->view.field_names();
}
const std::vector<ShardInfo>& Dataset::shards() const {
  return impl_->shards;
}
const std::string& Dataset::index_path() const {
  return impl_->index_path;
}

std::optional<std::size_t> Dataset::FieldIndex(std::string_view name) const {
  const auto& names = field_names();
  for (std::size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return i;
  return std::nullopt;
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
  }
  return slot.get();
}

Status Dataset::ReadFieldInto(const SampleInfo& info, std::size_t field, std::vector<std::byte>& out) const {
  if (field >= info.fields.size())
    return Status::InvalidArgument(fmt::format("field {} is out of range ({} fields)", field, info.fields.size()));
  const auto& loc = info.fields[field];
  if (!loc) return Status::NotFound(fmt::format("sample '{}' has no field '{}'", info.key, field_names()[field]));
  std::unique_ptr<ReadableFile> owner;
  STOKER_ASSIGN_OR_RETURN(ReadableFile * file, impl_->ShardForRead(info.shard, owner));
  out.resize(loc->size);
  Status s = file->ReadExactAt(loc->offset, out);
  if (!s.ok()) {
    return s.WithContext(fmt::format("reading field '{}' of sample '{}' at {}:{}", field_names()[field], info.key,
                                     impl_->shards[info.shard].path, loc->offset));
  }
  return Status::Ok();
}

std::size_t Dataset::ReadFields(std::span<FieldRead> reads, std::vector<std::byte>& arena,
                                const ReadFieldsOptions& options) const {
  struct Wanted {
    std::size_t read;  // index into `reads`
    std::uint32_t shard;
    FieldLocation loc;
  };
  std::vector<Wanted> wanted;
  wanted.reserve(reads.size());
  for (std::size_t i = 0; i < reads.size(); ++i) {
    FieldRead& r = reads[i];
    r.bytes = {};
    r.status = Status::Ok();
    const SampleInfo& info = *r.sample;
    if (r.field >= info.fields.size() || !info.fields[r.field]) {
      r.status = Status::NotFound(fmt::format("sample '{}' has no field {}", info.key,
                                              r.field < field_names().size() ? field_names()[r.field] : "?"));
      continue;
    }
    wanted.push_back({i, info.shard, *info.fields[r.field]});
  }
  std::sort(wanted.begin(), wanted.end(), [](const Wanted& a, const Wanted& b) {
    return a.shard != b.shard ? a.shard < b.shard : a.loc.offset < b.loc.offset;
  });

  // Merge neighbours into requests, laid out one after another in the arena.
  struct Request {
    std::uint32_t shard;
    std::uint64_t offset, end, arena_offset;
    std::size_t first, last;  // range in `wanted`
  };
  std::vector<Request> requests;
  std::uint64_t arena_size = 0;
  for (std::size_t w = 0; w < wanted.size(); ++w) {
    const auto& x = wanted[w];
    const std::uint64_t end = x.loc.offset + x.loc.size;
    if (!requests.empty()) {
      Request& last = requests.back();
      if (last.shard == x.shard && x.loc.offset <= last.end + options.max_gap &&
          std::max(end, last.end) - last.offset <= options.max_request) {
        arena_size += std::max(end, last.end) - last.end;
        last.end = std::max(end, last.end);
        last.last = w;
        continue;
      }
    }
    requests.push_back({x.shard, x.loc.offset, end, arena_size, w, w});
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

  for (std::size_t q = 0; q < requests.size(); ++q) {
    const Request& r = requests[q];
    for (std::size_t w = r.first; w <= r.last; ++w) {
      FieldRead& out = reads[wanted[w].read];
      const FieldLocation& loc = wanted[w].loc;
      const auto place = std::span(arena).subspan(r.arena_offset + (loc.offset - r.offset), loc.size);
      Status status = request_status[q];
      if (!status.ok() && r.first != r.last) {
        // A merged request failed (say, the shard ends early): read this
        // field alone, so that only the fields really affected fail.
        std::unique_ptr<ReadableFile> owner;
        auto file = impl_->ShardForRead(r.shard, owner);
        status = file.ok() ? (*file)->ReadExactAt(loc.offset, place) : file.error();
      }
      if (!status.ok()) {
        out.status =
            status.WithContext(fmt::format("reading field '{}' of sample '{}' at {}:{}", field_names()[out.field],
                                           out.sample->key, impl_->shards[r.shard].path, loc.offset));
        continue;
      }
      out.bytes = place;
    }
  }
  return batch.size();
}

Result<std::vector<std::byte>> Dataset::ReadField(std::uint64_t sample, std::size_t field) const {
  STOKER_ASSIGN_OR_RETURN(SampleInfo info, Sample(sample));
  std::vector<std::byte> out;
  STOKER_RETURN_IF_ERROR(ReadFieldInto(info, field, out));
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

FileSystem* Dataset::file_system() const {
  return impl_->fs;
}

}  // namespace stoker
