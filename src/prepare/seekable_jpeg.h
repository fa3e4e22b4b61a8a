// Seekable JPEGs at pack time (`stoker pack --seekable-jpeg`): each
// baseline JPEG is re-written losslessly with restart intervals (after the
// shrinker, when --max-side also asks for lighter images) and its restart
// table goes into the index; what cannot be re-written is stored as it is
// and counted. Plugs into pack through the dataset layer's FieldRewriter
// seam.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>

#include "codec/jpeg_restart.h"
#include "dataset/pack_rewrite.h"
#include "stoker/status.h"

namespace stoker::prepare {

class SeekableJpegWriter final : public pack_internal::FieldRewriter {
 public:
  // `before` (may be null, must outlive this) rewrites payloads first.
  explicit SeekableJpegWriter(const pack_internal::FieldRewriter* before) : before_(before) {}

  [[nodiscard]] Result<bool> Rewrite(std::string_view field, std::vector<std::byte>& bytes,
                                     SeekableTable& restarts) const override;
  // The note merges `before`'s (a JSON object) with "seekable_jpeg": counts
  // of images re-written and kept (by reason) and the bytes before and after.
  [[nodiscard]] std::string Note() const override;
  void Report(PackSummary& summary) const override;

 private:
  const pack_internal::FieldRewriter* before_;
  // JPEGs by outcome (codec::SeekableOutcome): re-written, or kept and why.
  mutable std::array<std::atomic<std::uint64_t>, codec::kSeekableOutcomes> by_outcome_{};
  mutable std::atomic<std::uint64_t> bytes_before_{0}, bytes_after_{0}, intervals_{0};
};

}  // namespace stoker::prepare
