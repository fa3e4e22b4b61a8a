#include "dataset/sample_check.h"

#include <fmt/format.h>

#include "core/hash.h"
#include "format/webdataset.h"

namespace stoker::dataset_internal {

Status CheckSample(const SampleInfo& info, std::span<const std::span<const std::byte>> fields,
                   std::optional<std::size_t> cls_field) {
  Xxh3Stream hash;
  for (std::size_t f = 0; f < fields.size(); ++f)
    if (info.fields[f]) hash.Update(fields[f]);
  if (hash.Digest() != info.checksum)
    return Status::Corruption(fmt::format(
        "sample checksum mismatch: its bytes are corrupt (xxh3 {:016x}, index {:016x})", hash.Digest(), info.checksum));
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

}  // namespace stoker::dataset_internal
