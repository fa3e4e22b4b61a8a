#include "prepare/jpeg_shrink.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "codec/exif.h"
#include "codec/jpeg.h"
#include "transform/orient.h"
#include "transform/resample.h"

namespace stoker::prepare {

Size ShrunkSize(int width, int height, std::uint32_t max_side) {
  const int longest = std::max(width, height);
  if (longest <= 0 || static_cast<std::uint32_t>(longest) <= max_side) return {width, height};
  const double scale = static_cast<double>(max_side) / longest;
  auto side = [&](int v) {
    return v == longest ? static_cast<int>(max_side) : std::max(1, static_cast<int>(std::lround(v * scale)));
  };
  return {side(width), side(height)};
}

Result<std::optional<std::vector<std::byte>>> ShrinkJpeg(std::span<const std::byte> jpeg, std::uint32_t max_side,
                                                         int quality, std::uint64_t max_pixels) {
  STOKER_ASSIGN_OR_RETURN(const codec::ImageSize size, codec::JpegSize(jpeg));
  const int orientation = codec::JpegExifOrientation(jpeg);
  const transform::OrientedSize turned = transform::Oriented(size.width, size.height, orientation);
  if (static_cast<std::uint32_t>(std::max(turned.width, turned.height)) <= max_side) return std::nullopt;
  const std::uint64_t pixels_claimed = std::uint64_t(size.width) * std::uint64_t(size.height);
  if (pixels_claimed > max_pixels)
    return Status::Corruption(fmt::format("the image claims {}x{} pixels, more than the limit {} (PIL's too)",
                                          size.width, size.height, max_pixels));

  codec::DecodedRegion decoded;
  STOKER_RETURN_IF_ERROR(codec::DecodeJpeg(jpeg, codec::Roi{}, 1, decoded));
  std::vector<std::uint8_t> oriented;
  const std::uint8_t* pixels = decoded.pixels.data();
  int width = decoded.width, height = decoded.height;
  if (orientation != 1) {
    transform::ApplyOrientation({decoded.pixels.data(), width, height, static_cast<std::size_t>(width) * 3},
                                orientation, oriented);
    pixels = oriented.data();
    width = turned.width;
    height = turned.height;
  }
  const Size out = ShrunkSize(width, height, max_side);
  std::vector<std::uint8_t> resized(static_cast<std::size_t>(out.width) * out.height * 3);
  transform::ResampleScratch scratch;
  if (!transform::ResampleBilinear({pixels, width, height, static_cast<std::size_t>(width) * 3}, 0, 0, width, height,
                                   out.width, out.height, resized.data(), scratch))
    return Status::Internal(fmt::format("resampling {}x{} to {}x{} failed", width, height, out.width, out.height));
  STOKER_ASSIGN_OR_RETURN(auto encoded, codec::EncodeJpegRgb(resized.data(), out.width, out.height, quality));
  return std::optional<std::vector<std::byte>>(std::move(encoded));
}

Result<std::unique_ptr<JpegShrinker>> JpegShrinker::Create(std::uint32_t max_side, int quality,
                                                           const ImageHeaderCheck* bad_images) {
  if (max_side == 0) return Status::InvalidArgument("max side must be at least 1 pixel");
  if (max_side > 65500) return Status::InvalidArgument(fmt::format("max side {} is over JPEG's 65500", max_side));
  if (quality < 1 || quality > 100)
    return Status::InvalidArgument(fmt::format("JPEG quality {} is outside 1-100", quality));
  return std::unique_ptr<JpegShrinker>(new JpegShrinker(max_side, quality, bad_images));
}

Result<pack_internal::Rewritten> JpegShrinker::Rewrite(const pack_internal::PackedField& field,
                                                       std::vector<std::byte>& bytes, SeekableTable&) const {
  if (!codec::IsJpegField(field.name)) return pack_internal::Rewritten::kUnchanged;
  auto shrunk = ShrinkJpeg(bytes, max_side_, quality_);
  if (!shrunk.ok()) {
    const Status why = shrunk.error().WithContext("cannot re-encode the image");
    return bad_images_ != nullptr ? bad_images_->Bad(field, why) : why;
  }
  if (!shrunk->has_value()) {
    kept_.fetch_add(1, std::memory_order_relaxed);
    return pack_internal::Rewritten::kUnchanged;
  }
  bytes_before_.fetch_add(bytes.size(), std::memory_order_relaxed);
  bytes = std::move(**shrunk);
  bytes_after_.fetch_add(bytes.size(), std::memory_order_relaxed);
  reencoded_.fetch_add(1, std::memory_order_relaxed);
  return pack_internal::Rewritten::kReplaced;
}

std::string JpegShrinker::Note() const {
  return fmt::format(
      R"j({{"max_side":{},"quality":{},"resample":"bilinear, antialiased (Pillow's Image.resize BILINEAR)",)j"
      R"j("exif_orientation":"applied to re-encoded images, whose EXIF is dropped","subsampling":"4:2:0",)j"
      R"j("images_reencoded":{},"images_kept":{},"reencoded_bytes_before":{},"reencoded_bytes_after":{}}})j",
      max_side_, quality_, reencoded_.load(), kept_.load(), bytes_before_.load(), bytes_after_.load());
}

void JpegShrinker::Report(PackSummary& summary) const {
  summary.images_reencoded = reencoded_.load();
  summary.reencoded_bytes_before = bytes_before_.load();
  summary.reencoded_bytes_after = bytes_after_.load();
}

}  // namespace stoker::prepare
