#include "dataset/sample_check.h"

#include <fmt/format.h>

#include "core/hash.h"
#include "format/index_format.h"
#include "format/webdataset.h"

namespace stoker::dataset_internal {

namespace {

Status CheckLabel(const SampleInfo& info, std::span<const std::span<const std::byte>> fields,
                  std::optional<std::size_t> cls_field) {
  if (cls_field && info.fields[*cls_field]) {
    const auto& bytes = fields[*cls_field];
    const auto label = wds::ParseLabel({reinterpret_cast<const char*>(bytes.data()), bytes.size()});
    if (!label || *label != info.label)
      return Status::Corruption(
          fmt::format("the index record's label {} differs from the shard's .cls ({}): the index is corrupt",
                      info.label == kNoLabel ? std::string("(none)") : std::to_string(info.label),
                      label ? std::to_string(*label) : std::string("not a number")));
  } else if (info.label != kNoLabel) {
    return Status::Corruption(fmt::format(
        "the index record has label {} but the sample has no .cls field: the index is corrupt", info.label));
  }
  return Status::Ok();
}

}  // namespace

Status CheckSample(const SampleInfo& info, std::span<const std::span<const std::byte>> fields,
                   std::optional<std::size_t> cls_field) {
  Xxh3Stream hash;
  for (std::size_t f = 0; f < fields.size(); ++f)
    if (info.fields[f]) hash.Update(fields[f]);
  if (hash.Digest() != info.checksum)
    return Status::Corruption(fmt::format(
        "sample checksum mismatch: its bytes are corrupt (xxh3 {:016x}, index {:016x})", hash.Digest(), info.checksum));
  return CheckLabel(info, fields, cls_field);
}

Status CheckSamplePieces(const SampleInfo& info, std::span<const std::span<const std::byte>> fields,
                         std::optional<std::size_t> cls_field, std::size_t part_field,
                         const Dataset::FieldRead::Part& part, std::span<const std::byte> head,
                         std::span<const std::byte> rows, bool* pieces_disagree) {
  *pieces_disagree = false;
  std::vector<std::span<const std::byte>> others;
  for (std::size_t f = 0; f < fields.size(); ++f)
    if (f != part_field && info.fields[f]) others.push_back(fields[f]);
  if (!info.fields[part_field] ||
      !index_format::RegionPiecesAgree(*part.region, *part.table, info.fields[part_field]->size, others, head,
                                       part.first_row, rows)) {
    *pieces_disagree = true;
    return Status::Corruption(fmt::format(
        "the bytes read of MCU rows {}-{} of its seekable JPEG (or of its other fields) differ from the index's "
        "region record: they are corrupt",
        part.first_row, part.end_row - 1));
  }
  return CheckLabel(info, fields, cls_field);
}

}  // namespace stoker::dataset_internal
