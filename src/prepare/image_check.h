// Images checked by what the loader reads of them first: the format, told
// by the first bytes, and the header (codec::CheckImageHeader), at pack time
// (a FieldRewriter, first in the chain) and by `stoker index` (a
// PayloadCheck over the shards as they are). An image field that fails (an
// empty file, an HTML error page saved as .jpg, a GIF, a cut header) would
// otherwise be packed or indexed as it is and fail in the training loop,
// hours later. It is refused, named; with keep_bad_images it is kept as it
// is, counted and named (the summary, the index's note). A body damaged past
// the header is not found here: `stoker verify --decode` decodes every image.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "core/mutex.h"
#include "dataset/pack_rewrite.h"

namespace stoker::prepare {

// How many kept bad images the index's note names (the smallest keys; as
// index_format::kBadImagesNamedInNote, which a merge keeps), and how many the
// summary lists (the smallest keys), so that one run lists what to fix.
inline constexpr std::size_t kBadImagesNamed = 5;
inline constexpr std::size_t kBadImagesListed = 1000;

class ImageHeaderCheck final : public pack_internal::FieldRewriter, public pack_internal::PayloadCheck {
 public:
  // `keep_hint`: how the user keeps such images, told in the error (pack's
  // option and flag; DatasetWriter's option).
  static constexpr std::string_view kPackKeepHint = "keep_bad_images, `--keep-bad-images`,";
  explicit ImageHeaderCheck(bool keep_bad_images, std::string_view keep_hint = kPackKeepHint)
      : keep_bad_images_(keep_bad_images), keep_hint_(keep_hint) {}

  // Never changes the bytes. Checks fields of kind image; one that
  // fails is an error (Corruption, or Unimplemented for a format stoker does
  // not decode), or kKeptAsItIs when bad images are kept.
  [[nodiscard]] Result<pack_internal::Rewritten> Rewrite(const pack_internal::PackedField& field,
                                                         std::vector<std::byte>& bytes,
                                                         SeekableTable& restarts) const override;
  // The same, for `stoker index`, which reads the shards as they are.
  [[nodiscard]] Result<pack_internal::Rewritten> Check(const pack_internal::PackedField& field,
                                                       std::span<const std::byte> bytes) const override;
  // A bad image found by a later rewriter (one that decodes it): the same
  // error, or the same record and kKeptAsItIs, as a header that fails here.
  [[nodiscard]] Result<pack_internal::Rewritten> Bad(const pack_internal::PackedField& field, const Status& why) const;
  // {"bad_images": {"kept": N, "named": {key: why, ...}}}, or empty when
  // none was kept.
  [[nodiscard]] std::string Note() const override;
  // PackSummary::bad_images_kept and bad_images_named.
  void Report(PackSummary& summary) const override;
  [[nodiscard]] std::uint64_t kept() const override { return kept_.load(); }
  [[nodiscard]] std::vector<std::string> named() const override;

 private:
  const bool keep_bad_images_;
  const std::string_view keep_hint_;
  mutable std::atomic<std::uint64_t> kept_{0};
  mutable Mutex mu_;
  // "key, field" -> why, the smallest kBadImagesListed (so the same input names the same ones).
  mutable std::map<std::string, std::string> named_ GUARDED_BY(mu_);
};

}  // namespace stoker::prepare
