#include "prepare/seekable_jpeg.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "codec/jpeg_restart.h"

namespace stoker::prepare {

Result<bool> SeekableJpegWriter::Rewrite(std::string_view field, std::vector<std::byte>& bytes,
                                         std::vector<std::uint32_t>& restarts) const {
  bool changed = false;
  if (before_ != nullptr) {
    STOKER_ASSIGN_OR_RETURN(changed, before_->Rewrite(field, bytes, restarts));
  }
  if (field != "jpg" && field != "jpeg") return changed;
  codec::SeekableJpeg seekable = codec::MakeSeekableJpeg(bytes);
  switch (seekable.outcome) {
    case codec::SeekableOutcome::kRewritten:
      break;
    case codec::SeekableOutcome::kProgressive:
      progressive_.fetch_add(1, std::memory_order_relaxed);
      return changed;
    case codec::SeekableOutcome::kArithmetic:
      arithmetic_.fetch_add(1, std::memory_order_relaxed);
      return changed;
    case codec::SeekableOutcome::kCmyk:
      cmyk_.fetch_add(1, std::memory_order_relaxed);
      return changed;
    case codec::SeekableOutcome::kUndecodable:
      undecodable_.fetch_add(1, std::memory_order_relaxed);
      return changed;
    case codec::SeekableOutcome::kOther:
      other_.fetch_add(1, std::memory_order_relaxed);
      return changed;
  }
  bytes_before_.fetch_add(bytes.size(), std::memory_order_relaxed);
  bytes_after_.fetch_add(seekable.bytes.size(), std::memory_order_relaxed);
  intervals_.fetch_add(seekable.table.size() - 1, std::memory_order_relaxed);
  rewritten_.fetch_add(1, std::memory_order_relaxed);
  bytes = std::move(seekable.bytes);
  restarts = std::move(seekable.table);
  return true;
}

std::string SeekableJpegWriter::Note() const {
  nlohmann::ordered_json note = nlohmann::ordered_json::object();
  if (before_ != nullptr) {
    auto parsed = nlohmann::ordered_json::parse(before_->Note(), nullptr, /*allow_exceptions=*/false);
    if (parsed.is_object()) note = std::move(parsed);
  }
  note["seekable_jpeg"] = {
      {"method", "lossless (coefficients re-written with restart intervals, Huffman tables optimised)"},
      {"images_rewritten", rewritten_.load()},
      {"restart_intervals", intervals_.load()},
      {"kept_progressive", progressive_.load()},
      {"kept_arithmetic", arithmetic_.load()},
      {"kept_cmyk", cmyk_.load()},
      {"kept_undecodable", undecodable_.load()},
      {"kept_other", other_.load()},
      {"rewritten_bytes_before", bytes_before_.load()},
      {"rewritten_bytes_after", bytes_after_.load()},
  };
  return note.dump();
}

void SeekableJpegWriter::Report(PackSummary& summary) const {
  if (before_ != nullptr) before_->Report(summary);
  summary.seekable_jpegs = rewritten_.load();
  summary.seekable_kept = progressive_.load() + arithmetic_.load() + cmyk_.load() + undecodable_.load() + other_.load();
  summary.seekable_bytes_before = bytes_before_.load();
  summary.seekable_bytes_after = bytes_after_.load();
}

}  // namespace stoker::prepare
