// Seekable JPEGs at pack time (`stoker pack --seekable-jpeg`): each
// baseline JPEG is re-written losslessly with restart intervals (after the
// shrinker, when --max-side also asks for lighter images) and its restart
// table goes into the index; what cannot be re-written is stored as it is
// and counted. Plugs into pack through the dataset layer's FieldRewriter
// seam (after the shrinker, in a RewriterChain, when both are asked for).
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
  [[nodiscard]] Result<pack_internal::Rewritten> Rewrite(const pack_internal::PackedField& field,
                                                         std::vector<std::byte>& bytes,
                                                         SeekableTable& restarts) const override;
  // {"seekable_jpeg": counts of images re-written and kept (by reason) and
  // the bytes before and after}.
  [[nodiscard]] std::string Note() const override;
  void Report(PackSummary& summary) const override;

 private:
  // JPEGs by outcome (codec::SeekableOutcome): re-written, or kept and why.
  mutable std::array<std::atomic<std::uint64_t>, codec::kSeekableOutcomes> by_outcome_{};
  mutable std::atomic<std::uint64_t> bytes_before_{0}, bytes_after_{0}, intervals_{0};
};

}  // namespace stoker::prepare
