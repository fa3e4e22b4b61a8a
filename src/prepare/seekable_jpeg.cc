#include "prepare/seekable_jpeg.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "codec/jpeg.h"
#include "codec/jpeg_restart.h"

namespace stoker::prepare {

// by_outcome_ is indexed by the outcome: re-written first, then the reasons kept.
static_assert(static_cast<std::size_t>(codec::SeekableOutcome::kRewritten) == 0);
static_assert(static_cast<std::size_t>(codec::SeekableOutcome::kOther) + 1 == codec::kSeekableOutcomes);

Result<pack_internal::Rewritten> SeekableJpegWriter::Rewrite(const pack_internal::PackedField& field,
                                                             std::vector<std::byte>& bytes,
                                                             SeekableTable& restarts) const {
  if (!codec::IsJpegField(field.name)) return pack_internal::Rewritten::kUnchanged;
  codec::SeekableJpeg seekable = codec::MakeSeekableJpeg(bytes);
  by_outcome_[static_cast<std::size_t>(seekable.outcome)].fetch_add(1, std::memory_order_relaxed);
  if (seekable.outcome != codec::SeekableOutcome::kRewritten) return pack_internal::Rewritten::kUnchanged;
  bytes_before_.fetch_add(bytes.size(), std::memory_order_relaxed);
  bytes_after_.fetch_add(seekable.bytes.size(), std::memory_order_relaxed);
  intervals_.fetch_add(seekable.table.size() - 1, std::memory_order_relaxed);
  bytes = std::move(seekable.bytes);
  auto layout = codec::ReadScanLayout(bytes);  // the table's geometry, for the index's region record
  if (!layout.ok()) return layout.status().WithContext("a seekable JPEG just written");
  restarts = {std::move(seekable.table), codec::IndexGeometry(*layout)};
  return pack_internal::Rewritten::kReplaced;
}

std::string SeekableJpegWriter::Note() const {
  nlohmann::ordered_json note = nlohmann::ordered_json::object();
  nlohmann::ordered_json seekable = {
      {"method", "lossless (coefficients re-written with restart intervals, Huffman tables optimised)"},
      {"images_rewritten", by_outcome_[0].load()},
      {"restart_intervals", intervals_.load()},
  };
  for (std::size_t i = 1; i < codec::kSeekableOutcomes; ++i)  // kept_progressive, ... kept_other
    seekable["kept_" + std::string(codec::SeekableOutcomeName(static_cast<codec::SeekableOutcome>(i)))] =
        by_outcome_[i].load();
  seekable["rewritten_bytes_before"] = bytes_before_.load();
  seekable["rewritten_bytes_after"] = bytes_after_.load();
  note["seekable_jpeg"] = std::move(seekable);
  return note.dump();
}

void SeekableJpegWriter::Report(PackSummary& summary) const {
  summary.seekable_jpegs = by_outcome_[0].load();
  summary.seekable_kept = 0;
  for (std::size_t i = 1; i < codec::kSeekableOutcomes; ++i) summary.seekable_kept += by_outcome_[i].load();
  summary.seekable_bytes_before = bytes_before_.load();
  summary.seekable_bytes_after = bytes_after_.load();
}

}  // namespace stoker::prepare
