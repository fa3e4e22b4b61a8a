// Checks one sample's bytes against its index record: the checksum over its
// fields, and the label against its `.cls` field. Shared by reads (the
// loader checks every sample it reads) and `stoker verify`.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>

#include "stoker/dataset.h"
#include "stoker/status.h"

namespace stoker::dataset_internal {

// `fields[f]` holds field f's bytes (empty where the sample lacks it), in the
// dataset's field order (sorted by name, as the checksum is defined).
// `cls_field` is the position of "cls" among the fields, if any. Corruption
// says what differs, without saying where (callers add the sample's place).
[[nodiscard]] Status CheckSample(const SampleInfo& info, std::span<const std::span<const std::byte>> fields,
                                 std::optional<std::size_t> cls_field);

// The same for a sample whose field `part_field`, a seekable JPEG, was read
// in part (Dataset::FieldRead::Part): `fields[part_field]` is ignored; the
// other fields, `head` and `rows` are checked against the region record.
[[nodiscard]] Status CheckSamplePieces(const SampleInfo& info, std::span<const std::span<const std::byte>> fields,
                                       std::optional<std::size_t> cls_field, std::size_t part_field,
                                       const Dataset::FieldRead::Part& part, std::span<const std::byte> head,
                                       std::span<const std::byte> rows, bool* pieces_disagree);

}  // namespace stoker::dataset_internal
