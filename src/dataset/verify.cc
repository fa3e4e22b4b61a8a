// Verify and Summarize: whole-dataset checks over the index and the shards.
#include <algorithm>
#include <unordered_map>

#include <fmt/format.h>

#include "core/hash.h"
#include "dataset/sample_check.h"
#include "format/tar.h"
#include "format/webdataset.h"
#include "stoker/dataset.h"

namespace stoker {
namespace {

std::uint64_t FirstOffset(const SampleInfo& info) {
  std::uint64_t first = UINT64_MAX;
  for (const auto& f : info.fields)
    if (f) first = std::min(first, f->offset);
  return first == UINT64_MAX ? 0 : first;
}

class ShardVerifier {
 public:
  ShardVerifier(const Dataset& dataset, std::uint32_t shard_id, std::span<const std::byte> bytes, VerifyReport& report)
      : dataset_(dataset),
        shard_(dataset.shards()[shard_id]),
        bytes_(bytes),
        report_(report),
        cls_field_(dataset.FieldIndex("cls")) {}

  void Run() {
    if (Xxh3(bytes_) != shard_.checksum)
      Problem(shard_.path, "", "shard checksum mismatch: the file's bytes differ from when it was indexed");
    CheckSamples();
    CheckTarAgreesWithIndex();
  }

 private:
  void Problem(std::string where, std::string_view key, std::string message) {
    report_.problems.push_back({std::move(where), std::string(key), std::move(message)});
  }
  std::string At(std::uint64_t offset) const { return fmt::format("{}:{}", shard_.path, offset); }

  void CheckSamples() {
    samples_.resize(shard_.num_samples);
    for (std::uint64_t k = 0; k < shard_.num_samples; ++k) {
      auto info = dataset_.Sample(shard_.first_sample + k);
      ++report_.samples_checked;
      if (!info.ok()) {
        Problem(dataset_.index_path(), "", info.error().message());
        continue;
      }
      std::vector<std::span<const std::byte>> fields(info->fields.size());
      bool inside = true;
      for (std::size_t f = 0; f < info->fields.size(); ++f) {
        const auto& loc = info->fields[f];
        if (!loc) continue;
        if (loc->offset > bytes_.size() || loc->size > bytes_.size() - loc->offset) {
          inside = false;
          break;
        }
        fields[f] = bytes_.subspan(loc->offset, loc->size);
      }
      if (!inside) {
        Problem(At(FirstOffset(*info)), info->key, "sample lies past the end of the shard (truncated shard?)");
      } else if (Status s = dataset_internal::CheckSample(*info, fields, cls_field_); !s.ok()) {
        Problem(At(FirstOffset(*info)), info->key, s.message());
      }
      for (std::size_t f = 0; f < info->fields.size(); ++f)
        if (info->fields[f]) by_offset_[info->fields[f]->offset] = {k, f, info->fields[f]->size};
      samples_[k] = std::move(info).value();
    }
  }

  // The sample whose first field starts soonest after `offset`: the owner of
  // a broken header at `offset`.
  std::string_view OwnerOf(std::uint64_t offset) const {
    const SampleInfo* owner = nullptr;
    for (const auto& s : samples_) {
      if (!s) continue;
      std::uint64_t first = FirstOffset(*s);
      if (first > offset && (owner == nullptr || first < FirstOffset(*owner))) owner = &*s;
    }
    return owner ? owner->key : std::string_view();
  }

