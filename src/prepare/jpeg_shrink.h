// Lighter images at pack time (`stoker pack --max-side N --quality Q`):
// JPEGs larger than N on their longest side are turned as their EXIF
// orientation says, resized with Pillow's antialiased bilinear filter and
// re-encoded; every other payload passes unchanged. Plugs into pack through
// the dataset layer's FieldRewriter seam.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "dataset/pack_rewrite.h"
#include "prepare/image_check.h"
#include "stoker/status.h"

namespace stoker::prepare {

// Images claiming more pixels than this are refused before decoding (a
// small file can claim a huge image): PIL's limit, 2 x Image.MAX_IMAGE_PIXELS.
inline constexpr std::uint64_t kMaxShrinkPixels = 178'956'970;

// The bytes to store for `jpeg`: nullopt when it stays as it is (its
// oriented longest side is max_side or less), else the re-encoded image.
// Corruption when it does not decode or claims more than max_pixels.
[[nodiscard]] Result<std::optional<std::vector<std::byte>>> ShrinkJpeg(std::span<const std::byte> jpeg,
                                                                       std::uint32_t max_side, int quality,
                                                                       std::uint64_t max_pixels = kMaxShrinkPixels);

// The size ShrinkJpeg gives an image of `width` x `height` (already turned).
struct Size {
  int width = 0;
  int height = 0;
};
[[nodiscard]] Size ShrunkSize(int width, int height, std::uint32_t max_side);

class JpegShrinker final : public pack_internal::FieldRewriter {
 public:
  // InvalidArgument for max_side 0 or quality outside 1-100. A JPEG that
  // does not decode goes to `bad_images` (may be null: an error; must
  // outlive this), which refuses or keeps it as pack was asked.
  [[nodiscard]] static Result<std::unique_ptr<JpegShrinker>> Create(std::uint32_t max_side, int quality,
                                                                    const ImageHeaderCheck* bad_images = nullptr);

  [[nodiscard]] Result<pack_internal::Rewritten> Rewrite(const pack_internal::PackedField& field,
                                                         std::vector<std::byte>& bytes,
                                                         SeekableTable& restarts) const override;
  [[nodiscard]] std::string Note() const override;
  void Report(PackSummary& summary) const override;

 private:
  JpegShrinker(std::uint32_t max_side, int quality, const ImageHeaderCheck* bad_images)
      : max_side_(max_side), quality_(quality), bad_images_(bad_images) {}
  const std::uint32_t max_side_;
  const int quality_;
  const ImageHeaderCheck* bad_images_;
  mutable std::atomic<std::uint64_t> reencoded_{0}, kept_{0}, bytes_before_{0}, bytes_after_{0};
};

}  // namespace stoker::prepare