  void CheckTarAgreesWithIndex() {
    const auto& names = dataset_.field_names();
    tar::Reader reader(bytes_, shard_.path);
    std::uint64_t matched = 0;
    while (true) {
      auto next = reader.Next();
      if (!next.ok()) {
        Problem(At(reader.offset()), OwnerOf(reader.offset()), next.error().message());
        return;
      }
      if (!next->has_value()) break;
      const tar::Member& m = **next;
      if (m.type != tar::MemberType::kRegular || wds::IsMetaMember(m.name)) continue;
      auto split = wds::SplitMemberName(m.name);
      if (!split) continue;  // no key: left out of the index as WebDataset leaves it out
      auto it = by_offset_.find(m.data_offset);
      if (it == by_offset_.end()) {
        Problem(At(m.header_offset), split ? split->key : "",
                fmt::format("tar member '{}' is not in the index", m.name));
        continue;
      }
      const Expected& e = it->second;
      std::string_view key = samples_[e.sample] ? samples_[e.sample]->key : std::string_view();
      if (!split || split->key != key || split->field != names[e.field] || m.size != e.size) {
        Problem(At(m.header_offset), key,
                fmt::format(
                    "tar member '{}' ({} bytes) does not match the index, which expects field '{}' of '{}' ({} bytes)",
                    m.name, m.size, names[e.field], key, e.size));
      }
      ++matched;
    }
    if (matched < by_offset_.size())
      Problem(shard_.path, "", fmt::format("{} indexed fields have no tar member", by_offset_.size() - matched));
  }

  struct Expected {
    std::uint64_t sample;  // relative to the shard's first sample
    std::size_t field;
    std::uint64_t size;
  };
  const Dataset& dataset_;
  const ShardInfo& shard_;
  std::span<const std::byte> bytes_;
  VerifyReport& report_;
  std::vector<std::optional<SampleInfo>> samples_;
  std::unordered_map<std::uint64_t, Expected> by_offset_;
  std::optional<std::size_t> cls_field_;
};

}  // namespace

Result<VerifyReport> Verify(const Dataset& dataset, const VerifyOptions& options) {
  if (dataset.loose_files())
    return Status::InvalidArgument(
        fmt::format("'{}' is a folder of loose files: they carry no checksums to verify (stoker pack writes them)",
                    dataset.index_path()));
  VerifyReport report;
  if (Status s = dataset.VerifyIndexChecksum(); !s.ok()) {
    report.problems.push_back({dataset.index_path(), "", s.message()});
  }
  FileSystem* fs = dataset.file_system();
  for (std::uint32_t i = 0; i < dataset.shards().size(); ++i) {
    const ShardInfo& shard = dataset.shards()[i];
    ++report.shards_checked;
    auto mapped = fs->Map(shard.full_path);
    if (!mapped.ok()) {
      report.problems.push_back({shard.path, "", mapped.error().message()});
      report.samples_checked += shard.num_samples;
    } else {
      auto bytes = (*mapped)->data();
      if (bytes.size() != shard.size) {
        report.problems.push_back(
            {shard.path, "", fmt::format("shard is {} bytes but the index says {}", bytes.size(), shard.size)});
      }
      ShardVerifier(dataset, i, bytes, report).Run();
      report.bytes_checked += bytes.size();
    }
    if (options.on_progress) options.on_progress(i + 1, report.bytes_checked);
  }
  return report;
}

Result<DatasetSummary> Summarize(const Dataset& dataset) {
  DatasetSummary summary;
  summary.num_samples = dataset.num_samples();
  summary.num_shards = dataset.shards().size();
  summary.skipped_members = dataset.skipped_members();
  summary.pack_note = std::string(dataset.pack_note());
  summary.class_names = dataset.class_names();
  summary.seekable_payloads = dataset.seekable_payloads();
  summary.region_records = dataset.has_region_records();
  for (const auto& s : dataset.shards()) summary.shard_bytes += s.size;
  for (std::size_t f = 0; f < dataset.field_names().size(); ++f) {
    const std::string& name = dataset.field_names()[f];
    const auto recorded = dataset.recorded_field(f);
    summary.fields.push_back(
        {name, 0, 0, recorded.kind.value_or(ConventionalFieldKind(name)), recorded.kind.has_value()});
  }
  for (std::uint64_t i = 0; i < dataset.num_samples(); ++i) {
    STOKER_ASSIGN_OR_RETURN(SampleInfo info, dataset.Sample(i));
    for (std::size_t f = 0; f < info.fields.size(); ++f) {
      if (!info.fields[f]) continue;
      summary.fields[f].samples++;
      summary.fields[f].bytes += info.fields[f]->size;
    }
    if (info.label == kNoLabel) {
      summary.unlabelled++;
    } else {
      summary.label_counts[info.label]++;
    }
  }
  return summary;
}

}  // namespace stoker
